//! opmark's own error type and the exit codes it maps to.
//!
//! The remote command's exit status is never confused with these: `run` returns the
//! command's own status only for the verdicts `completed` and `replayed`; everything
//! opmark says about itself uses the reserved codes below (documented in the README and
//! in `opmark --help`).

use std::fmt;

/// Exit codes reserved by opmark. Stable: agents branch on them.
pub mod exit_code {
    /// Success for commands other than `run`.
    pub const OK: u8 = 0;
    /// A check found problems: `reconcile` left operations unresolved, `audit verify`
    /// found a broken chain, `doctor` found a failing check.
    pub const FINDINGS: u8 = 1;
    /// Command-line usage error (unknown flag, missing argument). Nothing was sent.
    pub const USAGE: u8 = 2;
    /// `run` verdict `in_progress`: an earlier attempt holds the claim and is still running.
    pub const IN_PROGRESS: u8 = 240;
    /// `run` verdict `not_applied`: nothing ran and nothing can still run for this attempt.
    pub const NOT_APPLIED: u8 = 241;
    /// `run` verdict `indeterminate`: the command may have run; automatic retry blocked.
    pub const INDETERMINATE: u8 = 242;
    /// `run` verdict `conflict`: the op id is bound to a different fingerprint.
    pub const CONFLICT: u8 = 243;
    /// `run` verdict `blocked`: policy needs `--approve NOTE`.
    pub const BLOCKED: u8 = 244;
    /// `run` verdict `refused`, and any invalid input: nothing was sent.
    pub const REFUSED: u8 = 245;
    /// A configuration file (policy, ssh config, known_hosts) is malformed.
    pub const CONFIG: u8 = 246;
    /// The host could not be reached or authenticated (outside `run`, which gives a verdict).
    pub const UNREACHABLE: u8 = 247;
    /// The local ledger or a local file could not be read or written.
    pub const LOCAL_IO: u8 = 248;
    /// A bug in opmark or an answer from the host that breaks the protocol.
    pub const INTERNAL: u8 = 250;
    /// Stdout or stderr was a pipe whose reader went away (`opmark list | head`): the
    /// status a shell reports for a tool that SIGPIPE ended (128 + 13), printed quietly.
    pub const BROKEN_PIPE: u8 = 141;
}

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
    pub fn reason_code(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Config => "config_invalid",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::LocalIo => "local_io",
            ErrorKind::Internal => "internal",
            ErrorKind::StdoutClosed => "stdout_closed",
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
    pub code: Option<&'static str>,
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

    /// The same error with a finer reason code than its kind's.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The stable snake_case reason code an agent branches on (SPEC section 6).
    pub fn reason_code(&self) -> &'static str {
        self.code.unwrap_or(self.kind.reason_code())
    }

    /// True only when the same command may succeed later without a human: a host that
    /// may come back. Everything else needs a fix first.
    pub fn retryable(&self) -> bool {
        matches!(self.reason_code(), "connect_failed" | "unreachable")
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
                Error::new(ErrorKind::Unreachable, "x").with_code("connect_failed"),
                "connect_failed",
                true,
            ),
            (
                Error::new(ErrorKind::Unreachable, "x").with_code("host_key_rejected"),
                "host_key_rejected",
                false,
            ),
            (
                Error::new(ErrorKind::Unreachable, "x").with_code("auth_refused"),
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
