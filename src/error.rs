//! opmark's own error type and the exit codes it maps to.
//!
//! The remote command's exit status is never confused with these: `run` returns the
//! command's own status only for the verdicts `completed` and `replayed`; everything
//! opmark says about itself uses the reserved codes below (documented in
//! docs/agents.md#exit-codes and in `opmark --help`).

use std::fmt;

// The exit codes are part of the contract's vocabulary (a verdict's reserved code is one
// of them); they live in `vocab`, which depends on nothing, and are re-exported here
// under the path callers and tests have always used.
pub use crate::vocab::exit_code;
use crate::vocab::{ErrorCode, ReasonCode};

/// What kind of failure this is; decides the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Invalid input: bad op id, bad duration, bad path. Nothing sent.
    InvalidInput,
    /// A malformed configuration file.
    Config,
    /// Host unreachable, host key refused, authentication failed.
    Unreachable,
    /// Local ledger or file I/O.
    LocalIo,
    /// opmark bug or protocol violation.
    Internal,
    /// Our stdout was closed by its reader (`opmark list --json | head -c 10`): exits
    /// quietly with the status a shell gives a tool that SIGPIPE ended.
    StdoutClosed,
}

impl ErrorKind {
    /// The documented exit code of this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::InvalidInput => exit_code::REFUSED,
            ErrorKind::Config => exit_code::CONFIG,
            ErrorKind::Unreachable => exit_code::UNREACHABLE,
            ErrorKind::LocalIo => exit_code::LOCAL_IO,
            ErrorKind::Internal => exit_code::INTERNAL,
            ErrorKind::StdoutClosed => exit_code::BROKEN_PIPE,
        }
    }

    /// The reason code of an error of this kind when no cause names a finer one.
    pub fn reason_code(self) -> ErrorCode {
        match self {
            ErrorKind::InvalidInput => ErrorCode::Reason(ReasonCode::InvalidInput),
            ErrorKind::Config => ErrorCode::ConfigInvalid,
            ErrorKind::Unreachable => ErrorCode::Unreachable,
            ErrorKind::LocalIo => ErrorCode::LocalIo,
            ErrorKind::Internal => ErrorCode::Internal,
            ErrorKind::StdoutClosed => ErrorCode::StdoutClosed,
        }
    }
}

/// An error at the CLI edge: a kind for the exit code and a message for people.
/// Modules keep their own typed errors (callers branch on those) and convert here.
#[derive(Debug)]
pub struct Error {
    /// Decides the exit code.
    pub kind: ErrorKind,
    /// Says what went wrong and how to fix it. Never holds a secret.
    pub message: String,
    /// A finer stable reason code than the kind's (`unknown_operation`,
    /// `host_key_rejected`...), for the JSON error document.
    pub code: Option<ErrorCode>,
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            code: None,
        }
    }

    /// The same error with a finer reason code than its kind's (a verdict's
    /// [`ReasonCode`](crate::vocab::ReasonCode) converts).
    pub fn with_code(mut self, code: impl Into<ErrorCode>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The reason code an agent branches on (docs/guarantees.md#the-command-line-contract).
    pub fn code(&self) -> ErrorCode {
        self.code.unwrap_or(self.kind.reason_code())
    }

    /// The stable snake_case name of [`Error::code`].
    pub fn reason_code(&self) -> &'static str {
        self.code().as_str()
    }

    /// True only when the same command may succeed later without a human: a host that
    /// may come back. Everything else needs a fix first.
    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Result alias for the CLI edge.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_reason_codes_are_retryable_only_for_a_host_that_may_come_back() {
        let table = [
            (
                Error::new(ErrorKind::InvalidInput, "x"),
                "invalid_input",
                false,
            ),
            (Error::new(ErrorKind::Config, "x"), "config_invalid", false),
            (Error::new(ErrorKind::Unreachable, "x"), "unreachable", true),
            (
                Error::new(ErrorKind::Unreachable, "x").with_code(ReasonCode::ConnectFailed),
                "connect_failed",
                true,
            ),
            (
                Error::new(ErrorKind::Unreachable, "x").with_code(ReasonCode::HostKeyRejected),
                "host_key_rejected",
                false,
            ),
            (
                Error::new(ErrorKind::Unreachable, "x").with_code(ReasonCode::AuthRefused),
                "auth_refused",
                false,
            ),
            (Error::new(ErrorKind::LocalIo, "x"), "local_io", false),
            (Error::new(ErrorKind::Internal, "x"), "internal", false),
        ];
        for (e, code, retryable) in table {
            assert_eq!((e.reason_code(), e.retryable()), (code, retryable), "{e:?}");
        }
    }
}
