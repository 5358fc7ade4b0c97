//! What can go wrong in the ledger: [`LedgerError`] (with the database failures opmark
//! explains apart, [`DatabaseFault`], and who won a settlement race, [`SettledBy`]) and
//! how an error becomes the crate's [`Error`]. A leaf: every file of the ledger names it,
//! so it names none of them but the words it reports.

use std::path::Path;

use super::words::Decision;
use crate::error::{Error, ErrorKind};

/// Errors of the ledger. Messages never contain event contents (they may hold secrets the
/// redactor missed), only paths, sequence numbers and ids.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A file or directory operation failed.
    #[error("could not {what}: {source}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite failed (told as rusqlite tells it; the conversion is the SQLite store's, so
    /// that no other module names the database crate).
    #[error("ledger database error: {message}")]
    Sqlite {
        /// SQLite's complaint.
        message: String,
        /// Which of the failures opmark explains it is.
        fault: DatabaseFault,
    },
    /// PostgreSQL failed (the message names the server's complaint, never event content).
    #[error("ledger database error (PostgreSQL): {0}")]
    Postgres(String),
    /// A conditional settlement found the operation settled by someone else first.
    #[error("{0}")]
    AlreadySettled(Box<SettledBy>),
    /// The ledger exists but this user may not open it so (permissions, a read-only
    /// mount); the message names the path, the cause and the fix.
    #[error("{message}")]
    Denied {
        /// Path, cause and fix.
        message: String,
    },
    /// The ledger or a related file is unusable; the message says why and what to do.
    #[error("{message}")]
    Invalid {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The op id on this host is already bound to a different intent.
    #[error("operation `{op_id}` on `{host}` is already bound to a different command or stdin (fingerprint differs); resend exactly the recorded command for the same effect, or use a new op id for a different one")]
    FingerprintConflict {
        /// Operation id.
        op_id: String,
        /// Host.
        host: String,
    },
    /// A stored event cannot be decoded.
    #[error("event #{seq} in the ledger cannot be decoded ({why}); run `opmark audit verify`")]
    Corrupt {
        /// Its sequence number.
        seq: u64,
        /// The decoder's complaint (no event content).
        why: String,
    },
}

/// The failures of a database that opmark explains apart from the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFault {
    /// No space left for the write (SQLite's SQLITE_FULL).
    DiskFull,
    /// Read-only, cannot open, or permission denied.
    AccessDenied,
    /// The file is not a database.
    NotADatabase,
    /// Anything else.
    Other,
}

impl LedgerError {
    /// The write failed for want of space (SQLite's SQLITE_FULL, or ENOSPC/EDQUOT).
    pub fn is_disk_full(&self) -> bool {
        match self {
            LedgerError::Sqlite { fault, .. } => *fault == DatabaseFault::DiskFull,
            LedgerError::Io { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            }
            _ => false,
        }
    }
}

impl LedgerError {
    /// Opening failed for want of permission, or on a read-only file or filesystem (the
    /// file itself is fine: reading may still work).
    pub fn is_access_denied(&self) -> bool {
        match self {
            LedgerError::Sqlite { fault, .. } => *fault == DatabaseFault::AccessDenied,
            LedgerError::Io { source, .. } => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::EROFS)
                )
            }
            LedgerError::Denied { .. } => true,
            _ => false,
        }
    }
}

/// An opening failure told as the path, the cause and the fix (SQLite alone says "unable
/// to open database file"). `doing` is `open` (read and write) or `read`.
pub(super) fn explain_open_failure(path: &Path, e: LedgerError, doing: &str) -> LedgerError {
    let not_a_database = matches!(
        &e,
        LedgerError::Sqlite {
            fault: DatabaseFault::NotADatabase,
            ..
        }
    );
    if not_a_database {
        return LedgerError::Invalid {
            message: format!(
                "{} is not an opmark ledger ({e}); point --ledger (or OPMARK_LEDGER) at the ledger file; nothing was changed",
                path.display()
            ),
        };
    }
    if !e.is_access_denied() || matches!(e, LedgerError::Denied { .. }) {
        return e;
    }
    let fix = if doing == "read" {
        "give this user read access to the ledger and its key, or copy them somewhere it can read"
    } else {
        "commands that record (run, reconcile, probe, resolve, cancel, ledger archive) need write access to the file and its directory (SQLite writes -wal and -shm files beside it); list, show, stats and audit verify only need to read it. Use a ledger this user owns, or run as its owner"
    };
    LedgerError::Denied {
        message: format!("cannot {doing} the ledger {} ({e}): {fix}", path.display()),
    }
}

impl From<LedgerError> for Error {
    fn from(e: LedgerError) -> Self {
        let kind = match e {
            LedgerError::FingerprintConflict { .. } | LedgerError::AlreadySettled(_) => {
                ErrorKind::InvalidInput
            }
            _ => ErrorKind::LocalIo,
        };
        Error::new(kind, e.to_string())
    }
}

/// Who settled an operation first, for [`LedgerError::AlreadySettled`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledBy {
    /// Operation id.
    pub op_id: String,
    /// Host.
    pub host: String,
    /// `operator NAME` or `reconcile`.
    pub by: String,
    /// When (UTC, RFC 3339).
    pub at: String,
    /// What was decided.
    pub decision: Decision,
    /// The settling event.
    pub seq: u64,
}

impl std::fmt::Display for SettledBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "operation `{}` on `{}` was already settled by {} at {} ({}, event #{}); nothing was recorded. `opmark show {} --host {}` shows it",
            self.op_id, self.host, self.by, self.at, self.decision, self.seq, self.op_id, self.host
        )
    }
}
