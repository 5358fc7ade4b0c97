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
use crate::ledger::{Durability, Event, LedgerError, OpKey, RefusalWord};
use crate::op_id::OpId;
use crate::policy::AfterInterrupted;
use crate::shim::{ExitFrame, Frame, MarkerInfo, RefusalReason, RunRequest, StdinSpec, Verb};
use crate::ssh::{ConnectError, ConnectStage, Destination, Pool, Session};
use crate::vocab::{Boundary, RetryReason};

use super::decide::{
    self, connect_code, connect_is_final, Action, Answer, Dispatched, Effect, ExitEvidence, Facts,
    Followed, ProbeAction, ProbeSeen, RunReply, Step, Window,
};
use super::identity::Recorded;
use super::interrupt::{ClientSignal, Interrupts};
use super::output::Output;
use super::record::{self, RunLedger};
use super::{fault_point, new_attempt_id, progress, AttemptSummary, RunError, RunInput, RunReport};

/// The state of one `run`.
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
    /// When the `--wait` budget of this invocation is spent (docs/decisions.md#wait-budget):
    /// no connect before dispatch outlasts it, and over MCP no running command either.
    pub(crate) deadline: Instant,
    pub(crate) input: RunInput,
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
            approved: self.input.approve.is_some(),
            host_fp: &self.host_fp,
            attempts: &self.attempts,
            budget: self.budget,
            prior_dispatch: self.prior_dispatch.as_deref(),
            ledger_exit: self.ledger_exit,
            wait: self.input.wait,
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
                    self.begin(reason, Some(parent))?;
                    Action::Dispatch
                }
                Action::Backoff => {
                    // A pause past the budget would only end in the budget's answer later.
                    let left = self.deadline.saturating_duration_since(Instant::now());
                    if left < backoff && !self.dispatched {
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
        let attempt = self.current_attempt();
        // Before anything was sent, a connect gets what is left of the budget and no more
        // (a cut link would otherwise hold each attempt for its whole ConnectTimeout).
        let connect = self.pool.session(dest);
        let connected = if self.dispatched {
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
            sha256_hex: hex::encode(Sha256::digest(s)),
        });
        let supersede = self.facts().may_supersede();
        let verb = Verb::Run(RunRequest {
            op: &self.op,
            attempt_id: &attempt,
            host_fingerprint: &self.host_fp,
            family: self.family,
            timeout: self.input.timeout,
            output_cap: self.input.output_cap,
            stdin: stdin_spec,
            supersede_interrupted: supersede,
            command: &self.input.command,
        });
        let stdin = self.input.stdin.clone();
        fault_point("before_dispatch");
        // The last look before anything leaves: a signal that came in while this poll
        // ran must still keep the request home.
        if let Some(signal) = self.interrupts.received() {
            return self.interrupted(signal).map(|r| Sent::Stopped(Box::new(r)));
        }
        self.dispatched = true;
        self.ledger.dispatched = true;
        self.in_flight = Some(Boundary::SentNoResponse);
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
                error: None,
            };
            let call = call_shim(
                &session,
                &verb,
                expect_root.as_deref(),
                stdin,
                &mut observer,
            );
            let end = if self.input.wait_bounds_command {
                // MCP: the tool call never outlasts its budget; the command runs on.
                tokio::time::timeout_at(self.deadline.into(), call)
                    .await
                    .ok()
            } else {
                Some(call.await)
            };
            if let Some(e) = observer.error {
                return Err(e.into());
            }
            match end {
                Some(end) => end,
                None => {
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
        }
        Ok(Sent::Seen(match end {
            CallEnd::NotSent(why) => Dispatched::NotSent {
                why,
                code: crate::vocab::ReasonCode::ConnectFailed,
                final_failure: false,
            },
            CallEnd::Finished(frames) => {
                let reply = RunReply::from_frames(&frames).ok_or_else(|| {
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
        if self.input.wait_bounds_command {
            // MCP: the window ends with the call's budget, and decides as a window does.
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
            let step = decide::after_probe(&self.facts(), seen, window(pause));
            let mut next = self.apply(step)?;
            if let (ProbeAction::Attach { holder, resume }, Some(session)) = (&next, session) {
                let (out_off, err_off) = if *resume {
                    (self.output.out_bytes(), self.output.err_bytes())
                } else {
                    (0, 0)
                };
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
        let connected = match tokio::time::timeout(left, self.pool.session(dest)).await {
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
        let probe = tokio::time::timeout(left, host::probe(&session, &self.op, root)).await;
        let seen = match probe {
            Ok(Ok(m)) => ProbeSeen::Marker(m),
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

    fn ours(&self, attempt: &str) -> bool {
        self.attempts.iter().any(|a| a.attempt_id == attempt)
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
        self.take_exit(&answer);
        let exit_code = self.exit_code();
        if let Some(x) = self.exit.clone().filter(|x| !self.ours(&x.attempt)) {
            // A replay is an observation of an earlier attempt's exit, not a new exit.
            self.ledger.append(
                &self.key,
                &Event::Probed {
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
                },
                Durability::Normal,
            )?;
        }
        if let Some(x) = self.exit.clone().filter(|x| self.ours(&x.attempt)) {
            self.ledger.append(
                &self.key,
                &Event::ExitReceived {
                    attempt_id: x.attempt.clone(),
                    exit_code: Some(x.code),
                    signal: None,
                    timed_out: x.timed_out,
                    stdout_bytes: self.output.out_bytes(),
                    stderr_bytes: self.output.err_bytes(),
                    stdout_sha256: self.output.out_sha256(),
                    stderr_sha256: self.output.err_sha256(),
                },
                Durability::Normal,
            )?;
            // After the ledger, as for every boundary: the summary never says more.
            if let Some(a) = self.attempts.iter_mut().find(|a| a.attempt_id == x.attempt) {
                a.boundary = a.boundary.max(Boundary::ExitReceived);
            }
        }
        self.ledger.append(
            &self.key,
            &Event::Verdict {
                attempt_id: answer.attempt_id.clone(),
                verdict: answer.verdict,
                exit_code,
                reason: answer.reason.clone(),
            },
            Durability::Normal,
        )?;
        Ok(self.report(answer))
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

    pub(crate) fn report(&self, answer: Answer) -> RunReport {
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
