# Sourced by scripts/test: makes sure PostgreSQL's server binaries are
# installed for the Postgres outbox's tests. They start their own server
# (initdb + postgres from /usr/lib/postgresql/<version>/bin, which is not on
# PATH) on a free loopback port, never the machine's own on 5432; with
# PEERQ_TEST_POSTGRES_URL set they use that server instead and need none.
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

ensure_postgres() {
  [ -n "${PEERQ_TEST_POSTGRES_URL:-}" ] && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && return 0
  # Debian's `postgresql` also creates the `postgres` user the tests run
  # the server as when they run as root (initdb refuses root).
  apt_install postgresql && return 0
  echo "PostgreSQL is missing: install PostgreSQL 13 or newer with its server binaries" \
       "under /usr/lib/postgresql/<version>/bin (Debian/Ubuntu: sudo apt-get install postgresql)," \
       "or set PEERQ_TEST_POSTGRES_URL to a server the tests may create databases on" >&2
  return 1
}

# The newest installed version's bin dir, for the log line.
postgres_bin() {
  compgen -G "/usr/lib/postgresql/*/bin/postgres" | sort -V | tail -1
}
