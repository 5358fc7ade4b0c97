//! The shim's framed replies, parsed without I/O.
//!
//! stdout carries a header line `OPMARK/1 <nonce> H v=8` and nothing else. stderr carries
//! a header with the same nonce, then only frames `OPMARK/1 <nonce> <KIND> <key=value...>`;
//! a frame `O <n>` (stdout) or `E <n>` (stderr) is followed by exactly n raw bytes of the
//! command's output and then a frame `C` that commits them. Text before the headers (a
//! login shell's startup files) is skipped. The nonce is made on the host for this call
//! and exists only in the foreground shim's memory and its frames, so nothing the command
//! prints can pass for a frame.
//!
//! Any process of the login user can write into the channel through
//! `/proc/<shim>/fd/N`. Such bytes cannot carry the nonce: on stdout after the header, or
//! outside a payload, they are a protocol error; inside a payload they push the shim's own
//! bytes past the announced length, so the commit line fails. Payload bytes are delivered
//! only on their commit, so injected bytes never reach the caller; the client treats the
//! error as a lost reply and asks the marker.
//!
//! A parser made with [`ReplyParser::expecting`] takes only a header that echoes the
//! client's call token (`H v=8 c=<token>`), so startup-file text that looks like a header
//! is skipped too.

use std::collections::BTreeMap;

/// One of a command's two output streams, as the `output` verb names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// The command's stdout.
    Stdout,
    /// The command's stderr.
    Stderr,
}

impl OutputStream {
    /// The name on the wire (the kept copy's file in the marker).
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "out",
            OutputStream::Stderr => "err",
        }
    }
}

/// Longest preamble (login-shell noise) kept before the header; more is a protocol error.
const MAX_PREAMBLE: usize = 1 << 20;
/// Longest frame line.
const MAX_FRAME_LINE: usize = 64 * 1024;
const MAGIC: &[u8] = b"OPMARK/1 ";

/// What the parser yields, in stream order per stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Bytes of the command's stdout.
    Stdout(Vec<u8>),
    /// Bytes of the command's stderr.
    Stderr(Vec<u8>),
    /// A frame from the shim.
    Frame(Frame),
}

/// The marker states of docs/host-protocol.md#the-shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkerState {
    /// No marker: never claimed here (or removed by gc).
    Absent,
    /// Claimed and the recorded process (or its session) is alive.
    Running,
    /// The exit record exists.
    Completed,
    /// Claimed, but the process is gone without an exit record, or the host rebooted.
    Interrupted,
    /// Tombstoned: can never be claimed.
    Fenced,
}

impl MarkerState {
    /// The shim's name for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            MarkerState::Absent => "absent",
            MarkerState::Running => "running",
            MarkerState::Completed => "completed",
            MarkerState::Interrupted => "interrupted",
            MarkerState::Fenced => "fenced",
        }
    }

    fn parse(s: &str) -> Option<MarkerState> {
        Some(match s {
            "absent" => MarkerState::Absent,
            "running" => MarkerState::Running,
            "completed" => MarkerState::Completed,
            "interrupted" => MarkerState::Interrupted,
            "fenced" => MarkerState::Fenced,
            _ => return None,
        })
    }
}

/// What the shim reports about a marker (probe, refusal, attach, interrupted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MarkerInfo {
    /// The state.
    pub state: MarkerState,
    /// Why (e.g. `reboot`, `process_gone`, `never_started`, `starting`).
    pub why: Option<String>,
    /// The attempt that holds the claim.
    pub attempt: Option<String>,
    /// The plain SHA-256 intent fingerprint recorded in the claim.
    pub fingerprint: Option<String>,
    /// The family recorded in the claim.
    pub family: Option<String>,
    /// The recorded exit code (completed only).
    pub exit_code: Option<i32>,
    /// Whether the command was killed at its timeout.
    pub timed_out: bool,
    /// Captured stdout bytes so far.
    pub out_bytes: Option<u64>,
    /// Captured stderr bytes so far.
    pub err_bytes: Option<u64>,
    /// Every field as sent.
    pub fields: BTreeMap<String, String>,
}

impl MarkerInfo {
    /// A fenced marker whose command had started before the fence (the shim's
    /// `command_started=1`): its outcome is unknown, not "nothing ran". Records from
    /// shims that predate the field read as not started, as they were then taken.
    pub fn started_before_fence(&self) -> bool {
        self.state == MarkerState::Fenced
            && self.fields.get("command_started").map(String::as_str) == Some("1")
    }

    /// The report in one line for people and the ledger:
    /// `completed exit=5 attempt=at-... family=append-only`.
    pub fn summary(&self) -> String {
        let mut line = self.state.as_str().to_owned();
        if let Some(code) = self.exit_code {
            line.push_str(&format!(" exit={code}"));
        }
        if self.timed_out {
            line.push_str(" timed_out");
        }
        if self.cancelled() {
            line.push_str(" cancelled");
        }
        if self.cancel_pending() {
            line.push_str(" ended_while_cancel_pending");
        }
        if self.output_collected() {
            line.push_str(" output_collected");
        }
        for (key, value) in [
            ("why", &self.why),
            ("attempt", &self.attempt),
            ("family", &self.family),
        ] {
            if let Some(v) = value {
                line.push_str(&format!(" {key}={v}"));
            }
        }
        line
    }

    /// The exit record says `opmark cancel` stopped the command (`cancelled=1`): its
    /// signal went out before the command ended and the command died of it.
    pub fn cancelled(&self) -> bool {
        self.fields.get("cancelled").is_some_and(|c| c == "1")
    }

    /// The command ended by itself, with its own status, while a cancel was pending
    /// (`cancel_pending=1`): the cancel did not stop it (docs/host-protocol.md#cancel).
    pub fn cancel_pending(&self) -> bool {
        self.fields.get("cancel_pending").is_some_and(|c| c == "1")
    }

    /// gc collected this marker's output: what is left is its tombstone (state, exit,
    /// fingerprint, attempt, family, times), read as before (docs/host-protocol.md#tombstones).
    pub fn output_collected(&self) -> bool {
        self.fields
            .get("output_collected")
            .is_some_and(|c| c == "1")
    }

    /// `running` only because the host cannot read process identity (no `/proc`): the
    /// claim's process may be alive or gone; never taken for interrupted (docs/host-protocol.md#liveness).
    pub fn liveness_unknown(&self) -> bool {
        self.state == MarkerState::Running && self.why.as_deref() == Some("liveness_unknown")
    }

    pub(crate) fn from_fields(
        fields: BTreeMap<String, String>,
    ) -> Result<MarkerInfo, ProtocolError> {
        let state = fields
            .get("state")
            .and_then(|s| MarkerState::parse(s))
            .ok_or_else(|| ProtocolError::new("marker report without a known state"))?;
        Ok(MarkerInfo {
            state,
            why: fields.get("why").cloned(),
            attempt: fields.get("attempt").cloned(),
            fingerprint: fields.get("fp").cloned(),
            family: fields.get("family").cloned(),
            exit_code: fields.get("code").and_then(|c| c.parse().ok()),
            timed_out: fields.get("timed_out").is_some_and(|t| t == "1"),
            out_bytes: fields.get("out").and_then(|c| c.parse().ok()),
            err_bytes: fields.get("err").and_then(|c| c.parse().ok()),
            fields,
        })
    }
}

/// One held slot of a host lock, as the shim's `locks` verb lists it. The host's words are
/// kept only where they are what opmark writes (a lock name, an op id, numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// The lock's name.
    pub lock: String,
    /// Its capacity (None: unreadable).
    pub capacity: Option<u32>,
    /// The slot held (1..=capacity).
    pub slot: u32,
    /// The holding operation's op id.
    pub op: Option<String>,
    /// Since when, epoch seconds on the host.
    pub since: Option<u64>,
    /// Its holder still lives (false: the next taker reaps the slot).
    pub alive: bool,
    /// The holder's command as the host sent it (`cmd=`, `cmd_cut=`): undecoded and
    /// unredacted, for [`crate::operation::reply::holder_command`].
    pub command_fields: BTreeMap<String, String>,
}

impl LockHolder {
    fn from_fields(fields: &BTreeMap<String, String>) -> LockHolder {
        LockHolder {
            lock: fields
                .get("lock")
                .filter(|l| crate::host_lock::HostLock::parse(l).is_ok())
                .cloned()
                .unwrap_or_else(|| "?".to_owned()),
            capacity: fields.get("capacity").and_then(|c| c.parse().ok()),
            slot: fields.get("slot").and_then(|s| s.parse().ok()).unwrap_or(0),
            op: fields
                .get("op")
                .filter(|o| crate::op_id::OpId::parse(o).is_ok())
                .cloned(),
            since: fields
                .get("since")
                .and_then(|s| s.parse().ok())
                .filter(|s| *s > 0),
            alive: fields.get("alive").is_some_and(|a| a == "yes"),
            command_fields: command_fields(fields),
        }
    }
}

/// The `cmd=` and `cmd_cut=` fields of a frame that names an operation's command.
fn command_fields(fields: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    fields
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "cmd" | "cmd_cut"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A claim whose supervisor waits for its host locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockWaiter {
    /// The waiting operation's op id.
    pub op: Option<String>,
    /// The locks it takes, `NAME:N,...`.
    pub locks: Vec<crate::host_lock::HostLock>,
    /// Its claim time, epoch seconds on the host.
    pub since: Option<u64>,
    /// Its command as the host sent it, as [`LockHolder::command_fields`].
    pub command_fields: BTreeMap<String, String>,
}

impl LockWaiter {
    fn from_fields(fields: &BTreeMap<String, String>) -> LockWaiter {
        LockWaiter {
            op: fields
                .get("op")
                .filter(|o| crate::op_id::OpId::parse(o).is_ok())
                .cloned(),
            locks: fields
                .get("locks")
                .map(|l| {
                    l.split(',')
                        .filter_map(|l| crate::host_lock::HostLock::parse(l).ok())
                        .collect()
                })
                .unwrap_or_default(),
            since: fields
                .get("since")
                .and_then(|s| s.parse().ok())
                .filter(|s| *s > 0),
            command_fields: command_fields(fields),
        }
    }
}

/// Why the shim refused: its first word of an `R` frame. The finer cause, when there is
/// one, is in the frame's `reason=` field (`argument_count`, `no_space`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The op id breaks the charset or length rules.
    InvalidOpId,
    /// An argument is malformed (a client and shim that disagree, or a bug).
    BadArgs,
    /// The command in the channel's data did not arrive whole.
    BadCommand,
    /// The stdin did not arrive whole or does not hash to what the client said.
    BadStdin,
    /// The marker root cannot be used (not writable, volatile, full...).
    RootUnusable,
    /// The command could not be started detached (no usable `setsid`).
    CannotStart,
    /// The marker binds the op id to another fingerprint.
    Conflict,
    /// The marker root's id is not the one the operation's attempts reached (`r=`): another
    /// store of evidence (another user, a wiped or rebuilt root). Fields `expected`,
    /// `found` (`none`: the root has no id) and `root` (its path).
    RootChanged,
    /// The claim repeats an operation of the same intent (plain fingerprint) under another
    /// op id within the client's window, and the client's policy blocks it
    /// (docs/host-protocol.md#the-fingerprint-index). Fields `earlier` (its op id),
    /// `earlier_state`, `earlier_at` (epoch seconds of its claim).
    Repeats,
    /// `run`: the supervisor could not take a host lock of the claim within its wait, so
    /// nothing ran and a fresh claim was taken back (docs/host-protocol.md#host-locks).
    /// Fields `lock` (its name), `holder` (a holder's op id) and `since` (epoch seconds
    /// it holds since), or `reason=capacity_differs capacity=N` (the lock's own).
    LockBusy,
    /// The marker is in this state, so the verb did not act.
    Marker(MarkerState),
}

impl RefusalReason {
    /// The shim's word.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::InvalidOpId => "invalid_op_id",
            RefusalReason::BadArgs => "bad_args",
            RefusalReason::BadCommand => "bad_command",
            RefusalReason::BadStdin => "bad_stdin",
            RefusalReason::RootUnusable => "root_unusable",
            RefusalReason::CannotStart => "cannot_start",
            RefusalReason::Conflict => "conflict",
            RefusalReason::RootChanged => "root_changed",
            RefusalReason::Repeats => "repeats",
            RefusalReason::LockBusy => "lock_busy",
            RefusalReason::Marker(state) => state.as_str(),
        }
    }

    /// Reads the shim's word; None for a word this client does not know.
    pub fn parse(word: &str) -> Option<RefusalReason> {
        Some(match word {
            "invalid_op_id" => RefusalReason::InvalidOpId,
            "bad_args" => RefusalReason::BadArgs,
            "bad_command" => RefusalReason::BadCommand,
            "bad_stdin" => RefusalReason::BadStdin,
            "root_unusable" => RefusalReason::RootUnusable,
            "cannot_start" => RefusalReason::CannotStart,
            "conflict" => RefusalReason::Conflict,
            "root_changed" => RefusalReason::RootChanged,
            "repeats" => RefusalReason::Repeats,
            "lock_busy" => RefusalReason::LockBusy,
            state => RefusalReason::Marker(MarkerState::parse(state)?),
        })
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the shim's word (`reason == "conflict"`).
impl PartialEq<&str> for RefusalReason {
    fn eq(&self, word: &&str) -> bool {
        self.as_str() == *word
    }
}

/// A refusal: the shim did not run the command, and says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// A `completed` refusal of `run` that replays the recorded output and exit: the
    /// reply goes on (output, then an `Exit` frame).
    pub replay: bool,
    /// The marker's state when the refusal is about an existing marker.
    pub marker: Option<MarkerInfo>,
    /// Every field as sent.
    pub fields: BTreeMap<String, String>,
}

/// The exit trailer: the command finished and its record is durable on the host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExitFrame {
    /// Exit status as the host shell reported it (128+N for a signal N).
    pub code: i32,
    /// The stdout position this reply reached (its bytes were all sent before the frame).
    pub out_bytes: u64,
    /// The stderr position this reply reached.
    pub err_bytes: u64,
    /// Killed at `--timeout`.
    pub timed_out: bool,
    /// Stdout bytes in the host's kept copy (the replay copy, at most the cap); `None`
    /// from a shim that does not say.
    pub kept_out: Option<u64>,
    /// Stderr bytes in the host's kept copy.
    pub kept_err: Option<u64>,
    /// Stdout bytes beyond the cap, not kept.
    pub dropped_out: u64,
    /// Stderr bytes beyond the cap, not kept.
    pub dropped_err: u64,
    /// The attempt that ran the command.
    pub attempt: String,
    /// gc collected the output: only the exit status is left to replay (docs/host-protocol.md#tombstones).
    pub output_collected: bool,
    /// The exit record says `opmark cancel`'s signal stopped the command.
    pub cancelled: bool,
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The header; the nonce is checked by the parser.
    Hello {
        /// Shim protocol version.
        version: String,
    },
    /// `M`: the marker root's id (docs/host-protocol.md#root-id), before the verb's answer.
    Root {
        /// 32 hex digits.
        id: String,
    },
    /// `S`: claim recorded durably and command started by this attempt.
    Started {
        /// The attempt.
        attempt: String,
    },
    /// `R`: refused; nothing ran for this call (a `completed` refusal of `run` carries
    /// `replay=1` and is followed by the replayed output and an `Exit`).
    Refused(Refusal),
    /// `A`: attached to an existing marker; output and `Exit` or `Interrupted` follow.
    Attached(MarkerInfo),
    /// `U`: an interrupted claim was moved aside.
    Superseded {
        /// The attempt that superseded it.
        by: String,
    },
    /// `W`: the claim repeats an operation of the same intent under another op id within
    /// the window, and the client's policy warns: the fields of a `repeats` refusal; the
    /// claim goes on.
    Repeats(BTreeMap<String, String>),
    /// `X`: the command's exit.
    Exit(ExitFrame),
    /// `I`: while following, the process vanished without an exit record.
    Interrupted(MarkerInfo),
    /// `P`: probe answer.
    Probe(MarkerInfo),
    /// `J`: the `repeats` verb's answer: the earlier claim's fields (`earlier`,
    /// `earlier_state`, `earlier_at`), or none.
    IndexRepeat(Option<BTreeMap<String, String>>),
    /// `V`: the end of an `output` read, after its bytes: the marker, with the stream's
    /// `kept` and `dropped` byte counts and the range sent (`from`, `len`) among its fields.
    Output(MarkerInfo),
    /// `F`: fence answer.
    Fence {
        /// What the fence did.
        outcome: FenceOutcome,
        /// The marker afterwards.
        marker: MarkerInfo,
    },
    /// `G remove`: gc removed (or, in a dry run, would remove) one marker.
    GcRemoved(GcRemoved),
    /// `G done`: gc's last line.
    GcDone {
        /// Markers left in place (running, interrupted, or too young).
        kept: u64,
    },
    /// `K`: doctor facts, `key=value` (a bare word is a key with an empty value).
    Doctor(BTreeMap<String, String>),
    /// `L held`: one held slot of a host lock.
    LockHeld(LockHolder),
    /// `L waiting`: a claim whose supervisor waits for its host locks.
    LockWaiting(LockWaiter),
    /// `L done`: the lock listing's last line.
    LocksDone,
    /// `K done`: the doctor's last line.
    DoctorDone,
    /// `N`: what a cancel did, and the marker afterwards.
    Cancel {
        /// What happened.
        outcome: CancelOutcome,
        /// The marker afterwards.
        marker: MarkerInfo,
    },
}

/// What the shim's `fence` verb did (its `F` frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The tombstone is new.
    Fenced,
    /// It was already there: nothing changed.
    AlreadyFenced,
}

impl FenceOutcome {
    /// The shim's word.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceOutcome::Fenced => "fenced",
            FenceOutcome::AlreadyFenced => "already_fenced",
        }
    }
}

impl std::fmt::Display for FenceOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing gc reclaimed (or would reclaim).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GcRemoved {
    /// Operation id (for a reclaimed leftover: its file name).
    pub op: String,
    /// `completed` or `fenced` (empty for a leftover).
    pub state: String,
    /// Unix time of its exit or fence record (0 for a leftover).
    pub at: u64,
    /// What was done.
    pub action: GcAction,
}

/// What gc did to one entry of the marker root (docs/host-protocol.md#tombstones: evidence is never turned into
/// absence except by an explicit tombstone removal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GcAction {
    /// The marker's output was collected; its tombstone (state, exit, fingerprint,
    /// attempt, family, times) stays and is read as before.
    Collected,
    /// A tombstone was removed (`--tombstones-older-than`).
    TombstoneRemoved,
    /// A claim set aside because its supervisor never started (nothing ran).
    FailedStartReclaimed,
    /// A cached shim of another version.
    ShimReclaimed,
    /// A spooled upload never claimed (a cut connection's command or stdin, a put's
    /// partial content nobody resumed).
    SpoolReclaimed,
}

/// What the shim's `cancel` verb did (its `N` frame).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// The command was signalled and its exit record (marked cancelled) is down.
    Cancelled,
    /// The exit record already existed: nothing was signalled.
    AlreadyCompleted,
    /// The marker was already fenced: nothing changed.
    AlreadyFenced,
    /// The marker is now fenced; `was` says what it was: `absent`, `not_started` (claimed,
    /// the command never started) or `interrupted` (claimed, the process gone without an
    /// exit record).
    Fenced {
        /// The state before the fence.
        was: String,
    },
    /// Signals did not stop it in time: the marker is still in this state.
    Still {
        /// The marker's state name (normally `running`).
        state: String,
    },
}

impl CancelOutcome {
    /// The stable snake_case name used in JSON and the ledger.
    pub fn as_str(&self) -> &'static str {
        match self {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::AlreadyCompleted => "already_completed",
            CancelOutcome::AlreadyFenced => "already_fenced",
            CancelOutcome::Fenced { .. } => "fenced",
            CancelOutcome::Still { .. } => "still_running",
        }
    }

    fn parse(word: &str, fields: &BTreeMap<String, String>) -> Result<Self, ProtocolError> {
        Ok(match word {
            "cancelled" => CancelOutcome::Cancelled,
            "already_completed" => CancelOutcome::AlreadyCompleted,
            "already_fenced" => CancelOutcome::AlreadyFenced,
            "fenced" => CancelOutcome::Fenced {
                was: fields.get("was").cloned().unwrap_or_default(),
            },
            other => match other.strip_prefix("still_") {
                Some(state) => CancelOutcome::Still {
                    state: state.to_owned(),
                },
                None => {
                    return Err(ProtocolError::new(format!(
                        "unknown cancel outcome {other}"
                    )))
                }
            },
        })
    }
}

impl Frame {
    /// Whether this frame ends the shim's reply for the call.
    pub fn is_final(&self) -> bool {
        match self {
            Frame::Exit(_)
            | Frame::Interrupted(_)
            | Frame::Probe(_)
            | Frame::Output(_)
            | Frame::IndexRepeat(_)
            | Frame::Fence { .. }
            | Frame::Cancel { .. }
            | Frame::GcDone { .. }
            | Frame::DoctorDone
            | Frame::LocksDone => true,
            Frame::Refused(r) => !r.replay,
            Frame::Hello { .. }
            | Frame::Root { .. }
            | Frame::Started { .. }
            | Frame::Attached(_)
            | Frame::Superseded { .. }
            | Frame::Repeats(_)
            | Frame::GcRemoved(_)
            | Frame::Doctor(_)
            | Frame::LockHeld(_)
            | Frame::LockWaiting(_) => false,
        }
    }
}

/// The reply broke the protocol: the client cannot trust the rest of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Bytes that are not what the protocol allows.
    #[error("malformed reply from the host shim: {0}")]
    Malformed(String),
    /// The shim's header names another protocol version than this client speaks. The
    /// shim is shipped by the client and cached under its hash, so this means a copy
    /// that is not opmark's own, answering under its name.
    #[error("the host shim speaks protocol version {host:?}, this opmark speaks version {client}: the reply cannot be read. Remove the host's cached shim (`<marker root>/shim/`) so that opmark sends its own again")]
    VersionMismatch {
        /// The version in the shim's header.
        host: String,
        /// [`PROTOCOL_VERSION`].
        client: &'static str,
    },
}

impl ProtocolError {
    fn new(msg: impl Into<String>) -> Self {
        ProtocolError::Malformed(msg.into())
    }
}

/// The shim protocol version this client speaks: the `v=` of the shim's header, its
/// `OPMARK_SHIM_VERSION`. Bumped with any change to the verbs' arguments or frames.
pub const PROTOCOL_VERSION: &str = "8";

/// Incremental parser for one call's stdout and stderr streams.
#[derive(Debug, Default)]
pub struct ReplyParser {
    /// The call token a header must carry (`c=`), when the client sent one.
    token: Option<String>,
    nonce: Option<String>,
    stdout_nonce: Option<String>,
    stdout_pre: Vec<u8>,
    stdout_open: bool,
    stderr_buf: Vec<u8>,
    stderr_open: bool,
    /// Bytes still owed to the payload announced by the last `O`/`E` frame.
    raw_left: u64,
    /// The announced payload so far, held until its `C` frame commits it.
    pending: Option<(OutputStream, Vec<u8>)>,
    preamble_seen: usize,
    stdout_bytes: u64,
    stderr_bytes: u64,
    /// A resident's end frame `Z c=<token> status=N`: the request's reply is whole.
    end_status: Option<u32>,
    /// A resident's `Q ready pid=N`: it serves requests.
    ready_pid: Option<u32>,
}

impl ReplyParser {
    /// A parser for a fresh call.
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser for a call whose shim was given `token`: only a header echoing it counts.
    pub fn expecting(token: &str) -> Self {
        ReplyParser {
            token: Some(token.to_owned()),
            ..Self::default()
        }
    }

    /// Whether the shim's header arrived on either stream: the shim itself ran. When the
    /// channel closes without it, the shim never reached its first line of output, and so
    /// never claimed anything.
    pub fn header_seen(&self) -> bool {
        self.stdout_open || self.stderr_open
    }

    /// What arrived before any header (a login shell's or its startup files' messages),
    /// for telling why the shim did not start. At most `max` bytes per stream.
    pub fn preamble(&self, max: usize) -> (Vec<u8>, Vec<u8>) {
        let cut = |b: &[u8]| b[..b.len().min(max)].to_vec();
        let err = if self.stderr_open {
            Vec::new()
        } else {
            cut(&self.stderr_buf)
        };
        (cut(&self.stdout_pre), err)
    }

    /// The status of a resident's request, once its end frame came (the reply is whole:
    /// nothing more of this request follows on the channel).
    pub fn end_status(&self) -> Option<u32> {
        self.end_status
    }

    /// The resident's pid, once its `Q ready` frame came: it serves requests
    /// (docs/host-protocol.md#the-resident-session).
    pub fn ready_pid(&self) -> Option<u32> {
        self.ready_pid
    }

    /// Command stdout bytes delivered so far.
    pub fn stdout_bytes(&self) -> u64 {
        self.stdout_bytes
    }

    /// Command stderr bytes delivered so far.
    pub fn stderr_bytes(&self) -> u64 {
        self.stderr_bytes
    }

    /// Feeds stdout bytes. Only the header travels there (output comes in committed
    /// frames on stderr), so this never yields a reply; `_out` keeps both streams' calls
    /// alike.
    pub fn push_stdout(&mut self, data: &[u8], _out: &mut Vec<Reply>) -> Result<(), ProtocolError> {
        if self.stdout_open {
            return Self::no_stdout_after_header(data);
        }
        self.stdout_pre.extend_from_slice(data);
        if let Some((start, end, nonce)) = find_header(&self.stdout_pre, self.token.as_deref()) {
            self.preamble_seen += start;
            if let Some(n) = &self.nonce {
                if *n != nonce {
                    return Err(ProtocolError::new("stdout and stderr headers disagree"));
                }
            }
            self.stdout_nonce = Some(nonce);
            self.stdout_open = true;
            let rest = self.stdout_pre.split_off(end);
            self.stdout_pre.clear();
            return Self::no_stdout_after_header(&rest);
        }
        if self.stdout_pre.len() > MAX_PREAMBLE {
            return Err(ProtocolError::new(
                "no shim header on stdout (is the remote login shell POSIX-compatible?)",
            ));
        }
        Ok(())
    }

    fn no_stdout_after_header(data: &[u8]) -> Result<(), ProtocolError> {
        if data.is_empty() {
            return Ok(());
        }
        // The shim lets go of stdout after its header: these bytes are not its.
        Err(ProtocolError::new(
            "bytes on stdout after the shim's header (another process wrote into the channel)",
        ))
    }

    /// Feeds stderr bytes.
    pub fn push_stderr(&mut self, data: &[u8], out: &mut Vec<Reply>) -> Result<(), ProtocolError> {
        self.stderr_buf.extend_from_slice(data);
        if !self.stderr_open {
            let Some((start, end, nonce)) = find_header(&self.stderr_buf, self.token.as_deref())
            else {
                if self.stderr_buf.len() > MAX_PREAMBLE {
                    return Err(ProtocolError::new("no shim header on stderr"));
                }
                return Ok(());
            };
            self.preamble_seen += start;
            if let Some(n) = &self.stdout_nonce {
                if *n != nonce {
                    return Err(ProtocolError::new("stdout and stderr headers disagree"));
                }
            }
            let version = header_version(&self.stderr_buf[start..end]);
            if version != PROTOCOL_VERSION {
                return Err(ProtocolError::VersionMismatch {
                    host: version,
                    client: PROTOCOL_VERSION,
                });
            }
            self.nonce = Some(nonce);
            self.stderr_open = true;
            self.stderr_buf.drain(..end);
            out.push(Reply::Frame(Frame::Hello { version }));
        }
        self.drain_stderr(out)
    }

    fn drain_stderr(&mut self, out: &mut Vec<Reply>) -> Result<(), ProtocolError> {
        loop {
            if self.raw_left > 0 {
                if self.stderr_buf.is_empty() {
                    return Ok(());
                }
                let take = (self.raw_left as usize).min(self.stderr_buf.len());
                if let Some((_, held)) = &mut self.pending {
                    held.extend(self.stderr_buf.drain(..take));
                }
                self.raw_left -= take as u64;
                continue;
            }
            let Some(nl) = self.stderr_buf.iter().position(|&b| b == b'\n') else {
                if self.stderr_buf.len() > MAX_FRAME_LINE {
                    return Err(ProtocolError::new("frame line too long"));
                }
                return Ok(());
            };
            let line: Vec<u8> = self.stderr_buf.drain(..=nl).collect();
            let line = std::str::from_utf8(&line[..line.len() - 1])
                .map_err(|_| ProtocolError::new("frame is not UTF-8"))?;
            let nonce = self.nonce.as_deref().unwrap_or_default();
            let body = line
                .strip_prefix("OPMARK/1 ")
                .and_then(|l| l.strip_prefix(nonce))
                .and_then(|l| l.strip_prefix(' '))
                .ok_or_else(|| ProtocolError::new("text outside a frame on the shim's stderr"))?;
            let (kind, rest) = body.split_once(' ').unwrap_or((body, ""));
            if self.pending.is_some() && kind != "C" {
                return Err(ProtocolError::new(
                    "output payload without its commit frame",
                ));
            }
            if kind == "O" || kind == "E" {
                let len: u64 = rest
                    .parse()
                    .map_err(|_| ProtocolError::new(format!("bad {kind} frame length")))?;
                let stream = if kind == "O" {
                    OutputStream::Stdout
                } else {
                    OutputStream::Stderr
                };
                self.raw_left = len;
                self.pending = Some((stream, Vec::new()));
                continue;
            }
            if kind == "C" {
                let Some((stream, bytes)) = self.pending.take() else {
                    return Err(ProtocolError::new("commit frame without a payload"));
                };
                if !bytes.is_empty() {
                    match stream {
                        OutputStream::Stdout => {
                            self.stdout_bytes += bytes.len() as u64;
                            out.push(Reply::Stdout(bytes));
                        }
                        OutputStream::Stderr => {
                            self.stderr_bytes += bytes.len() as u64;
                            out.push(Reply::Stderr(bytes));
                        }
                    }
                }
                continue;
            }
            // A resident's own frames: they frame the session, not the verb's answer, so
            // they never reach the verb's readers.
            match kind {
                // A resident's request waits (the keepalive of docs/host-protocol.md#the-resident-session).
                "B" => continue,
                "Z" => {
                    let (_, fields) = parse_fields(rest);
                    if self.token.is_some() && fields.get("c") != self.token.as_ref() {
                        return Err(ProtocolError::new("an end frame for another request"));
                    }
                    let status = fields
                        .get("status")
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| ProtocolError::new("end frame without a status"))?;
                    self.end_status = Some(status);
                    continue;
                }
                "Q" => {
                    let (_, fields) = parse_fields(rest);
                    self.ready_pid = Some(
                        fields
                            .get("pid")
                            .and_then(|p| p.parse().ok())
                            .ok_or_else(|| ProtocolError::new("ready frame without a pid"))?,
                    );
                    continue;
                }
                _ => {}
            }
            out.push(Reply::Frame(parse_frame(kind, rest)?));
        }
    }
}

fn parse_fields(rest: &str) -> (Vec<&str>, BTreeMap<String, String>) {
    let mut words = Vec::new();
    let mut fields = BTreeMap::new();
    for token in rest.split(' ').filter(|t| !t.is_empty()) {
        match token.split_once('=') {
            Some((k, v)) => {
                fields.insert(k.to_owned(), v.to_owned());
            }
            None => words.push(token),
        }
    }
    (words, fields)
}

fn parse_frame(kind: &str, rest: &str) -> Result<Frame, ProtocolError> {
    let (words, fields) = parse_fields(rest);
    let num = |k: &str| -> Result<u64, ProtocolError> {
        fields
            .get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ProtocolError::new(format!("frame {kind} lacks a numeric {k}")))
    };
    Ok(match kind {
        "H" => Frame::Hello {
            version: fields.get("v").cloned().unwrap_or_default(),
        },
        "M" => Frame::Root {
            id: fields.get("root_id").cloned().unwrap_or_default(),
        },
        "S" => Frame::Started {
            attempt: fields.get("attempt").cloned().unwrap_or_default(),
        },
        "R" => {
            let word = words
                .first()
                .ok_or_else(|| ProtocolError::new("refusal without a reason"))?;
            let reason = RefusalReason::parse(word)
                .ok_or_else(|| ProtocolError::new(format!("unknown refusal reason {word}")))?;
            let marker = if fields.contains_key("state") {
                Some(MarkerInfo::from_fields(fields.clone())?)
            } else {
                None
            };
            Frame::Refused(Refusal {
                reason,
                replay: fields.get("replay").is_some_and(|r| r == "1"),
                marker,
                fields,
            })
        }
        "A" => Frame::Attached(MarkerInfo::from_fields(fields)?),
        "W" => Frame::Repeats(fields),
        "U" => Frame::Superseded {
            by: fields.get("superseded_by").cloned().unwrap_or_default(),
        },
        "X" => Frame::Exit(ExitFrame {
            code: fields
                .get("code")
                .and_then(|c| c.parse().ok())
                .ok_or_else(|| ProtocolError::new("exit frame without a code"))?,
            out_bytes: num("out")?,
            err_bytes: num("err")?,
            timed_out: fields.get("timed_out").is_some_and(|v| v == "1"),
            kept_out: num("kept_out").ok(),
            kept_err: num("kept_err").ok(),
            dropped_out: num("dropped_out").unwrap_or(0),
            dropped_err: num("dropped_err").unwrap_or(0),
            attempt: fields.get("attempt").cloned().unwrap_or_default(),
            output_collected: fields.get("output_collected").is_some_and(|v| v == "1"),
            cancelled: fields.get("cancelled").is_some_and(|v| v == "1"),
        }),
        "I" => Frame::Interrupted(MarkerInfo::from_fields(fields)?),
        "P" => Frame::Probe(MarkerInfo::from_fields(fields)?),
        "V" => Frame::Output(MarkerInfo::from_fields(fields)?),
        "J" if words == ["none"] => Frame::IndexRepeat(None),
        "J" if fields.contains_key("earlier") => Frame::IndexRepeat(Some(fields)),
        "J" => {
            return Err(ProtocolError::new(
                "repeats answer without an earlier claim",
            ))
        }
        "F" => Frame::Fence {
            outcome: match words.first() {
                Some(&"fenced") => FenceOutcome::Fenced,
                Some(&"already_fenced") => FenceOutcome::AlreadyFenced,
                _ => return Err(ProtocolError::new("fence answer without a known outcome")),
            },
            marker: MarkerInfo::from_fields(fields)?,
        },
        "G" => match words.first() {
            Some(&word @ ("remove" | "collect")) => Frame::GcRemoved(GcRemoved {
                op: fields.get("op").cloned().unwrap_or_default(),
                state: fields.get("state").cloned().unwrap_or_default(),
                at: fields.get("at").and_then(|a| a.parse().ok()).unwrap_or(0),
                action: if word == "collect" {
                    GcAction::Collected
                } else {
                    GcAction::TombstoneRemoved
                },
            }),
            Some(&"reclaim") => Frame::GcRemoved(GcRemoved {
                op: fields.get("name").cloned().unwrap_or_default(),
                state: String::new(),
                at: 0,
                action: match fields.get("what").map(String::as_str) {
                    Some("shim") => GcAction::ShimReclaimed,
                    Some("spool") => GcAction::SpoolReclaimed,
                    _ => GcAction::FailedStartReclaimed,
                },
            }),
            Some(&"done") => Frame::GcDone {
                kept: fields.get("kept").and_then(|k| k.parse().ok()).unwrap_or(0),
            },
            _ => return Err(ProtocolError::new("gc line without a known action")),
        },
        "L" => match words.first() {
            Some(&"held") => Frame::LockHeld(LockHolder::from_fields(&fields)),
            Some(&"waiting") => Frame::LockWaiting(LockWaiter::from_fields(&fields)),
            Some(&"done") => Frame::LocksDone,
            _ => return Err(ProtocolError::new("lock line without a known kind")),
        },
        "K" if words == ["done"] && fields.is_empty() => Frame::DoctorDone,
        "K" => {
            let mut fields = fields;
            for w in words {
                fields.insert(w.to_owned(), String::new());
            }
            Frame::Doctor(fields)
        }
        // `N` (caNcel): `C` commits payload frames.
        "N" => Frame::Cancel {
            outcome: CancelOutcome::parse(
                words
                    .first()
                    .ok_or_else(|| ProtocolError::new("cancel answer without an outcome"))?,
                &fields,
            )?,
            marker: MarkerInfo::from_fields(fields)?,
        },
        other => return Err(ProtocolError::new(format!("unknown frame kind {other}"))),
    })
}

/// Finds `OPMARK/1 <32 hex> H ...\n` anywhere in `buf` (with ` c=<token>` among its
/// fields when a token is expected): (start, end after newline, nonce).
fn find_header(buf: &[u8], token: Option<&str>) -> Option<(usize, usize, String)> {
    let mut from = 0;
    while let Some(pos) = find(&buf[from..], MAGIC) {
        let start = from + pos;
        let after = &buf[start + MAGIC.len()..];
        let nl = after.iter().position(|&b| b == b'\n')?;
        let line = &after[..nl];
        let echoes_token = |fields: &[u8]| match token {
            None => true,
            Some(t) => fields
                .split(|&b| b == b' ')
                .any(|f| f.strip_prefix(b"c=") == Some(t.as_bytes())),
        };
        if line.len() >= 35
            && line[..32]
                .iter()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && &line[32..35] == b" H "
            && echoes_token(&line[35..])
        {
            let nonce = String::from_utf8_lossy(&line[..32]).into_owned();
            return Some((start, start + MAGIC.len() + nl + 1, nonce));
        }
        from = start + 1;
    }
    None
}

fn header_version(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    text.split(' ')
        .find_map(|t| t.strip_prefix("v="))
        .unwrap_or_default()
        .trim_end()
        .to_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "0123456789abcdef0123456789abcdef";

    fn parse(stdout: &[u8], stderr: &[u8]) -> Result<Vec<Reply>, ProtocolError> {
        let mut p = ReplyParser::new();
        let mut out = Vec::new();
        // Byte at a time: the parser must not depend on how the transport chunks data.
        for b in stderr {
            p.push_stderr(std::slice::from_ref(b), &mut out)?;
        }
        for b in stdout {
            p.push_stdout(std::slice::from_ref(b), &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn a_header_of_another_protocol_version_is_a_typed_error() {
        let mut p = ReplyParser::new();
        let mut out = Vec::new();
        let err = p
            .push_stderr(format!("OPMARK/1 {N} H v=9\n").as_bytes(), &mut out)
            .unwrap_err();
        assert_eq!(
            err,
            ProtocolError::VersionMismatch {
                host: "9".into(),
                client: PROTOCOL_VERSION
            }
        );
        assert!(err.to_string().contains("version \"9\""), "{err}");
        assert!(out.is_empty());
    }

    #[test]
    fn refusals_gc_doctor_and_fence_lines_are_typed() {
        let stderr = format!(
            "OPMARK/1 {N} H v=8\nOPMARK/1 {N} R completed replay=1 state=completed code=0\nOPMARK/1 {N} R bad_args reason=argument_count\nOPMARK/1 {N} G remove op=a state=fenced at=7\nOPMARK/1 {N} G done kept=3\nOPMARK/1 {N} K writable=yes\nOPMARK/1 {N} K done\nOPMARK/1 {N} F already_fenced state=fenced\n"
        );
        let replies = parse(b"", stderr.as_bytes()).unwrap();
        let frames: Vec<&Frame> = replies
            .iter()
            .filter_map(|r| match r {
                Reply::Frame(f) => Some(f),
                _ => None,
            })
            .collect();
        let Frame::Refused(replay) = frames[1] else {
            panic!("{frames:?}")
        };
        assert_eq!(replay.reason, RefusalReason::Marker(MarkerState::Completed));
        assert!(replay.replay && !frames[1].is_final());
        let Frame::Refused(bad) = frames[2] else {
            panic!("{frames:?}")
        };
        assert_eq!(bad.reason, "bad_args");
        assert!(!bad.replay && frames[2].is_final());
        assert!(matches!(frames[3], Frame::GcRemoved(r) if r.op == "a" && r.at == 7));
        assert!(!frames[3].is_final());
        assert_eq!(*frames[4], Frame::GcDone { kept: 3 });
        assert!(frames[4].is_final());
        assert!(matches!(frames[5], Frame::Doctor(k) if k["writable"] == "yes"));
        assert!(!frames[5].is_final());
        assert_eq!(*frames[6], Frame::DoctorDone);
        assert!(frames[6].is_final());
        assert!(matches!(
            frames[7],
            Frame::Fence {
                outcome: FenceOutcome::AlreadyFenced,
                ..
            }
        ));
        let unknown = format!("OPMARK/1 {N} H v=8\nOPMARK/1 {N} R no_such_reason\n");
        assert!(parse(b"", unknown.as_bytes()).is_err());
    }

    fn collect_stdout(replies: &[Reply]) -> Vec<u8> {
        replies
            .iter()
            .filter_map(|r| match r {
                Reply::Stdout(b) => Some(b.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn skips_login_noise_and_decodes_a_run() {
        let stdout = format!("motd junk\nOPMARK/1 {N} H v=8\n");
        let stderr = format!(
            "noise without newline OPMARK/1 {N} H v=8\nOPMARK/1 {N} S attempt=a1\nOPMARK/1 {N} O 6\nhello\nOPMARK/1 {N} C\nOPMARK/1 {N} E 5\nerr\n\nOPMARK/1 {N} C\nOPMARK/1 {N} X code=255 out=6 err=5 timed_out=0 dropped_out=0 dropped_err=0 attempt=a1\n"
        );
        let replies = parse(stdout.as_bytes(), stderr.as_bytes()).unwrap();
        assert_eq!(collect_stdout(&replies), b"hello\n");
        let stderr_bytes: Vec<u8> = replies
            .iter()
            .filter_map(|r| match r {
                Reply::Stderr(b) => Some(b.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(stderr_bytes, b"err\n\n");
        let exit = replies.iter().find_map(|r| match r {
            Reply::Frame(Frame::Exit(x)) => Some(x.clone()),
            _ => None,
        });
        assert_eq!(exit.unwrap().code, 255);
    }

    #[test]
    fn command_output_imitating_frames_is_just_data() {
        // The command printed a fake exit frame with a made-up nonce inside its stderr.
        let fake = format!("OPMARK/1 {} X code=0 out=0 err=0\n", "f".repeat(32));
        let stderr = format!(
            "OPMARK/1 {N} H v=8\nOPMARK/1 {N} E {}\n{fake}OPMARK/1 {N} C\nOPMARK/1 {N} X code=201 out=0 err={} attempt=a\n",
            fake.len(),
            fake.len()
        );
        let replies = parse(
            format!("OPMARK/1 {N} H v=8\n").as_bytes(),
            stderr.as_bytes(),
        )
        .unwrap();
        let exits: Vec<_> = replies
            .iter()
            .filter_map(|r| match r {
                Reply::Frame(Frame::Exit(x)) => Some(x.code),
                _ => None,
            })
            .collect();
        assert_eq!(exits, vec![201]);
    }

    /// Feeds both streams, stopping at the first protocol error, and returns what was
    /// delivered before it together with the error.
    fn parse_until_error(stdout: &[u8], stderr: &[u8]) -> (Vec<Reply>, Option<ProtocolError>) {
        let mut p = ReplyParser::new();
        let mut out = Vec::new();
        for b in stdout {
            if let Err(e) = p.push_stdout(std::slice::from_ref(b), &mut out) {
                return (out, Some(e));
            }
        }
        for b in stderr {
            if let Err(e) = p.push_stderr(std::slice::from_ref(b), &mut out) {
                return (out, Some(e));
            }
        }
        (out, None)
    }

    #[test]
    fn bytes_written_into_the_channel_stdout_after_the_header_are_refused() {
        let stdout = format!("OPMARK/1 {N} H v=8\nFORGED\n");
        let (replies, err) = parse_until_error(stdout.as_bytes(), b"");
        assert!(err.is_some());
        assert!(collect_stdout(&replies).is_empty());
    }

    #[test]
    fn bytes_slipped_into_a_payload_are_never_delivered() {
        // Another process wrote 4 bytes between the shim's `O 6` line and its payload:
        // they fill the announced length, so the shim's own bytes land where the commit
        // line should be and fail the nonce. Nothing of the payload is delivered.
        let stderr = format!(
            "OPMARK/1 {N} H v=8\nOPMARK/1 {N} O 6\nEVILhello\nOPMARK/1 {N} C\nOPMARK/1 {N} X code=0 out=6 err=0 attempt=a\n"
        );
        let header = format!("OPMARK/1 {N} H v=8\n");
        let (replies, err) = parse_until_error(header.as_bytes(), stderr.as_bytes());
        assert!(err.is_some(), "{replies:?}");
        assert!(collect_stdout(&replies).is_empty(), "{replies:?}");
    }

    #[test]
    fn a_payload_without_its_commit_is_never_delivered() {
        let stderr = format!("OPMARK/1 {N} H v=8\nOPMARK/1 {N} O 3\nabc");
        let header = format!("OPMARK/1 {N} H v=8\n");
        let (replies, err) = parse_until_error(header.as_bytes(), stderr.as_bytes());
        assert!(err.is_none());
        assert!(collect_stdout(&replies).is_empty());
        let forged = format!("{stderr}OPMARK/1 {} C\n", "f".repeat(32));
        let (replies, err) = parse_until_error(header.as_bytes(), forged.as_bytes());
        assert!(err.is_some());
        assert!(collect_stdout(&replies).is_empty());
    }

    #[test]
    fn a_startup_file_copying_a_header_is_skipped_when_a_token_is_expected() {
        let fake = "f".repeat(32);
        let token = "c0ffee";
        let stdout = format!("OPMARK/1 {fake} H v=8\nOPMARK/1 {N} H v=8 c={token}\n");
        let stderr = format!(
            "OPMARK/1 {fake} H v=8\nOPMARK/1 {N} H v=8 c={token}\nOPMARK/1 {N} O 4\nout\nOPMARK/1 {N} C\nOPMARK/1 {N} X code=4 out=4 err=0 attempt=a\n"
        );
        let mut p = ReplyParser::expecting(token);
        let mut out = Vec::new();
        for b in stderr.as_bytes() {
            p.push_stderr(std::slice::from_ref(b), &mut out).unwrap();
        }
        for b in stdout.as_bytes() {
            p.push_stdout(std::slice::from_ref(b), &mut out).unwrap();
        }
        assert_eq!(collect_stdout(&out), b"out\n");
        assert!(out
            .iter()
            .any(|r| matches!(r, Reply::Frame(Frame::Exit(x)) if x.code == 4)));
        // Without the token, the copy would have been taken for the header.
        assert!(parse(stdout.as_bytes(), stderr.as_bytes()).is_err());
    }

    #[test]
    fn no_header_means_the_shim_never_spoke() {
        let mut p = ReplyParser::expecting("c0ffee");
        let mut out = Vec::new();
        p.push_stderr(b"fish: Unknown command\n", &mut out).unwrap();
        assert!(!p.header_seen());
        assert_eq!(p.preamble(8).1, b"fish: Un");
    }

    #[test]
    fn text_outside_frames_after_the_header_is_a_protocol_error() {
        let stderr = format!("OPMARK/1 {N} H v=8\nsurprise\n");
        assert!(parse(b"", stderr.as_bytes()).is_err());
    }

    #[test]
    fn mismatched_headers_are_refused() {
        let other = "f".repeat(32);
        let err = parse(
            format!("OPMARK/1 {other} H v=8\n").as_bytes(),
            format!("OPMARK/1 {N} H v=8\n").as_bytes(),
        );
        assert!(err.is_err());
    }

    #[test]
    fn cancel_answers_parse_with_their_outcome_and_marker() {
        let stderr = format!(
            "OPMARK/1 {N} H v=8\nOPMARK/1 {N} N cancelled state=completed attempt=a code=143 timed_out=0 cancelled=1\n"
        );
        let replies = parse(b"", stderr.as_bytes()).unwrap();
        let Reply::Frame(f @ Frame::Cancel { outcome, marker }) = &replies[1] else {
            panic!("{replies:?}")
        };
        assert!(f.is_final());
        assert_eq!(*outcome, CancelOutcome::Cancelled);
        assert_eq!(marker.exit_code, Some(143));
        assert!(marker.cancelled());
        assert_eq!(marker.summary(), "completed exit=143 cancelled attempt=a");

        let fenced = format!("OPMARK/1 {N} H v=8\nOPMARK/1 {N} N fenced was=absent state=fenced\n");
        let replies = parse(b"", fenced.as_bytes()).unwrap();
        assert!(matches!(
            &replies[1],
            Reply::Frame(Frame::Cancel { outcome: CancelOutcome::Fenced { was }, .. }) if was == "absent"
        ));
        let still = format!("OPMARK/1 {N} H v=8\nOPMARK/1 {N} N still_running state=running\n");
        let replies = parse(b"", still.as_bytes()).unwrap();
        assert!(matches!(
            &replies[1],
            Reply::Frame(Frame::Cancel { outcome: CancelOutcome::Still { state }, .. }) if state == "running"
        ));
        let odd = format!("OPMARK/1 {N} H v=8\nOPMARK/1 {N} N exploded state=running\n");
        assert!(parse(b"", odd.as_bytes()).is_err());
    }

    #[test]
    fn refusal_carries_marker_state() {
        let stderr = format!(
            "OPMARK/1 {N} H v=8\nOPMARK/1 {N} R conflict state=completed attempt=a fp={} code=0\n",
            "a".repeat(64)
        );
        let replies = parse(b"", stderr.as_bytes()).unwrap();
        let Reply::Frame(Frame::Refused(r)) = &replies[1] else {
            panic!("{replies:?}")
        };
        assert_eq!(r.reason, "conflict");
        assert_eq!(r.marker.as_ref().unwrap().state, MarkerState::Completed);
        assert!(Frame::Refused(r.clone()).is_final());
    }
}
