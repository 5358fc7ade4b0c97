//! The ledger file made private before SQLite opens it: created 0600, never an
//! existing file opened (see [`create_private`] for why that matters to SQLite's locks).
//! Its own leaf: opening a ledger and writing an archive file both need it.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::ledger::error::LedgerError;

/// Creates the database file 0600 when it does not exist yet (SQLite gives its -wal and
/// -shm files the database file's mode), and never opens an existing one.
///
/// Closing ANY descriptor of a file drops every POSIX advisory lock this process holds on
/// it, and SQLite's locks are such locks. A fleet opens one connection per host task
/// while its other tasks' connections are open: had this opened (and closed) the
/// existing file, each open would have silently released the locks those connections
/// hold, SQLite (which counts its locks per process) would not retake them, and another
/// process closing its last connection would then believe itself alone, checkpoint and
/// remove the WAL under them: commits lost, or `disk I/O error` (issue 24 row 10). A file
/// that did not exist a moment ago has no connection of this process on it, so closing
/// the descriptor that created it releases nothing.
pub(crate) fn create_private(path: &Path) -> Result<(), LedgerError> {
    // O_CREAT|O_EXCL: an existing file is refused by the kernel without being opened.
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        // Another process (or host task) created it first.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(LedgerError::Io {
            what: format!("create the ledger {}", path.display()),
            source,
        }),
    }
}
