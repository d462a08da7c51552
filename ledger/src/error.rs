//! Errors of opening and joining a ledger, and the quota's refusal.

use super::*;

/// Why a ledger could not be used.
#[derive(Debug)]
pub enum LedgerError {
    Io {
        path: PathBuf,
        err: std::io::Error,
    },
    Corrupt {
        path: PathBuf,
        why: String,
    },
    Version {
        path: PathBuf,
        found: u32,
    },
    /// No free container or process slot.
    Full {
        path: PathBuf,
        what: &'static str,
    },
}

/// An allocation refused because it would pass the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub quota: u64,
    pub used: u64,
    pub requested: u64,
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerError::Io { path, err } => write!(f, "ledger {}: {err}", path.display()),
            LedgerError::Corrupt { path, why } => {
                write!(f, "ledger {} is corrupt: {why}", path.display())
            }
            LedgerError::Version { path, found } => write!(
                f,
                "ledger {} has format version {found}, this build speaks {FORMAT_VERSION}",
                path.display()
            ),
            LedgerError::Full { path, what } => {
                write!(f, "ledger {} has no free {what} slot", path.display())
            }
        }
    }
}

impl std::error::Error for LedgerError {}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes requested, {} of {} held",
            self.requested, self.used, self.quota
        )
    }
}

impl LedgerError {
    /// The table lock stayed held by a live process (a stopped one, or one
    /// that is not scheduled) for the whole wait. Passing; try again.
    pub fn is_busy(&self) -> bool {
        matches!(self, LedgerError::Io { err, .. } if err.kind() == std::io::ErrorKind::TimedOut)
    }
    /// No free slot (passing, when processes or containers leave).
    pub fn is_full(&self) -> bool {
        matches!(self, LedgerError::Full { .. })
    }
    pub(crate) fn io(path: &Path, err: std::io::Error) -> Self {
        LedgerError::Io {
            path: path.to_owned(),
            err,
        }
    }
}
