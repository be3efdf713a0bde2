//! The periodic jobs a consumer's builder is given: each task is kept
//! encoded with every codec until the consumer starts, since `.codec(…)`
//! may come after `.periodic(…)` (docs/design.md §6, periodic jobs).

use crate::codec::{Codec, EachCodec};
use crate::error::{Error, Result};
use crate::periodic::{Periodic, Registered};

/// A job as the consumer's builder was given it: its task encoded with
/// every codec, since the builder's codec may still change after it.
#[derive(Debug)]
pub(crate) struct GivenJob {
    job: Periodic,
    task: EachCodec,
}

impl GivenJob {
    /// Job `job`, which enqueues `task`.
    pub(crate) fn new<T: serde::Serialize>(job: Periodic, task: &T) -> Self {
        GivenJob {
            job,
            task: EachCodec::of(task),
        }
    }

    /// The job with its task encoded by `C`, the codec the consumer runs
    /// with; an error naming the job when its task does not encode so, or
    /// its headers are out of their bounds.
    pub(crate) fn registered<C: Codec>(&self) -> Result<Registered> {
        if let Err(Error::InvalidSetting { setting, message }) = self.job.checked_headers() {
            let job = self.job.name();
            return Err(Error::invalid(setting, format!("job `{job}`: {message}")));
        }
        match self.task.by::<C>() {
            Ok(payload) => Ok(Registered {
                job: self.job.clone(),
                codec: C::NAME,
                payload: payload.to_vec(),
            }),
            Err(e) => Err(Error::invalid(
                "periodic",
                format!("job `{}`: its task does not encode: {e}", self.job.name()),
            )),
        }
    }
}
