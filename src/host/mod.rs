//! The host protocol: the one way opmark talks to a host's shim. Connect (holding the
//! host to the key an operation ran against), call one verb, and read the reply as that
//! verb's typed answer. Commands and the run/reconcile machinery come here; none of them
//! builds a shim call, reads frames by the keys they carry, or matches a call's end by
//! hand.
//!
//! - [`call`]: one call over an SSH session, streamed to an observer, and how it ended
//!   ([`CallEnd`]). The `run` and `attach` verbs use it directly: their output streams.
//!   Through the keeper it goes to the host's resident shim ([`resident`]) when the host
//!   has one, with the same answers.
//! - The one-answer verbs, typed: [`probe`], [`fence`], [`gc`], [`doctor`], [`cancel`],
//!   and [`attach`]'s end. Each returns its answer or a [`CallError`].
//! - [`Host`]: a connected host, reached with [`Host::connect_checked`].
//! - What the commands need of [`crate::ssh`] to name and reach a host (resolve a
//!   destination, the connection pool, no prompts under MCP), re-exported so that this
//!   module is their one door to hosts.
//!
//! Below it, [`crate::shim`] owns the wire: the script, the verb table ([`shim::VERBS`],
//! mirrored by the shim's header, `remote-scripts/shim/00-header.sh`), the exec request
//! and the frame parser, which checks the shim's protocol version ([`PROTOCOL_VERSION`])
//! in its header.

pub mod call;
mod delivery;
pub mod reply;
pub mod resident;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::op_id::OpId;
use crate::shim::Frame;
use crate::ssh::Session;

pub use crate::shim::{
    check_command, CancelOutcome, ExitFrame, FenceOutcome, GcAction, GcRemoved, InvocationError,
    LockHolder, LockWaiter, MarkerInfo, MarkerState, OutputFrom, OutputStream, ProtocolError,
    Refusal, RefusalReason, RunCall, StdinSpec, Verb, DEFAULT_OUTPUT_CAP, PROTOCOL_VERSION,
};
pub use crate::ssh::auth::forbid_prompts;
pub use crate::ssh::{
    check_destination, resolve, resolve_route, ConnectError, ConnectStage, Destination, HostSpec,
    Pool, Route,
};
pub use call::{call_shim, FramesOnly};
pub use reply::{CallEnd, CallObserver, NeverStarted};

/// The connection keeper (docs/trust.md#the-keeper) as commands see it: where it lives, whether reuse is
/// on, its control requests and answers, and the hidden `serve` loop. The framing and the
/// connections stay in `ssh::keeper`.
pub mod keeper {
    pub use crate::ssh::keeper::client::control;
    /// The keeper's hidden `serve` loop for `dir`, its resident channels running the shim.
    pub fn serve(dir: &std::path::Path, persist: std::time::Duration) -> Result<(), String> {
        crate::ssh::keeper_server::serve(
            dir,
            persist,
            std::sync::Arc::new(super::resident::ShimResident),
        )
    }
    pub use crate::ssh::keeper::wire::{KeeperReply, KeeperRequest};
    pub use crate::ssh::keeper::{set_persist, KeeperDir, DEFAULT_PERSIST};
}

/// A one-answer call that did not bring its answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The exec request never left: the verb did nothing.
    #[error("{0}")]
    NotSent(String),
    /// The request left but the answer did not come back: the verb may have acted.
    #[error("{reason}")]
    Lost {
        /// What the transport said, or why the reply could not be read.
        reason: String,
        /// Set when the channel closed in order before the shim started: it did nothing.
        never_started: Option<NeverStarted>,
        /// Set when the reply broke the protocol (a version the client does not speak,
        /// bytes that are not frames).
        protocol: Option<ProtocolError>,
    },
    /// The shim refused: it did nothing, and says why.
    #[error("refused: {}", refusal_summary(.0))]
    Refused(Box<Refusal>),
    /// The shim ended its reply without the verb's answer (a shim that is not opmark's).
    #[error("the host shim ended its {0} reply without an answer")]
    NoAnswer(&'static str),
}

fn refusal_summary(r: &Refusal) -> String {
    r.marker
        .as_ref()
        .map(MarkerInfo::summary)
        .unwrap_or_else(|| r.reason.to_string())
}

impl CallError {
    /// What was seen, for a message: the marker's summary for a refusal about a marker,
    /// the reason otherwise.
    pub fn seen(&self) -> String {
        match self {
            CallError::Refused(r) => refusal_summary(r),
            other => other.to_string(),
        }
    }
}

/// Reads a finished call's frames as one verb's answer: the first frame `pick` takes, a
/// refusal, or [`CallError::NoAnswer`]; a call that did not finish is its [`CallError`].
/// The one place a call's end is matched.
fn answer<T>(
    end: CallEnd,
    verb: &'static str,
    mut pick: impl FnMut(Frame) -> Option<T>,
) -> Result<T, CallError> {
    let frames = match end {
        CallEnd::Finished(frames) => frames,
        CallEnd::NotSent(why) => return Err(CallError::NotSent(why)),
        CallEnd::Lost {
            reason,
            never_started,
            protocol,
            ..
        } => {
            return Err(CallError::Lost {
                reason,
                never_started,
                protocol,
            })
        }
    };
    for frame in frames {
        if let Frame::Refused(r) = frame {
            return Err(CallError::Refused(Box::new(r)));
        }
        if let Some(found) = pick(frame) {
            return Ok(found);
        }
    }
    Err(CallError::NoAnswer(verb))
}

/// The marker's state, read-only. `root`: the marker root id the operation's attempts
/// reached, when known (a shim whose root has another id refuses, `root_changed`); the
/// same for every verb below that takes one.
pub async fn probe(
    session: &Session,
    op: &OpId,
    root: Option<&str>,
) -> Result<MarkerInfo, CallError> {
    let end = call_shim(session, &Verb::Probe(op), root, None, &mut FramesOnly).await;
    answer(end, "probe", |f| match f {
        Frame::Probe(m) => Some(m),
        _ => None,
    })
}

/// The earlier claim of intent `fingerprint` under another op id, within `window`, that a
/// claim of `op` would meet in the host's fingerprint index (its fields: `earlier`,
/// `earlier_state`, `earlier_at`); `None` when there is none. Reads only.
pub async fn repeats(
    session: &Session,
    op: &OpId,
    fingerprint: &str,
    window: Duration,
    declared: &[String],
    root: Option<&str>,
) -> Result<Option<BTreeMap<String, String>>, CallError> {
    let verb = Verb::Repeats {
        op,
        fingerprint,
        window,
        declared,
    };
    let end = call_shim(session, &verb, root, None, &mut FramesOnly).await;
    answer(end, "repeats", |f| match f {
        Frame::IndexRepeat(found) => Some(found),
        _ => None,
    })
}

/// A range of one stream's kept copy, read by [`output`].
#[derive(Debug, Clone)]
pub struct OutputRange {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The offset of the first one in the stream.
    pub from: u64,
    /// Bytes of the stream the host keeps now.
    pub kept: u64,
    /// Bytes of the stream beyond the host's cap, never kept.
    pub dropped: u64,
    /// The marker as the read found it.
    pub marker: MarkerInfo,
}

/// Reads at most `len` bytes of a stream's kept copy from `from`, as the host holds it
/// now (a running command's copy may grow). Reads only.
pub async fn output(
    session: &Session,
    op: &OpId,
    stream: OutputStream,
    from: OutputFrom,
    len: u64,
    root: Option<&str>,
) -> Result<OutputRange, CallError> {
    struct Collect(Vec<u8>);
    impl CallObserver for Collect {
        fn stdout(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
        fn stderr(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
        fn frame(&mut self, _: &Frame) {}
    }
    let verb = Verb::Output {
        op,
        stream,
        from,
        len,
    };
    let mut bytes = Collect(Vec::new());
    let end = call_shim(session, &verb, root, None, &mut bytes).await;
    let marker = answer(end, "output", |f| match f {
        Frame::Output(m) => Some(m),
        _ => None,
    })?;
    let field = |k: &str| marker.fields.get(k).and_then(|v| v.parse::<u64>().ok());
    let (Some(kept), Some(dropped), Some(at), Some(sent)) =
        (field("kept"), field("dropped"), field("from"), field("len"))
    else {
        return Err(CallError::NoAnswer("output"));
    };
    if sent != bytes.0.len() as u64 {
        return Err(CallError::Lost {
            reason: format!(
                "the output read announced {sent} bytes and brought {}",
                bytes.0.len()
            ),
            never_started: None,
            protocol: Some(ProtocolError::Malformed("output length mismatch".into())),
        });
    }
    Ok(OutputRange {
        bytes: bytes.0,
        from: at,
        kept,
        dropped,
        marker,
    })
}

/// What a fence did, and the marker afterwards.
#[derive(Debug, Clone)]
pub struct Fenced {
    /// New tombstone or an existing one.
    pub outcome: FenceOutcome,
    /// The marker afterwards.
    pub marker: MarkerInfo,
}

/// Tombstones the op id; `force` fences an interrupted, started claim too. A marker that
/// completed or runs is a [`CallError::Refused`] carrying it.
pub async fn fence(
    session: &Session,
    op: &OpId,
    force: bool,
    root: Option<&str>,
) -> Result<Fenced, CallError> {
    let verb = Verb::Fence { op, force };
    let end = call_shim(session, &verb, root, None, &mut FramesOnly).await;
    answer(end, "fence", |f| match f {
        Frame::Fence { outcome, marker } => Some(Fenced { outcome, marker }),
        _ => None,
    })
}

/// What gc removed (or would remove) and how many markers it kept.
#[derive(Debug, Clone, Default)]
pub struct GcSweep {
    /// Removed markers, in the shim's order.
    pub removed: Vec<GcRemoved>,
    /// Markers left in place.
    pub kept: u64,
}

/// Collects completed or fenced markers older than `older_than` down to tombstones and
/// removes tombstones older than `tombstones_older_than` when given (only reports, with
/// `dry_run`). A lost answer may mean some were collected.
pub async fn gc(
    session: &Session,
    older_than: Duration,
    dry_run: bool,
    root: Option<&str>,
    tombstones_older_than: Option<Duration>,
) -> Result<GcSweep, CallError> {
    let verb = Verb::Gc {
        older_than,
        dry_run,
        tombstones_older_than,
    };
    let end = call_shim(session, &verb, root, None, &mut FramesOnly).await;
    let mut report = GcSweep::default();
    answer(end, "gc", |f| match f {
        Frame::GcRemoved(r) => {
            report.removed.push(r);
            None
        }
        Frame::GcDone { kept } => Some(kept),
        _ => None,
    })
    .map(|kept| GcSweep { kept, ..report })
}

/// The doctor's facts about the marker root and the tools (`K key=value`). When the
/// reply is cut short, the facts that arrived come with the error.
pub async fn doctor(
    session: &Session,
) -> Result<BTreeMap<String, String>, (BTreeMap<String, String>, CallError)> {
    let end = call_shim(session, &Verb::Doctor, None, None, &mut FramesOnly).await;
    let mut facts = BTreeMap::new();
    let seen = match &end {
        CallEnd::Lost { frames, .. } => frames.clone(),
        _ => Vec::new(),
    };
    for f in seen {
        if let Frame::Doctor(fields) = f {
            facts.extend(fields);
        }
    }
    let done = answer(end, "doctor", |f| match f {
        Frame::Doctor(fields) => {
            facts.extend(fields);
            None
        }
        Frame::DoctorDone => Some(()),
        _ => None,
    });
    match done {
        Ok(()) => Ok(facts),
        Err(e) => Err((facts, e)),
    }
}

/// The host locks held and waited for on a host (docs/host-protocol.md#host-locks).
#[derive(Debug, Clone, Default)]
pub struct HostLocks {
    /// Each held slot, lock by lock.
    pub held: Vec<LockHolder>,
    /// The claims whose supervisors wait for locks.
    pub waiting: Vec<LockWaiter>,
}

/// Lists the host locks held and waited for; changes nothing.
pub async fn locks(session: &Session) -> Result<HostLocks, CallError> {
    let end = call_shim(session, &Verb::Locks, None, None, &mut FramesOnly).await;
    let mut found = HostLocks::default();
    answer(end, "locks", |f| match f {
        Frame::LockHeld(h) => {
            found.held.push(h);
            None
        }
        Frame::LockWaiting(w) => {
            found.waiting.push(w);
            None
        }
        Frame::LocksDone => Some(()),
        _ => None,
    })
    .map(|()| found)
}

/// What a cancel did, and the marker afterwards.
#[derive(Debug, Clone)]
pub struct Cancelled {
    /// What happened.
    pub outcome: CancelOutcome,
    /// The marker afterwards.
    pub marker: MarkerInfo,
}

/// Stops the operation for good: TERM, KILL after `grace`, wait for the exit record; an
/// absent, unstarted or interrupted marker is fenced. A lost answer means the signals
/// may have gone out.
pub async fn cancel(
    session: &Session,
    op: &OpId,
    grace: Duration,
    root: Option<&str>,
) -> Result<Cancelled, CallError> {
    let verb = Verb::Cancel { op, grace };
    let end = call_shim(session, &verb, root, None, &mut FramesOnly).await;
    answer(end, "cancel", |f| match f {
        Frame::Cancel { outcome, marker } => Some(Cancelled { outcome, marker }),
        _ => None,
    })
}

/// How an attach ended.
#[derive(Debug, Clone)]
pub enum Attached {
    /// The command's exit, with the attempt that ran it.
    Exit(ExitFrame),
    /// The process vanished without an exit record while followed.
    Interrupted(MarkerInfo),
}

/// Streams a marker's output from the given offsets to `observer` until the command
/// exits or is found interrupted.
pub async fn attach(
    session: &Session,
    op: &OpId,
    out_offset: u64,
    err_offset: u64,
    root: Option<&str>,
    observer: &mut dyn CallObserver,
) -> Result<Attached, CallError> {
    let verb = Verb::Attach {
        op,
        out_offset,
        err_offset,
    };
    let end = call_shim(session, &verb, root, None, observer).await;
    answer(end, "attach", |f| match f {
        Frame::Exit(x) => Some(Attached::Exit(x)),
        Frame::Interrupted(m) => Some(Attached::Interrupted(m)),
        _ => None,
    })
}

/// The `run` verb's frames, read once: what the shim did with the claim, as the wire says
/// it (`operation::reply::RunReply` narrows it to the answers that settle a call). Output
/// went to the call's observer as it arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFrames {
    /// `S`: this attempt's claim is durable and the command started.
    pub started: Option<String>,
    /// `U`: an interrupted claim was moved aside for this attempt.
    pub superseded: bool,
    /// `R`: the claim was refused (for a `completed` marker, with its replay following).
    pub refusal: Option<Refusal>,
    /// `X`: the command's exit (this attempt's, or the replayed one).
    pub exit: Option<ExitFrame>,
    /// `I`: the supervisor vanished without an exit record while followed.
    pub interrupted: Option<MarkerInfo>,
}

impl RunFrames {
    /// Reads the frames of a `run` call (finished or not: a lost call's frames say how far
    /// it got). The first frame of each kind counts.
    pub fn from_frames(frames: &[Frame]) -> RunFrames {
        let mut reply = RunFrames::default();
        for f in frames {
            match f {
                Frame::Started { attempt } if reply.started.is_none() => {
                    reply.started = Some(attempt.clone())
                }
                Frame::Superseded { .. } => reply.superseded = true,
                Frame::Refused(r) if reply.refusal.is_none() => reply.refusal = Some(r.clone()),
                Frame::Exit(x) if reply.exit.is_none() => reply.exit = Some(x.clone()),
                Frame::Interrupted(m) if reply.interrupted.is_none() => {
                    reply.interrupted = Some(m.clone())
                }
                _ => {}
            }
        }
        reply
    }
}

/// A session to a host, connected and, where an operation's identity is known, checked
/// to be the machine the operation ran on.
#[derive(Debug, Clone)]
pub struct Host {
    session: Session,
    /// The marker root id the operation's attempts reached (docs/guarantees.md#evidence-identity): every call names it.
    root: Option<String>,
}

/// Why a host could not be reached for a call; nothing was sent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReachError {
    /// Resolving, connecting or authenticating failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The host presented another key than the one recorded: another machine.
    #[error("{0}")]
    KeyMismatch(String),
    /// The same key, but reached as another user (another marker root): not the store of
    /// evidence the operation's attempts reached (docs/guarantees.md#evidence-identity).
    #[error("{0}")]
    HostChanged(String),
}

/// Why a host reached for an operation is not where its attempts went (see
/// `operation::identity::Recorded::check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// Another host key: another machine, or a changed key.
    Key(String),
    /// The same key, another user (or another marker root).
    Other(String),
}

impl Changed {
    /// The message, naming what changed and how the operation was reached before.
    pub fn message(&self) -> &str {
        match self {
            Changed::Key(m) | Changed::Other(m) => m,
        }
    }
}

impl From<Changed> for ReachError {
    fn from(c: Changed) -> Self {
        match c {
            Changed::Key(m) => ReachError::KeyMismatch(m),
            Changed::Other(m) => ReachError::HostChanged(m),
        }
    }
}

impl Host {
    /// Connects to `dest`.
    pub async fn connect(dest: &Destination) -> Result<Host, ConnectError> {
        Ok(Host {
            session: Session::connect(dest).await?,
            root: None,
        })
    }

    /// Connects to `dest`, then hands the host key it presented and the route taken to
    /// `check` (which says why they are not where the operation ran: see
    /// `operation::identity::Recorded::check`). The host's calls then name `root`, the
    /// marker root id the operation's attempts reached, so that a shim whose root has
    /// another id refuses before acting.
    pub async fn connect_checked(
        dest: &Destination,
        root: Option<&str>,
        check: impl FnOnce(Option<&str>, &Route) -> Result<(), Changed>,
    ) -> Result<Host, ReachError> {
        let mut host = Host::connect(dest).await?;
        check(host.session.host_key().as_deref(), &dest.route())?;
        host.root = root.map(str::to_owned);
        Ok(host)
    }

    /// The same connection, its calls naming the marker root id `root` (docs/guarantees.md#evidence-identity): a
    /// shim whose root has another id refuses (`root_changed`) before acting.
    pub fn expecting_root(&self, root: Option<&str>) -> Host {
        Host {
            session: self.session.clone(),
            root: root.map(str::to_owned),
        }
    }

    /// The host key the host presented, as the ledger records it.
    pub fn host_key(&self) -> Option<String> {
        self.session.host_key()
    }

    /// [`probe`] on this host.
    pub async fn probe(&self, op: &OpId) -> Result<MarkerInfo, CallError> {
        probe(&self.session, op, self.root.as_deref()).await
    }

    /// [`repeats`] on this host.
    pub async fn repeats(
        &self,
        op: &OpId,
        fingerprint: &str,
        window: Duration,
        declared: &[String],
    ) -> Result<Option<BTreeMap<String, String>>, CallError> {
        repeats(
            &self.session,
            op,
            fingerprint,
            window,
            declared,
            self.root.as_deref(),
        )
        .await
    }

    /// [`output`] on this host.
    pub async fn output(
        &self,
        op: &OpId,
        stream: OutputStream,
        from: OutputFrom,
        len: u64,
    ) -> Result<OutputRange, CallError> {
        output(&self.session, op, stream, from, len, self.root.as_deref()).await
    }

    /// [`fence`] on this host.
    pub async fn fence(&self, op: &OpId, force: bool) -> Result<Fenced, CallError> {
        fence(&self.session, op, force, self.root.as_deref()).await
    }

    /// [`gc`] on this host.
    pub async fn gc(
        &self,
        older_than: Duration,
        dry_run: bool,
        tombstones_older_than: Option<Duration>,
    ) -> Result<GcSweep, CallError> {
        gc(
            &self.session,
            older_than,
            dry_run,
            self.root.as_deref(),
            tombstones_older_than,
        )
        .await
    }

    /// [`locks`] on this host.
    pub async fn locks(&self) -> Result<HostLocks, CallError> {
        locks(&self.session).await
    }

    /// [`doctor`] on this host.
    pub async fn doctor(
        &self,
    ) -> Result<BTreeMap<String, String>, (BTreeMap<String, String>, CallError)> {
        doctor(&self.session).await
    }

    /// [`cancel`] on this host.
    pub async fn cancel(&self, op: &OpId, grace: Duration) -> Result<Cancelled, CallError> {
        cancel(&self.session, op, grace, self.root.as_deref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::frames::{Reply, ReplyParser};

    const N: &str = "0123456789abcdef0123456789abcdef";

    fn frames(stderr: &str) -> Vec<Frame> {
        let mut p = ReplyParser::new();
        let mut out = Vec::new();
        p.push_stderr(stderr.as_bytes(), &mut out).unwrap();
        out.into_iter()
            .filter_map(|r| match r {
                Reply::Frame(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    fn finished(lines: &[&str]) -> CallEnd {
        let mut text = format!("OPMARK/1 {N} H v=8\n");
        for l in lines {
            text.push_str(&format!("OPMARK/1 {N} {l}\n"));
        }
        CallEnd::Finished(frames(&text))
    }

    #[test]
    fn a_probe_answer_is_its_marker_and_a_refusal_is_typed() {
        let m = answer(
            finished(&["P state=completed code=3"]),
            "probe",
            |f| match f {
                Frame::Probe(m) => Some(m),
                _ => None,
            },
        )
        .unwrap();
        assert_eq!((m.state, m.exit_code), (MarkerState::Completed, Some(3)));
        let refused = answer(finished(&["R invalid_op_id"]), "probe", |f| match f {
            Frame::Probe(m) => Some(m),
            _ => None,
        });
        let Err(CallError::Refused(r)) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(r.reason, RefusalReason::InvalidOpId);
        let none = answer(finished(&["S attempt=a1"]), "probe", |f| match f {
            Frame::Probe(m) => Some(m),
            _ => None,
        });
        assert!(
            matches!(none, Err(CallError::NoAnswer("probe"))),
            "{none:?}"
        );
    }

    #[test]
    fn a_run_reply_says_what_the_shim_did_with_the_claim() {
        let CallEnd::Finished(frames) = finished(&[
            "U superseded_by=a2",
            "S attempt=a2",
            "X code=4 out=0 err=0 attempt=a2",
        ]) else {
            unreachable!()
        };
        let reply = RunFrames::from_frames(&frames);
        assert!(reply.superseded && reply.refusal.is_none() && reply.interrupted.is_none());
        assert_eq!(reply.started.as_deref(), Some("a2"));
        assert_eq!(
            reply.exit.map(|x| (x.code, x.attempt)),
            Some((4, "a2".into()))
        );
        let CallEnd::Finished(frames) = finished(&[
            "R completed replay=1 state=completed code=0 attempt=a1",
            "X code=0 out=0 err=0 attempt=a1",
        ]) else {
            unreachable!()
        };
        let replay = RunFrames::from_frames(&frames);
        let refusal = replay.refusal.expect("a refusal");
        assert!(refusal.replay);
        assert_eq!(
            refusal.reason,
            RefusalReason::Marker(MarkerState::Completed)
        );
        assert!(replay.exit.is_some() && replay.started.is_none());
    }

    #[test]
    fn gc_lines_are_collected_until_done() {
        let end = finished(&[
            "G remove op=a state=completed at=5",
            "G remove op=b state=fenced at=6",
            "G done removed=2 kept=4 dry_run=0",
        ]);
        let mut removed = Vec::new();
        let kept = answer(end, "gc", |f| match f {
            Frame::GcRemoved(r) => {
                removed.push(r.op);
                None
            }
            Frame::GcDone { kept } => Some(kept),
            _ => None,
        })
        .unwrap();
        assert_eq!((removed, kept), (vec!["a".to_owned(), "b".to_owned()], 4));
    }

    #[test]
    fn an_unfinished_call_keeps_why() {
        let lost = answer::<()>(
            CallEnd::Lost {
                frames: Vec::new(),
                reason: "reset".into(),
                never_started: None,
                protocol: Some(ProtocolError::VersionMismatch {
                    host: "9".into(),
                    client: PROTOCOL_VERSION,
                }),
            },
            "probe",
            |_| None,
        );
        assert!(
            matches!(
                &lost,
                Err(CallError::Lost {
                    protocol: Some(ProtocolError::VersionMismatch { .. }),
                    ..
                })
            ),
            "{lost:?}"
        );
        let not_sent = answer::<()>(CallEnd::NotSent("no channel".into()), "probe", |_| None);
        assert_eq!(not_sent.unwrap_err().to_string(), "no channel");
    }
}
