//! Singleton work (docs/design.md §20): a long-running job that runs on
//! exactly one instance of a service at a time, chosen by the assignor like
//! a partition and moved by the same drain-then-switch rules, with a
//! fencing token for the stores it writes to.
//!
//! A consumer runs singletons beside its partitions
//! ([`ConsumerBuilder::singleton`](crate::consumer::ConsumerBuilder::singleton));
//! a program that runs no consumer uses [`Singleton::builder`].
//!
//! Each singleton is a unit of the instance's handover machine: its holder
//! under an epoch's assignment is a function of its name alone (a number
//! drawn from the name under `Modulo`, the members' scores for the name
//! under `Rendezvous`, weights included), so every instance assigned in the
//! epoch agrees on it. The next holder starts only once the previous one
//! wrote its release mark, which it writes after its job's future has
//! ended, or once the handover deadline passed (a crash, a freeze). Work
//! the job spawns on its own (a `tokio::spawn` it does not await) escapes
//! this: it is not cancelled with the job.

mod context;
mod driver;
mod holder;
mod standalone;
pub(crate) mod store;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use self::context::SingletonContext;
pub(crate) use self::driver::{Setup, Singletons};
pub use self::standalone::{Singleton, SingletonBuilder};
pub use self::store::SingletonHolder;
use crate::error::{Error, Result};
use crate::handler::BoxError;

/// A job's run, boxed.
type Run = Pin<Box<dyn Future<Output = std::result::Result<(), BoxError>> + Send>>;

/// A singleton's job, erased: called once per run.
pub(crate) type Job = Arc<dyn Fn(SingletonContext) -> Run + Send + Sync>;

/// A singleton as a builder was given it.
#[derive(Clone)]
pub(crate) struct Declared {
    pub(crate) name: Arc<str>,
    pub(crate) job: Job,
}

impl std::fmt::Debug for Declared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Declared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Declared {
    /// Singleton `name` running `job`.
    pub(crate) fn new<F, Fut, E>(name: &str, job: F) -> Declared
    where
        F: Fn(SingletonContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let job = Arc::new(job);
        Declared {
            name: name.into(),
            job: Arc::new(move |cx| {
                let run = job(cx);
                Box::pin(async move { run.await.map_err(Into::into) })
            }),
        }
    }
}

/// Checks the singletons a consumer was given: valid names, each once.
pub(crate) fn check(declared: &[Declared]) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for d in declared {
        store::check_name(&d.name)?;
        if !seen.insert(d.name.clone()) {
            return Err(Error::invalid(
                "singleton",
                format!("name {:?} is given twice", &*d.name),
            ));
        }
    }
    Ok(())
}
