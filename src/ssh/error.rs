//! Why a connection was not made: every failure before the exec request leaves, with the
//! stage it failed at (boundary `not_sent`: nothing was sent).

use std::fmt;

use crate::error::{Error, ErrorKind};
use crate::vocab::{Boundary, ErrorCode, ReasonCode};

/// Where a connection attempt failed. Every stage means nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectStage {
    /// The ssh config or a `-o` option is malformed, or asks for something opmark does
    /// not do (exit 246; retrying cannot help).
    Config,
    /// The host could not be resolved: ssh config, DNS.
    Resolve,
    /// TCP connect, jump channel or key exchange failed.
    Connect,
    /// The connect (TCP, banner, key exchange) did not finish within `ConnectTimeout`:
    /// one bounded attempt, as ssh makes, not retried within the same run.
    Timeout,
    /// The host key is unknown, changed or revoked.
    HostKey,
    /// Every identity was refused.
    Auth,
}

impl ConnectStage {
    /// Lower-case name for messages and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectStage::Config => "config",
            ConnectStage::Resolve => "resolve",
            ConnectStage::Connect | ConnectStage::Timeout => "connect",
            ConnectStage::HostKey => "host_key",
            ConnectStage::Auth => "auth",
        }
    }
}

/// A failure before any exec request left: the attempt's boundary is `not_sent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    /// Which stage failed.
    pub stage: ConnectStage,
    /// What happened and how to fix it; never holds key material.
    pub message: String,
}

impl ConnectError {
    /// An error at `stage`.
    pub fn new(stage: ConnectStage, message: impl Into<String>) -> Self {
        ConnectError {
            stage,
            message: message.into(),
        }
    }

    /// Always `not_sent`: a connect error happens before any exec request.
    pub fn boundary(&self) -> Boundary {
        Boundary::NotSent
    }

    /// The reason code a `run` verdict, or any command's JSON error, gives this failure.
    pub fn reason_code(&self) -> ReasonCode {
        match self.stage {
            ConnectStage::Resolve | ConnectStage::Config => ReasonCode::NameUnresolvable,
            ConnectStage::Connect | ConnectStage::Timeout => ReasonCode::ConnectFailed,
            ConnectStage::HostKey => ReasonCode::HostKeyRejected,
            ConnectStage::Auth => ReasonCode::AuthRefused,
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.stage.as_str(), self.message)
    }
}

impl std::error::Error for ConnectError {}

// Here rather than in `error`, so that `error` depends on nothing: the CLI's error type
// is the edge every module converts to, never a module's dependency.
/// A host that could not be resolved or reached: a config problem is a config error
/// (exit 246), anything else leaves the host unreachable (exit 247); the reason code is
/// the one a `run` verdict would give (`host_key_rejected`, `auth_refused`...).
impl From<ConnectError> for Error {
    fn from(e: ConnectError) -> Self {
        let (kind, code) = if e.stage == ConnectStage::Config {
            (ErrorKind::Config, ErrorCode::ConfigInvalid)
        } else {
            (ErrorKind::Unreachable, e.reason_code().into())
        };
        Error::new(kind, e.to_string()).with_code(code)
    }
}
