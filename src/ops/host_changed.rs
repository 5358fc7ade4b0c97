//! How an operator operation (`probe`, `resolve`, `cancel`, `gc`) answers when the host
//! it reached is not the machine, user or marker root an operation's attempts reached
//! (docs/guarantees.md#evidence-identity): as `run` answers it, `conflict` with reason_code `host_changed`, the same
//! message (what changed, expected and found root ids, how the operation was reached
//! before), the same exit code and the same JSON fields, so an operator or an agent reads
//! one story whichever command met the change. The messages themselves are made where
//! `run` makes them, in `operation::identity`.

use serde::Serialize;

use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::host::{ReachError, Refusal};
use crate::operation::identity::Recorded;
use crate::vocab::{ErrorCode, ReasonCode, Verdict, HOST_CHANGED_PREFIX};

/// The fields of `run`'s document that a `host_changed` verdict fills.
#[derive(Debug, Clone, Serialize)]
pub struct HostChanged {
    pub op_id: String,
    pub host: String,
    pub attempt_id: Option<String>,
    pub verdict: Verdict,
    pub exit_code: Option<i32>,
    pub reason: String,
    pub reason_code: ReasonCode,
    pub retryable: bool,
}

impl HostChanged {
    /// `conflict`'s reserved exit code, as `run` gives it.
    pub fn exit_status(&self) -> u8 {
        self.verdict
            .reserved_exit_code()
            .unwrap_or(exit_code::CONFLICT)
    }
}

/// An operator operation's answer: its report, or the host change that stopped it.
#[derive(Debug, Clone)]
pub enum Answered<R> {
    /// What the operation did.
    Report(R),
    /// The host is not the one the operation's attempts reached; nothing was done.
    HostChanged(HostChanged),
}

/// The reason code that marks an error as a host change until [`answer`] reads it.
const CODE: ErrorCode = ErrorCode::Reason(ReasonCode::HostChanged);

/// A host change that `why` describes (an identity message; prefixed as `run`'s reason is).
fn changed(why: String) -> Error {
    let reason = if why.starts_with(HOST_CHANGED_PREFIX) {
        why
    } else {
        format!("{HOST_CHANGED_PREFIX}{why}")
    };
    Error::new(ErrorKind::Unreachable, reason).with_code(CODE)
}

/// A host that could not be reached for a call: another key, user or root is a host
/// change; a connect failure is what [`super::reach_error`] makes of it.
pub fn reach_error(e: ReachError, nothing: &str) -> Error {
    match e {
        ReachError::KeyMismatch(why) | ReachError::HostChanged(why) => changed(why),
        connect @ ReachError::Connect(_) => super::reach_error(connect, nothing),
    }
}

/// A shim's `root_changed` refusal: the marker root it reached has another id than the
/// one the operation's attempts reached.
pub fn root_changed(recorded: &Recorded, host: &str, op: &str, refusal: &Refusal) -> Error {
    changed(recorded.root_changed(host, op, refusal))
}

/// A host change of operation `op` on `host` as `run` answers it; any other error is
/// returned as it is.
pub fn answer<R>(op: &str, host: &str, e: Error) -> Result<Answered<R>> {
    if e.code != Some(CODE) {
        return Err(e);
    }
    Ok(Answered::HostChanged(HostChanged {
        op_id: op.to_owned(),
        host: host.to_owned(),
        attempt_id: None,
        verdict: Verdict::Conflict,
        exit_code: None,
        reason: e.message,
        reason_code: ReasonCode::HostChanged,
        retryable: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_key_reads_as_runs_host_changed_reason_and_is_not_retryable() {
        let e = reach_error(
            ReachError::KeyMismatch("host key for h is now SHA256:b".into()),
            "nothing was probed",
        );
        assert_eq!(e.message, "host changed: host key for h is now SHA256:b");
        assert_eq!((e.reason_code(), e.retryable()), ("host_changed", false));
        // Already prefixed (a user or root change): kept as it is.
        let e = reach_error(
            ReachError::HostChanged("host changed: h is now reached as user b".into()),
            "nothing was probed",
        );
        assert_eq!(e.message, "host changed: h is now reached as user b");
    }
}
