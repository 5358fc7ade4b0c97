//! How an operator operation (`probe`, `resolve`, `cancel`, `gc`) answers when the host
//! it reached is not the machine, user or marker root an operation's attempts reached
//! (docs/guarantees.md#evidence-identity): as `run` answers it, `conflict` with reason_code `host_changed`, the same
//! message (what changed, expected and found root ids, how the operation was reached
//! before) and the same exit code, so an operator or an agent reads one story whichever
//! command met the change. The document is the operator command's own, not `run`'s: it
//! names the `subcommand` that answered and has no `attempt_id` or `exit_code`, which
//! mean something only for a run (each command's schema in schemas/ declares it). The
//! messages themselves are made where `run` makes them, in `operation::identity`.

use serde::Serialize;

use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::host::{ReachError, Refusal};
use crate::operation::identity::Recorded;
use crate::vocab::{ErrorCode, ReasonCode, Verdict, HOST_CHANGED_PREFIX};

/// The operator command that met the host change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Subcommand {
    Probe,
    Output,
    Cancel,
    Resolve,
    Gc,
}

/// An operator command's answer to a host change, in the verdict words `run` uses.
#[derive(Debug, Clone, Serialize)]
pub struct HostChanged {
    /// Which command answered (its document is not a run's).
    pub subcommand: Subcommand,
    pub op_id: String,
    pub host: String,
    /// Always `conflict`, as `run` answers a host change.
    pub verdict: Verdict,
    pub reason: String,
    /// Always `host_changed`.
    pub reason_code: ReasonCode,
    /// Always false: the same op id meets the same other machine until a human acts.
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

/// A host change of operation `op` on `host`, met by `subcommand`, as `run` answers it;
/// any other error is returned as it is.
pub fn answer<R>(subcommand: Subcommand, op: &str, host: &str, e: Error) -> Result<Answered<R>> {
    if e.code != Some(CODE) {
        return Err(e);
    }
    Ok(Answered::HostChanged(HostChanged {
        subcommand,
        op_id: op.to_owned(),
        host: host.to_owned(),
        verdict: Verdict::Conflict,
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
