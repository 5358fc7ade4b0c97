//! The shim's answer to a `run` call, read once into types at the boundary: which frames
//! came (exit, refusal, interruption, supersede) and why a refusal refused, as an enum
//! instead of the shim's words. [`super::decide`] decides from these, never from strings.

use std::collections::BTreeMap;

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
        let mut reply = RunReply {
            superseded: false,
            exit: None,
            refusal: None,
            interrupted: None,
        };
        for f in frames {
            match f {
                Frame::Superseded { .. } => reply.superseded = true,
                Frame::Exit(x) if reply.exit.is_none() => reply.exit = Some(x.clone()),
                Frame::Refused(r) if reply.refusal.is_none() => {
                    reply.refusal = Some(Refused::from(r));
                }
                Frame::Interrupted(m) if reply.interrupted.is_none() => {
                    reply.interrupted = Some(m.clone());
                }
                _ => {}
            }
        }
        (reply.exit.is_some() || reply.refusal.is_some() || reply.interrupted.is_some())
            .then_some(reply)
    }
}

/// The shim's refusal words (`R <word> key=value...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    /// The marker completed (followed by a replay when the verb is `run`).
    Completed,
    /// Another attempt holds the claim and runs.
    Running,
    /// The claim was interrupted.
    Interrupted,
    /// The marker is fenced.
    Fenced,
    /// The marker binds the op id to another fingerprint.
    Conflict,
    /// The marker root cannot be used (full disk, permissions).
    RootUnusable,
    /// The command could not be started (no `setsid -f`, `setsid` failed).
    CannotStart,
    /// The op id failed the shim's own check.
    InvalidOpId,
    /// Malformed arguments.
    BadArgs,
    /// The command did not arrive intact.
    BadCommand,
    /// The stdin did not arrive intact.
    BadStdin,
    /// A word this client does not know.
    Other(String),
}

impl RefusalReason {
    /// Reads the shim's word.
    pub fn parse(word: &str) -> RefusalReason {
        match word {
            "completed" => RefusalReason::Completed,
            "running" => RefusalReason::Running,
            "interrupted" => RefusalReason::Interrupted,
            "fenced" => RefusalReason::Fenced,
            "conflict" => RefusalReason::Conflict,
            "root_unusable" => RefusalReason::RootUnusable,
            "cannot_start" => RefusalReason::CannotStart,
            "invalid_op_id" => RefusalReason::InvalidOpId,
            "bad_args" => RefusalReason::BadArgs,
            "bad_command" => RefusalReason::BadCommand,
            "bad_stdin" => RefusalReason::BadStdin,
            other => RefusalReason::Other(other.to_owned()),
        }
    }

    /// The shim's word, as the ledger records it.
    pub fn word(&self) -> &str {
        match self {
            RefusalReason::Completed => "completed",
            RefusalReason::Running => "running",
            RefusalReason::Interrupted => "interrupted",
            RefusalReason::Fenced => "fenced",
            RefusalReason::Conflict => "conflict",
            RefusalReason::RootUnusable => "root_unusable",
            RefusalReason::CannotStart => "cannot_start",
            RefusalReason::InvalidOpId => "invalid_op_id",
            RefusalReason::BadArgs => "bad_args",
            RefusalReason::BadCommand => "bad_command",
            RefusalReason::BadStdin => "bad_stdin",
            RefusalReason::Other(word) => word,
        }
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
}

impl From<&Refusal> for Refused {
    fn from(r: &Refusal) -> Self {
        Refused {
            reason: RefusalReason::parse(&r.reason),
            cause: r.fields.get("reason").cloned(),
            supersede_failed: r.fields.get("supersede_failed").cloned(),
            detail: describe_fields(&r.fields),
            marker: r.marker.clone(),
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
        }
    }

    fn refusal(word: &str, fields: &[(&str, &str)]) -> Refusal {
        Refusal {
            reason: word.into(),
            marker: None,
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn refusal_words_are_read_once_into_the_enum_and_unknown_words_are_kept() {
        for word in [
            "completed",
            "running",
            "interrupted",
            "fenced",
            "conflict",
            "root_unusable",
            "cannot_start",
            "invalid_op_id",
            "bad_args",
            "bad_command",
            "bad_stdin",
        ] {
            let r = RefusalReason::parse(word);
            assert!(!matches!(r, RefusalReason::Other(_)), "{word}");
            assert_eq!(r.word(), word);
        }
        assert_eq!(
            RefusalReason::parse("new_thing"),
            RefusalReason::Other("new_thing".into())
        );
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
        assert_eq!(r.reason, RefusalReason::Interrupted);
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
            Some(RefusalReason::Completed)
        );
    }
}
