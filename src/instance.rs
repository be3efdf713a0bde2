//! The identity of one running instance.

use std::fmt;
use std::sync::Arc;

/// A unique name for one running instance: `<host>-<pid>-<random>`.
///
/// It is the member in the indexer's round keys, the consumer name in the
/// partition streams' consumer groups and part of the owner records, so two
/// instances must never share one, even inside one process.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct InstanceId(Arc<str>);

impl InstanceId {
    /// A new random id for this process.
    pub fn generate() -> Self {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        // Keep only characters that are safe in keys, logs and owner records
        // (`<epoch>:<id>` is split at the first colon).
        let host: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let suffix: u32 = rand::random();
        InstanceId(format!("{host}-{}-{suffix:08x}", std::process::id()).into())
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_key_safe() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| InstanceId::generate()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids {
            assert!(!id.as_str().contains([':', '{', '}', '/', ' ']), "{id}");
        }
    }
}
