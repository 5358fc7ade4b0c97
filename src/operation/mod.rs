//! One operation's lifecycle: classify, record the intent, dispatch attempts through the
//! shim, and, after a lost connection, probe the marker before anything else (SPEC
//! sections 2 and 4). Every retry decision is made in this file, in [`Runner::drive`].
//!
//! - [`call`]: one shim call over SSH, streamed to an observer.
//! - [`interrupt`]: SIGINT/SIGTERM/SIGHUP to the client, answered by [`run_interruptible`].
//! - [`output`]: the caller's view of the output (offsets for re-attach, digests).
//! - [`identity`]: which machine an operation ran on, and the host key check.
//! - [`fleet`]: one operation on many hosts (SPEC section 11): forks, failure budget,
//!   rolling batches, the combined answer.

pub mod call;
pub mod fleet;
pub mod identity;
pub mod interrupt;
pub mod output;
pub mod reconcile;
pub mod record;

use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind};
use crate::family::Family;
use crate::ledger::fingerprint::{self, InstallationKey, Intent};
use crate::ledger::{Durability, Event, Ledger, LedgerError, OpKey, Redactor, StoredEvent};
use crate::op_id::OpId;
use crate::policy::{AfterInterrupted, Classification, Policy};
use crate::shim::{ExitFrame, Frame, MarkerInfo, MarkerState, RunRequest, StdinSpec, Verb};
use crate::ssh::{self, ConnectError, ConnectStage, Destination, HostSpec, Pool, Session};
use crate::vocab::{Boundary, ReasonCode, RetryReason, Verdict};

use call::{call_shim, CallEnd, CallObserver, FramesOnly};
use identity::Recorded;
use interrupt::{ClientSignal, Interrupts};
use output::Output;
use record::{LedgerWriteError, RunLedger};

/// What the caller asked `opmark run` to do.
#[derive(Debug, Clone)]
pub struct RunInput {
    /// Where (host as typed plus connection options).
    pub host: HostSpec,
    /// The operation id (given or minted).
    pub op: OpId,
    /// The command string (words joined by spaces), run by `sh -c` on the host.
    pub command: String,
    /// `--class`: at least this family.
    pub class: Option<Family>,
    /// Spooled stdin, when `--stdin`.
    pub stdin: Option<Vec<u8>>,
    /// `--timeout`, enforced by the shim on the host.
    pub timeout: Option<Duration>,
    /// `--attempts`, else the family's budget.
    pub attempts: Option<u32>,
    /// `--wait`: how long to follow a running operation, and to keep probing an
    /// unreachable host, before answering.
    pub wait: Duration,
    /// `--approve NOTE`.
    pub approve: Option<String>,
    /// Who approves (`$USER`).
    pub approver: String,
    /// Stream output live (plain mode) instead of keeping it for JSON.
    pub live_output: bool,
    /// Per-stream output cap on the host.
    pub output_cap: u64,
    /// Live output lines start with this (`host: `) when several hosts run.
    pub prefix: Option<String>,
    /// `--detach`: answer `in_progress` (reason code `detached`) once the shim has
    /// acknowledged the claim, leaving the command running.
    pub detach: bool,
}

impl RunInput {
    /// The canonical intent: the command and the digest of the stdin it is given.
    pub fn intent(&self) -> Intent<'_> {
        Intent {
            command: &self.command,
            stdin_sha256: self.stdin.as_ref().map(|s| Sha256::digest(s).into()),
        }
    }
}

/// The family a run uses and the rule that decided it: the policy's, made stricter (never
/// milder) by `--class`.
pub(crate) fn family_and_rule(
    classification: &Classification,
    input: &RunInput,
) -> (Family, String) {
    let family = input.class.map_or(classification.family, |class| {
        classification.family.max(class)
    });
    let rule = classification
        .parts
        .iter()
        .find(|p| p.family == classification.family)
        .map_or_else(|| "no parts: read-only".to_owned(), |p| p.rule.clone());
    (family, rule)
}

/// What the process using the library shares with a run.
#[derive(Debug)]
pub struct RunEnv<'a> {
    /// The ledger.
    pub ledger: &'a mut Ledger,
    /// The policy.
    pub policy: &'a Policy,
    /// The per-installation fingerprint key.
    pub key: &'a InstallationKey,
    /// This session's id.
    pub session_id: String,
    /// SSH connections, shared by every call of this process.
    pub pool: &'a Pool,
}

/// One attempt as reported to the caller.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptSummary {
    /// Attempt id.
    pub attempt_id: String,
    /// 1, 2, ...
    pub number: u32,
    /// The attempt it retries.
    pub parent: Option<String>,
    /// Why it was made.
    pub reason: RetryReason,
    /// How far it got.
    pub boundary: Boundary,
}

/// The answer of `opmark run` (the `--json` document, SPEC section 6).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Operation id.
    pub op_id: String,
    /// Host as the ledger names it.
    pub host: String,
    /// The attempt the verdict is about (the one that ran the command, when known).
    pub attempt_id: Option<String>,
    /// Family used for the decision.
    pub family: Family,
    /// The verdict.
    pub verdict: Verdict,
    /// The command's exit status; null when unknown.
    pub exit_code: Option<i32>,
    /// Captured stdout (lossy UTF-8; empty in plain mode, where it was streamed).
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
    /// Every attempt this invocation made.
    pub attempts: Vec<AttemptSummary>,
    /// The ledger fingerprint of the intent.
    pub fingerprint: String,
    /// Why this verdict, in words an agent can log.
    pub reason: String,
    /// Why this verdict, for machines (stable snake_case, SPEC section 2).
    pub reason_code: ReasonCode,
    /// True only when a rerun with the same op id may change the outcome without a human.
    pub retryable: bool,
    /// The policy rule that decided the family.
    pub rule: String,
    /// The command was killed at `--timeout`.
    pub timed_out: bool,
    /// Output bytes the host dropped beyond its cap (stdout, stderr).
    pub dropped: (u64, u64),
    /// A ledger write that failed after dispatch: the verdict stands, the ledger does not
    /// hold it, and a rerun with the same op id replays it from the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_error: Option<LedgerWriteError>,
    /// The output delivered here lacks bytes the command wrote: it came from the host's
    /// capped copy (a replay, or a re-attach after bytes were dropped).
    pub truncated: bool,
    /// Bytes kept in the host's copy per stream (stdout, stderr): the cap a truncated
    /// replay was cut at.
    #[serde(skip)]
    pub kept: (u64, u64),
}

impl RunReport {
    /// The process exit status for this report (SPEC section 2).
    pub fn exit_status(&self) -> u8 {
        match self.verdict.reserved_exit_code() {
            Some(code) => code,
            None => self.exit_code.map_or(0, |c| (c & 0xff) as u8),
        }
    }
}

/// Runs one operation end to end. Errors are opmark's own failures (ledger, policy);
/// every outcome about the operation, unknown included, is a verdict in the report.
pub async fn run(env: RunEnv<'_>, input: RunInput) -> Result<RunReport, Error> {
    run_interruptible(env, input, &Interrupts::never()).await
}

/// [`run`], stopped by the first of `interrupts` (SPEC section 10): what was reached is
/// recorded (a `client_interrupted` event, then the verdict) and the report says
/// `in_progress` when this invocation's request may have reached the host (the command
/// keeps running, detached by design) or `not_applied` when nothing was sent, with the
/// reason code `client_interrupted`. Nothing is sent once a signal has been seen.
pub async fn run_interruptible(
    env: RunEnv<'_>,
    input: RunInput,
    interrupts: &Interrupts,
) -> Result<RunReport, Error> {
    let classification = env.policy.classify(&input.command);
    let (family, rule) = family_and_rule(&classification, &input);
    let redactor = Redactor::new(env.policy.redact_patterns());
    let display = redactor.redact_owned(&input.command);
    let intent = input.intent();
    let host_fp = fingerprint::host_fingerprint(&intent);
    let ledger_fp = fingerprint::ledger_fingerprint(&intent, env.key);

    // The ledger names the host as the user did; resolution problems are a verdict.
    let resolved = ssh::resolve(&input.host);
    // A malformed or unsupported ssh config is the user's to fix: an error (exit 246)
    // before any ledger record, never a "safe to retry" verdict.
    if let Err(e) = &resolved {
        if e.stage == ConnectStage::Config {
            return Err(Error::new(ErrorKind::Config, e.to_string()));
        }
    }
    let host_name = match &resolved {
        Ok(dest) => dest.display(),
        Err(_) => input.host.host.clone(),
    };
    let key = OpKey::new(input.op.as_str(), host_name.clone());
    let family_policy = env.policy.family(family).clone();
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let detach = input.detach;
    let mut runner = Runner {
        ledger: RunLedger::new(env.ledger),
        pool: env.pool,
        key,
        op: input.op.clone(),
        session_id: env.session_id,
        family,
        rule: rule.clone(),
        host_fp,
        ledger_fp: ledger_fp.clone(),
        display,
        attempts: Vec::new(),
        budget: input.attempts.unwrap_or(family_policy.attempts).max(1),
        after_interrupted: family_policy.after_interrupted,
        output: match (&input.prefix, input.live_output) {
            (Some(prefix), true) => Output::prefixed(prefix.clone()),
            _ => Output::new(input.live_output),
        },
        exit: None,
        attempt_base: 0,
        prior_dispatch: None,
        ledger_exit: None,
        exit_from_ledger: false,
        identity: Recorded::default(),
        interrupts: interrupts.clone(),
        in_flight: None,
        dispatched: false,
        started: started.clone(),
        input,
    };

    if let Some(rule) = &classification.deny {
        let reason = format!(
            "policy denies this command ({rule}); nothing was sent. Change the command or the policy"
        );
        runner.record_closed_intent(Verdict::Refused, &reason)?;
        return Ok(runner.report(Answer::new(
            Verdict::Refused,
            None,
            ReasonCode::PolicyDenied,
            reason,
        )));
    }
    if let Some(rule) = &classification.approval {
        if runner.input.approve.is_none() {
            let reason = format!(
                "policy requires approval for this command ({rule}); rerun with --approve NOTE"
            );
            runner.record_closed_intent(Verdict::Blocked, &reason)?;
            return Ok(runner.report(Answer::new(
                Verdict::Blocked,
                None,
                ReasonCode::ApprovalRequired,
                reason,
            )));
        }
    }

    // The ledger guards the op id: a different intent under it is a conflict before
    // anything is sent. An earlier attempt becomes this run's first parent.
    let existing = runner.ledger.operation(&runner.key)?;
    let (first_reason, first_parent) = match existing.as_ref().and_then(|r| r.last_attempt.clone())
    {
        Some(parent) if runner.input.approve.is_some() => {
            (RetryReason::OperatorApproved, Some(parent))
        }
        Some(parent) => (RetryReason::CallerRerun, Some(parent)),
        None => (RetryReason::FirstAttempt, None),
    };
    runner.attempt_base = existing.as_ref().map_or(0, |r| r.attempts);
    // An earlier invocation's attempt left this machine unless the operation was closed
    // as not applied since.
    runner.prior_dispatch = existing
        .as_ref()
        .filter(|r| r.verdict != Some(Verdict::NotApplied) || r.unresolved)
        .and_then(|r| r.last_attempt.clone());
    // The ledger already holds this operation's exit: never claim again, even if the
    // host marker has since been removed (gc, a wiped host); look, then replay.
    runner.ledger_exit = existing
        .as_ref()
        .filter(|r| matches!(r.verdict, Some(Verdict::Completed | Verdict::Replayed)))
        .and_then(|r| r.exit_code);
    if let Some(existing) = &existing {
        if existing.fingerprint != ledger_fp {
            let reason = format!(
                "operation {} on {} is already bound to a different command or stdin (recorded {}); nothing was sent. For the same effect resend exactly the recorded command and stdin (`opmark show`); a new op id only for a different effect, since for the same command it would run again",
                runner.key.op_id, runner.key.host, existing.created_at
            );
            return Ok(runner.report(Answer::new(
                Verdict::Conflict,
                None,
                ReasonCode::ConflictInLedger,
                reason,
            )));
        }
    }

    if existing.is_some() {
        let events = runner.ledger.events(&runner.key)?;
        // An operator's decision is terminal (SPEC section 2): answer it, contact nothing.
        if let Some(decision) = terminal_decision(&events) {
            let answer = runner.decided(&decision);
            return runner.finish(answer);
        }
        runner.identity = identity::recorded(&events);
    }

    let dest = match resolved {
        Ok(dest) => dest,
        Err(e) => {
            runner.begin(first_reason, first_parent)?;
            let attempt = runner.current_attempt();
            runner.boundary(&attempt, Boundary::NotSent, &e.message)?;
            let answer = runner
                .after_not_sent(&attempt, &e.message, ReasonCode::NameUnresolvable, true)
                .expect("a final failure always answers");
            return runner.finish(answer);
        }
    };
    // The handshake overlaps the durable writes below; nothing is sent before them.
    runner.pool.prewarm(&dest);
    if let Some(note) = runner.input.approve.clone() {
        runner.ledger.append(
            &runner.key,
            &Event::OperatorDecision {
                by: runner.input.approver.clone(),
                decision: "approved".into(),
                note,
                exit_code: None,
            },
            Durability::Normal,
        )?;
    }
    runner.begin(first_reason, first_parent)?;
    // Biased: once a signal is in, the run is never polled again, so nothing more leaves.
    // `--detach` leaves at the claim acknowledgement, which the observer announces.
    let driven = tokio::select! {
        biased;
        signal = interrupts.wait() => Err(Some(signal)),
        report = runner.drive(&dest) => Ok(report),
        () = started.notified(), if detach => Err(None),
    };
    match driven {
        Err(Some(signal)) => runner.interrupted(signal),
        Err(None) => runner.detached(),
        // After dispatch with a ledger that stopped taking writes (a retry could not be
        // recorded, so it was not sent): the caller still gets a verdict, and it claims
        // no more than the evidence.
        Ok(Err(e)) if runner.ledger.failed().is_some() => {
            let reason = format!(
                "{}; an attempt was dispatched before that, so the command may have run. Rerun with the same op id once the ledger can be written: the host marker decides",
                e.message
            );
            let attempt = runner.current_attempt();
            Ok(runner.report(Answer::new(
                Verdict::Indeterminate,
                Some(attempt),
                ReasonCode::EarlierDispatchUnknown,
                reason,
            )))
        }
        Ok(other) => other,
    }
}

/// The state of one `run`.
struct Runner<'a> {
    ledger: RunLedger<'a>,
    pool: &'a Pool,
    key: OpKey,
    op: OpId,
    session_id: String,
    family: Family,
    rule: String,
    host_fp: String,
    ledger_fp: String,
    display: String,
    attempts: Vec<AttemptSummary>,
    budget: u32,
    after_interrupted: AfterInterrupted,
    output: Output,
    exit: Option<ExitFrame>,
    /// Attempts the ledger already holds for this operation (earlier invocations).
    attempt_base: u32,
    /// An earlier invocation's attempt that may have reached the host.
    prior_dispatch: Option<String>,
    /// The exit code the ledger recorded when the operation already completed.
    ledger_exit: Option<i32>,
    /// The verdict's exit code comes from the ledger (the host marker is gone, or an
    /// operator vouched for it).
    exit_from_ledger: bool,
    /// The host keys this operation's attempts saw: every connection is held to them.
    identity: Recorded,
    /// Signals that stop this run.
    interrupts: Interrupts,
    /// While a `run` call is out: `sent_no_response` from just before the exec request,
    /// `started` once the shim acknowledged the claim. What an interruption records.
    in_flight: Option<Boundary>,
    /// A `run` request of this invocation may have reached the host.
    dispatched: bool,
    /// Notified when the shim acknowledges a claim of this invocation (for `--detach`).
    started: std::sync::Arc<tokio::sync::Notify>,
    input: RunInput,
}

/// A verdict with what it rests on: the attempt it is about, the machine-readable code
/// and the words for people.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    verdict: Verdict,
    attempt_id: Option<String>,
    code: ReasonCode,
    reason: String,
}

impl Answer {
    fn new(
        verdict: Verdict,
        attempt_id: Option<String>,
        code: ReasonCode,
        reason: impl Into<String>,
    ) -> Self {
        Answer {
            verdict,
            attempt_id,
            code,
            reason: reason.into(),
        }
    }
}

/// What a probe-and-follow step concluded.
enum Settled {
    /// A verdict is reached.
    Verdict(Answer),
    /// Make another attempt for this reason.
    Retry(RetryReason),
}

impl<'a> Runner<'a> {
    /// THE retry state machine (SPEC section 4).
    async fn drive(&mut self, dest: &Destination) -> Result<RunReport, Error> {
        if let Some(code) = self.ledger_exit {
            let attempt = self.current_attempt();
            self.boundary(
                &attempt,
                Boundary::Refused,
                "not claimed: the ledger already holds this operation's exit; probing to replay",
            )?;
            return match self.probe_and_follow(dest, &attempt).await? {
                // Another machine answers under this name: the ledger's record stands.
                Settled::Verdict(answer) if answer.code == ReasonCode::HostKeyMismatch => {
                    self.exit_from_ledger = true;
                    let reason = format!(
                        "the ledger recorded this operation completed with exit {code}; nothing ran again, and the output is not available: {}",
                        answer.reason
                    );
                    self.finish(Answer::new(
                        Verdict::Replayed,
                        Some(attempt),
                        ReasonCode::ReplayedFromLedger,
                        reason,
                    ))
                }
                Settled::Verdict(answer) => self.finish(answer),
                // Absent, though the ledger saw it complete: the marker was removed.
                // Running it again would be a second execution.
                Settled::Retry(_) => {
                    let reason = format!(
                        "the ledger recorded this operation completed with exit {code}, but its marker is gone from the host (gc?); nothing ran again, and the output is no longer available"
                    );
                    self.exit_from_ledger = true;
                    self.finish(Answer::new(
                        Verdict::Replayed,
                        Some(attempt),
                        ReasonCode::ReplayedFromLedger,
                        reason,
                    ))
                }
            };
        }
        let mut backoff = Duration::from_millis(200);
        loop {
            let attempt = self.current_attempt();
            let supersede = self.may_supersede();
            let session = match self.pool.session(dest).await {
                Ok(s) => s,
                Err(e) => {
                    let why = e.to_string();
                    match self
                        .not_sent(
                            &attempt,
                            &why,
                            connect_code(&e),
                            connect_is_final(&e),
                            &mut backoff,
                        )
                        .await?
                    {
                        Some(report) => return Ok(report),
                        None => continue,
                    }
                }
            };
            if let Some(answer) = self.connected(&attempt, &session)? {
                return self.finish(answer);
            }
            let stdin_spec = self.input.stdin.as_ref().map(|s| StdinSpec {
                len: s.len() as u64,
                sha256_hex: hex::encode(Sha256::digest(s)),
            });
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
                return self.interrupted(signal);
            }
            self.dispatched = true;
            self.ledger.dispatched = true;
            self.in_flight = Some(Boundary::SentNoResponse);
            let end = {
                let mut observer = RunObserver {
                    ledger: &mut self.ledger,
                    key: &self.key,
                    attempt: &attempt,
                    attempts: &mut self.attempts,
                    output: &mut self.output,
                    in_flight: &mut self.in_flight,
                    started: &self.started,
                    error: None,
                };
                let end = call_shim(&session, &verb, stdin, &mut observer).await;
                if let Some(e) = observer.error {
                    return Err(e.into());
                }
                end
            };
            // From here the call's end is recorded as the attempt's own boundary.
            self.in_flight = None;
            let settled = match end {
                CallEnd::NotSent(why) => {
                    match self
                        .not_sent(
                            &attempt,
                            &why,
                            ReasonCode::ConnectFailed,
                            false,
                            &mut backoff,
                        )
                        .await?
                    {
                        Some(report) => return Ok(report),
                        None => continue,
                    }
                }
                CallEnd::Finished(frames) => self.settle_reply(dest, &attempt, frames).await?,
                CallEnd::Lost {
                    never_started: Some(never),
                    ..
                } => {
                    // Nothing of the shim ran, so this attempt claimed nothing: no probe
                    // needed, and retrying would meet the same host.
                    self.boundary(&attempt, Boundary::SentNoResponse, &never.describe())?;
                    Settled::Verdict(self.never_started_answer(&attempt, &never))
                }
                CallEnd::Lost {
                    frames,
                    shim_started: _,
                    reason,
                    never_started: None,
                } => {
                    let started = frames.iter().any(|f| matches!(f, Frame::Started { .. }));
                    let boundary = if started {
                        Boundary::Started
                    } else {
                        Boundary::SentNoResponse
                    };
                    // The loss itself is evidence worth keeping (SPEC 7: "response lost").
                    self.boundary(&attempt, boundary, &format!("response lost: {reason}"))?;
                    progress(&format!(
                        "connection to {} lost after dispatch ({reason}); probing the marker before anything else",
                        self.key.host
                    ));
                    self.probe_and_follow(dest, &attempt).await?
                }
            };
            match settled {
                Settled::Verdict(answer) => return self.finish(answer),
                Settled::Retry(reason) => {
                    if self.attempts.len() as u32 >= self.budget {
                        let why = format!(
                            "a retry was needed ({}) but the attempt budget ({}) is spent; retry with the same op id (the atomic claim makes it safe), or run `opmark reconcile`",
                            reason, self.budget
                        );
                        return self.finish(Answer::new(
                            Verdict::Indeterminate,
                            Some(attempt),
                            ReasonCode::AttemptBudgetSpent,
                            why,
                        ));
                    }
                    self.begin(reason, Some(attempt))?;
                }
            }
        }
    }

    /// An attempt that never left: records it, then either answers (`Some`) or waits
    /// and begins the next attempt (`None`: the caller loops).
    async fn not_sent(
        &mut self,
        attempt: &str,
        why: &str,
        code: ReasonCode,
        final_failure: bool,
        backoff: &mut Duration,
    ) -> Result<Option<RunReport>, Error> {
        self.boundary(attempt, Boundary::NotSent, why)?;
        if let Some(answer) = self.after_not_sent(attempt, why, code, final_failure) {
            return self.finish(answer).map(Some);
        }
        self.pause(backoff).await;
        self.begin(
            RetryReason::ConnectionNotEstablished,
            Some(attempt.to_owned()),
        )?;
        Ok(None)
    }

    /// After a `not_sent` attempt: `None` to retry, or the final verdict. `code` says why
    /// this attempt never left.
    fn after_not_sent(
        &self,
        attempt: &str,
        why: &str,
        code: ReasonCode,
        final_failure: bool,
    ) -> Option<Answer> {
        if !final_failure && (self.attempts.len() as u32) < self.budget {
            return None;
        }
        // This attempt never left, but an earlier one did and its outcome is not known
        // here: claiming `not_applied` for the operation would claim more than we know.
        let earlier = self
            .attempts
            .iter()
            .find(|a| a.boundary != Boundary::NotSent)
            .map(|a| a.attempt_id.clone())
            .or_else(|| self.prior_dispatch.clone());
        if let Some(earlier) = earlier {
            return Some(Answer::new(
                Verdict::Indeterminate,
                Some(attempt.to_owned()),
                ReasonCode::EarlierDispatchUnknown,
                format!(
                    "{why}; this attempt was not sent, but attempt {earlier} was dispatched earlier and its outcome is unknown. Retry with the same op id when the host is reachable, or run `opmark reconcile`"
                ),
            ));
        }
        let advice = if code.retryable() {
            "safe to retry with the same op id"
        } else {
            "retrying will not help until this is fixed; then retry with the same op id"
        };
        Some(Answer::new(
            Verdict::NotApplied,
            Some(attempt.to_owned()),
            code,
            format!(
                "{why}; nothing was sent after {} attempt(s); {advice}",
                self.attempts.len()
            ),
        ))
    }

    /// This attempt's shim never started. `not_applied` unless an earlier attempt left
    /// and its outcome is unknown (that one may still have run).
    fn never_started_answer(&self, attempt: &str, never: &call::NeverStarted) -> Answer {
        let earlier = self
            .attempts
            .iter()
            .find(|a| a.attempt_id != attempt && a.boundary != Boundary::NotSent)
            .map(|a| a.attempt_id.clone())
            .or_else(|| self.prior_dispatch.clone());
        match earlier {
            Some(earlier) => Answer::new(
                Verdict::Indeterminate,
                Some(attempt.to_owned()),
                ReasonCode::EarlierDispatchUnknown,
                format!(
                    "{}; attempt {earlier} was dispatched earlier and its outcome is unknown. Run `opmark reconcile` once the host is fixed",
                    never.describe()
                ),
            ),
            None => Answer::new(
                Verdict::NotApplied,
                Some(attempt.to_owned()),
                ReasonCode::ShimDidNotStart,
                never.describe(),
            ),
        }
    }

    fn may_supersede(&self) -> bool {
        self.after_interrupted == AfterInterrupted::Rerun || self.input.approve.is_some()
    }

    /// The shim answered completely: decide from its frames.
    async fn settle_reply(
        &mut self,
        dest: &Destination,
        attempt: &str,
        frames: Vec<Frame>,
    ) -> Result<Settled, Error> {
        for f in &frames {
            if let Frame::Superseded { .. } = f {
                let note = if self.input.approve.is_some() {
                    "operator approved superseding the interrupted claim"
                } else {
                    "policy reruns interrupted operations of this family"
                };
                self.ledger.append(
                    &self.key,
                    &Event::Superseded {
                        attempt_id: attempt.to_owned(),
                        note: note.into(),
                    },
                    Durability::Normal,
                )?;
            }
        }
        let exit = frames.iter().find_map(|f| match f {
            Frame::Exit(x) => Some(x.clone()),
            _ => None,
        });
        let refusal = frames.iter().find_map(|f| match f {
            Frame::Refused(r) => Some(r.clone()),
            _ => None,
        });
        if let Some(x) = exit {
            let by_us = self.ours(&x.attempt);
            let boundary = if refusal.is_some() {
                Boundary::Refused
            } else {
                Boundary::ExitReceived
            };
            if boundary == Boundary::Refused {
                self.boundary(attempt, Boundary::Refused, "already completed on the host")?;
            }
            let mut settled = self.exit_verdict(x, by_us);
            if let (Settled::Verdict(answer), Some(m)) = (&mut settled, &refusal) {
                if m.marker.as_ref().is_some_and(MarkerInfo::cancelled) {
                    answer
                        .reason
                        .push_str("; it had been stopped by `opmark cancel`");
                }
            }
            return Ok(settled);
        }
        let Some(refusal) = refusal else {
            // The supervisor vanished without an exit record while we followed it.
            if let Some(m) = frames.iter().find_map(|f| match f {
                Frame::Interrupted(m) => Some(m.clone()),
                _ => None,
            }) {
                self.record_probe(attempt, &m)?;
                return Ok(self.after_interrupted_marker(Some(&m), attempt));
            }
            return Err(Error::new(
                ErrorKind::Internal,
                "the shim ended its reply without an exit or a refusal",
            ));
        };
        self.boundary(attempt, Boundary::Refused, &refusal.reason)?;
        let marker = refusal.marker.clone();
        let settled = match refusal.reason.as_str() {
            "running" => {
                let holder = marker.as_ref().and_then(|m| m.attempt.clone());
                progress(&format!(
                    "op {} is already running on {} (attempt {}); following it for up to {}s",
                    self.key.op_id,
                    self.key.host,
                    holder.as_deref().unwrap_or("?"),
                    self.input.wait.as_secs()
                ));
                self.probe_and_follow(dest, attempt).await?
            }
            // Superseding needs room for the new claim; the old evidence stays in place.
            "interrupted" if refusal.fields.contains_key("supersede_failed") => {
                let why = marker
                    .as_ref()
                    .and_then(|m| m.why.clone())
                    .unwrap_or_else(|| "unknown".into());
                Settled::Verdict(Answer::new(
                    Verdict::Indeterminate,
                    Some(attempt.to_owned()),
                    ReasonCode::HostDiskFull,
                    format!(
                        "the operation was interrupted on the host ({why}) and may have had effects; it could not be re-run because the host's marker root is full ({}); its evidence is kept. Free space on the host, then rerun with the same op id",
                        refusal.fields["supersede_failed"]
                    ),
                ))
            }
            "interrupted" => self.after_interrupted_marker(marker.as_ref(), attempt),
            "fenced" => Settled::Verdict(Answer::new(
                Verdict::NotApplied,
                Some(attempt.to_owned()),
                ReasonCode::Fenced,
                "the operation was closed as not applied (its marker is fenced); nothing ran and nothing can run under this op id",
            )),
            "conflict" => Settled::Verdict(Answer::new(
                Verdict::Conflict,
                Some(attempt.to_owned()),
                ReasonCode::ConflictOnHost,
                format!(
                    "the host's marker binds op {} to a different command or stdin; nothing ran. For the same effect resend exactly that command and stdin; a new op id only for a different effect",
                    self.key.op_id
                ),
            )),
            // This call moved an interrupted claim aside before its own start failed: the
            // earlier attempt may have run.
            "root_unusable" if frames.iter().any(|f| matches!(f, Frame::Superseded { .. })) => {
                Settled::Verdict(Answer::new(
                    Verdict::Indeterminate,
                    Some(attempt.to_owned()),
                    ReasonCode::HostDiskFull,
                    format!(
                        "an interrupted claim was superseded, then the new attempt could not start ({}); the earlier attempt may have had effects. Free space on the host, then rerun with the same op id",
                        describe_fields(&refusal.fields)
                    ),
                ))
            }
            "root_unusable" if refusal.fields.get("reason").is_some_and(|r| is_resource_cause(r)) => {
                Settled::Verdict(Answer::new(
                    Verdict::NotApplied,
                    Some(attempt.to_owned()),
                    ReasonCode::HostDiskFull,
                    format!(
                        "the host's marker root is full ({}): the operation's records could not be written before the command started, so the claim was undone and nothing ran. Free space on the host (see `opmark doctor`), then retry with the same op id",
                        refusal.fields["reason"]
                    ),
                ))
            }
            "cannot_start"
                if matches!(
                    refusal.fields.get("reason").map(String::as_str),
                    Some("no_setsid" | "setsid_without_f")
                ) =>
            {
                Settled::Verdict(Answer::new(
                    Verdict::NotApplied,
                    Some(attempt.to_owned()),
                    ReasonCode::HostMissingSetsid,
                    "the host has no util-linux `setsid` with `-f` (busybox's setsid lacks it), which the shim needs to detach the command from the connection; nothing ran. Install util-linux on the host (Debian/Ubuntu: `apt-get install util-linux`; Alpine: `apk add util-linux-misc`), then retry with the same op id",
                ))
            }
            "invalid_op_id" | "bad_args" => Settled::Verdict(Answer::new(
                Verdict::Refused,
                Some(attempt.to_owned()),
                ReasonCode::InvalidInput,
                format!("the host shim refused the request as invalid ({})", describe_fields(&refusal.fields)),
            )),
            other => Settled::Verdict(Answer::new(
                Verdict::NotApplied,
                Some(attempt.to_owned()),
                ReasonCode::ShimCannotStart,
                format!(
                    "the host shim could not start the command ({other}: {}); nothing ran. Check the host with `opmark doctor`",
                    describe_fields(&refusal.fields)
                ),
            )),
        };
        Ok(self.unless_an_earlier_attempt_may_have_run(attempt, settled))
    }

    /// A refusal says that *this* attempt ran nothing. When an earlier attempt of the
    /// operation may have run (it was sent and never answered, or started), `not_applied`
    /// would claim more than that: the operation's outcome is unknown. (A fence is the
    /// exception: the shim fences only what never started.)
    fn unless_an_earlier_attempt_may_have_run(&self, attempt: &str, settled: Settled) -> Settled {
        let Settled::Verdict(answer) = settled else {
            return settled;
        };
        if answer.verdict != Verdict::NotApplied || answer.code == ReasonCode::Fenced {
            return Settled::Verdict(answer);
        }
        let earlier = self
            .attempts
            .iter()
            .find(|a| {
                a.attempt_id != attempt
                    && matches!(
                        a.boundary,
                        Boundary::SentNoResponse | Boundary::Started | Boundary::ExitReceived
                    )
            })
            .map(|a| a.attempt_id.clone())
            .or_else(|| self.prior_dispatch.clone());
        match earlier {
            None => Settled::Verdict(answer),
            Some(earlier) => Settled::Verdict(Answer::new(
                Verdict::Indeterminate,
                answer.attempt_id,
                answer.code,
                format!(
                    "{}; but attempt {earlier} reached the host earlier and may have run, so the operation's outcome is unknown. Rerun with the same op id once this is fixed, or run `opmark reconcile`",
                    answer.reason.trim_end_matches("; nothing ran. Check the host with `opmark doctor`")
                ),
            )),
        }
    }

    fn after_interrupted_marker(&mut self, marker: Option<&MarkerInfo>, attempt: &str) -> Settled {
        if marker.is_some_and(|m| m.state == MarkerState::Fenced) {
            // Fenced while we followed it (`opmark cancel` before the command started):
            // nothing ran and nothing can; superseding would only be refused.
            return Settled::Verdict(Answer::new(
                Verdict::NotApplied,
                Some(attempt.to_owned()),
                ReasonCode::Fenced,
                "the marker was fenced before the command started (opmark cancel or resolve); nothing ran and nothing can run under this op id",
            ));
        }
        let why = marker
            .and_then(|m| m.why.clone())
            .unwrap_or_else(|| "unknown".into());
        if self.may_supersede() {
            let reason = if self.input.approve.is_some() {
                RetryReason::OperatorApproved
            } else {
                RetryReason::InterruptedRerun
            };
            return Settled::Retry(reason);
        }
        Settled::Verdict(Answer::new(
            Verdict::Indeterminate,
            Some(attempt.to_owned()),
            ReasonCode::InterruptedNeedsApproval,
            format!(
                "the operation was interrupted on the host ({why}) and may have had effects; {} commands are not re-run automatically: check the host, then rerun with --approve NOTE or record a decision with `opmark resolve`",
                self.family
            ),
        ))
    }

    /// After a loss, or when another attempt holds the claim: probe, then follow or retry.
    async fn probe_and_follow(
        &mut self,
        dest: &Destination,
        attempt: &str,
    ) -> Result<Settled, Error> {
        let deadline = Instant::now() + self.input.wait;
        let mut pause = Duration::from_millis(250);
        let mut last_problem = String::from("no probe answered");
        loop {
            // Bounded by what is left of --wait, so a slow connect cannot overshoot it.
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
                    last_problem = e.to_string();
                    self.observe_unreachable(attempt, &last_problem)?;
                    if Instant::now() + pause >= deadline {
                        return Ok(self.unreachable_verdict(attempt, &last_problem));
                    }
                    progress(&format!(
                        "{} unreachable ({}); probing again",
                        self.key.host, e.message
                    ));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            if let Err(why) = self.identity.check(
                &self.key.host,
                &self.key.op_id,
                session.host_key().as_deref(),
            ) {
                return Ok(Settled::Verdict(self.key_mismatch(attempt, why)));
            }
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(500));
            let probe = tokio::time::timeout(
                left,
                call_shim(&session, &Verb::Probe(&self.op), None, &mut FramesOnly),
            )
            .await;
            let marker = match probe {
                Ok(CallEnd::Finished(frames)) => frames.into_iter().find_map(|f| match f {
                    Frame::Probe(m) => Some(m),
                    _ => None,
                }),
                Ok(CallEnd::NotSent(why) | CallEnd::Lost { reason: why, .. }) => {
                    last_problem = why;
                    None
                }
                Err(_) => {
                    last_problem = "the probe got no answer within the --wait budget".into();
                    None
                }
            };
            let Some(marker) = marker else {
                self.observe_unreachable(attempt, &last_problem)?;
                if Instant::now() + pause >= deadline {
                    return Ok(self.unreachable_verdict(attempt, &last_problem));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            };
            self.record_probe(attempt, &marker)?;
            match marker.state {
                MarkerState::Absent => {
                    return Ok(Settled::Retry(RetryReason::ResponseLostAfterDispatch))
                }
                MarkerState::Fenced => return Ok(Settled::Verdict(Answer::new(
                    Verdict::NotApplied,
                    Some(attempt.to_owned()),
                    ReasonCode::Fenced,
                    "the marker is fenced: the operation was closed as not applied; nothing ran",
                ))),
                MarkerState::Interrupted => {
                    return Ok(self.after_interrupted_marker(Some(&marker), attempt))
                }
                MarkerState::Running | MarkerState::Completed => {
                    if marker
                        .fingerprint
                        .as_deref()
                        .is_some_and(|fp| fp != self.host_fp)
                    {
                        return Ok(Settled::Verdict(Answer::new(
                            Verdict::Conflict,
                            Some(attempt.to_owned()),
                            ReasonCode::ConflictOnHost,
                            "the host's marker binds this op id to a different command or stdin",
                        )));
                    }
                    let holder = marker.attempt.clone().unwrap_or_default();
                    let (out_off, err_off) = if self.ours(&holder) {
                        (self.output.out_bytes(), self.output.err_bytes())
                    } else {
                        (0, 0)
                    };
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    match self.follow(&session, out_off, err_off, remaining).await? {
                        Followed::Exit(x) => {
                            let by_us = self.ours(&x.attempt);
                            return Ok(self.exit_verdict(x, by_us));
                        }
                        Followed::Interrupted(m) => {
                            self.record_probe(attempt, &m)?;
                            return Ok(self.after_interrupted_marker(Some(&m), attempt));
                        }
                        Followed::StillRunning => {
                            return Ok(Settled::Verdict(Answer::new(
                                Verdict::InProgress,
                                Some(holder.clone()),
                                ReasonCode::StillRunning,
                                format!(
                                    "attempt {holder} holds the claim and is still running after waiting {}s; run again with the same op id to follow it",
                                    self.input.wait.as_secs()
                                ),
                            )))
                        }
                        Followed::Lost(why) => {
                            last_problem = why;
                            progress(&format!("lost {} again while following ({last_problem}); probing", self.key.host));
                            if Instant::now() >= deadline {
                                return Ok(self.unreachable_verdict(attempt, &last_problem));
                            }
                            continue;
                        }
                    }
                }
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
    ) -> Result<Followed, Error> {
        let verb = Verb::Attach {
            op: &self.op,
            out_offset,
            err_offset,
        };
        let mut observer = OutputObserver {
            output: &mut self.output,
        };
        let end = match tokio::time::timeout(limit, call_shim(session, &verb, None, &mut observer))
            .await
        {
            Ok(end) => end,
            Err(_) => return Ok(Followed::StillRunning),
        };
        Ok(match end {
            CallEnd::Finished(frames) => {
                let mut result = Followed::Lost("attach ended without an answer".into());
                for f in frames {
                    match f {
                        Frame::Exit(x) => result = Followed::Exit(x),
                        Frame::Interrupted(m) => result = Followed::Interrupted(m),
                        Frame::Refused(r) => {
                            result = Followed::Lost(format!("attach refused: {}", r.reason))
                        }
                        _ => {}
                    }
                }
                result
            }
            CallEnd::NotSent(why) | CallEnd::Lost { reason: why, .. } => Followed::Lost(why),
        })
    }

    fn exit_verdict(&mut self, x: ExitFrame, by_us: bool) -> Settled {
        let (verdict, code) = if by_us {
            (Verdict::Completed, ReasonCode::CommandExited)
        } else {
            (Verdict::Replayed, ReasonCode::ReplayedFromHost)
        };
        let reason = if by_us {
            format!(
                "attempt {} ran the command and its exit status was received",
                x.attempt
            )
        } else {
            format!(
                "the operation had already run on the host (attempt {}); its recorded exit status and output are returned, nothing ran again",
                x.attempt
            )
        };
        let attempt = x.attempt.clone();
        self.exit = Some(x);
        Settled::Verdict(Answer::new(verdict, Some(attempt), code, reason))
    }

    fn unreachable_verdict(&self, attempt: &str, problem: &str) -> Settled {
        Settled::Verdict(Answer::new(
            Verdict::Indeterminate,
            Some(attempt.to_owned()),
            ReasonCode::UnreachableAfterDispatch,
            format!(
                "the request was dispatched, then {} could not be probed within {}s ({problem}); the command may have run. Run `opmark reconcile` when the host is back",
                self.key.host,
                self.input.wait.as_secs()
            ),
        ))
    }

    fn observe_unreachable(&mut self, attempt: &str, problem: &str) -> Result<(), Error> {
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

    fn record_probe(&mut self, attempt: &str, marker: &MarkerInfo) -> Result<(), Error> {
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

    fn current_attempt(&self) -> String {
        self.attempts
            .last()
            .map(|a| a.attempt_id.clone())
            .unwrap_or_default()
    }

    /// Records a new attempt durably before it is dispatched (with the intent, for the
    /// first one, in the same transaction).
    fn begin(&mut self, reason: RetryReason, parent: Option<String>) -> Result<(), Error> {
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
    fn record_closed_intent(&mut self, verdict: Verdict, reason: &str) -> Result<(), Error> {
        let events = [
            self.intended(),
            Event::Verdict {
                attempt_id: None,
                verdict,
                exit_code: None,
                reason: reason.to_owned(),
            },
        ];
        match self
            .ledger
            .append_many(&self.key, &events, Durability::Normal)
        {
            Ok(_) => Ok(()),
            // The op id already names another intent: the refusal stands on its own.
            Err(crate::ledger::LedgerError::FingerprintConflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn boundary(&mut self, attempt: &str, boundary: Boundary, detail: &str) -> Result<(), Error> {
        record_boundary(
            &mut self.ledger,
            &self.key,
            &mut self.attempts,
            attempt,
            boundary,
            detail,
        )?;
        Ok(())
    }

    /// A connection for `attempt` is up: holds the host key to the one this operation
    /// ran against (SPEC section 9), then records the route and key before anything is
    /// sent. `Some` is the verdict when it is another machine.
    fn connected(&mut self, attempt: &str, session: &Session) -> Result<Option<Answer>, Error> {
        let seen = session.host_key();
        if let Err(why) = self
            .identity
            .check(&self.key.host, &self.key.op_id, seen.as_deref())
        {
            self.boundary(attempt, Boundary::NotSent, &why)?;
            return Ok(Some(self.key_mismatch(attempt, why)));
        }
        let Some(host_key) = seen else {
            return Ok(None);
        };
        let route = session.destination().route();
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

    /// The host presents another key than the operation ran against: nothing is
    /// concluded there. Something of this operation reached the original machine (that
    /// is how its key is known), so its outcome is not known here.
    fn key_mismatch(&self, attempt: &str, why: String) -> Answer {
        Answer::new(
            Verdict::Indeterminate,
            Some(attempt.to_owned()),
            ReasonCode::HostKeyMismatch,
            why,
        )
    }

    /// The answer to a `run` of an operation an operator has decided.
    fn decided(&mut self, d: &Decision) -> Answer {
        let by = format!(
            "operator {} resolved this operation as {} ({})",
            d.by,
            d.decision.replace('_', "-"),
            d.note
        );
        if d.decision == "applied" {
            self.ledger_exit = d.exit_code;
            self.exit_from_ledger = true;
            let exit = d
                .exit_code
                .map_or_else(|| "no exit status".to_owned(), |c| format!("exit {c}"));
            Answer::new(
                Verdict::Replayed,
                None,
                ReasonCode::ResolvedApplied,
                format!("{by}, with {exit}; that decision is final: nothing ran again"),
            )
        } else if d.decision == "abandoned" {
            // Abandoned says nothing about whether it ran: only that nothing runs again.
            Answer::new(
                Verdict::NotApplied,
                None,
                ReasonCode::ResolvedAbandoned,
                format!("{by}; that decision is final: whether it ever ran is not known, and nothing runs under this op id now. Use a new op id"),
            )
        } else {
            Answer::new(
                Verdict::NotApplied,
                None,
                ReasonCode::ResolvedNotApplied,
                format!("{by}; that decision is final: it did not apply, the marker is fenced, and nothing runs under this op id. Use a new op id"),
            )
        }
    }

    async fn pause(&self, backoff: &mut Duration) {
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(Duration::from_secs(3));
    }

    /// Records the exit (if any) and the verdict; builds the report.
    fn finish(&mut self, answer: Answer) -> Result<RunReport, Error> {
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

    /// A signal stopped this run: records how far the current attempt got and what the
    /// caller is told, then answers. `in_progress` when a request of this invocation may
    /// have reached the host: the command, if it started, keeps running (detached by
    /// design). `not_applied` when nothing was sent: nothing of this invocation can run.
    fn interrupted(&mut self, signal: ClientSignal) -> Result<RunReport, Error> {
        let attempt = self.attempts.last().map(|a| a.attempt_id.clone());
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
        let op = &self.key.op_id;
        let host = &self.key.host;
        let earlier = self.prior_dispatch.clone();
        let (verdict, detail, reason) = if self.dispatched {
            let seen = match boundary {
                Boundary::SentNoResponse => "the request may have reached the host (no claim acknowledgement yet): if the command started, it keeps running there, detached by design",
                Boundary::Started => "the shim had claimed the marker and started the command: it keeps running on the host, detached by design",
                Boundary::Refused => "another attempt holds the claim and was running: it keeps running on the host, detached by design",
                Boundary::NotSent => "this attempt was not sent, but an earlier attempt of this run was dispatched: if its command started, it keeps running on the host, detached by design",
                Boundary::ExitReceived => "the exit status had been received",
            };
            (
                Verdict::InProgress,
                seen.to_owned(),
                format!(
                    "interrupted by {signal} at boundary {boundary}: {seen}. `opmark run` with op id {op} follows or replays it; `opmark cancel {host} {op}` stops it"
                ),
            )
        } else {
            let earlier_note = earlier
                .as_deref()
                .map(|a| format!(" (attempt {a} of an earlier run was dispatched; this says nothing about it)"))
                .unwrap_or_default();
            (
                Verdict::NotApplied,
                "nothing was sent by this invocation".to_owned(),
                format!(
                    "interrupted by {signal} before anything was sent: this invocation ran nothing and nothing of it can still run{earlier_note}. `opmark run` with op id {op} runs it (at most once)"
                ),
            )
        };
        self.ledger.append(
            &self.key,
            &Event::ClientInterrupted {
                attempt_id: attempt.clone(),
                boundary,
                signal: signal.name().into(),
                detail,
            },
            Durability::Normal,
        )?;
        let answer = Answer::new(verdict, attempt, ReasonCode::ClientInterrupted, reason);
        // Nothing sent now, but an earlier run's attempt (or exit) stands: a not_applied
        // verdict in the ledger would close an operation this invocation knows nothing of.
        if verdict == Verdict::NotApplied && (earlier.is_some() || self.ledger_exit.is_some()) {
            return Ok(self.report(answer));
        }
        self.finish(answer)
    }

    /// `--detach`: the shim acknowledged the claim (recorded as `started`); the command
    /// runs on, detached by design, and the verdict says exactly that.
    fn detached(&mut self) -> Result<RunReport, Error> {
        let attempt = self.attempts.last().map(|a| a.attempt_id.clone());
        let op = &self.key.op_id;
        let host = &self.key.host;
        let reason = format!(
            "detached: the shim claimed the marker and started the command, which keeps running on {host}. `opmark run` with op id {op} follows or replays it; `opmark cancel {host} {op}` stops it"
        );
        let answer = Answer::new(Verdict::InProgress, attempt, ReasonCode::Detached, reason);
        self.finish(answer)
    }

    fn report(&self, answer: Answer) -> RunReport {
        RunReport {
            op_id: self.key.op_id.clone(),
            host: self.key.host.clone(),
            attempt_id: answer.attempt_id,
            family: self.family,
            verdict: answer.verdict,
            exit_code: self.exit_code(),
            stdout: String::from_utf8_lossy(self.output.kept_stdout()).into_owned(),
            stderr: String::from_utf8_lossy(self.output.kept_stderr()).into_owned(),
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
        }
    }
}

enum Followed {
    Exit(ExitFrame),
    Interrupted(MarkerInfo),
    StillRunning,
    Lost(String),
}

/// The reason code of a connection that could not be made.
pub fn connect_code(e: &ConnectError) -> ReasonCode {
    match e.stage {
        ConnectStage::Resolve | ConnectStage::Config => ReasonCode::NameUnresolvable,
        ConnectStage::Connect | ConnectStage::Timeout => ReasonCode::ConnectFailed,
        ConnectStage::HostKey => ReasonCode::HostKeyRejected,
        ConnectStage::Auth => ReasonCode::AuthRefused,
    }
}

/// Host key and authentication failures will not change by retrying; a connect that
/// used up its ConnectTimeout is one attempt, as in ssh (the caller may rerun).
fn connect_is_final(e: &ConnectError) -> bool {
    matches!(
        e.stage,
        ConnectStage::HostKey
            | ConnectStage::Auth
            | ConnectStage::Resolve
            | ConnectStage::Config
            | ConnectStage::Timeout
    )
}

/// Bytes the host kept per stream (stdout, stderr), from the trailer.
fn kept(x: &ExitFrame) -> (u64, u64) {
    (
        x.kept_out.unwrap_or(x.out_bytes),
        x.kept_err.unwrap_or(x.err_bytes),
    )
}

/// The shim's names for a marker root that ran out of room (`root_unusable reason=...`).
fn is_resource_cause(reason: &str) -> bool {
    matches!(reason, "no_space" | "no_inodes" | "quota_exceeded")
}

fn describe_fields(fields: &std::collections::BTreeMap<String, String>) -> String {
    fields
        .iter()
        .filter(|(k, _)| k.as_str() == "reason" || k.as_str() == "state")
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
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
    detail: &str,
) -> Result<(), LedgerError> {
    ledger.append(
        key,
        &Event::BoundaryReached {
            attempt_id: attempt.to_owned(),
            boundary,
            detail: detail.to_owned(),
        },
        Durability::Normal,
    )?;
    if let Some(a) = attempts.iter_mut().find(|a| a.attempt_id == attempt) {
        a.boundary = a.boundary.max(boundary);
    }
    Ok(())
}

/// An operator's decision that settles an operation for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// `applied`, `not_applied` or `abandoned`.
    pub decision: String,
    /// Who decided.
    pub by: String,
    /// Their note.
    pub note: String,
    /// `resolve --exit N`.
    pub exit_code: Option<i32>,
}

/// The latest terminal operator decision among `events`, if any (SPEC section 2).
pub fn terminal_decision(events: &[StoredEvent]) -> Option<Decision> {
    events.iter().rev().find_map(|e| match &e.event {
        Event::OperatorDecision {
            by,
            decision,
            note,
            exit_code,
        } if matches!(
            decision.as_str(),
            "applied" | "not_applied" | "not-applied" | "abandoned"
        ) =>
        {
            Some(Decision {
                decision: decision.replace('-', "_"),
                by: by.clone(),
                note: note.clone(),
                exit_code: *exit_code,
            })
        }
        _ => None,
    })
}

/// A fresh attempt id: `at-<16 hex>` (same charset as op ids, safe on the host).
pub fn new_attempt_id() -> String {
    format!("at-{:016x}", rand::random::<u64>())
}

/// opmark's own progress line on stderr.
pub fn progress(message: &str) {
    crate::logging::say(format_args!("opmark: {message}"));
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
    started: &'r tokio::sync::Notify,
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
        if let Frame::Started { .. } = frame {
            *self.in_flight = Some(Boundary::Started);
            let result = record_boundary(
                self.ledger,
                self.key,
                self.attempts,
                self.attempt,
                Boundary::Started,
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

/// Fault injection for the crash tests: `OPMARK_FAULT=<point>` makes this process
/// SIGKILL itself at that point (`before_dispatch`, `after_dispatch`, `after_started`,
/// `after_exit`), as a crash or `kill -9` would. Never set outside tests.
pub(crate) fn fault_point(point: &str) {
    if std::env::var("OPMARK_FAULT").is_ok_and(|p| p == point) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        // kill(1) missing: die without cleanup all the same.
        std::process::abort();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn decided(decision: &str, exit_code: Option<i32>) -> StoredEvent {
        StoredEvent {
            seq: 1,
            op_id: "op".into(),
            host: "h".into(),
            at: String::new(),
            event: Event::OperatorDecision {
                by: "alice".into(),
                decision: decision.into(),
                note: "n".into(),
                exit_code,
            },
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    #[test]
    fn the_latest_settling_decision_is_terminal_and_an_approval_is_not() {
        assert_eq!(terminal_decision(&[decided("approved", None)]), None);
        let d = terminal_decision(&[
            decided("abandoned", None),
            decided("applied", Some(3)),
            decided("approved", None),
        ])
        .unwrap();
        assert_eq!((d.decision.as_str(), d.exit_code), ("applied", Some(3)));
        let d = terminal_decision(&[decided("not-applied", None)]).unwrap();
        assert_eq!(d.decision, "not_applied");
    }
}
