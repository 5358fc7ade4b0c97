//! The I/O around the decision table: one `run`'s connections, shim calls, ledger writes
//! and pauses. Each step observes something, hands it to [`super::decide`], records what
//! the decision says to record, and does what it says next; this file makes no decision
//! of its own about verdicts or retries.
//!
//! The loop: [`Runner::drive`] performs [`Action`]s until one is an answer;
//! [`Runner::dispatch`] sends the current attempt and reports how it ended;
//! [`Runner::probe_window`] probes the marker, follows it ([`Runner::follow`]) and
//! probes again, within one `--wait` window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::family::Family;
use crate::host::{self, call_shim, CallEnd, CallObserver};
use crate::ledger::{Durability, Event, LedgerError, OpKey, Redactor, RefusalWord};
use crate::op_id::OpId;
use crate::policy::{AfterInterrupted, OnRepeat};
use crate::shim::{
    ExitFrame, Frame, MarkerInfo, RefusalReason, RepeatCheck, RunCall, RunKind, StdinSpec, Verb,
};
use crate::ssh::{ConnectError, ConnectStage, Destination, Pool, Session};
use crate::vocab::{Boundary, RetryReason};

use super::decide::AttemptSummary;
use super::decide::{
    self, connect_code, connect_is_final, Action, Answer, ApprovalNeeded, Dispatched, Effect,
    ExitEvidence, Facts, Followed, ProbeAction, ProbeSeen, RunReply, Step, Window,
};
use super::identity::Recorded;
use super::input::{RunInput, WaitScope, LAST_LOOK};
use super::interrupt::{ClientSignal, Interrupts};
use super::output::Output;
use super::record::{self, RunLedger};
use super::repeat::Repetition;
use super::report::{progress, ObservationReport, RunError, RunReport};
use crate::fault::point as fault_point;
use crate::ledger::ObservationKind;
use crate::vocab::{ReasonCode, Verdict};

/// The state of one `run`.
/// A verified signed approval, as the attempt it lets run records it.
#[derive(Debug, Clone)]
pub(crate) struct SignedUse {
    pub(crate) principal: String,
    pub(crate) key: String,
    pub(crate) nonce: String,
    pub(crate) note: String,
}

pub(crate) struct Runner<'a> {
    pub(crate) ledger: RunLedger<'a>,
    pub(crate) pool: &'a Pool,
    pub(crate) key: OpKey,
    pub(crate) op: OpId,
    pub(crate) session_id: String,
    pub(crate) family: Family,
    pub(crate) rule: String,
    pub(crate) host_fp: String,
    pub(crate) ledger_fp: String,
    pub(crate) display: String,
    /// The policy's redaction, for text of other operations a reply names (a lock
    /// holder's command) before it reaches an answer.
    pub(crate) redactor: Redactor,
    pub(crate) attempts: Vec<AttemptSummary>,
    pub(crate) budget: u32,
    pub(crate) after_interrupted: AfterInterrupted,
    pub(crate) output: Output,
    pub(crate) exit: Option<ExitFrame>,
    /// Attempts the ledger already holds for this operation (earlier invocations).
    pub(crate) attempt_base: u32,
    /// An earlier invocation's attempt that may have reached the host.
    pub(crate) prior_dispatch: Option<String>,
    /// The exit code the ledger recorded when the operation already completed.
    pub(crate) ledger_exit: Option<i32>,
    /// The verdict's exit code comes from the ledger (the host marker is gone, or an
    /// operator vouched for it).
    pub(crate) exit_from_ledger: bool,
    /// The host keys, routes and marker roots this operation's attempts reached: every
    /// connection and call is held to them (docs/guarantees.md#evidence-identity).
    pub(crate) identity: Recorded,
    /// Signals that stop this run.
    pub(crate) interrupts: Interrupts,
    /// While a `run` call is out: `sent_no_response` from just before the exec request,
    /// `started` once the shim acknowledged the claim. What an interruption records.
    pub(crate) in_flight: Option<Boundary>,
    /// A `run` request of this invocation may have reached the host.
    pub(crate) dispatched: bool,
    /// Notified when the shim acknowledges a claim of this invocation (for `--detach`).
    pub(crate) started: Arc<Notify>,
    /// The family's `repeat_window` and `on_repeat` (docs/guarantees.md#repetitions).
    pub(crate) repeat_window: Duration,
    pub(crate) on_repeat: OnRepeat,
    /// The earlier operation this run repeats, when found (ledger or host).
    pub(crate) repeats: Option<Repetition>,
    /// When the `--wait` budget of this invocation is spent (docs/decisions.md#wait-budget):
    /// no connect before dispatch outlasts it, and over MCP no running command either.
    pub(crate) deadline: Instant,
    pub(crate) input: RunInput,
    /// An earlier invocation's attempt that reached the host: this run observes it first
    /// and makes an attempt only when something may still have to run.
    pub(crate) observed: Option<String>,
    /// Why this invocation's first attempt is made, and the attempt it follows.
    pub(crate) first_reason: RetryReason,
    /// Policy needs an approval that was not given: replays and follows only.
    pub(crate) held: Option<ApprovalNeeded>,
    /// The operation was unsettled when this run began.
    pub(crate) was_unresolved: bool,
    /// The attempt of another invocation whose running command this run followed.
    pub(crate) followed: Option<String>,
    /// This invocation's observations, as recorded.
    pub(crate) observations: Vec<ObservationReport>,
    /// The attempt whose completed marker a probe of this run recorded.
    pub(crate) probed_completed: Option<String>,
    /// A human's approval lets this run supersede or run what policy holds: `--approve
    /// NOTE` where approvals are self-service, a verified signed approval where they are
    /// not (docs/trust.md#the-approval-flow).
    pub(crate) approved: bool,
    /// The signed approval that counts, recorded with the attempt it lets run.
    pub(crate) signed: Option<SignedUse>,
    /// Why a repetition of this family is held back and where to change it (the family,
    /// its rule, the policy file), for a `blocked` reason.
    pub(crate) repeat_because: String,
    /// A signed approval was presented whose one use is spent: the run goes on without
    /// it (a replay or a follow needs none), and a hold says why the token did not count.
    pub(crate) spent: Option<String>,
    /// A put's content held on the host by a cut attempt, as the last probe that found
    /// the marker absent said (`spooled=`): the next attempt sends only the rest.
    pub(crate) put_spooled: u64,
}

/// How sending the current attempt ended, for the loop.
enum Sent {
    /// Decide from this.
    Seen(Dispatched),
    /// A signal came in before the request left: answered already.
    Stopped(Box<RunReport>),
}

impl<'a> Runner<'a> {
    /// What the decisions may look at.
    fn facts(&self) -> Facts<'_> {
        Facts {
            op: &self.key.op_id,
            host: &self.key.host,
            family: self.family,
            after_interrupted: self.after_interrupted,
            approved: self.approved,
            host_fp: &self.host_fp,
            command: &self.input.command,
            stdin: self.input.stdin.as_deref(),
            secret_names: self.input.secrets.names(),
            become_user: self.input.become_user.as_deref(),
            attempts: &self.attempts,
            budget: self.budget,
            prior_dispatch: self.prior_dispatch.as_deref(),
            ledger_exit: self.ledger_exit,
            wait: self.input.wait,
            repeats: self.repeats.as_ref().filter(|r| r.action == "block"),
            observed: self.observed.as_deref(),
            held: self.held.as_ref(),
        }
    }

    /// Runs the decided actions until one is the verdict (docs/decisions.md#after-a-lost-connection).
    pub(crate) async fn drive(&mut self, dest: &Destination) -> Result<RunReport, RunError> {
        let mut backoff = Duration::from_millis(200);
        let step = decide::start(&self.facts());
        let mut next = self.apply(step)?;
        loop {
            next = match next {
                Action::Answer(answer) => return self.finish(answer),
                Action::Dispatch => match self.dispatch(dest).await? {
                    Sent::Stopped(report) => return Ok(*report),
                    Sent::Seen(seen) => {
                        let step = decide::after_dispatch(&self.facts(), seen);
                        self.apply(step)?
                    }
                },
                Action::Retry(reason) | Action::Supersede(reason) => {
                    let parent = self.current_attempt();
                    // This invocation's first attempt, after a look at the marker: it is
                    // made because the caller reran the operation.
                    let reason = match reason {
                        RetryReason::ResponseLostAfterDispatch if self.attempts.is_empty() => {
                            self.first_reason
                        }
                        other => other,
                    };
                    self.begin(reason, Some(parent))?;
                    Action::Dispatch
                }
                Action::Backoff => {
                    // A pause past the budget would only end in the budget's answer later.
                    let left = self.deadline.saturating_duration_since(Instant::now());
                    if left < backoff && !self.dispatched && !self.input.wait.is_zero() {
                        tokio::time::sleep(left).await;
                        // The last attempt's `not_sent` is recorded already.
                        return self.budget_spent("on connection attempts", false);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(3));
                    let parent = self.current_attempt();
                    self.begin(RetryReason::ConnectionNotEstablished, Some(parent))?;
                    Action::Dispatch
                }
                Action::Probe => self.probe_window(dest).await?,
            };
        }
    }

    /// Records a decision's evidence, in order, and hands back what to do next.
    fn apply<A>(&mut self, step: Step<A>) -> Result<A, RunError> {
        let attempt = self.current_attempt();
        for effect in step.record {
            match effect {
                Effect::Boundary { boundary, detail } => {
                    self.boundary(&attempt, boundary, &detail)?;
                }
                Effect::Refused { refusal, detail } => {
                    record_boundary(
                        &mut self.ledger,
                        &self.key,
                        &mut self.attempts,
                        &attempt,
                        Boundary::Refused,
                        Some(refusal),
                        &detail,
                    )?;
                }
                Effect::Superseded { note } => self.ledger.append(
                    &self.key,
                    &Event::Superseded {
                        attempt_id: attempt.clone(),
                        note: note.into(),
                    },
                    Durability::Normal,
                )?,
                Effect::Probed(marker) => self.record_probe(&attempt, &marker)?,
                Effect::Unreachable(problem) => self.observe_unreachable(&attempt, &problem)?,
                Effect::Progress(line) => progress(&line),
            }
        }
        Ok(step.then)
    }

    /// Connects and sends the current attempt's `run` request; says how it ended.
    async fn dispatch(&mut self, dest: &Destination) -> Result<Sent, RunError> {
        // In a fleet, this attempt's record waits for the hosts' shared commit.
        self.ledger.release().await?;
        let attempt = self.current_attempt();
        // Before anything was sent, a connect gets what is left of the budget and no more
        // (a cut link would otherwise hold each attempt for its whole ConnectTimeout).
        // `--wait 0s` asks for one look without following, not for no connect at all.
        let connect = self.pool.session(dest);
        let connected = if self.dispatched || self.input.wait.is_zero() {
            connect.await
        } else {
            match tokio::time::timeout_at(self.deadline.into(), connect).await {
                Ok(connected) => connected,
                Err(_) => {
                    let doing = format!("connecting to {}", self.key.host);
                    return self
                        .budget_spent(&doing, true)
                        .map(|r| Sent::Stopped(Box::new(r)));
                }
            }
        };
        let session = match connected {
            Ok(s) => s,
            Err(e) => {
                return Ok(Sent::Seen(Dispatched::NotSent {
                    why: e.to_string(),
                    code: connect_code(&e),
                    final_failure: connect_is_final(&e),
                }))
            }
        };
        if let Some(why) = self.connected(&attempt, &session)? {
            return Ok(Sent::Seen(Dispatched::KeyMismatch(why)));
        }
        let stdin_spec = self.input.stdin.as_ref().map(|s| StdinSpec {
            len: s.len() as u64,
            sha256_hex: hex::encode(
                self.input
                    .stdin_digest()
                    .unwrap_or_else(|| Sha256::digest(s).into()),
            ),
        });
        // A put cut while its content travelled resumes from what the host holds; the
        // digest over the whole content is checked there before anything is claimed.
        let put_from = match (&self.input.stdin, self.input.kind) {
            (Some(s), RunKind::Put) if self.put_spooled > 0 => self.put_spooled.min(s.len() as u64),
            _ => 0,
        };
        if put_from > 0 {
            progress(&format!(
                "resuming the put of op {}: the host holds {put_from} of its {} bytes; sending the rest",
                self.key.op_id,
                self.input.stdin.as_ref().map_or(0, Vec::len)
            ));
        }
        let supersede = self.facts().may_supersede();
        let declared = self.input.declared.ops();
        let verb = Verb::Run(RunCall {
            op: &self.op,
            attempt_id: &attempt,
            host_fingerprint: &self.host_fp,
            family: self.family,
            timeout: self.input.timeout,
            output_cap: self.input.output_cap,
            stdin: stdin_spec,
            supersede_interrupted: supersede,
            repeat: RepeatCheck {
                window: self.repeat_window,
                action: self.on_repeat,
                declared: &declared,
            },
            command: &self.input.command,
            secrets: &self.input.secrets,
            become_user: self.input.become_user.as_deref(),
            locks: &self.input.locks,
            lock_wait: self.input.lock_wait,
            kind: self.input.kind,
            put_from,
        });
        // Borrowed, not copied: a put's content may be large, and it stays in the input
        // for a later attempt.
        let stdin = self
            .input
            .stdin
            .as_deref()
            .map(|s| &s[usize::try_from(put_from).unwrap_or(s.len()).min(s.len())..]);
        fault_point("before_dispatch");
        // The last look before anything leaves: a signal that came in while this poll
        // ran must still keep the request home.
        if let Some(signal) = self.interrupts.received() {
            return self.interrupted(signal).map(|r| Sent::Stopped(Box::new(r)));
        }
        self.dispatched = true;
        self.ledger.dispatched = true;
        self.in_flight = Some(Boundary::SentNoResponse);
        // A claim's output begins at byte 0: a local file's bytes from before go.
        self.output.start_over();
        let expect_root = self.identity.root().map(str::to_owned);
        let mut root_seen = None;
        let end = {
            let mut observer = RunObserver {
                ledger: &mut self.ledger,
                key: &self.key,
                attempt: &attempt,
                attempts: &mut self.attempts,
                output: &mut self.output,
                in_flight: &mut self.in_flight,
                started: &self.started,
                root_seen: &mut root_seen,
                repeats: &mut self.repeats,
                route: session.destination().route().describe(),
                op: &self.key.op_id,
                host: &self.key.host,
                error: None,
            };
            let call = call_shim(
                &session,
                &verb,
                expect_root.as_deref(),
                stdin,
                &mut observer,
            );
            let end = match self.input.wait_scope {
                WaitScope::Probes => Some(call.await),
                // The budget bounds the command too; it runs on, detached by design.
                WaitScope::Invocation | WaitScope::Call => {
                    tokio::time::timeout_at(self.deadline.into(), call)
                        .await
                        .ok()
                }
            };
            if let Some(e) = observer.error {
                return Err(e.into());
            }
            match (end, self.input.wait_scope) {
                (Some(end), _) => end,
                (None, WaitScope::Invocation) => {
                    return self
                        .last_look(dest, &attempt)
                        .await
                        .map(|r| Sent::Stopped(Box::new(r)))
                }
                (None, _) => {
                    return self
                        .budget_spent("while the command ran", false)
                        .map(|r| Sent::Stopped(Box::new(r)))
                }
            }
        };
        // From here the call's end is recorded as the attempt's own boundary.
        self.in_flight = None;
        if let Some(root) = root_seen {
            self.identity.reached_root(&attempt, &root);
        }
        if let CallEnd::Finished(frames) = &end {
            if let Some(why) = self.root_refusal(frames) {
                return Ok(Sent::Seen(Dispatched::RootChanged(why)));
            }
            self.host_repetition(frames, &session)?;
        }
        Ok(Sent::Seen(match end {
            CallEnd::NotSent(why) => Dispatched::NotSent {
                why,
                code: crate::vocab::ReasonCode::ConnectFailed,
                final_failure: false,
            },
            CallEnd::Finished(frames) => {
                let reply = RunReply::from_frames(&frames, &self.redactor).ok_or_else(|| {
                    RunError::Internal(
                        "the shim ended its reply without an exit or a refusal".into(),
                    )
                })?;
                Dispatched::Replied(Box::new(reply))
            }
            CallEnd::Lost {
                never_started: Some(never),
                ..
            } => Dispatched::NeverStarted(never.describe()),
            CallEnd::Lost {
                frames,
                reason,
                never_started: None,
                ..
            } => Dispatched::Lost {
                started: frames.iter().any(|f| matches!(f, Frame::Started { .. })),
                reason,
            },
        }))
    }

    /// One probe window of `--wait` (after a loss, or when another attempt holds the
    /// claim): probe, follow, probe again, until the decision leaves the window.
    async fn probe_window(&mut self, dest: &Destination) -> Result<Action, RunError> {
        let mut deadline = Instant::now() + self.input.wait;
        if self.input.wait_scope != WaitScope::Probes {
            // The window ends with the invocation's budget, and decides as a window does.
            deadline = deadline.min(self.deadline);
        }
        let mut pause = Duration::from_millis(250);
        // A probe whose reply holds no answer reports the last problem seen before it.
        let mut last_problem = String::from("no probe answered");
        loop {
            let window = |pause| Window {
                left: deadline.saturating_duration_since(Instant::now()),
                pause,
            };
            let (seen, session) = self.probe_once(dest, deadline, &last_problem).await;
            if let ProbeSeen::ConnectFailed { problem, .. } | ProbeSeen::NoAnswer(problem) = &seen {
                last_problem.clone_from(problem);
            }
            if let ProbeSeen::Marker(m) = &seen {
                if m.state == crate::shim::MarkerState::Running {
                    let holder = m.attempt.clone().unwrap_or_default();
                    if !self.ours(&holder) {
                        self.followed = Some(holder);
                    }
                }
            }
            let step = decide::after_probe(&self.facts(), seen, window(pause));
            let mut next = self.apply(step)?;
            if let (ProbeAction::Attach { holder, resume }, Some(session)) = (&next, session) {
                let (out_off, err_off) = self.attach_offsets(*resume);
                let remaining = deadline.saturating_duration_since(Instant::now());
                let followed = self.follow(&session, out_off, err_off, remaining).await;
                if let Followed::Lost(why) = &followed {
                    last_problem.clone_from(why);
                }
                let step = decide::after_follow(&self.facts(), holder, followed, window(pause));
                next = self.apply(step)?;
            }
            match next {
                ProbeAction::Then(action) => return Ok(action),
                ProbeAction::Wait => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                ProbeAction::Again => {}
                ProbeAction::Attach { .. } => {
                    return Err(RunError::Internal(
                        "a probe decided to attach without a connection".into(),
                    ))
                }
            }
        }
    }

    /// A command-line `--wait` ran out while the command ran: one look at the marker,
    /// bounded by [`LAST_LOOK`], so that the answer says what the host showed and no more
    /// (docs/decisions.md#wait-budget). Running: `in_progress`, it keeps running; finished
    /// meanwhile: its exit; no answer (a cut link is silent until keepalives give up):
    /// `indeterminate`, it may still be running.
    async fn last_look(
        &mut self,
        dest: &Destination,
        attempt: &str,
    ) -> Result<RunReport, RunError> {
        let budget = crate::duration::format_duration(self.input.wait);
        if let Some(boundary) = self.in_flight {
            let detail = format!(
                "the --wait budget ({budget}) was spent while the command ran; one last probe"
            );
            self.boundary(attempt, boundary, &detail)?;
        }
        progress(&format!(
            "the --wait budget ({budget}) is spent while the command runs on {}: one last look at its marker (at most {}s)",
            self.key.host,
            LAST_LOOK.as_secs()
        ));
        let until = Instant::now() + LAST_LOOK;
        let (seen, session) = self.probe_once(dest, until, "no word from the host").await;
        let spent = |left| Window {
            left,
            pause: LAST_LOOK,
        };
        let step = decide::after_probe(&self.facts(), seen, spent(Duration::ZERO));
        let next = match (self.apply(step)?, session) {
            (ProbeAction::Attach { holder, resume }, Some(session)) => {
                let (out_off, err_off) = self.attach_offsets(resume);
                // Long enough to read an exit that is there, not to follow a command.
                let left = until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(500));
                let followed = self.follow(&session, out_off, err_off, left).await;
                let step =
                    decide::after_follow(&self.facts(), &holder, followed, spent(Duration::ZERO));
                self.apply(step)?
            }
            (next, _) => next,
        };
        match next {
            ProbeAction::Then(Action::Answer(answer)) if answer.verdict != Verdict::InProgress => {
                self.in_flight = None;
                self.finish(answer)
            }
            // Seen running, or not decided by a look (a retry is not made once the
            // budget is spent): the budget's own answer.
            _ => self.budget_spent("while the command ran", false),
        }
    }

    /// Connects (held to the recorded host key) and probes the marker, all bounded by
    /// what is left of `--wait`, so a slow connect cannot overshoot it.
    async fn probe_once(
        &mut self,
        dest: &Destination,
        deadline: Instant,
        last_problem: &str,
    ) -> (ProbeSeen, Option<Session>) {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500));
        let connect = self.saying_while(self.pool.session(dest), deadline, "connecting to probe");
        let connected = match tokio::time::timeout(left, connect).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::new(
                ConnectStage::Connect,
                format!(
                    "no connection within the --wait budget ({}s)",
                    self.input.wait.as_secs()
                ),
            )),
        };
        let session = match connected {
            Ok(s) => s,
            Err(e) => {
                let seen = ProbeSeen::ConnectFailed {
                    problem: e.to_string(),
                    message: e.message,
                };
                return (seen, None);
            }
        };
        if let Err(why) = self.identity.check(
            &self.key.host,
            &self.key.op_id,
            session.host_key().as_deref(),
            Some(&session.destination().route()),
        ) {
            return (ProbeSeen::KeyMismatch(why.message().to_owned()), None);
        }
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500));
        let root = self.identity.root();
        let probe = self.saying_while(host::probe(&session, &self.op, root), deadline, "probing");
        let probe = tokio::time::timeout(left, probe).await;
        let seen = match probe {
            Ok(Ok(m)) => {
                if m.state == crate::shim::MarkerState::Absent {
                    self.put_spooled = m
                        .fields
                        .get("spooled")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
                ProbeSeen::Marker(m)
            }
            Ok(Err(host::CallError::Refused(r))) if r.reason == RefusalReason::RootChanged => {
                let why = self
                    .identity
                    .root_changed(&self.key.host, &self.key.op_id, &r);
                return (ProbeSeen::KeyMismatch(why), None);
            }
            Ok(Err(host::CallError::NoAnswer(_))) => ProbeSeen::NoAnswer(last_problem.to_owned()),
            Ok(Err(e)) => ProbeSeen::NoAnswer(e.to_string()),
            Err(_) => {
                ProbeSeen::NoAnswer("the probe got no answer within the --wait budget".into())
            }
        };
        (seen, Some(session))
    }

    /// Awaits `work` (a connect or a probe of a host that may be cut off), saying every
    /// few seconds that it still waits and how much of the budget is left: a silent
    /// host is never a silent client.
    async fn saying_while<T>(
        &self,
        work: impl std::future::Future<Output = T>,
        deadline: Instant,
        doing: &str,
    ) -> T {
        const EVERY: Duration = Duration::from_secs(5);
        tokio::pin!(work);
        let started = Instant::now();
        let mut tick = tokio::time::interval_at((started + EVERY).into(), EVERY);
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = tick.tick() => progress(&format!(
                    "{doing} {}: no answer for {}s, {}s of --wait left",
                    self.key.host,
                    started.elapsed().as_secs(),
                    deadline.saturating_duration_since(Instant::now()).as_secs()
                )),
            }
        }
    }

    /// Streams the marker's output from the given offsets until it exits, is found
    /// interrupted, the connection drops, or `limit` passes.
    async fn follow(
        &mut self,
        session: &Session,
        out_offset: u64,
        err_offset: u64,
        limit: Duration,
    ) -> Followed {
        let mut observer = OutputObserver {
            output: &mut self.output,
        };
        let root = self.identity.root();
        let attach = host::attach(
            session,
            &self.op,
            out_offset,
            err_offset,
            root,
            &mut observer,
        );
        match tokio::time::timeout(limit, attach).await {
            Err(_) => Followed::StillRunning,
            Ok(Ok(host::Attached::Exit(x))) => Followed::Exit(x),
            Ok(Ok(host::Attached::Interrupted(m))) => Followed::Interrupted(m),
            Ok(Err(host::CallError::Refused(r))) => {
                Followed::Lost(format!("attach refused: {}", r.reason))
            }
            Ok(Err(host::CallError::NoAnswer(_))) => {
                Followed::Lost("attach ended without an answer".into())
            }
            Ok(Err(e)) => Followed::Lost(e.to_string()),
        }
    }

    /// The message for a `run` call the shim refused as `root_changed` (docs/guarantees.md#evidence-identity).
    fn root_refusal(&self, frames: &[Frame]) -> Option<String> {
        frames.iter().find_map(|f| match f {
            Frame::Refused(r) if r.reason == RefusalReason::RootChanged => Some(
                self.identity
                    .root_changed(&self.key.host, &self.key.op_id, r),
            ),
            _ => None,
        })
    }

    fn observe_unreachable(&mut self, attempt: &str, problem: &str) -> Result<(), RunError> {
        self.ledger.append(
            &self.key,
            &Event::Probed {
                attempt_id: Some(attempt.to_owned()),
                state: "unreachable".into(),
                exit_code: None,
                detail: problem.to_owned(),
                claim: None,
            },
            Durability::Normal,
        )?;
        Ok(())
    }

    fn record_probe(&mut self, attempt: &str, marker: &MarkerInfo) -> Result<(), RunError> {
        if marker.state == crate::shim::MarkerState::Completed {
            self.probed_completed.clone_from(&marker.attempt);
        }
        let detail = format!(
            "marker {}{}{}",
            marker.state.as_str(),
            marker
                .why
                .as_deref()
                .map(|w| format!(" ({w})"))
                .unwrap_or_default(),
            marker
                .attempt
                .as_deref()
                .map(|a| format!(", held by attempt {a}"))
                .unwrap_or_default()
        );
        self.ledger.append(
            &self.key,
            &Event::Probed {
                attempt_id: Some(attempt.to_owned()),
                state: marker.state.as_str().into(),
                exit_code: marker.exit_code,
                detail,
                claim: record::claim_seen(marker),
            },
            Durability::Normal,
        )?;
        Ok(())
    }

    /// The command's exit status as far as the evidence goes.
    fn exit_code(&self) -> Option<i32> {
        match &self.exit {
            Some(x) => Some(x.code),
            None if self.exit_from_ledger => self.ledger_exit,
            None => None,
        }
    }

    /// Where an attach starts: after what this invocation has seen of its own attempt's
    /// output (`resume`), else at the marker's first bytes, or after those a local file
    /// holds from an earlier invocation's read (a get resumed).
    fn attach_offsets(&mut self, resume: bool) -> (u64, u64) {
        if resume {
            return (self.output.out_bytes(), self.output.err_bytes());
        }
        let (out, err) = self.output.replay_offsets();
        if out > 0 {
            progress(&format!(
                "resuming the read of op {}: the first {out} bytes of its output are here already; reading the rest",
                self.key.op_id
            ));
        }
        (out, err)
    }

    fn ours(&self, attempt: &str) -> bool {
        self.attempts.iter().any(|a| a.attempt_id == attempt)
    }

    /// `not_applied` says no attempt of the operation may have reached the host. Another
    /// invocation of the op id on this ledger (two callers at once) may have made one
    /// since this run read the ledger: it is read again, and an attempt that is not this
    /// run's is weighed as an earlier dispatch (`indeterminate` unless fenced). Found by
    /// the fault-history checker: a caller whose connect timed out answered `not_applied`
    /// while the other caller's attempt had started the command.
    fn not_applied_rechecked(&mut self, answer: Answer) -> Result<Answer, RunError> {
        if answer.verdict != Verdict::NotApplied || self.prior_dispatch.is_some() {
            return Ok(answer);
        }
        let Some(fresh) = self.ledger.operation(&self.key)? else {
            return Ok(answer);
        };
        if fresh.attempts <= self.attempt_base + self.attempts.len() as u32 {
            return Ok(answer);
        }
        let other = self
            .ledger
            .events(&self.key)?
            .into_iter()
            .rev()
            .find_map(|e| match e.event {
                Event::AttemptDispatched { attempt_id, .. } if !self.ours(&attempt_id) => {
                    Some(attempt_id)
                }
                _ => None,
            });
        let Some(other) = other.or(fresh.last_attempt) else {
            return Ok(answer);
        };
        self.prior_dispatch = Some(other);
        let attempt = answer.attempt_id.clone().unwrap_or_default();
        Ok(decide::earlier_may_have_run(
            &self.facts(),
            &attempt,
            answer,
        ))
    }

    pub(crate) fn current_attempt(&self) -> String {
        self.facts().current()
    }

    /// Records a new attempt durably before it is dispatched (with the intent, for the
    /// first one, in the same transaction).
    pub(crate) fn begin(
        &mut self,
        reason: RetryReason,
        parent: Option<String>,
    ) -> Result<(), RunError> {
        let number = self.attempt_base + self.attempts.len() as u32 + 1;
        let attempt_id = new_attempt_id();
        let mut events = Vec::new();
        if self.attempts.is_empty() {
            events.push(Event::SessionStarted {
                session: self.session_id.clone(),
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").into(),
            });
            // A rerun of a known operation adds attempts, not another intent (the ledger
            // already binds the op id to this fingerprint; it was checked above).
            if self.attempt_base == 0 {
                events.push(self.intended());
            }
            // The approval is what lets this attempt run: recorded with it, durably (a
            // signed one's nonce too, so it never lets another attempt run).
            if let Some(signed) = &self.signed {
                events.push(Event::Approved {
                    by: signed.principal.clone(),
                    note: signed.note.clone(),
                    key: Some(signed.key.clone()),
                    nonce: Some(signed.nonce.clone()),
                });
            } else if let (true, Some(note)) = (self.approved, self.input.approve.clone()) {
                events.push(Event::Approved {
                    by: format!("{} (session {})", self.input.approver, self.session_id),
                    note,
                    key: None,
                    nonce: None,
                });
            }
        }
        events.push(Event::AttemptDispatched {
            attempt_id: attempt_id.clone(),
            number,
            parent: parent.clone(),
            reason,
        });
        self.ledger
            .append_many(&self.key, &events, Durability::Full)?;
        if number > 1 {
            progress(&format!(
                "attempt {number} ({attempt_id}) for op {}: {reason}",
                self.key.op_id
            ));
        }
        self.attempts.push(AttemptSummary {
            attempt_id,
            number,
            parent,
            reason,
            boundary: Boundary::NotSent,
        });
        Ok(())
    }

    fn intended(&self) -> Event {
        Event::Intended {
            session: self.session_id.clone(),
            family: self.family,
            display: self.display.clone(),
            fingerprint: self.ledger_fp.clone(),
            rule: self.rule.clone(),
            secrets: self.input.secrets.names().to_vec(),
            become_user: self.input.become_user.clone(),
            locks: self.input.locks.iter().map(ToString::to_string).collect(),
        }
    }

    /// Denied or blocked: the intent and the verdict are recorded, nothing is sent.
    pub(crate) fn record_closed_intent(&mut self, answer: &Answer) -> Result<(), RunError> {
        let events = [
            self.intended(),
            Event::Verdict {
                attempt_id: None,
                verdict: answer.verdict,
                exit_code: None,
                reason: answer.reason.clone(),
            },
        ];
        match self
            .ledger
            .append_many(&self.key, &events, Durability::Normal)
        {
            Ok(_) => Ok(()),
            // The op id already names another intent: the refusal stands on its own.
            Err(LedgerError::FingerprintConflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The shim refused the claim as a repetition its fingerprint index holds: what it
    /// named is recorded (the verdict follows from the decisions).
    fn host_repetition(&mut self, frames: &[Frame], session: &Session) -> Result<(), RunError> {
        let held = frames.iter().find_map(|f| match f {
            Frame::Refused(r) if r.reason == RefusalReason::Repeats => Some(&r.fields),
            _ => None,
        });
        if let Some(fields) = held {
            let mut found =
                Repetition::from_host(fields, session.destination().route().describe(), "block");
            found.because = Some(self.repeat_because.clone());
            self.ledger
                .append(&self.key, &found.event(), Durability::Normal)?;
            self.repeats = Some(found);
        }
        Ok(())
    }

    /// A repetition held back before anything was sent: the intent, what was found, and
    /// the verdict.
    pub(crate) fn record_held(
        &mut self,
        found: &Repetition,
        answer: &Answer,
    ) -> Result<(), RunError> {
        let events = [
            self.intended(),
            found.event(),
            Event::Verdict {
                attempt_id: None,
                verdict: answer.verdict,
                exit_code: None,
                reason: answer.reason.clone(),
            },
        ];
        self.ledger
            .append_many(&self.key, &events, Durability::Normal)?;
        Ok(())
    }

    /// `--repeats` / `--amends`: the link under this operation and, when the ledger holds
    /// the other one on this host, the reverse link under it (so `show` displays it on
    /// both; the other keeps its own state and outcome). Recorded once.
    pub(crate) fn record_links(&mut self) -> Result<(), RunError> {
        let links = self.input.declared.links();
        if links.is_empty() {
            return Ok(());
        }
        let ours: Vec<Event> = self
            .ledger
            .events(&self.key)?
            .into_iter()
            .map(|e| e.event)
            .collect();
        for (relation, other_op) in links {
            let link = Event::Linked {
                relation,
                other_op: other_op.clone(),
                other_host: self.key.host.clone(),
            };
            if ours.contains(&link) {
                continue;
            }
            self.ledger.append(&self.key, &link, Durability::Normal)?;
            let other = OpKey::new(other_op, self.key.host.clone());
            if self.ledger.operation(&other)?.is_some() {
                let back = Event::Linked {
                    relation: relation.reverse(),
                    other_op: self.key.op_id.clone(),
                    other_host: self.key.host.clone(),
                };
                self.ledger.append(&other, &back, Durability::Normal)?;
            }
        }
        Ok(())
    }

    pub(crate) fn boundary(
        &mut self,
        attempt: &str,
        boundary: Boundary,
        detail: &str,
    ) -> Result<(), RunError> {
        record_boundary(
            &mut self.ledger,
            &self.key,
            &mut self.attempts,
            attempt,
            boundary,
            None,
            detail,
        )?;
        Ok(())
    }

    /// A connection for `attempt` is up: holds the host key to the one this operation
    /// ran against (docs/guarantees.md#host-identity), then records the route and key before anything is
    /// sent. `Some` says why it is another machine.
    fn connected(&mut self, attempt: &str, session: &Session) -> Result<Option<String>, RunError> {
        let seen = session.host_key();
        let route = session.destination().route();
        if let Err(why) = self.identity.check(
            &self.key.host,
            &self.key.op_id,
            seen.as_deref(),
            Some(&route),
        ) {
            return Ok(Some(why.message().to_owned()));
        }
        let Some(host_key) = seen else {
            return Ok(None);
        };
        self.ledger.append(
            &self.key,
            &Event::Connected {
                attempt_id: attempt.to_owned(),
                route: route.clone(),
                host_key: host_key.clone(),
            },
            Durability::Normal,
        )?;
        self.identity.connected(attempt, route, &host_key);
        Ok(None)
    }

    /// The answer to an attempt that never left (the name did not resolve): records
    /// `not_sent` and answers.
    pub(crate) fn unresolvable(&mut self, why: &str) -> Result<RunReport, RunError> {
        let step = decide::after_dispatch(
            &self.facts(),
            Dispatched::NotSent {
                why: why.to_owned(),
                code: crate::vocab::ReasonCode::NameUnresolvable,
                final_failure: true,
            },
        );
        match self.apply(step)? {
            Action::Answer(answer) => self.finish(answer),
            _ => Err(RunError::Internal(
                "a final connect failure decided no verdict".into(),
            )),
        }
    }

    /// Records the exit (if any) and the verdict; builds the report.
    pub(crate) fn finish(&mut self, answer: Answer) -> Result<RunReport, RunError> {
        let answer = self.not_applied_rechecked(answer)?;
        let answer = self.with_spent_token(answer);
        self.take_exit(&answer);
        let exit_code = self.exit_code();
        let probed_already = |x: &ExitFrame| {
            self.probed_completed.as_deref() == Some(x.attempt.as_str()) && !x.attempt.is_empty()
        };
        // What the run ends with goes in one commit (each commit rewrites the same index
        // pages: a run's tail of two or three commits was a third of its log's pages).
        let mut tail = Vec::new();
        // A probe of this run that saw the marker completed already holds that evidence.
        if let Some(x) = self
            .exit
            .clone()
            .filter(|x| !self.ours(&x.attempt) && !probed_already(x))
        {
            // A replay is an observation of an earlier attempt's exit, not a new exit.
            tail.push(Event::Probed {
                attempt_id: Some(x.attempt.clone()),
                state: "completed".into(),
                exit_code: Some(x.code),
                detail: format!(
                    "replayed from the host marker: {} stdout and {} stderr bytes",
                    self.output.out_bytes(),
                    self.output.err_bytes()
                ),
                claim: Some(crate::ledger::event::ClaimSeen {
                    attempt: Some(x.attempt.clone()).filter(|a| !a.is_empty()),
                }),
            });
        }
        let observed = self.observation(&answer, exit_code);
        if let Some(o) = &observed {
            tail.push(Event::Observed {
                kind: o.kind.clone(),
                reading: o.reading.clone(),
                effect: o.effect.clone(),
            });
        }
        let exited = self.exit.clone().filter(|x| self.ours(&x.attempt));
        if let Some(x) = &exited {
            tail.push(Event::ExitReceived {
                attempt_id: x.attempt.clone(),
                exit_code: Some(x.code),
                signal: None,
                timed_out: x.timed_out,
                stdout_bytes: self.output.out_bytes(),
                stderr_bytes: self.output.err_bytes(),
                stdout_sha256: self.output.out_sha256(),
                stderr_sha256: self.output.err_sha256(),
            });
        }
        tail.push(Event::Verdict {
            attempt_id: answer.attempt_id.clone(),
            verdict: answer.verdict,
            exit_code,
            reason: answer.reason.clone(),
        });
        self.ledger
            .append_after_dispatch(&self.key, &tail, Durability::Normal)?;
        // After the ledger, as for every boundary: the summary never says more.
        self.observations.extend(observed);
        if let Some(x) = exited {
            if let Some(a) = self.attempts.iter_mut().find(|a| a.attempt_id == x.attempt) {
                a.boundary = a.boundary.max(Boundary::ExitReceived);
            }
        }
        Ok(self.report(answer))
    }

    /// A run answered from evidence (a replay, a follow, a look that made no attempt)
    /// records what it read and what that did to the state, as an observation
    /// (docs/ledger.md#observations). A run whose own attempt ran the command records none.
    fn observation(&self, answer: &Answer, exit_code: Option<i32>) -> Option<ObservationReport> {
        let host_exit = match &answer.exit {
            ExitEvidence::Host(x) => Some(x.clone()),
            _ => None,
        };
        if host_exit.as_ref().is_some_and(|x| self.ours(&x.attempt)) {
            return None;
        }
        let exit = exit_code.map_or_else(|| "no exit status".to_owned(), |c| format!("exit {c}"));
        let settles = !matches!(answer.verdict, Verdict::Indeterminate | Verdict::InProgress);
        let effect_of = |what: &str| {
            if !settles {
                format!("left unsettled: {what}")
            } else if self.was_unresolved {
                format!("settled as {what}")
            } else {
                format!("no change: already settled; {what}")
            }
        };
        let claim_note = match self.attempts.first() {
            Some(a) => format!(
                "; the claim request of attempt {} ran nothing",
                a.attempt_id
            ),
            None => String::new(),
        };
        let (kind, reading, effect) = match (&host_exit, &self.followed) {
            (Some(x), Some(holder)) if *holder == x.attempt => (
                ObservationKind::Follow,
                format!(
                    "attempt {} held the claim and was running; followed it until it exited with {exit} ({} stdout and {} stderr bytes){claim_note}",
                    x.attempt,
                    self.output.out_bytes(),
                    self.output.err_bytes()
                ),
                effect_of(&format!("completed {exit}; nothing ran again")),
            ),
            (Some(x), _) => (
                if self.ledger_exit.is_some() {
                    ObservationKind::ReplayFromLedger
                } else {
                    ObservationKind::ReplayFromHost
                },
                format!(
                    "{}the host marker holds the exit of attempt {} ({exit}); replayed {} stdout and {} stderr bytes{claim_note}",
                    if self.ledger_exit.is_some() {
                        "the ledger already held this operation's exit; "
                    } else {
                        ""
                    },
                    x.attempt,
                    self.output.out_bytes(),
                    self.output.err_bytes()
                ),
                effect_of(&format!("completed {exit}; nothing ran again")),
            ),
            (None, Some(holder)) if answer.code == ReasonCode::StillRunning => (
                ObservationKind::Follow,
                format!(
                    "attempt {holder} holds the claim and is running; followed it for {}s ({} stdout and {} stderr bytes so far){claim_note}",
                    self.input.wait.as_secs(),
                    self.output.out_bytes(),
                    self.output.err_bytes()
                ),
                "left unsettled: still running on the host; a rerun with the same op id follows it again".to_owned(),
            ),
            _ if !self.attempts.is_empty() => return None,
            (None, _) => (
                match answer.exit {
                    ExitEvidence::Ledger(_) => ObservationKind::ReplayFromLedger,
                    _ => ObservationKind::Probe,
                },
                answer.reason.clone(),
                effect_of(&format!("{} ({}), {exit}", answer.verdict, answer.code)),
            ),
        };
        Some(ObservationReport {
            kind,
            reading,
            effect,
        })
    }

    /// Keeps the exit status the answer rests on.
    fn take_exit(&mut self, answer: &Answer) {
        match &answer.exit {
            ExitEvidence::None => {}
            ExitEvidence::Host(x) => self.exit = Some(x.clone()),
            ExitEvidence::Ledger(code) => {
                self.ledger_exit = *code;
                self.exit_from_ledger = true;
            }
        }
    }

    /// A signal stopped this run: records how far the current attempt got and what the
    /// caller is told, then answers (the decision is [`decide::client_interrupted`]).
    pub(crate) fn interrupted(&mut self, signal: ClientSignal) -> Result<RunReport, RunError> {
        let boundary = self
            .attempts
            .last()
            .map(|a| a.boundary)
            .into_iter()
            .chain(self.in_flight)
            .max()
            .unwrap_or(Boundary::NotSent);
        if let Some(a) = self.attempts.last_mut() {
            a.boundary = boundary;
        }
        let decided = decide::client_interrupted(&self.facts(), signal, self.dispatched, boundary);
        self.ledger.append(
            &self.key,
            &Event::ClientInterrupted {
                attempt_id: decided.answer.attempt_id.clone(),
                boundary,
                signal: signal.name().into(),
                detail: decided.detail,
            },
            Durability::Normal,
        )?;
        if decided.record_verdict {
            self.finish(decided.answer)
        } else {
            Ok(self.report(decided.answer))
        }
    }

    /// The `--wait` budget of the invocation is spent `doing` something: recorded and
    /// answered as a signal would be, under its own code (docs/decisions.md#wait-budget);
    /// `cut_connect`: the current attempt's connect was cut, its `not_sent` is recorded here.
    pub(crate) fn budget_spent(
        &mut self,
        doing: &str,
        cut_connect: bool,
    ) -> Result<RunReport, RunError> {
        let boundary = self
            .attempts
            .last()
            .map(|a| a.boundary)
            .into_iter()
            .chain(self.in_flight)
            .max()
            .unwrap_or(Boundary::NotSent);
        self.in_flight = None;
        let decided = decide::wait_budget_spent(&self.facts(), self.dispatched, boundary, doing);
        let attempt = self.current_attempt();
        if cut_connect {
            self.boundary(&attempt, Boundary::NotSent, &decided.detail)?;
        }
        if decided.record_verdict {
            self.finish(decided.answer)
        } else {
            Ok(self.report(decided.answer))
        }
    }

    /// `--detach`: the claim is acknowledged; answers `in_progress`.
    pub(crate) fn detached(&mut self) -> Result<RunReport, RunError> {
        let answer = decide::detached(&self.facts());
        self.finish(answer)
    }

    /// The ledger refused a write after dispatch: the verdict claims no more than that.
    pub(crate) fn ledger_failed(&self, message: &str) -> RunReport {
        self.report(decide::ledger_failed_after_dispatch(&self.facts(), message))
    }

    /// A hold that a spent signed approval did not lift says so, with its own code.
    pub(crate) fn with_spent_token(&self, mut answer: Answer) -> Answer {
        if let (Some(why), crate::vocab::ReasonCode::ApprovalRequired) = (&self.spent, answer.code)
        {
            answer.code = crate::vocab::ReasonCode::ApprovalUsed;
            answer.reason = format!("{why}, so it does not lift this hold: {}", answer.reason);
        }
        answer
    }

    pub(crate) fn report(&self, answer: Answer) -> RunReport {
        let answer = self.with_spent_token(answer);
        let output_collected = self.exit.as_ref().is_some_and(|x| x.output_collected);
        let output_available =
            !(output_collected || answer.code == crate::vocab::ReasonCode::ReplayedFromLedger);
        let mut answer = answer;
        if output_collected {
            answer.reason.push_str(
                "; its output was collected by gc on the host (a tombstone keeps the exit status, nothing else), so none is replayed",
            );
        }
        RunReport {
            op_id: self.key.op_id.clone(),
            host: self.key.host.clone(),
            attempt_id: answer.attempt_id,
            family: self.family,
            verdict: answer.verdict,
            exit_code: self.exit_code(),
            stdout: self.output.kept_stdout(),
            stderr: self.output.kept_stderr(),
            attempts: self.attempts.clone(),
            fingerprint: self.ledger_fp.clone(),
            reason: answer.reason,
            reason_code: answer.code,
            retryable: answer.code.retryable(),
            rule: self.rule.clone(),
            timed_out: self.exit.as_ref().is_some_and(|x| x.timed_out),
            dropped: self
                .exit
                .as_ref()
                .map_or((0, 0), |x| (x.dropped_out, x.dropped_err)),
            ledger_error: self.ledger.failed().cloned(),
            repeats: self.repeats.clone(),
            // Evidence, not assumption: what the command wrote (kept + dropped on the host)
            // against what reached this caller.
            truncated: self.exit.as_ref().is_some_and(|x| {
                let (kept_out, kept_err) = kept(x);
                self.output.out_bytes() < kept_out + x.dropped_out
                    || self.output.err_bytes() < kept_err + x.dropped_err
            }),
            kept: self.exit.as_ref().map_or((0, 0), kept),
            output_collected,
            output_available,
            cancelled: self.exit.as_ref().is_some_and(|x| x.cancelled),
            observations: self.observations.clone(),
            approval_needed: answer.approval.map(|a| *a),
            conflict_differs: answer.differs,
        }
    }
}

/// Bytes the host kept per stream (stdout, stderr), from the trailer.
fn kept(x: &ExitFrame) -> (u64, u64) {
    (
        x.kept_out.unwrap_or(x.out_bytes),
        x.kept_err.unwrap_or(x.err_bytes),
    )
}

/// THE one way an attempt's boundary is recorded: the ledger first, then this
/// invocation's summary, so `run --json`'s `attempts[]` (and every decision made from
/// it) says exactly what the ledger says, never more.
fn record_boundary(
    ledger: &mut RunLedger<'_>,
    key: &OpKey,
    attempts: &mut [AttemptSummary],
    attempt: &str,
    boundary: Boundary,
    refusal: Option<RefusalWord>,
    detail: &str,
) -> Result<(), LedgerError> {
    ledger.append(
        key,
        &Event::BoundaryReached {
            attempt_id: attempt.to_owned(),
            boundary,
            detail: detail.to_owned(),
            refusal,
        },
        Durability::Normal,
    )?;
    if let Some(a) = attempts.iter_mut().find(|a| a.attempt_id == attempt) {
        a.boundary = a.boundary.max(boundary);
    }
    Ok(())
}

/// Streams a run call: output to the caller, `started` to the ledger as soon as seen.
struct RunObserver<'r, 'a> {
    ledger: &'r mut RunLedger<'a>,
    key: &'r OpKey,
    attempt: &'r str,
    attempts: &'r mut Vec<AttemptSummary>,
    output: &'r mut Output,
    /// Raised to `started` on the claim acknowledgement, for an interruption mid-call.
    in_flight: &'r mut Option<Boundary>,
    /// Told of the claim acknowledgement once it is recorded (for `--detach`).
    started: &'r Notify,
    /// The marker root id the shim reported (`M`), recorded as this attempt's.
    root_seen: &'r mut Option<String>,
    /// The repetition this run already knows of (from the ledger), or the one the shim's
    /// fingerprint index reports (`W`: the policy warns, the command runs).
    repeats: &'r mut Option<Repetition>,
    /// How this call reached the host, for a repetition seen there.
    route: String,
    op: &'r str,
    host: &'r str,
    error: Option<LedgerError>,
}

impl CallObserver for RunObserver<'_, '_> {
    fn stdout(&mut self, bytes: &[u8]) {
        self.output.stdout(bytes);
    }
    fn stderr(&mut self, bytes: &[u8]) {
        self.output.stderr(bytes);
    }
    fn frame(&mut self, frame: &Frame) {
        if let Frame::Exit(_) = frame {
            fault_point("after_exit");
        }
        if let Frame::Root { id } = frame {
            // Recorded before the claim's acknowledgement can be: a later call for this
            // operation names the root its attempt reached (docs/guarantees.md#evidence-identity).
            let event = Event::MarkerRoot {
                attempt_id: self.attempt.to_owned(),
                root_id: id.clone(),
            };
            match self.ledger.append(self.key, &event, Durability::Normal) {
                Ok(_) => *self.root_seen = Some(id.clone()),
                Err(e) => {
                    self.error.get_or_insert(e);
                }
            }
        }
        if let (Frame::Repeats(fields), None) = (frame, &self.repeats) {
            // The host knows of a repetition the ledger did not (another ledger, another
            // machine): recorded and said before the command's output.
            let found = Repetition::from_host(fields, self.route.clone(), "warn");
            if let Err(e) = self
                .ledger
                .append(self.key, &found.event(), Durability::Normal)
            {
                self.error.get_or_insert(e);
            }
            progress(&found.warning(self.op, self.host));
            *self.repeats = Some(found);
        }
        if let Frame::Started { .. } = frame {
            *self.in_flight = Some(Boundary::Started);
            let result = record_boundary(
                self.ledger,
                self.key,
                self.attempts,
                self.attempt,
                Boundary::Started,
                None,
                "the shim claimed the marker and started the command",
            );
            match result {
                // Only a recorded `started` may end a detached run: the ledger must know
                // the command may be running before the caller is told it is.
                Ok(()) => self.started.notify_one(),
                Err(e) => {
                    self.error.get_or_insert(e);
                }
            }
            fault_point("after_started");
        }
    }
}

struct OutputObserver<'r> {
    output: &'r mut Output,
}

impl CallObserver for OutputObserver<'_> {
    fn stdout(&mut self, bytes: &[u8]) {
        self.output.stdout(bytes);
    }
    fn stderr(&mut self, bytes: &[u8]) {
        self.output.stderr(bytes);
    }
    fn frame(&mut self, _: &Frame) {}
}
/// A fresh attempt id: `at-<16 hex>` (same charset as op ids, safe on the host).
fn new_attempt_id() -> String {
    format!("at-{:016x}", rand::random::<u64>())
}
