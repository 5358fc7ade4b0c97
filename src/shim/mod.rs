//! The host shim: the embedded `remote-scripts/shim.sh`, the one place that builds the
//! command line invoking it (all quoting happens here), and its framed replies
//! ([`frames`]).
//!
//! Nothing is installed on a host: every call sends the script as part of the exec
//! request (`sh -c SCRIPT opmark-shim SCRIPT VERB ARGS...`). The script gets its own text
//! as its first argument so that it can start its detached supervisor with the same code.

pub mod frames;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::family::Family;
use crate::op_id::OpId;

pub use frames::{
    CancelOutcome, ExitFrame, Frame, MarkerInfo, MarkerState, ProtocolError, Refusal, Reply,
    ReplyParser,
};

/// The shim's source, delivered with every call.
pub const SCRIPT: &str = include_str!("../../remote-scripts/shim.sh");

/// The shim protocol version this client speaks (the `H v=` field).
pub const PROTOCOL_VERSION: &str = "1";

/// Default cap on captured output per stream on the host: beyond it, bytes are counted
/// and dropped, and the trailer says how many.
pub const DEFAULT_OUTPUT_CAP: u64 = 8 * 1024 * 1024;

/// Spooled stdin as the shim must verify it before claiming (a connection lost halfway
/// must not start the command on half an input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdinSpec {
    /// Exact byte count the client sends.
    pub len: u64,
    /// Lower-case hex SHA-256 of those bytes.
    pub sha256_hex: String,
}

/// Everything the `run` verb needs.
#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    /// The operation.
    pub op: &'a OpId,
    /// This attempt's id (same charset as op ids).
    pub attempt_id: &'a str,
    /// Plain SHA-256 of the canonical intent (what the host marker records).
    pub host_fingerprint: &'a str,
    /// The command's family, recorded in the claim.
    pub family: Family,
    /// Kill the command's process group after this long.
    pub timeout: Option<Duration>,
    /// Cap per captured stream.
    pub output_cap: u64,
    /// `Some` when stdin is forwarded.
    pub stdin: Option<StdinSpec>,
    /// Whether an interrupted claim may be moved aside and claimed again by this attempt
    /// (policy `rerun`, or an operator's approval).
    pub supersede_interrupted: bool,
    /// The command string, run by `sh -c` on the host.
    pub command: &'a str,
}

/// One call of the shim.
#[derive(Debug, Clone)]
pub enum Verb<'a> {
    /// Claim and run.
    Run(RunRequest<'a>),
    /// Report the marker's state without changing it.
    Probe(&'a OpId),
    /// Stream a running (or finished) operation's output from byte offsets until it exits.
    Attach {
        /// The operation.
        op: &'a OpId,
        /// Stdout bytes the caller already has.
        out_offset: u64,
        /// Stderr bytes the caller already has.
        err_offset: u64,
    },
    /// Tombstone the op id so it can never be claimed. `force` also fences an
    /// interrupted claim (an operator's not-applied decision).
    Fence {
        /// The operation.
        op: &'a OpId,
        /// Fence even an interrupted, started claim.
        force: bool,
    },
    /// Move an interrupted claim aside (kept for audit) so it can be claimed again.
    Supersede {
        /// The operation.
        op: &'a OpId,
        /// The attempt that will claim next.
        by_attempt: &'a str,
    },
    /// Remove completed or fenced markers older than `older_than`.
    Gc {
        /// Retention.
        older_than: Duration,
        /// Report only.
        dry_run: bool,
    },
    /// Facts about the marker root for `opmark doctor`.
    Doctor,
    /// Stop the operation for good (`opmark cancel`): TERM the running command's session,
    /// KILL after `grace`, wait for the exit record; fence an absent, unstarted or
    /// interrupted one.
    Cancel {
        /// The operation.
        op: &'a OpId,
        /// Time between TERM and KILL (sent in milliseconds; the shim waits in tenths).
        grace: Duration,
    },
}

impl Verb<'_> {
    /// The verb's name and arguments, in the order the script expects.
    pub fn args(&self) -> Vec<String> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_owned();
        match self {
            Verb::Run(r) => vec![
                "run".into(),
                r.op.to_string(),
                r.attempt_id.into(),
                r.host_fingerprint.into(),
                r.family.as_str().into(),
                r.timeout.map_or(0, |t| t.as_secs().max(1)).to_string(),
                r.output_cap.to_string(),
                r.stdin.as_ref().map_or("-".into(), |s| s.len.to_string()),
                r.stdin
                    .as_ref()
                    .map_or("-".into(), |s| s.sha256_hex.clone()),
                flag(r.supersede_interrupted),
                r.command.into(),
            ],
            Verb::Probe(op) => vec!["probe".into(), op.to_string()],
            Verb::Attach {
                op,
                out_offset,
                err_offset,
            } => vec![
                "attach".into(),
                op.to_string(),
                out_offset.to_string(),
                err_offset.to_string(),
            ],
            Verb::Fence { op, force } => vec!["fence".into(), op.to_string(), flag(*force)],
            Verb::Supersede { op, by_attempt } => {
                vec!["supersede".into(), op.to_string(), (*by_attempt).into()]
            }
            Verb::Gc {
                older_than,
                dry_run,
            } => vec![
                "gc".into(),
                older_than.as_secs().to_string(),
                flag(*dry_run),
            ],
            Verb::Doctor => vec!["doctor".into()],
            Verb::Cancel { op, grace } => vec![
                "cancel".into(),
                op.to_string(),
                grace.as_millis().to_string(),
            ],
        }
    }
}

/// Quotes one word for a POSIX shell: single quotes, with `'` written as `'\''`.
/// The only quoting function in opmark.
pub fn quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The exec request string sent over SSH. The remote login shell (sshd runs
/// `$SHELL -c STRING`) sees: `OPMARK_S='<script>';exec sh -c "$OPMARK_S" opmark-shim
/// "$OPMARK_S" VERB ARGS...`. The variable is not exported, so the command never sees it.
pub fn remote_command(verb: &Verb) -> String {
    let mut cmd = String::with_capacity(SCRIPT.len() + 256);
    cmd.push_str("OPMARK_S=");
    cmd.push_str(&quote(SCRIPT));
    cmd.push_str(";exec sh -c \"$OPMARK_S\" opmark-shim \"$OPMARK_S\"");
    for arg in verb.args() {
        cmd.push(' ');
        cmd.push_str(&quote(&arg));
    }
    cmd
}

/// The same call run locally by `shell` (tests, and hosts reached by other means):
/// `shell -c SCRIPT opmark-shim SCRIPT VERB ARGS...`.
pub fn local_args(verb: &Verb) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "-c".into(),
        SCRIPT.into(),
        "opmark-shim".into(),
        SCRIPT.into(),
    ];
    args.extend(verb.args().into_iter().map(OsString::from));
    args
}

/// A `std::process::Command` running the shim locally under `shell`, with the
/// supervisor and the command run by the same shell (`OPMARK_SH`).
pub fn local_command(shell: &Path, verb: &Verb) -> std::process::Command {
    let mut cmd = std::process::Command::new(shell);
    cmd.args(local_args(verb)).env("OPMARK_SH", shell);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_survives_every_awkward_character() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
        // Round trip through a real shell.
        let nasty = "a'b\"c$d`e\\f\ng h;i|j&k*";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote(nasty)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), nasty);
    }

    #[test]
    fn run_args_carry_every_field_in_order() {
        let op = OpId::parse("deploy-1").unwrap();
        let verb = Verb::Run(RunRequest {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &"ab".repeat(32),
            family: Family::Convergent,
            timeout: Some(Duration::from_millis(1500)),
            output_cap: 1024,
            stdin: Some(StdinSpec {
                len: 3,
                sha256_hex: "cd".repeat(32),
            }),
            supersede_interrupted: true,
            command: "echo 'hi'",
        });
        let args = verb.args();
        assert_eq!(args[0], "run");
        assert_eq!(args[4], "convergent");
        assert_eq!(args[5], "1");
        assert_eq!(args[7], "3");
        assert_eq!(args[9], "1");
        assert_eq!(args[10], "echo 'hi'");
        assert_eq!(args.len(), 11);
        let remote = remote_command(&verb);
        assert!(remote.starts_with("OPMARK_S='"));
        assert!(remote.ends_with("'echo '\\''hi'\\'''"));
    }
}
