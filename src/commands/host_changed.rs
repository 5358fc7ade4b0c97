//! How an operator command (`probe`, `resolve`, `cancel`, `gc`) answers when the host it
//! reached is not the machine, user or marker root an operation's attempts reached (SPEC
//! 17): as `run` answers it, `conflict` with reason_code `host_changed`, the same message
//! (what changed, expected and found root ids, how the operation was reached before),
//! the same exit code and the same JSON fields, so an operator or an agent reads one
//! story whichever command met the change. The messages themselves are made where `run`
//! makes them, in `operation::identity`.

use serde::Serialize;

use super::common;
use crate::cli::GlobalArgs;
use crate::error::{Error, ErrorKind, Result};
use crate::host::{ReachError, Refusal};
use crate::operation::identity::Recorded;
use crate::vocab::{ReasonCode, Verdict, HOST_CHANGED_PREFIX};

/// The reason code that marks an error as a host change until [`answer`] renders it.
const CODE: &str = "host_changed";

/// The fields of `run`'s document that a `host_changed` verdict fills.
#[derive(Serialize)]
struct Answer<'a> {
    op_id: &'a str,
    host: &'a str,
    attempt_id: Option<&'a str>,
    verdict: Verdict,
    exit_code: Option<i32>,
    reason: &'a str,
    reason_code: ReasonCode,
    retryable: bool,
}

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
/// change; a connect failure is what [`common::reach_error`] makes of it.
pub fn reach_error(e: ReachError, nothing: &str) -> Error {
    match e {
        ReachError::KeyMismatch(why) | ReachError::HostChanged(why) => changed(why),
        connect @ ReachError::Connect(_) => common::reach_error(connect, nothing),
    }
}

/// A shim's `root_changed` refusal: the marker root it reached has another id than the
/// one the operation's attempts reached.
pub fn root_changed(recorded: &Recorded, host: &str, op: &str, refusal: &Refusal) -> Error {
    changed(recorded.root_changed(host, op, refusal))
}

/// Answers a host change of operation `op` on `host` the way `run` does (the document
/// with `--json`, else `opmark: conflict: REASON` on stderr; exit 243). Any other error
/// is returned as it is.
pub fn answer(global: &GlobalArgs, op: &str, host: &str, e: Error) -> Result<u8> {
    if e.code != Some(CODE) {
        return Err(e);
    }
    let verdict = Verdict::Conflict;
    if global.json {
        common::print_json(&Answer {
            op_id: op,
            host,
            attempt_id: None,
            verdict,
            exit_code: None,
            reason: &e.message,
            reason_code: ReasonCode::HostChanged,
            retryable: false,
        })?;
    } else {
        crate::logging::say(format_args!("opmark: {verdict}: {}", e.message));
    }
    Ok(verdict
        .reserved_exit_code()
        .unwrap_or(crate::error::exit_code::CONFLICT))
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
