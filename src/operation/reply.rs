//! The shim's answer to a `run` call as the decision table reads it: the protocol's
//! [`host::RunFrames`] (frames read once, refusal words already typed) narrowed to the
//! answers that settle a call, with a refusal's cause and detail pulled out of its
//! fields. [`super::decide`] decides from these, never from strings.

use std::collections::BTreeMap;

use crate::host;
pub use crate::shim::RefusalReason;
use crate::shim::{ExitFrame, Frame, MarkerInfo, Refusal};

/// The shim's complete answer to a `run` call, read once from its frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReply {
    /// This call moved an interrupted claim aside.
    pub superseded: bool,
    /// The exit trailer.
    pub exit: Option<ExitFrame>,
    /// Why the shim did not run the command.
    pub refusal: Option<Refused>,
    /// The command vanished without an exit record while the call followed it.
    pub interrupted: Option<MarkerInfo>,
}

impl RunReply {
    /// Reads a finished call's frames; `None` when they hold no exit, refusal or
    /// interruption (the shim broke its protocol).
    pub fn from_frames(frames: &[Frame]) -> Option<RunReply> {
        let reply = host::RunFrames::from_frames(frames);
        (reply.exit.is_some() || reply.refusal.is_some() || reply.interrupted.is_some()).then(
            || RunReply {
                superseded: reply.superseded,
                exit: reply.exit,
                refusal: reply.refusal.as_ref().map(Refused::from),
                interrupted: reply.interrupted,
            },
        )
    }
}

/// A refusal, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why.
    pub reason: RefusalReason,
    /// The `reason=` field: the cause (`no_space`, `no_setsid`, ...).
    pub cause: Option<String>,
    /// `supersede_failed=`: superseding an interrupted claim found no room.
    pub supersede_failed: Option<String>,
    /// The fields worth showing (`reason=... state=...`).
    pub detail: String,
    /// The marker, when the refusal is about one.
    pub marker: Option<MarkerInfo>,
    /// `lock_busy`: the lock that was not free, and who held it.
    pub busy_lock: Option<BusyLock>,
}

/// A host lock the supervisor could not take (`lock_busy`'s fields). The host's words are
/// kept only where they are what opmark writes (a lock name, an op id, a number): they go
/// into the verdict's reason.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BusyLock {
    /// The lock's name (`?` when the host sent none that is one).
    pub lock: String,
    /// The op id of an operation holding it.
    pub holder: Option<String>,
    /// Since when it holds it (RFC 3339, UTC).
    pub since: Option<String>,
    /// The lock's own capacity, when the run named another.
    pub capacity: Option<u32>,
    /// The host cannot wait for a lock at all (no `readlink`, no `/proc/uptime`).
    pub cannot_wait: bool,
}

impl BusyLock {
    fn from_fields(fields: &BTreeMap<String, String>) -> BusyLock {
        let lock = fields
            .get("lock")
            .filter(|l| crate::host_lock::HostLock::parse(l).is_ok())
            .cloned()
            .unwrap_or_else(|| "?".to_owned());
        BusyLock {
            lock,
            holder: fields
                .get("holder")
                .filter(|h| crate::op_id::OpId::parse(h).is_ok())
                .cloned(),
            since: fields
                .get("since")
                .and_then(|s| s.parse::<i64>().ok())
                .and_then(super::repeat::epoch_stamp),
            capacity: fields
                .get("reason")
                .filter(|r| r.as_str() == "capacity_differs")
                .and(fields.get("capacity"))
                .and_then(|c| c.parse().ok()),
            cannot_wait: fields.get("reason").is_some_and(|r| r == "cannot_wait"),
        }
    }
}

impl From<&Refusal> for Refused {
    fn from(r: &Refusal) -> Self {
        Refused {
            reason: r.reason,
            cause: r.fields.get("reason").cloned(),
            supersede_failed: r.fields.get("supersede_failed").cloned(),
            detail: describe_fields(&r.fields),
            marker: r.marker.clone(),
            busy_lock: (r.reason == RefusalReason::LockBusy)
                .then(|| BusyLock::from_fields(&r.fields)),
        }
    }
}

fn describe_fields(fields: &BTreeMap<String, String>) -> String {
    fields
        .iter()
        .filter(|(k, _)| k.as_str() == "reason" || k.as_str() == "state")
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::MarkerState;

    fn exit(by: &str) -> ExitFrame {
        ExitFrame {
            code: 0,
            out_bytes: 0,
            err_bytes: 0,
            timed_out: false,
            kept_out: None,
            kept_err: None,
            dropped_out: 0,
            dropped_err: 0,
            attempt: by.into(),
            output_collected: false,
            cancelled: false,
        }
    }

    fn refusal(word: &str, fields: &[(&str, &str)]) -> Refusal {
        Refusal {
            reason: RefusalReason::parse(word).expect("a shim word"),
            replay: false,
            marker: None,
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_refusal_keeps_its_cause_and_the_fields_worth_showing() {
        let r = Refused::from(&refusal(
            "interrupted",
            &[
                ("reason", "no_space"),
                ("state", "interrupted"),
                ("supersede_failed", "no_inodes"),
                ("x", "y"),
            ],
        ));
        assert_eq!(r.reason, RefusalReason::Marker(MarkerState::Interrupted));
        assert_eq!(r.cause.as_deref(), Some("no_space"));
        assert_eq!(r.supersede_failed.as_deref(), Some("no_inodes"));
        assert_eq!(r.detail, "reason=no_space state=interrupted");
    }

    #[test]
    fn a_reply_with_no_exit_refusal_or_interruption_is_not_a_reply() {
        assert_eq!(RunReply::from_frames(&[]), None);
        assert_eq!(
            RunReply::from_frames(&[Frame::Superseded { by: "at-2".into() }]),
            None
        );
        let reply = RunReply::from_frames(&[
            Frame::Superseded { by: "at-2".into() },
            Frame::Started {
                attempt: "at-2".into(),
            },
            Frame::Refused(refusal("completed", &[("replay", "1")])),
            Frame::Exit(exit("at-1")),
        ])
        .unwrap();
        assert!(reply.superseded);
        assert_eq!(reply.exit, Some(exit("at-1")));
        assert_eq!(
            reply.refusal.map(|r| r.reason),
            Some(RefusalReason::Marker(MarkerState::Completed))
        );
    }
}
