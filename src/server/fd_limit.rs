//! The process's file-descriptor limit: every connection is a descriptor,
//! and the soft `RLIMIT_NOFILE` that shells and service managers hand out
//! (often 1,024) caps a broker far below what the machine allows. At start
//! the server raises the soft limit to the hard one, which needs no
//! privilege, and logs both, so a refused connection later (`accept
//! failed: Too many open files`) can be read against them.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Where Linux keeps the per-process ceiling (`fs.nr_open`) that an
/// unlimited hard limit still cannot exceed.
const NR_OPEN_PATH: &str = "/proc/sys/fs/nr_open";

/// What [`raise_to_hard`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FdLimit {
    /// The soft limit before (`None`: unlimited).
    pub(crate) soft_before: Option<u64>,
    /// The soft limit now.
    pub(crate) soft: Option<u64>,
    /// The hard limit (`None`: unlimited).
    pub(crate) hard: Option<u64>,
}

/// The soft limit to ask for: the hard one, or `fs.nr_open` when the hard
/// limit is unlimited (the kernel refuses a soft limit above it).
fn target(hard: Option<u64>, nr_open: Option<u64>) -> Option<u64> {
    match (hard, nr_open) {
        (Some(hard), Some(ceiling)) => Some(hard.min(ceiling)),
        (Some(hard), None) => Some(hard),
        (None, ceiling) => ceiling,
    }
}

fn nr_open() -> Option<u64> {
    std::fs::read_to_string(NR_OPEN_PATH)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and logs both.
/// Failing to raise it is logged and otherwise ignored: the broker still
/// runs, with fewer connections.
pub(crate) fn raise_to_hard() -> FdLimit {
    let before = getrlimit(Resource::Nofile);
    let mut soft = before.current;
    if let Some(wanted) = target(before.maximum, nr_open()) {
        if before.current.is_some_and(|current| current < wanted) {
            let raised = Rlimit {
                current: Some(wanted),
                maximum: before.maximum,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => soft = Some(wanted),
                Err(e) => tracing::warn!(
                    error = %e,
                    soft = ?before.current,
                    wanted,
                    "cannot raise the file descriptor limit; connections are capped by the soft limit"
                ),
            }
        }
    }
    let limit = FdLimit {
        soft_before: before.current,
        soft,
        hard: before.maximum,
    };
    tracing::info!(
        soft_before = ?limit.soft_before,
        soft = ?limit.soft,
        hard = ?limit.hard,
        "file descriptor limit (RLIMIT_NOFILE): one per connection"
    );
    limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_hard_limit_within_nr_open() {
        assert_eq!(target(Some(20_000), Some(1_048_576)), Some(20_000));
        assert_eq!(target(Some(2_000_000), Some(1_048_576)), Some(1_048_576));
        assert_eq!(target(None, Some(1_048_576)), Some(1_048_576));
        assert_eq!(target(Some(4096), None), Some(4096));
        assert_eq!(target(None, None), None);
    }
}
