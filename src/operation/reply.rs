//! The shim's answer to a `run` call as the decision table reads it: the protocol's
//! [`host::RunFrames`] (frames read once, refusal words already typed) narrowed to the
//! answers that settle a call, with a refusal's cause and detail pulled out of its
//! fields. [`super::decide`] decides from these, never from strings.

use std::collections::BTreeMap;

use crate::host;
use crate::redact::Redactor;
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
    /// interruption (the shim broke its protocol). Text of other operations the host
    /// names (a lock holder's command) is passed through `redactor` here, before it can
    /// reach an answer, a document or the ledger.
    pub fn from_frames(frames: &[Frame], redactor: &Redactor) -> Option<RunReply> {
        let reply = host::RunFrames::from_frames(frames);
        (reply.exit.is_some() || reply.refusal.is_some() || reply.interrupted.is_some()).then(
            || RunReply {
                superseded: reply.superseded,
                exit: reply.exit,
                refusal: reply.refusal.as_ref().map(|r| Refused::read(r, redactor)),
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
/// kept only where they are what opmark writes (a lock name, an op id, a number) or have
/// been made safe to show (the holder's command): they go into the verdict's reason.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BusyLock {
    /// The lock's name (`?` when the host sent none that is one).
    pub lock: String,
    /// The op id of an operation holding it.
    pub holder: Option<String>,
    /// Since when it holds it (RFC 3339, UTC).
    pub since: Option<String>,
    /// The holder's command, for people: the first line of its marker's command and at
    /// most its first [`HOLDER_COMMAND_BYTES`], control characters replaced, redacted
    /// (another operation's command may hold a secret), `…` marking a cut.
    pub command: Option<String>,
    /// The lock's own capacity, when the run named another.
    pub capacity: Option<u32>,
    /// The host cannot wait for a lock at all (no `readlink`, no `/proc/uptime`).
    pub cannot_wait: bool,
}

/// The most of a lock holder's command the shim sends (`cmd=`, docs/host-protocol.md#host-locks).
pub const HOLDER_COMMAND_BYTES: usize = 160;

impl BusyLock {
    fn from_fields(fields: &BTreeMap<String, String>, redactor: &Redactor) -> BusyLock {
        let lock = fields
            .get("lock")
            .filter(|l| crate::host_lock::HostLock::parse(l).is_ok())
            .cloned()
            .unwrap_or_else(|| "?".to_owned());
        let holder = fields
            .get("holder")
            .filter(|h| crate::op_id::OpId::parse(h).is_ok())
            .cloned();
        BusyLock {
            lock,
            // A command is named only with its op id: it says which operation holds the lock.
            command: holder
                .as_ref()
                .and_then(|_| holder_command(fields, redactor)),
            holder,
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

/// The holder's command from `cmd=` (hex of its bytes) and `cmd_cut=1` (the host's marker
/// holds more): decoded, cut to its first line and [`HOLDER_COMMAND_BYTES`] (whatever the
/// host sent), a character split by the cut dropped, other bytes that are not UTF-8 and
/// control characters replaced (the text goes to a terminal), then redacted; `…` marks
/// a cut. `None` when the field is missing, not hex, or names nothing.
pub fn holder_command(fields: &BTreeMap<String, String>, redactor: &Redactor) -> Option<String> {
    let mut bytes = hex::decode(fields.get("cmd")?).ok()?;
    let mut cut = fields.get("cmd_cut").is_some_and(|c| c == "1");
    if let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
        bytes.truncate(newline);
        cut = true;
    }
    if bytes.len() > HOLDER_COMMAND_BYTES {
        bytes.truncate(HOLDER_COMMAND_BYTES);
        cut = true;
    }
    if cut {
        if let Err(e) = std::str::from_utf8(&bytes) {
            if e.error_len().is_none() {
                bytes.truncate(e.valid_up_to());
            }
        }
    }
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .map(|c| match c {
            '\t' => ' ',
            c if c.is_control() => char::REPLACEMENT_CHARACTER,
            c => c,
        })
        .collect();
    let mut text = redactor.redact_owned(text.trim_end());
    if text.trim().is_empty() {
        return None;
    }
    if cut {
        text.push('…');
    }
    Some(text)
}

impl Refused {
    /// Reads a refusal, passing what it names of other operations through `redactor`.
    pub fn read(r: &Refusal, redactor: &Redactor) -> Self {
        Refused {
            reason: r.reason,
            cause: r.fields.get("reason").cloned(),
            supersede_failed: r.fields.get("supersede_failed").cloned(),
            detail: describe_fields(&r.fields),
            marker: r.marker.clone(),
            busy_lock: (r.reason == RefusalReason::LockBusy)
                .then(|| BusyLock::from_fields(&r.fields, redactor)),
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
        let r = Refused::read(
            &refusal(
                "interrupted",
                &[
                    ("reason", "no_space"),
                    ("state", "interrupted"),
                    ("supersede_failed", "no_inodes"),
                    ("x", "y"),
                ],
            ),
            &Redactor::default(),
        );
        assert_eq!(r.reason, RefusalReason::Marker(MarkerState::Interrupted));
        assert_eq!(r.cause.as_deref(), Some("no_space"));
        assert_eq!(r.supersede_failed.as_deref(), Some("no_inodes"));
        assert_eq!(r.detail, "reason=no_space state=interrupted");
    }

    #[test]
    fn a_reply_with_no_exit_refusal_or_interruption_is_not_a_reply() {
        assert_eq!(RunReply::from_frames(&[], &Redactor::default()), None);
        assert_eq!(
            RunReply::from_frames(
                &[Frame::Superseded { by: "at-2".into() }],
                &Redactor::default()
            ),
            None
        );
        let reply = RunReply::from_frames(
            &[
                Frame::Superseded { by: "at-2".into() },
                Frame::Started {
                    attempt: "at-2".into(),
                },
                Frame::Refused(refusal("completed", &[("replay", "1")])),
                Frame::Exit(exit("at-1")),
            ],
            &Redactor::default(),
        )
        .unwrap();
        assert!(reply.superseded);
        assert_eq!(reply.exit, Some(exit("at-1")));
        assert_eq!(
            reply.refusal.map(|r| r.reason),
            Some(RefusalReason::Marker(MarkerState::Completed))
        );
    }

    fn busy(fields: &[(&str, &str)]) -> BusyLock {
        let policy = crate::policy::Policy::builtin();
        let redactor = Redactor::with_patterns(policy.redact_patterns());
        Refused::read(&refusal("lock_busy", fields), &redactor)
            .busy_lock
            .expect("a lock_busy refusal names its lock")
    }

    fn hex_of(text: &[u8]) -> String {
        hex::encode(text)
    }

    #[test]
    fn a_lock_holders_command_is_decoded_made_printable_redacted_and_marked_when_cut() {
        let with = |cmd: &[u8], cut: bool| {
            let hex = hex_of(cmd);
            let mut fields = vec![
                ("lock", "apt"),
                ("holder", "upgrade-1"),
                ("cmd", hex.as_str()),
            ];
            if cut {
                fields.push(("cmd_cut", "1"));
            }
            busy(&fields).command
        };
        assert_eq!(
            with(b"apt-get -y upgrade", false).as_deref(),
            Some("apt-get -y upgrade")
        );
        assert_eq!(
            with(b"mysql --password=hunter2 -e 'select 1'", false).as_deref(),
            Some("mysql --password=*** -e 'select 1'")
        );
        // The policy's own patterns too, not only the built-in rules.
        let token = format!("ghp_{}", "A1b2".repeat(9));
        assert_eq!(
            with(format!("deploy {token} web").as_bytes(), false).as_deref(),
            Some("deploy ghp_*** web")
        );
        assert_eq!(
            with(b"printf '\x1b]0;x\x07'\tdone", false).as_deref(),
            Some("printf '\u{FFFD}]0;x\u{FFFD}' done")
        );
        assert_eq!(with(b"make all", true).as_deref(), Some("make all…"));
        // More than the host sends, or a second line: cut all the same.
        let long = "a".repeat(200);
        assert_eq!(
            with(long.as_bytes(), false),
            Some(format!("{}…", "a".repeat(HOLDER_COMMAND_BYTES)))
        );
        assert_eq!(with(b"one\ntwo", false).as_deref(), Some("one…"));
        // A character split by the host's cut is dropped, not shown as a stray byte.
        let split = [&b"echo "[..], "é".as_bytes().get(..1).unwrap()].concat();
        assert_eq!(with(&split, true).as_deref(), Some("echo…"));
        assert_eq!(with(b"\xff ok", false).as_deref(), Some("\u{FFFD} ok"));
        // Nothing worth naming, or not hex: no command.
        assert_eq!(with(b"   ", false), None);
        assert_eq!(
            busy(&[("lock", "apt"), ("holder", "h"), ("cmd", "zz")]).command,
            None
        );
        // Without an op id the command would name no one.
        assert_eq!(
            busy(&[("lock", "apt"), ("cmd", &hex_of(b"ls"))]).command,
            None
        );
    }
}
