//! peerq's migrations: the SQL files of the repository's `migrations/`,
//! embedded in the crate, applied in order, each once, and recorded in
//! `peerq_migrations`, a table of peerq's own.
//!
//! Not sqlx's migrator: its history table `_sqlx_migrations` is the
//! application's, and a second set of migrations in it breaks the
//! application's own `migrate!` (sqlx issue 1698: it refuses versions it
//! does not know). Applying is safe twice and from several processes at
//! once: the whole run holds a session advisory lock on a fixed key, and
//! each migration commits in one transaction with its record.

use sqlx::{Connection, Executor, PgConnection, PgPool, Row};
use tracing::info;

use crate::error::{Error, Result};

/// One of peerq's migrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migration {
    /// Its number, the file's prefix: applied in this order.
    pub version: i32,
    /// The rest of the file's name, as `peerq_migrations` records it.
    pub name: &'static str,
    /// Its statements.
    pub sql: &'static str,
}

/// Every migration, in order (`migrations/NNNN_name.sql`).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "outbox",
        sql: include_str!("../../migrations/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "inbox",
        sql: include_str!("../../migrations/0002_inbox.sql"),
    },
    Migration {
        version: 3,
        name: "inbox_done_at",
        sql: include_str!("../../migrations/0003_inbox_done_at.sql"),
    },
    Migration {
        version: 4,
        name: "outbox_sent",
        sql: include_str!("../../migrations/0004_outbox_sent.sql"),
    },
    Migration {
        version: 5,
        name: "outbox_headers",
        sql: include_str!("../../migrations/0005_outbox_headers.sql"),
    },
];

/// The key of the advisory lock a run holds: `fnv1a64("peerq_migrations")`
/// as a signed 64-bit integer, pinned by a test. Another application's
/// advisory lock on the same number would only make a run wait.
const LOCK: i64 = 0x4fcc_48f8_ac18_7d38;

/// Applies the migrations `pool`'s database lacks, in order, and returns
/// those it applied (none when it is up to date, or when another process
/// applied them meanwhile).
///
/// It works on a connection of its own, taken from the pool and closed at
/// the end, so the lock it holds ends with it even after an error.
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// let pool = sqlx::PgPool::connect("postgres://app@localhost/app").await?;
/// for m in peerq::postgres::migrate(&pool).await? {
///     println!("applied {:04}_{}", m.version, m.name);
/// }
/// # Ok(()) }
/// ```
///
/// A database whose `peerq_migrations` records a known version under
/// another name is refused with [`Error::Migration`]; versions this peerq
/// does not know (a newer peerq applied them) are left alone.
pub async fn migrate(pool: &PgPool) -> Result<Vec<Migration>> {
    run(pool.acquire().await?.detach()).await
}

/// [`migrate`] on the database at `url` (`postgres://user:password@host/db`),
/// on one connection made for it: for deploy scripts and
/// `peerq migrate --postgres URL`. A failure is an
/// [`Error::PostgresAt`] naming the URL without its password.
pub async fn migrate_url(url: &str) -> Result<Vec<Migration>> {
    let at = |source| Error::PostgresAt {
        url: crate::connection::redact(url),
        source,
    };
    let conn = PgConnection::connect(url).await.map_err(at)?;
    run(conn).await.map_err(|e| match e {
        Error::Postgres(source) => at(source),
        other => other,
    })
}

/// Applies them on `conn`, then closes it: closing ends the session and
/// with it the lock, also after an error.
async fn run(mut conn: PgConnection) -> Result<Vec<Migration>> {
    let applied = apply(&mut conn).await;
    let closed = conn.close().await;
    let applied = applied?;
    closed?;
    Ok(applied)
}

/// The run, on `conn`, under the lock.
async fn apply(conn: &mut PgConnection) -> Result<Vec<Migration>> {
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS peerq_migrations (
             version int PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .execute(&mut *conn)
    .await?;
    let recorded: Vec<(i32, String)> = sqlx::query("SELECT version, name FROM peerq_migrations")
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, sqlx::Error>>()?;
    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        match recorded.iter().find(|(v, _)| *v == migration.version) {
            Some((_, name)) if name == migration.name => continue,
            Some((_, name)) => {
                return Err(Error::Migration(format!(
                    "`peerq_migrations` records version {} as `{name}`, which this peerq \
                     knows as `{}`: the database was migrated by another program or build",
                    migration.version, migration.name
                )));
            }
            None => {}
        }
        let mut tx = conn.begin().await?;
        // Several statements: the simple query protocol (`Executor`'s
        // own `execute`, not `raw_sql(…).execute`, whose future is not
        // `Send` for every lifetime).
        (&mut *tx).execute(migration.sql).await?;
        sqlx::query("INSERT INTO peerq_migrations (version, name) VALUES ($1, $2)")
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        info!(
            version = migration.version,
            name = migration.name,
            "postgres migration applied"
        );
        applied.push(*migration);
    }
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_key_is_the_hash_of_the_table_name() {
        assert_eq!(LOCK as u64, crate::partition::fnv1a64(b"peerq_migrations"));
    }

    #[test]
    fn migrations_are_numbered_in_order_like_their_files() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1);
            assert!(!m.sql.trim().is_empty());
        }
        let files: Vec<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
        let mut files = files;
        files.sort();
        let named: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.name))
            .collect();
        assert_eq!(files, named, "every file in migrations/ is embedded");
    }
}
