//! The run's decision table (docs/decisions.md): a pure function of what the
//! run knows ([`Facts`]) and what it just observed, answering with what to record
//! ([`Effect`]) and what to do next ([`Action`], [`ProbeAction`]). No I/O happens here:
//! the driver (`driver.rs`) connects, calls the shim, writes the ledger and sleeps,
//! then asks this file what the evidence means. Every row below is a unit test named
//! for its row (`probe_finds_absent_...`, `interrupted_and_convergent_...`,
//! `claim_finds_fenced_...`, `connect_fails_after_an_earlier_dispatch_...`, ...).
//!
//! docs/decisions.md#after-a-lost-connection, after dispatch nothing is retried without a probe
//! ([`after_probe`], [`after_follow`]):
//!
//! | probe says | action | code |
//! |---|---|---|
//! | `completed` | attach from byte 0, which replays the kept output and the exit: `replayed` (`completed` when this invocation's attempt ran it) | [`after_probe`] → [`ProbeAction::Attach`], [`after_follow`] |
//! | `running` | attach and keep streaming from the last offset seen (when the attempt is ours), up to `--wait`; then `in_progress` | [`ProbeAction::Attach`] (`resume`), [`Followed::StillRunning`] |
//! | `running`/`completed` with another fingerprint | `conflict` | [`after_probe`] |
//! | `absent` | retry with the same op id, within the attempt budget | [`Action::Retry`] (`response_lost_after_dispatch`) |
//! | `interrupted`, family `read-only`/`convergent` (policy `rerun`) | supersede and re-run | [`Action::Supersede`] (`interrupted_rerun`) |
//! | `interrupted`, `append-only`/`destructive`, no `--approve` | `indeterminate` (`interrupted_needs_approval`) | [`after_interrupted`] |
//! | `interrupted`, `--approve` | supersede and re-run | [`Action::Supersede`] (`operator_approved`) |
//! | `fenced` | `not_applied` (`fenced`); `indeterminate` (`fenced_after_start`) when its command had started | [`after_probe`] |
//! | probe unreachable, `--wait` left | probe again after a pause | [`ProbeAction::Wait`] |
//! | probe unreachable, `--wait` spent | `indeterminate` (`unreachable_after_dispatch`) | [`after_probe`] |
//! | another host key | `conflict` (`host_changed`): nothing concluded | [`after_probe`] |
//! | connection lost while following | probe again (same window) or `indeterminate` | [`after_follow`] |
//!
//! Before a probe: what one dispatch ended with ([`after_dispatch`], [`after_reply`]):
//!
//! | observation | action |
//! |---|---|
//! | connect failed before dispatch, budget left | record `not_sent`, back off, retry (`connection_not_established`) |
//! | connect failed finally (key, auth, name, timeout) or budget spent | `not_applied` with the connect's code, or `indeterminate` (`earlier_dispatch_unknown`) when an earlier attempt was dispatched |
//! | the host presents another key than the operation ran against | record `not_sent`, `conflict` (`host_changed`) |
//! | the shim never started (orderly close, no header) | `not_applied` (`shim_did_not_start`), or `indeterminate` after an earlier dispatch |
//! | reply lost after dispatch | record `started`/`sent_no_response` ("response lost"), then probe |
//! | exit frame | `completed` when ours, `replayed` when an earlier attempt's (a refusal before it records `refused`) |
//! | refused `running` | record `refused`, probe and follow |
//! | refused `interrupted` | as the probe row; `indeterminate` (`host_disk_full`) when superseding found no room |
//! | refused `fenced` | `not_applied` (`fenced`); `indeterminate` (`fenced_after_start`) when its command had started |
//! | refused `conflict` | `conflict` (`conflict_on_host`) |
//! | refused `root_unusable` (full disk) / `cannot_start` (no `setsid -f`) / other | `not_applied` with the cause, `indeterminate` when this call had superseded a claim |
//! | refused as invalid (`invalid_op_id`, `bad_args`) | `refused` (`invalid_input`) |
//!
//! Verdict rules (docs/decisions.md#no-not-applied-without-proof and docs/guarantees.md#verdicts):
//! - no `not_applied` without proof: a refusal or a connect failure says *this* attempt
//!   ran nothing; when an earlier attempt (of this run, or an earlier invocation's) was
//!   dispatched and is unknown, the answer is `indeterminate` ([`earlier_may_have_run`]).
//!   A fence is the exception: the shim fences only what never started.
//! - a retry past the attempt budget is `indeterminate` (`attempt_budget_spent`).
//! - the ledger already holds the exit: never claim again; a marker that is gone (or
//!   another machine under the name) replays from the ledger ([`start`], [`conclude`]).
//! - policy denies → `refused`; approval needed without `--approve` → `blocked`; another
//!   intent under the op id in the ledger → `conflict` ([`policy_gate`], [`ledger_conflict`]).
//! - an operator's decision is terminal ([`operator_decided`]).
//! - a signal answers `in_progress` when something may have reached the host, else
//!   `not_applied` ([`client_interrupted`]); `--detach` answers `in_progress` ([`detached`]).
//! - the `--wait` budget bounds the whole invocation: spent while connecting, `not_applied`;
//!   spent while an MCP run's command runs, `in_progress` (both `wait_budget_spent`,
//!   [`wait_budget_spent`]).

use std::time::Duration;

use crate::family::Family;
use crate::ledger::fingerprint::{host_fingerprint, Intent};
use crate::ledger::history::FinalDecision;
use crate::ledger::{Decision, OperationRecord, RefusalWord};
use crate::policy::AfterInterrupted;
use crate::shim::{ExitFrame, MarkerInfo, MarkerState};
use crate::ssh::{ConnectError, ConnectStage};
use crate::vocab::{Boundary, Differs, ReasonCode, RetryReason, Verdict, HOST_CHANGED_PREFIX};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::interrupt::ClientSignal;
use super::repeat::Repetition;
pub use super::reply::{RefusalReason, Refused, RunReply};

/// What a run knows when it decides.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The operation id.
    pub op: &'a str,
    /// The host as the ledger names it.
    pub host: &'a str,
    /// The family the run uses.
    pub family: Family,
    /// The family's policy for an interrupted claim.
    pub after_interrupted: AfterInterrupted,
    /// `--approve` was given.
    pub approved: bool,
    /// The plain SHA-256 intent fingerprint the host marker holds.
    pub host_fp: &'a str,
    /// The command string this run sends (with [`Facts::stdin`], what `host_fp` digests).
    pub command: &'a str,
    /// The stdin this run forwards, if any.
    pub stdin: Option<&'a [u8]>,
    /// The names of this run's secrets (part of what `host_fp` digests).
    pub secret_names: &'a [String],
    /// `--become USER` (part of what `host_fp` digests).
    pub become_user: Option<&'a str>,
    /// This invocation's attempts, oldest first; the last is the current one.
    pub attempts: &'a [AttemptSummary],
    /// `--attempts` (or the family's budget).
    pub budget: u32,
    /// An earlier invocation's attempt that may have reached the host.
    pub prior_dispatch: Option<&'a str>,
    /// The exit code the ledger recorded when the operation already completed.
    pub ledger_exit: Option<i32>,
    /// `--wait`.
    pub wait: Duration,
    /// The earlier operation the shim's fingerprint index says this run repeats, when it
    /// refused the claim as a repetition (docs/guarantees.md#repetitions).
    pub repeats: Option<&'a Repetition>,
    /// An earlier invocation's attempt that reached the host (or whose exit the ledger
    /// holds): this run looks at the marker first and makes an attempt only if something
    /// may still have to run (docs/decisions.md#what-earlier-runs-left). Until it makes
    /// one, what it records is an observation about this attempt.
    pub observed: Option<&'a str>,
    /// Policy needs an approval that was not given: this run may replay or follow, but
    /// anything that would run answers `blocked` with this.
    pub held: Option<&'a ApprovalNeeded>,
}

impl Facts<'_> {
    /// What follows or replays the operation: `opmark run`, or for a file delivered or
    /// read, the same `opmark put`/`opmark get` (`opmark run` refuses their intents).
    pub fn rerun(&self) -> &'static str {
        let word = self.command.split(' ').next().unwrap_or_default();
        if word == crate::shim::PUT_WORD {
            "the same `opmark put`"
        } else if word == crate::shim::GET_WORD {
            "the same `opmark get`"
        } else {
            "`opmark run`"
        }
    }

    /// The attempt being made now (or, before this run made one, the earlier attempt it
    /// observes).
    pub fn current(&self) -> String {
        self.attempts
            .last()
            .map(|a| a.attempt_id.clone())
            .or_else(|| self.observed.map(str::to_owned))
            .unwrap_or_default()
    }

    /// Whether `attempt` is one of this invocation's.
    pub fn ours(&self, attempt: &str) -> bool {
        self.attempts.iter().any(|a| a.attempt_id == attempt)
    }

    /// The family's policy or the operator allow moving an interrupted claim aside.
    pub fn may_supersede(&self) -> bool {
        self.after_interrupted == AfterInterrupted::Rerun || self.approved
    }

    fn spent(&self) -> bool {
        self.attempts.len() as u32 >= self.budget
    }
}

/// Where the verdict's exit status comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ExitEvidence {
    /// None: the exit status is not known.
    #[default]
    None,
    /// The host's exit trailer (this attempt's, or an earlier one's replayed).
    Host(ExitFrame),
    /// The ledger (the marker is gone, or an operator vouched for it).
    Ledger(Option<i32>),
}

/// A verdict with what it rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The verdict.
    pub verdict: Verdict,
    /// The attempt it is about.
    pub attempt_id: Option<String>,
    /// The machine-readable reason.
    pub code: ReasonCode,
    /// The words for people.
    pub reason: String,
    /// Where its exit status comes from.
    pub exit: ExitEvidence,
    /// `blocked`: what a human decides on.
    pub approval: Option<Box<ApprovalNeeded>>,
    /// `conflict_on_host`: what differs from the claim, when the claim says.
    pub differs: Option<Differs>,
}

/// What approving a blocked run would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovingWould {
    /// Run the command (nothing of it ran under this op id as far as the evidence goes).
    Run,
    /// Move an interrupted claim aside (kept for audit) and run the command again.
    SupersedeInterruptedClaim,
}

/// An earlier attempt as a blocked run reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EarlierAttempt {
    /// Attempt id.
    pub attempt_id: String,
    /// 1, 2, ...
    pub number: u32,
    /// The furthest boundary it reached (`null`: none recorded).
    pub boundary: Option<Boundary>,
}

/// What a human needs to decide on a `blocked` run (docs/decisions.md#approvals).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalNeeded {
    /// The command, redacted.
    pub intent: String,
    /// The family policy gave it.
    pub family: Family,
    /// The policy rule that asks for approval.
    pub rule: String,
    /// What earlier attempts of the operation reached.
    pub earlier_attempts: Vec<EarlierAttempt>,
    /// What approving would do.
    pub approving_would: ApprovingWould,
    /// Where approvals are signed (docs/trust.md#the-approval-flow): the exact `opmark
    /// approve` command a human runs; the run is then repeated with `--approval FILE`.
    /// None where approvals are self-service (`--approve NOTE`).
    pub approve_command: Option<String>,
}

impl ApprovalNeeded {
    /// The same, with what approving would do.
    fn would(&self, would: ApprovingWould) -> ApprovalNeeded {
        ApprovalNeeded {
            approving_would: would,
            ..self.clone()
        }
    }
}

/// The `blocked` answer: nothing was sent; the reason says what a human decides on.
pub fn blocked(need: ApprovalNeeded, host: &str) -> Answer {
    let earlier = if need.earlier_attempts.is_empty() {
        "no earlier attempt".to_owned()
    } else {
        need.earlier_attempts
            .iter()
            .map(|a| {
                format!(
                    "attempt #{} {} reached {}",
                    a.number,
                    a.attempt_id,
                    a.boundary.map_or("no boundary", |b| b.as_str())
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let would = match need.approving_would {
        ApprovingWould::Run => format!("run the command on {host}"),
        ApprovingWould::SupersedeInterruptedClaim => format!(
            "move the interrupted claim aside (kept for audit) and run the command again on {host}"
        ),
    };
    let how = match &need.approve_command {
        Some(command) => format!(
            "approvals here are signed: a human runs `{command}` and this run is repeated with --approval FILE (the token it writes); --approve NOTE does not count"
        ),
        None => "approvals here are self-service: rerun with --approve NOTE".to_owned(),
    };
    let mut answer = Answer::new(
        Verdict::Blocked,
        None,
        ReasonCode::ApprovalRequired,
        format!(
            "policy requires approval for this command ({}); nothing was sent. Intent: `{}` (family {}); earlier: {earlier}. Approving would {would}; {how}",
            need.rule, need.intent, need.family
        ),
    );
    answer.approval = Some(Box::new(need));
    answer
}

impl Answer {
    /// An answer without an exit status.
    pub fn new(
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
            exit: ExitEvidence::None,
            approval: None,
            differs: None,
        }
    }

    fn with_exit(mut self, exit: ExitEvidence) -> Self {
        self.exit = exit;
        self
    }
}

/// What the driver does next, outside a probe window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send the current attempt.
    Dispatch,
    /// Record a new attempt for this reason (durably, before it leaves), then send it.
    Retry(RetryReason),
    /// A new attempt whose claim moves the interrupted one aside (the run request asks
    /// the shim to supersede), recorded with this reason.
    Supersede(RetryReason),
    /// Wait (growing backoff), then retry: the last attempt never got a connection.
    Backoff,
    /// Open a probe window of `--wait`: probe the marker, then follow or decide.
    Probe,
    /// The verdict.
    Answer(Answer),
}

/// What the driver does next inside a probe window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// Pause (growing), then probe again.
    Wait,
    /// Probe again at once (the connection dropped while following).
    Again,
    /// Attach to the marker and stream its output until it exits or `--wait` passes.
    Attach {
        /// The attempt holding the claim.
        holder: String,
        /// Continue from the bytes this invocation already delivered (its own attempt);
        /// else from byte 0 (an earlier invocation's output, replayed in full).
        resume: bool,
    },
    /// Leave the window.
    Then(Action),
}

/// Evidence the driver records before it acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The current attempt reached this boundary.
    Boundary {
        /// How far it got.
        boundary: Boundary,
        /// Why, in words.
        detail: String,
    },
    /// The current attempt was refused, for this typed reason (reconcile reads it).
    Refused {
        /// Why, as the ledger types it.
        refusal: RefusalWord,
        /// Why, in words.
        detail: String,
    },
    /// This call moved an interrupted claim aside.
    Superseded {
        /// Who allowed it.
        note: &'static str,
    },
    /// What the marker looked like.
    Probed(MarkerInfo),
    /// The host could not be probed.
    Unreachable(String),
    /// A progress line on stderr (not evidence; shown to the person waiting).
    Progress(String),
}

/// One decision: what to record, in order, then what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<A> {
    /// Recorded first.
    pub record: Vec<Effect>,
    /// Then done.
    pub then: A,
}

impl<A> Step<A> {
    fn just(then: A) -> Self {
        Step {
            record: Vec::new(),
            then,
        }
    }

    fn after(record: Vec<Effect>, then: A) -> Self {
        Step { record, then }
    }
}

/// How one dispatch of the current attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatched {
    /// No connection, or the exec request never left.
    NotSent {
        /// What went wrong.
        why: String,
        /// The reason code if this is the last word.
        code: ReasonCode,
        /// Retrying will not change it (host key, auth, name, connect timeout).
        final_failure: bool,
    },
    /// The connection reached another machine (or user) than the operation ran on; nothing
    /// was sent (docs/guarantees.md#evidence-identity).
    KeyMismatch(String),
    /// The shim refused before acting: its marker root's id is not the one the
    /// operation's attempts reached (docs/guarantees.md#evidence-identity). The message says what changed.
    RootChanged(String),
    /// The channel closed in order before the shim said anything (described).
    NeverStarted(String),
    /// The request left and the reply ended early.
    Lost {
        /// The shim had acknowledged the claim.
        started: bool,
        /// What the transport said.
        reason: String,
    },
    /// The shim answered in full.
    Replied(Box<RunReply>),
}

/// The shim's names for a marker root that ran out of room (`root_unusable reason=...`).
fn is_resource_cause(reason: &str) -> bool {
    matches!(reason, "no_space" | "no_inodes" | "quota_exceeded")
}

/// What a probe window saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeSeen {
    /// No connection.
    ConnectFailed {
        /// The full problem, for the record and the verdict.
        problem: String,
        /// The short message, for the progress line.
        message: String,
    },
    /// Connected to another machine or user, or the shim's marker root is not the one
    /// the operation's attempts reached (docs/guarantees.md#evidence-identity); the message says what changed.
    KeyMismatch(String),
    /// Connected, but the probe got no answer.
    NoAnswer(String),
    /// The marker.
    Marker(MarkerInfo),
}

/// How following (attaching to) a marker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// The command exited.
    Exit(ExitFrame),
    /// The command vanished without an exit record.
    Interrupted(MarkerInfo),
    /// `--wait` passed while it ran.
    StillRunning,
    /// The connection dropped (or the attach was refused).
    Lost(String),
}

/// The time a probe window has left, and the pause before the next probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Until the window closes.
    pub left: Duration,
    /// The next pause.
    pub pause: Duration,
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
pub fn connect_is_final(e: &ConnectError) -> bool {
    matches!(
        e.stage,
        ConnectStage::HostKey
            | ConnectStage::Auth
            | ConnectStage::Resolve
            | ConnectStage::Config
            | ConnectStage::Timeout
    )
}

/// The first move of a run: dispatch its recorded attempt, or, when an earlier attempt
/// reached the host (or the ledger already holds the exit), look at the marker first:
/// a replay or a follow is an observation, and only an absent or superseded marker makes
/// an attempt (never claim again what the ledger saw complete).
pub fn start(facts: &Facts<'_>) -> Step<Action> {
    if facts.ledger_exit.is_some() || (facts.attempts.is_empty() && facts.observed.is_some()) {
        return Step::just(Action::Probe);
    }
    Step::just(Action::Dispatch)
}

/// After one dispatch of the current attempt.
pub fn after_dispatch(facts: &Facts<'_>, seen: Dispatched) -> Step<Action> {
    let attempt = facts.current();
    match seen {
        Dispatched::NotSent {
            why,
            code,
            final_failure,
        } => {
            let then = match not_sent(facts, &why, code, final_failure) {
                Some(answer) => Action::Answer(answer),
                None => Action::Backoff,
            };
            Step::after(
                vec![Effect::Boundary {
                    boundary: Boundary::NotSent,
                    detail: why,
                }],
                then,
            )
        }
        Dispatched::KeyMismatch(why) => Step::after(
            vec![Effect::Boundary {
                boundary: Boundary::NotSent,
                detail: why.clone(),
            }],
            Action::Answer(key_mismatch(&attempt, why)),
        ),
        Dispatched::RootChanged(why) => Step::after(
            vec![Effect::Refused {
                refusal: RefusalWord::from("root_changed"),
                detail: why.clone(),
            }],
            Action::Answer(key_mismatch(&attempt, why)),
        ),
        Dispatched::NeverStarted(described) => {
            // Nothing of the shim ran, so this attempt claimed nothing: no probe needed,
            // and retrying would meet the same host.
            let answer = never_started(facts, &attempt, &described);
            Step::after(
                vec![Effect::Boundary {
                    boundary: Boundary::SentNoResponse,
                    detail: described,
                }],
                Action::Answer(answer),
            )
        }
        Dispatched::Lost { started, reason } => Step::after(
            vec![
                // The loss itself is evidence worth keeping (docs/ledger.md#events: "response lost").
                Effect::Boundary {
                    boundary: if started {
                        Boundary::Started
                    } else {
                        Boundary::SentNoResponse
                    },
                    detail: format!("response lost: {reason}"),
                },
                Effect::Progress(format!(
                    "connection to {} lost after dispatch ({reason}); probing the marker before anything else",
                    facts.host
                )),
            ],
            Action::Probe,
        ),
        Dispatched::Replied(reply) => after_reply(facts, *reply),
    }
}

/// An attempt that never left: `None` to back off and retry, or the final verdict.
pub fn not_sent(
    facts: &Facts<'_>,
    why: &str,
    code: ReasonCode,
    final_failure: bool,
) -> Option<Answer> {
    if !final_failure && !facts.spent() {
        return None;
    }
    let attempt = facts.current();
    // This attempt never left, but an earlier one did and its outcome is not known
    // here: claiming `not_applied` for the operation would claim more than we know.
    let earlier = facts
        .attempts
        .iter()
        .find(|a| a.boundary != Boundary::NotSent)
        .map(|a| a.attempt_id.clone())
        .or_else(|| facts.prior_dispatch.map(str::to_owned));
    if let Some(earlier) = earlier {
        return Some(Answer::new(
            Verdict::Indeterminate,
            Some(attempt),
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
        Some(attempt),
        code,
        format!(
            "{why}; nothing was sent after {} attempt(s); {advice}",
            facts.attempts.len()
        ),
    ))
}

/// This attempt's shim never started. `not_applied` unless an earlier attempt left and
/// its outcome is unknown (that one may still have run).
fn never_started(facts: &Facts<'_>, attempt: &str, described: &str) -> Answer {
    let earlier = facts
        .attempts
        .iter()
        .find(|a| a.attempt_id != attempt && a.boundary != Boundary::NotSent)
        .map(|a| a.attempt_id.clone())
        .or_else(|| facts.prior_dispatch.map(str::to_owned));
    match earlier {
        Some(earlier) => Answer::new(
            Verdict::Indeterminate,
            Some(attempt.to_owned()),
            ReasonCode::EarlierDispatchUnknown,
            format!(
                "{described}; attempt {earlier} was dispatched earlier and its outcome is unknown. Run `opmark reconcile` once the host is fixed"
            ),
        ),
        None => Answer::new(
            Verdict::NotApplied,
            Some(attempt.to_owned()),
            ReasonCode::ShimDidNotStart,
            described,
        ),
    }
}

/// The shim answered a `run` call in full.
pub fn after_reply(facts: &Facts<'_>, reply: RunReply) -> Step<Action> {
    let attempt = facts.current();
    let mut record = Vec::new();
    if reply.superseded {
        record.push(Effect::Superseded {
            note: if facts.approved {
                "operator approved superseding the interrupted claim"
            } else {
                "policy reruns interrupted operations of this family"
            },
        });
    }
    if let Some(x) = reply.exit {
        if reply.refusal.is_some() {
            record.push(Effect::Refused {
                refusal: RefusalWord::AlreadyCompleted,
                detail: "already completed on the host".into(),
            });
        }
        let mut x = x;
        x.cancelled |= reply
            .refusal
            .as_ref()
            .and_then(|r| r.marker.as_ref())
            .is_some_and(MarkerInfo::cancelled);
        return Step::after(record, Action::Answer(exit_answer(facts, x)));
    }
    let Some(refusal) = reply.refusal else {
        // The supervisor vanished without an exit record while the call followed it.
        let marker = reply.interrupted;
        if let Some(m) = &marker {
            record.push(Effect::Probed(m.clone()));
        }
        let then = conclude(facts, after_interrupted(facts, marker.as_ref()));
        return Step::after(record, then);
    };
    // The shim's reason is a protocol word: it types the refusal.
    record.push(Effect::Refused {
        refusal: RefusalWord::from(refusal.reason.as_str()),
        detail: refusal.reason.as_str().to_owned(),
    });
    let then = match refusal.reason {
        RefusalReason::Marker(MarkerState::Running) => {
            let holder = refusal.marker.as_ref().and_then(|m| m.attempt.clone());
            record.push(Effect::Progress(format!(
                "op {} is already running on {} (attempt {}); following it for up to {}s",
                facts.op,
                facts.host,
                holder.as_deref().unwrap_or("?"),
                facts.wait.as_secs()
            )));
            // A probe window answers `fenced` as its only `not_applied`, which the
            // earlier-attempt rule below leaves alone: nothing to re-check after it.
            return Step::after(record, Action::Probe);
        }
        // Superseding needs room for the new claim; the old evidence stays in place.
        RefusalReason::Marker(MarkerState::Interrupted) if refusal.supersede_failed.is_some() => {
            let why = refusal
                .marker
                .as_ref()
                .and_then(|m| m.why.clone())
                .unwrap_or_else(|| "unknown".into());
            Action::Answer(Answer::new(
                Verdict::Indeterminate,
                Some(attempt.clone()),
                ReasonCode::HostDiskFull,
                format!(
                    "the operation was interrupted on the host ({why}) and may have had effects; it could not be re-run because the host's marker root is full ({}); its evidence is kept. Free space on the host, then rerun with the same op id",
                    refusal.supersede_failed.as_deref().unwrap_or_default()
                ),
            ))
        }
        RefusalReason::Marker(MarkerState::Interrupted) => conclude(facts, after_interrupted(facts, refusal.marker.as_ref())),
        RefusalReason::Marker(MarkerState::Fenced) => Action::Answer(fenced(
            &attempt,
            refusal.marker.as_ref(),
            "the operation was closed as not applied (its marker is fenced); nothing ran and nothing can run under this op id",
        )),
        RefusalReason::Conflict => Action::Answer(host_conflict(
            facts,
            &attempt,
            refusal.marker.as_ref(),
            "nothing ran. For the same effect resend exactly that command and stdin; a new op id only for a different effect",
        )),
        // This call moved an interrupted claim aside before its own start failed: the
        // earlier attempt may have run.
        RefusalReason::RootUnusable if reply.superseded => Action::Answer(Answer::new(
            Verdict::Indeterminate,
            Some(attempt.clone()),
            ReasonCode::HostDiskFull,
            format!(
                "an interrupted claim was superseded, then the new attempt could not start ({}); the earlier attempt may have had effects. Free space on the host, then rerun with the same op id",
                refusal.detail
            ),
        )),
        RefusalReason::RootUnusable
            if refusal.cause.as_deref().is_some_and(is_resource_cause) =>
        {
            Action::Answer(Answer::new(
                Verdict::NotApplied,
                Some(attempt.clone()),
                ReasonCode::HostDiskFull,
                format!(
                    "the host's marker root is full ({}): the operation's records could not be written before the command started, so the claim was undone and nothing ran. Free space on the host (see `opmark doctor`), then retry with the same op id",
                    refusal.cause.as_deref().unwrap_or_default()
                ),
            ))
        }
        RefusalReason::CannotStart
            if matches!(
                refusal.cause.as_deref(),
                Some("no_setsid" | "setsid_without_f")
            ) =>
        {
            Action::Answer(Answer::new(
                Verdict::NotApplied,
                Some(attempt.clone()),
                ReasonCode::HostMissingSetsid,
                "the host has no `setsid` (neither util-linux's nor busybox's, on PATH or in /usr/bin, /bin, /usr/sbin, /sbin), which the shim needs to detach the command from the connection; nothing ran. Install util-linux on the host (Debian/Ubuntu: `apt-get install util-linux`; Alpine: `apk add util-linux-misc`) or a busybox with its setsid applet, then retry with the same op id",
            ))
        }
        RefusalReason::CannotStart
            if refusal
                .cause
                .as_deref()
                .is_some_and(|c| c == "no_sudo" || c.starts_with("become_")) =>
        {
            let why = match refusal.cause.as_deref() {
                Some("no_sudo") => "the host has no `sudo`. Install it there, or run without --become",
                Some("become_needs_tty") => "the host's sudo needs a terminal (`requiretty` in sudoers), which a command run by opmark never has. Drop `requiretty` for this user (`Defaults:USER !requiretty`), or run without --become",
                Some("become_needs_password") => "the host's sudo needs a password for this user and none was given. Give it with --secret SUDO_PASSWORD=env:VAR (or file:PATH), or allow the user NOPASSWD in sudoers",
                Some("become_wrong_password") => "the host's sudo did not accept the password given as SUDO_PASSWORD. Check the secret's source",
                _ => "the host's sudo refused to run a command as that user for the login user (not in sudoers, or not for that user). Check `sudo -l` on the host",
            };
            Action::Answer(Answer::new(
                Verdict::NotApplied,
                Some(attempt.clone()),
                ReasonCode::BecomeRefused,
                format!("--become cannot work: {why}; the shim checked this before claiming anything, and nothing ran. Then retry with the same op id"),
            ))
        }
        RefusalReason::CannotStart if refusal.cause.as_deref() == Some("no_awk") => {
            Action::Answer(Answer::new(
                Verdict::NotApplied,
                Some(attempt.clone()),
                ReasonCode::ShimCannotStart,
                "the host has no `awk`, which the shim needs to redact the secrets' values from the command's output before it keeps any; it claimed nothing and nothing ran. Install awk on the host (Debian/Ubuntu: `apt-get install mawk`; busybox: its awk applet), or run without --secret, then retry with the same op id",
            ))
        }
        RefusalReason::CannotStart if refusal.cause.as_deref() == Some("no_process_identity") => {
            Action::Answer(Answer::new(
                Verdict::NotApplied,
                Some(attempt.clone()),
                ReasonCode::ShimCannotStart,
                "the host gives the shim no readable process identity (no /proc, a /proc of another pid namespace, or hidepid hiding the user's own processes), so it could never tell a running command from a gone one; it claimed nothing and nothing ran. Mount /proc for the login user (see `opmark doctor`), then retry with the same op id",
            ))
        }
        // The shim's fingerprint index holds the same intent under another op id within
        // the window (another ledger, another machine, or a racing claim that won):
        // held back, nothing ran.
        RefusalReason::Repeats => Action::Answer(match facts.repeats {
            Some(found) => repetition_held(found, facts.op, facts.host, Some(attempt.clone())),
            None => Answer::new(
                Verdict::Blocked,
                Some(attempt.clone()),
                ReasonCode::RepeatsRecentOperation,
                format!(
                    "the host holds the same command under another op id ({}); nothing ran. Rerun under that op id to replay it, or with --repeats OP to repeat it deliberately",
                    refusal.detail
                ),
            ),
        }),
        // The command never started: the supervisor gave its locks back and took a fresh
        // claim back, so a rerun under this op id claims it again.
        RefusalReason::LockBusy => Action::Answer(lock_busy(
            &attempt,
            refusal.busy_lock.clone().unwrap_or_default(),
        )),
        RefusalReason::InvalidOpId | RefusalReason::BadArgs => Action::Answer(Answer::new(
            Verdict::Refused,
            Some(attempt.clone()),
            ReasonCode::InvalidInput,
            format!(
                "the host shim refused the request as invalid ({})",
                refusal.detail
            ),
        )),
        other => Action::Answer(Answer::new(
            Verdict::NotApplied,
            Some(attempt.clone()),
            ReasonCode::ShimCannotStart,
            format!(
                "the host shim could not start the command ({}: {}); nothing ran. Check the host with `opmark doctor`",
                other.as_str(),
                refusal.detail
            ),
        )),
    };
    let then = match then {
        Action::Answer(answer) => Action::Answer(earlier_may_have_run(facts, &attempt, answer)),
        other => other,
    };
    Step::after(record, then)
}

/// A refusal says that *this* attempt ran nothing. When an earlier attempt of the
/// operation may have run (it was sent and never answered, or started), `not_applied`
/// would claim more than that: the operation's outcome is unknown. (A fence is the
/// exception: `not_applied`/`fenced` is given only for a fence over a command that never
/// started; one over a started command is `indeterminate` already.)
pub fn earlier_may_have_run(facts: &Facts<'_>, attempt: &str, answer: Answer) -> Answer {
    if answer.verdict != Verdict::NotApplied || answer.code == ReasonCode::Fenced {
        return answer;
    }
    let earlier = facts
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
        .or_else(|| facts.prior_dispatch.map(str::to_owned));
    match earlier {
        None => answer,
        Some(earlier) => Answer::new(
            Verdict::Indeterminate,
            answer.attempt_id,
            answer.code,
            format!(
                "{}; but attempt {earlier} reached the host earlier and may have run, so the operation's outcome is unknown. Rerun with the same op id once this is fixed, or run `opmark reconcile`",
                answer
                    .reason
                    .trim_end_matches("; nothing ran. Check the host with `opmark doctor`")
            ),
        ),
    }
}

/// A fenced marker's answer. `not_applied` only when the command never started: a fence
/// taken over a started command (`opmark cancel` of an interrupted claim, a forced
/// operator fence) closes the op id, but the command may have had effects, and "nothing
/// ran" would claim more than the evidence.
fn fenced(attempt: &str, marker: Option<&MarkerInfo>, never_started: &str) -> Answer {
    if marker.is_some_and(MarkerInfo::started_before_fence) {
        return Answer::new(
            Verdict::Indeterminate,
            Some(attempt.to_owned()),
            ReasonCode::FencedAfterStart,
            "the marker is fenced, but its command had started before the fence (opmark cancel of an interrupted operation, or a forced resolve): it may have had effects, and nothing more can run under this op id. Check the host, then record what happened with `opmark resolve --as applied` or `--as abandoned`",
        );
    }
    Answer::new(
        Verdict::NotApplied,
        Some(attempt.to_owned()),
        ReasonCode::Fenced,
        never_started,
    )
}

/// The marker is interrupted (or was fenced while followed): supersede when the policy
/// or the operator allows, else `indeterminate` until someone decides.
pub fn after_interrupted(facts: &Facts<'_>, marker: Option<&MarkerInfo>) -> Action {
    let attempt = facts.current();
    if marker.is_some_and(|m| m.state == MarkerState::Fenced) {
        // Fenced while followed: nothing more can run, and superseding would only be
        // refused; whether anything ran is what the fence record says.
        return Action::Answer(fenced(
            &attempt,
            marker,
            "the marker was fenced before the command started (opmark cancel or resolve); nothing ran and nothing can run under this op id",
        ));
    }
    if facts.may_supersede() {
        return Action::Supersede(if facts.approved {
            RetryReason::OperatorApproved
        } else {
            RetryReason::InterruptedRerun
        });
    }
    let why = marker
        .and_then(|m| m.why.clone())
        .unwrap_or_else(|| "unknown".into());
    Action::Answer(Answer::new(
        Verdict::Indeterminate,
        Some(attempt),
        ReasonCode::InterruptedNeedsApproval,
        format!(
            "the operation was interrupted on the host ({why}) and may have had effects; {} commands are not re-run automatically: check the host, then rerun with --approve NOTE or record a decision with `opmark resolve`",
            facts.family
        ),
    ))
}

/// A probe that got no answer (`said` is how): recorded as unreachable, then probed
/// again while the window lasts (saying so, with the time left), else `indeterminate`.
fn probe_unanswered(
    facts: &Facts<'_>,
    problem: String,
    said: String,
    window: Window,
) -> Step<ProbeAction> {
    if window.pause >= window.left {
        let answer = unreachable(facts, &problem);
        return Step::after(
            vec![Effect::Unreachable(problem)],
            ProbeAction::Then(Action::Answer(answer)),
        );
    }
    Step::after(
        vec![
            Effect::Unreachable(problem),
            Effect::Progress(format!(
                "{said}; probing again, {}s left",
                window.left.as_secs()
            )),
        ],
        ProbeAction::Wait,
    )
}

/// What a probe window saw, decided.
pub fn after_probe(facts: &Facts<'_>, seen: ProbeSeen, window: Window) -> Step<ProbeAction> {
    let attempt = facts.current();
    match seen {
        ProbeSeen::ConnectFailed { problem, message } => {
            let said = format!("{} unreachable ({message})", facts.host);
            probe_unanswered(facts, problem, said, window)
        }
        ProbeSeen::NoAnswer(problem) => {
            let said = format!("{} did not answer the probe ({problem})", facts.host);
            probe_unanswered(facts, problem, said, window)
        }
        ProbeSeen::KeyMismatch(why) => Step::just(ProbeAction::Then(Action::Answer(key_mismatch(
            &attempt, why,
        )))),
        ProbeSeen::Marker(marker) => {
            let record = vec![Effect::Probed(marker.clone())];
            let then = match marker.state {
                MarkerState::Absent => ProbeAction::Then(conclude(
                    facts,
                    Action::Retry(RetryReason::ResponseLostAfterDispatch),
                )),
                MarkerState::Fenced => ProbeAction::Then(Action::Answer(fenced(
                    &attempt,
                    Some(&marker),
                    "the marker is fenced: the operation was closed as not applied; nothing ran",
                ))),
                MarkerState::Interrupted => {
                    ProbeAction::Then(conclude(facts, after_interrupted(facts, Some(&marker))))
                }
                MarkerState::Running | MarkerState::Completed
                    if marker
                        .fingerprint
                        .as_deref()
                        .is_some_and(|fp| fp != facts.host_fp) =>
                {
                    ProbeAction::Then(Action::Answer(host_conflict(
                        facts,
                        &attempt,
                        Some(&marker),
                        "nothing was sent",
                    )))
                }
                MarkerState::Running | MarkerState::Completed => {
                    let holder = marker.attempt.clone().unwrap_or_default();
                    ProbeAction::Attach {
                        resume: facts.ours(&holder),
                        holder,
                    }
                }
            };
            Step::after(record, then)
        }
    }
}

/// How following `holder`'s marker ended, decided.
pub fn after_follow(
    facts: &Facts<'_>,
    holder: &str,
    followed: Followed,
    window: Window,
) -> Step<ProbeAction> {
    match followed {
        Followed::Exit(x) => Step::just(ProbeAction::Then(Action::Answer(exit_answer(facts, x)))),
        Followed::Interrupted(m) => {
            let then = conclude(facts, after_interrupted(facts, Some(&m)));
            Step::after(vec![Effect::Probed(m)], ProbeAction::Then(then))
        }
        Followed::StillRunning => Step::just(ProbeAction::Then(Action::Answer(Answer::new(
            Verdict::InProgress,
            Some(holder.to_owned()),
            ReasonCode::StillRunning,
            format!(
                "attempt {holder} holds the claim and is still running after waiting {}s; run again with the same op id to follow it",
                facts.wait.as_secs()
            ),
        )))),
        Followed::Lost(why) => {
            let record = vec![Effect::Progress(format!(
                "lost {} again while following ({why}); probing",
                facts.host
            ))];
            if window.left.is_zero() {
                let answer = unreachable(facts, &why);
                return Step::after(record, ProbeAction::Then(Action::Answer(answer)));
            }
            Step::after(record, ProbeAction::Again)
        }
    }
}

/// The rules every retry and every verdict leaving a probe pass through: a ledger that
/// already holds the exit is never claimed against (a marker gone replays from the
/// ledger; another machine, user or marker root under the name is `host_changed`, never
/// a replay: an outcome there is not an outcome here, docs/guarantees.md#evidence-identity), and no retry is made past
/// the budget.
pub fn conclude(facts: &Facts<'_>, action: Action) -> Action {
    let attempt = facts.current();
    if let Some(code) = facts.ledger_exit {
        match &action {
            // Absent (or superseded), though the ledger saw it complete: the marker was
            // removed. Running it again would be a second execution.
            Action::Retry(_) | Action::Supersede(_) | Action::Backoff | Action::Dispatch => {
                let reason = format!(
                    "the ledger recorded this operation completed with exit {code}, but its marker is gone from the host (gc?); nothing ran again, and the output is no longer available"
                );
                return Action::Answer(
                    Answer::new(
                        Verdict::Replayed,
                        Some(attempt),
                        ReasonCode::ReplayedFromLedger,
                        reason,
                    )
                    .with_exit(ExitEvidence::Ledger(Some(code))),
                );
            }
            _ => {}
        }
    }
    if let Some(need) = facts.held {
        match &action {
            Action::Retry(_) | Action::Backoff | Action::Dispatch => {
                return Action::Answer(blocked(need.would(ApprovingWould::Run), facts.host));
            }
            Action::Supersede(_) => {
                return Action::Answer(blocked(
                    need.would(ApprovingWould::SupersedeInterruptedClaim),
                    facts.host,
                ));
            }
            _ => {}
        }
    }
    match action {
        Action::Retry(reason) | Action::Supersede(reason) if facts.spent() => {
            Action::Answer(Answer::new(
                Verdict::Indeterminate,
                Some(attempt),
                ReasonCode::AttemptBudgetSpent,
                format!(
                    "a retry was needed ({}) but the attempt budget ({}) is spent; retry with the same op id (the atomic claim makes it safe), or run `opmark reconcile`",
                    reason, facts.budget
                ),
            ))
        }
        other => other,
    }
}

/// The exit trailer: `completed` when one of this invocation's attempts ran it,
/// `replayed` when an earlier one did.
fn exit_answer(facts: &Facts<'_>, x: ExitFrame) -> Answer {
    let attempt = x.attempt.clone();
    let mut answer = if facts.ours(&x.attempt) {
        Answer::new(
            Verdict::Completed,
            Some(attempt),
            ReasonCode::CommandExited,
            format!(
                "attempt {} ran the command and its exit status was received",
                x.attempt
            ),
        )
    } else {
        Answer::new(
            Verdict::Replayed,
            Some(attempt),
            ReasonCode::ReplayedFromHost,
            format!(
                "the operation had already run on the host (attempt {}); its recorded exit status and output are returned, nothing ran again",
                x.attempt
            ),
        )
    };
    // Whichever way the exit was reached (a claim refused as completed, or a follow
    // after a probe), a replay of a cancelled command says so.
    if x.cancelled && !facts.ours(&x.attempt) {
        answer
            .reason
            .push_str("; it had been stopped by `opmark cancel`");
    }
    answer.with_exit(ExitEvidence::Host(x))
}

fn unreachable(facts: &Facts<'_>, problem: &str) -> Answer {
    Answer::new(
        Verdict::Indeterminate,
        Some(facts.current()),
        ReasonCode::UnreachableAfterDispatch,
        format!(
            "the request was dispatched, then {} could not be probed within {}s ({problem}); the command may have run. Run `opmark reconcile` when the host is back",
            facts.host,
            facts.wait.as_secs()
        ),
    )
}

/// The host presents another key than the operation ran against, is reached as another
/// user, or its marker root has another id (docs/guarantees.md#evidence-identity): nothing is sent or concluded there,
/// and the op id stays bound to the machine and store its attempts reached: `conflict`,
/// `host_changed`, not retryable.
fn key_mismatch(attempt: &str, why: String) -> Answer {
    let why = if why.starts_with(HOST_CHANGED_PREFIX) {
        why
    } else {
        format!("{HOST_CHANGED_PREFIX}{why}")
    };
    Answer::new(
        Verdict::Conflict,
        Some(attempt.to_owned()),
        ReasonCode::HostChanged,
        why,
    )
}

/// The policy's word before anything is recorded or sent: `refused` when it denies the
/// command, `blocked` when it needs an approval that was not given.
pub fn policy_gate(deny: Option<&str>, approval: Option<&str>, approved: bool) -> Option<Answer> {
    if let Some(rule) = deny {
        return Some(Answer::new(
            Verdict::Refused,
            None,
            ReasonCode::PolicyDenied,
            format!(
                "policy denies this command ({rule}); nothing was recorded or sent. Change the command or the policy"
            ),
        ));
    }
    match approval {
        Some(rule) if !approved => Some(Answer::new(
            Verdict::Blocked,
            None,
            ReasonCode::ApprovalRequired,
            format!(
                "policy requires approval for this command ({rule}); rerun with --approve NOTE"
            ),
        )),
        _ => None,
    }
}

/// What this run sends differently from the claim `marker` reports, told from the
/// claim's fingerprint and stdin digest (`stdin_sum`, `-` for none): the command is the
/// same exactly when this command with the claim's stdin has the claim's fingerprint.
/// None when the claim does not say (a shim older than the field) or nothing differs.
pub fn host_differs(facts: &Facts<'_>, marker: &MarkerInfo) -> Option<Differs> {
    let claimed_fp = marker.fingerprint.as_deref()?;
    let claimed_stdin: Option<[u8; 32]> = match marker.fields.get("stdin_sum")?.as_str() {
        "-" => None,
        hex => Some(hex::decode(hex).ok()?.try_into().ok()?),
    };
    let ours: Option<[u8; 32]> = facts.stdin.map(|s| Sha256::digest(s).into());
    let same_command = host_fingerprint(&Intent {
        command: facts.command,
        stdin_sha256: claimed_stdin,
        secret_names: facts.secret_names,
        become_user: facts.become_user,
    }) == claimed_fp;
    match (same_command, ours == claimed_stdin) {
        (false, true) => Some(Differs::Command),
        (true, false) => Some(Differs::Stdin),
        (false, false) => Some(Differs::CommandAndStdin),
        (true, true) => None,
    }
}

/// The host's marker binds the op id to another intent: `conflict_on_host`, saying what
/// differs when the claim tells, then `then` (what was not done and what to do).
fn host_conflict(
    facts: &Facts<'_>,
    attempt: &str,
    marker: Option<&MarkerInfo>,
    then: &str,
) -> Answer {
    let differs = marker.and_then(|m| host_differs(facts, m));
    let what = match differs {
        Some(Differs::Command) => "a different command (the stdin is the same)",
        Some(Differs::Stdin) if is_put(facts.command) => {
            "the same delivery with other content (the file changed since this op id delivered it)"
        }
        Some(Differs::Stdin) => "the same command with a different stdin",
        Some(Differs::CommandAndStdin) => "a different command and a different stdin",
        None => "a different command or stdin",
    };
    let mut answer = Answer::new(
        Verdict::Conflict,
        Some(attempt.to_owned()),
        ReasonCode::ConflictOnHost,
        format!("the host's marker binds op {} to {what}; {then}", facts.op),
    );
    answer.differs = differs;
    answer
}

/// The ledger binds the op id to another intent: `conflict`, before anything is sent.
pub fn ledger_conflict(
    op: &str,
    host: &str,
    existing: &OperationRecord,
    ledger_fp: &str,
    display: &str,
) -> Option<Answer> {
    (existing.fingerprint != ledger_fp).then(|| {
        // The fingerprint binds command and stdin together; the recorded (redacted)
        // display form tells which of the two changed.
        if existing.display == display && is_put(display) {
            // A put's stdin is the file: what changed is the file, and the way out is a
            // new op id, not resending the old content.
            return Answer::new(
                Verdict::Conflict,
                None,
                ReasonCode::ConflictInLedger,
                format!(
                    "operation {op} on {host} delivered other content to that path (`{}`, recorded {}): the file changed since; nothing was sent. An op id delivers only the content it was first given: give a new op id to deliver this content",
                    crate::text::printable(display),
                    existing.created_at
                ),
            );
        }
        let what = if existing.display == display {
            format!(
                "the same command (`{}`) with a different stdin (or a redacted secret in the command differs)",
                crate::text::printable(display)
            )
        } else {
            format!(
                "a different command: recorded `{}`, now `{}`",
                crate::text::printable(&existing.display),
                crate::text::printable(display)
            )
        };
        Answer::new(
            Verdict::Conflict,
            None,
            ReasonCode::ConflictInLedger,
            format!(
                "operation {op} on {host} is already bound to another intent, {what} (recorded {}); nothing was sent. For the same effect resend exactly the recorded command and stdin (`opmark show`); a new op id only for a different effect, since for the same command it would run again",
                existing.created_at
            ),
        )
    })
}

/// Is `command` a put's delivery (`opmark put`'s intent)?
fn is_put(command: &str) -> bool {
    command
        .strip_prefix(crate::shim::PUT_WORD)
        .is_some_and(|rest| rest.starts_with(' '))
}

/// What earlier invocations left that this run's decisions depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Earlier {
    /// Why this run's first attempt is made.
    pub first_reason: RetryReason,
    /// The attempt it retries.
    pub first_parent: Option<String>,
    /// Attempts the ledger already holds.
    pub attempt_base: u32,
    /// An earlier attempt that may have reached the host.
    pub prior_dispatch: Option<String>,
    /// The exit the ledger recorded when the operation already completed.
    pub ledger_exit: Option<i32>,
}

/// Reads the operation's projection row (if any) into [`Earlier`].
pub fn earlier(existing: Option<&OperationRecord>, approved: bool) -> Earlier {
    let (first_reason, first_parent) = match existing.and_then(|r| r.last_attempt.clone()) {
        Some(parent) if approved => (RetryReason::OperatorApproved, Some(parent)),
        Some(parent) => (RetryReason::CallerRerun, Some(parent)),
        None => (RetryReason::FirstAttempt, None),
    };
    Earlier {
        first_reason,
        first_parent,
        attempt_base: existing.map_or(0, |r| r.attempts),
        // An earlier invocation's attempt left this machine unless the operation was
        // closed as not applied since.
        prior_dispatch: existing
            .filter(|r| r.verdict != Some(Verdict::NotApplied) || r.unresolved)
            .and_then(|r| r.last_attempt.clone()),
        // The ledger already holds this operation's exit: never claim again, even if the
        // host marker has since been removed (gc, a wiped host); look, then replay. A
        // probe that saw the marker completed (an exit code the projection took from it,
        // for an operation not closed as not applied) counts too (docs/decisions.md#what-earlier-runs-left).
        ledger_exit: existing
            .filter(|r| r.verdict != Some(Verdict::NotApplied))
            .and_then(|r| r.exit_code),
    }
}

/// The answer to a `run` of an operation an operator has decided: final, nothing is
/// contacted.
pub fn operator_decided(d: &FinalDecision) -> Answer {
    let by = format!(
        "operator {} resolved this operation as {} ({})",
        d.by,
        d.decision.as_str().replace('_', "-"),
        d.note
    );
    if d.decision == Decision::Applied {
        let exit = d
            .exit_code
            .map_or_else(|| "no exit status".to_owned(), |c| format!("exit {c}"));
        Answer::new(
            Verdict::Replayed,
            None,
            ReasonCode::ResolvedApplied,
            format!("{by}, with {exit}; that decision is final: nothing ran again"),
        )
        .with_exit(ExitEvidence::Ledger(d.exit_code))
    } else if d.decision == Decision::Abandoned {
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

/// What a signal to the client makes of the run (docs/decisions.md#client-signal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    /// What the `client_interrupted` event says was seen.
    pub detail: String,
    /// The answer.
    pub answer: Answer,
    /// Whether the verdict goes to the ledger: not when nothing was sent now but an
    /// earlier run's attempt (or exit) stands, since a `not_applied` there would close an
    /// operation this invocation knows nothing of.
    pub record_verdict: bool,
}

/// A signal stopped the run at `boundary`: `in_progress` when a request of this
/// invocation may have reached the host (the command, if it started, keeps running,
/// detached by design); `not_applied` when nothing was sent.
pub fn client_interrupted(
    facts: &Facts<'_>,
    signal: ClientSignal,
    dispatched: bool,
    boundary: Boundary,
) -> Interruption {
    let attempt = facts.attempts.last().map(|a| a.attempt_id.clone());
    let op = facts.op;
    let host = facts.host;
    if dispatched {
        let seen = match boundary {
            Boundary::SentNoResponse => "the request may have reached the host (no claim acknowledgement yet): if the command started, it keeps running there, detached by design",
            Boundary::Started => "the shim had claimed the marker and started the command: it keeps running on the host, detached by design",
            Boundary::Refused => "another attempt holds the claim and was running: it keeps running on the host, detached by design",
            Boundary::NotSent => "this attempt was not sent, but an earlier attempt of this run was dispatched: if its command started, it keeps running on the host, detached by design",
            Boundary::ExitReceived => "the exit status had been received",
        };
        return Interruption {
            detail: seen.to_owned(),
            answer: Answer::new(
                Verdict::InProgress,
                attempt,
                ReasonCode::ClientInterrupted,
                format!(
                    "interrupted by {signal} at boundary {boundary}: {seen}. {again} with op id {op} follows or replays it; `opmark cancel {host} {op}` stops it",
                    again = facts.rerun()
                ),
            ),
            record_verdict: true,
        };
    }
    let earlier_note = facts
        .prior_dispatch
        .map(|a| {
            format!(" (attempt {a} of an earlier run was dispatched; this says nothing about it)")
        })
        .unwrap_or_default();
    Interruption {
        detail: "nothing was sent by this invocation".to_owned(),
        answer: Answer::new(
            Verdict::NotApplied,
            attempt,
            ReasonCode::ClientInterrupted,
            format!(
                "interrupted by {signal} before anything was sent: this invocation ran nothing and nothing of it can still run{earlier_note}. `opmark run` with op id {op} runs it (at most once)"
            ),
        ),
        record_verdict: facts.prior_dispatch.is_none() && facts.ledger_exit.is_none(),
    }
}

/// The `--wait` budget, which bounds the whole invocation (connects included), was spent
/// at `boundary` (docs/decisions.md#wait-budget): as a signal would have, but the code says
/// why. `in_progress` when a request of this invocation may have reached the host (the
/// command, if it started, keeps running, detached by design); `not_applied` when nothing
/// was ever sent; `indeterminate`, not recorded, when this invocation sent nothing but an
/// earlier run's attempt was dispatched (its outcome is not known here).
pub fn wait_budget_spent(
    facts: &Facts<'_>,
    dispatched: bool,
    boundary: Boundary,
    doing: &str,
) -> Interruption {
    let attempt = facts.attempts.last().map(|a| a.attempt_id.clone());
    let (op, host) = (facts.op, facts.host);
    let budget = if facts.wait.subsec_millis() == 0 {
        format!("{}s", facts.wait.as_secs())
    } else {
        format!("{}ms", facts.wait.as_millis())
    };
    if dispatched {
        let seen = match boundary {
            Boundary::NotSent | Boundary::SentNoResponse => "the request may have reached the host (no claim acknowledgement yet): if the command started, it keeps running there, detached by design",
            Boundary::Started | Boundary::Refused => "the shim had claimed the marker and started the command: it keeps running on the host, detached by design",
            Boundary::ExitReceived => "the exit status had been received",
        };
        return Interruption {
            detail: seen.to_owned(),
            answer: Answer::new(
                Verdict::InProgress,
                attempt,
                ReasonCode::WaitBudgetSpent,
                format!(
                    "the --wait budget ({budget}) was spent {doing}, at boundary {boundary}: {seen}. {again} with op id {op} follows or replays it; `opmark cancel {host} {op}` stops it",
                    again = facts.rerun()
                ),
            ),
            record_verdict: true,
        };
    }
    // No `not_applied` without proof (docs/decisions.md#no-not-applied-without-proof): an
    // earlier run's attempt may have run the command, and this one says nothing about it.
    if let Some(earlier) = facts.prior_dispatch {
        return Interruption {
            detail: format!("the --wait budget ({budget}) was spent {doing}; nothing was sent"),
            answer: Answer::new(
                Verdict::Indeterminate,
                attempt,
                ReasonCode::WaitBudgetSpent,
                format!(
                    "the --wait budget ({budget}) was spent {doing}, before this invocation sent anything; attempt {earlier} of an earlier run was dispatched and its outcome is not known here. Retry with the same op id when the host is reachable (a longer --wait gives the connects more time), or run `opmark reconcile`"
                ),
            ),
            record_verdict: false,
        };
    }
    Interruption {
        detail: format!("the --wait budget ({budget}) was spent {doing}; nothing was sent"),
        answer: Answer::new(
            Verdict::NotApplied,
            attempt,
            ReasonCode::WaitBudgetSpent,
            format!(
                "the --wait budget ({budget}) was spent {doing}, before anything was sent: this invocation ran nothing and nothing of it can still run. Safe to retry with the same op id (a longer --wait gives the connects more time)"
            ),
        ),
        record_verdict: facts.ledger_exit.is_none(),
    }
}

/// `--detach`: the shim acknowledged the claim (recorded as `started`); the command runs
/// on, detached by design, and the verdict says exactly that.
pub fn detached(facts: &Facts<'_>) -> Answer {
    let attempt = facts.attempts.last().map(|a| a.attempt_id.clone());
    let (op, host) = (facts.op, facts.host);
    Answer::new(
        Verdict::InProgress,
        attempt,
        ReasonCode::Detached,
        format!(
            "detached: the shim claimed the marker and started the command, which keeps running on {host}. {again} with op id {op} follows or replays it; `opmark cancel {host} {op}` stops it",
            again = facts.rerun()
        ),
    )
}

/// The ledger stopped taking writes after dispatch, so a needed retry could not be
/// recorded (and was not sent): the answer claims no more than that.
pub fn ledger_failed_after_dispatch(facts: &Facts<'_>, message: &str) -> Answer {
    Answer::new(
        Verdict::Indeterminate,
        Some(facts.current()),
        ReasonCode::EarlierDispatchUnknown,
        format!(
            "{message}; an attempt was dispatched before that, so the command may have run. Rerun with the same op id once the ledger can be written: the host marker decides"
        ),
    )
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

/// The `blocked` answer to a repetition the policy holds (docs/guarantees.md#repetitions):
/// names the earlier operation, its state, when and where, and the two ways forward.
pub fn repetition_held(
    found: &Repetition,
    op: &str,
    host: &str,
    attempt: Option<String>,
) -> Answer {
    Answer::new(
        Verdict::Blocked,
        attempt,
        ReasonCode::RepeatsRecentOperation,
        format!(
            "this command already ran on {host} under op {earlier} ({state}, at {at}, via {route}; seen in the {seen}) and its family does not repeat safely{because}; nothing was sent for op {op}. If you meant the same effect, rerun with --op {earlier} (it replays or follows that operation); if you mean to do it again, rerun with --repeats {earlier}",
            earlier = found.op_id,
            state = found.state,
            at = found.at,
            route = found.route,
            seen = found.seen_in,
            because = found.because.as_deref().map_or(String::new(), |b| format!(" ({b})")),
        ),
    )
}

/// The answer to a host lock not taken in time: `not_applied`, naming the lock and its
/// holder (op id, redacted command, since when); or, when the lock has another capacity on that host than the run named, the
/// input is what to change (`refused`: waiting would never help).
fn lock_busy(attempt: &str, busy: super::reply::BusyLock) -> Answer {
    let lock = busy.lock;
    if busy.cannot_wait {
        return Answer::new(
            Verdict::NotApplied,
            Some(attempt.to_owned()),
            ReasonCode::ShimCannotStart,
            format!(
                "the host cannot hold the lock `{lock}`: it lacks `readlink` or a readable /proc/uptime, which host locks need; the command did not start and nothing ran. Install coreutils (or a busybox with readlink) there (`opmark doctor` checks), or run without --lock"
            ),
        );
    }
    if let Some(capacity) = busy.capacity {
        return Answer::new(
            Verdict::Refused,
            Some(attempt.to_owned()),
            ReasonCode::InvalidInput,
            format!(
                "the host lock `{lock}` has {capacity} slot(s) on that host, and this run named another capacity; the command did not start and nothing ran. Name it `--lock {lock}:{capacity}` (a lock's capacity is set by its first holder on the host)"
            ),
        );
    }
    // The command came redacted from the reply (super::reply::BusyLock::command).
    let holder = match (busy.holder, busy.command) {
        (Some(op), Some(command)) => format!("held by op {op} (`{command}`)"),
        (Some(op), None) => format!("held by op {op}"),
        (None, _) => "held by another operation".to_owned(),
    };
    let holder = match busy.since {
        Some(since) => format!("{holder} since {since}"),
        None => holder,
    };
    Answer::new(
        Verdict::NotApplied,
        Some(attempt.to_owned()),
        ReasonCode::LockBusy,
        format!(
            "the host lock `{lock}` is {holder} (`opmark show` or `opmark list` name it if this ledger ran it); the command did not start and nothing ran. Rerun with the same op id to try again, with --lock-wait to wait for the lock"
        ),
    )
}

#[cfg(test)]
mod tests {
    //! One test per row of the tables in the header, named for the scenario it proves.

    use std::collections::BTreeMap;

    use super::*;
    use crate::ledger::{Event, History, StoredEvent};
    use crate::shim::Refusal;

    const FP: &str = "fp-of-this-intent";

    /// An attempt of this invocation, how far it got.
    fn attempt(id: &str, boundary: Boundary) -> AttemptSummary {
        AttemptSummary {
            attempt_id: id.into(),
            number: 1,
            parent: None,
            reason: RetryReason::FirstAttempt,
            boundary,
        }
    }

    /// A run of `family` whose attempts so far are `attempts` (the last is current).
    fn facts(family: Family, attempts: &[AttemptSummary]) -> Facts<'_> {
        Facts {
            op: "op-1",
            host: "web1",
            family,
            after_interrupted: if family <= Family::Convergent {
                AfterInterrupted::Rerun
            } else {
                AfterInterrupted::Block
            },
            approved: false,
            host_fp: FP,
            command: "echo hi",
            stdin: None,
            secret_names: &[],
            become_user: None,
            attempts,
            budget: 3,
            prior_dispatch: None,
            ledger_exit: None,
            wait: Duration::from_secs(30),
            repeats: None,
            observed: None,
            held: None,
        }
    }

    fn marker(state: MarkerState, holder: Option<&str>) -> MarkerInfo {
        MarkerInfo {
            state,
            why: (state == MarkerState::Interrupted).then(|| "reboot".into()),
            attempt: holder.map(Into::into),
            fingerprint: holder.map(|_| FP.into()),
            family: None,
            exit_code: (state == MarkerState::Completed).then_some(0),
            timed_out: false,
            out_bytes: None,
            err_bytes: None,
            fields: BTreeMap::new(),
        }
    }

    fn exit(by: &str, code: i32) -> ExitFrame {
        ExitFrame {
            code,
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

    fn refusal(word: &str, fields: &[(&str, &str)], marker: Option<MarkerInfo>) -> Refused {
        Refused::read(
            &Refusal {
                reason: RefusalReason::parse(word).expect("a shim word"),
                replay: false,
                marker,
                fields: fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
            &crate::redact::Redactor::default(),
        )
    }

    fn replied(reply: RunReply) -> Dispatched {
        Dispatched::Replied(Box::new(reply))
    }

    fn refused_reply(r: Refused) -> Dispatched {
        replied(RunReply {
            superseded: false,
            exit: None,
            refusal: Some(r),
            interrupted: None,
        })
    }

    const TIME_LEFT: Window = Window {
        left: Duration::from_secs(10),
        pause: Duration::from_millis(250),
    };
    const SPENT: Window = Window {
        left: Duration::from_millis(100),
        pause: Duration::from_millis(250),
    };

    fn answer<A: std::fmt::Debug + Into<Option<Answer>>>(then: A) -> Answer {
        let shown = format!("{then:?}");
        then.into()
            .unwrap_or_else(|| panic!("expected an answer, got {shown}"))
    }

    impl From<Action> for Option<Answer> {
        fn from(a: Action) -> Self {
            match a {
                Action::Answer(answer) => Some(answer),
                _ => None,
            }
        }
    }

    impl From<ProbeAction> for Option<Answer> {
        fn from(a: ProbeAction) -> Self {
            match a {
                ProbeAction::Then(Action::Answer(answer)) => Some(answer),
                _ => None,
            }
        }
    }

    fn verdict_of(a: &Answer) -> (Verdict, ReasonCode) {
        (a.verdict, a.code)
    }

    // --- docs/decisions.md#after-a-lost-connection: what the probe says ---

    #[test]
    fn probe_finds_completed_by_an_earlier_invocation_then_attach_replays_it() {
        let ours = [attempt("at-2", Boundary::SentNoResponse)];
        let f = facts(Family::AppendOnly, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Completed, Some("at-1"))),
            TIME_LEFT,
        );
        assert_eq!(
            step.record,
            vec![Effect::Probed(marker(MarkerState::Completed, Some("at-1")))]
        );
        assert_eq!(
            step.then,
            ProbeAction::Attach {
                holder: "at-1".into(),
                resume: false
            }
        );
        let step = after_follow(&f, "at-1", Followed::Exit(exit("at-1", 4)), TIME_LEFT);
        let a = answer(step.then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Replayed, ReasonCode::ReplayedFromHost)
        );
        assert_eq!(a.exit, ExitEvidence::Host(exit("at-1", 4)));
        assert_eq!(a.attempt_id.as_deref(), Some("at-1"));
    }

    #[test]
    fn probe_finds_our_own_attempt_running_then_attach_resumes_and_answers_completed() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::Destructive, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Running, Some("at-1"))),
            TIME_LEFT,
        );
        assert_eq!(
            step.then,
            ProbeAction::Attach {
                holder: "at-1".into(),
                resume: true
            },
            "our own attempt's output continues from the last byte delivered"
        );
        let a = answer(after_follow(&f, "at-1", Followed::Exit(exit("at-1", 0)), TIME_LEFT).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Completed, ReasonCode::CommandExited)
        );
        assert_eq!(a.exit, ExitEvidence::Host(exit("at-1", 0)));
    }

    #[test]
    fn probe_finds_an_earlier_invocations_attempt_running_then_its_exit_is_a_replay() {
        let ours = [attempt("at-2", Boundary::Refused)];
        let f = facts(Family::Convergent, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Running, Some("at-1"))),
            TIME_LEFT,
        );
        assert_eq!(
            step.then,
            ProbeAction::Attach {
                holder: "at-1".into(),
                resume: false
            }
        );
        let a = answer(after_follow(&f, "at-1", Followed::Exit(exit("at-1", 0)), TIME_LEFT).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Replayed, ReasonCode::ReplayedFromHost)
        );
    }

    #[test]
    fn still_running_when_wait_passes_is_in_progress_about_the_holder_and_retryable() {
        let ours = [attempt("at-2", Boundary::Refused)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(after_follow(&f, "at-1", Followed::StillRunning, SPENT).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::InProgress, ReasonCode::StillRunning)
        );
        assert_eq!(a.attempt_id.as_deref(), Some("at-1"));
        assert!(a.code.retryable());
    }

    #[test]
    fn probe_finds_a_marker_with_another_fingerprint_is_a_conflict_not_a_replay() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::ReadOnly, &ours);
        let mut m = marker(MarkerState::Completed, Some("at-0"));
        m.fingerprint = Some("someone-elses".into());
        let a = answer(after_probe(&f, ProbeSeen::Marker(m), TIME_LEFT).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Conflict, ReasonCode::ConflictOnHost)
        );
    }

    #[test]
    fn probe_finds_absent_after_a_lost_dispatch_then_retry_with_the_same_op_id() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::Destructive, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Absent, None)),
            TIME_LEFT,
        );
        assert_eq!(
            step.then,
            ProbeAction::Then(Action::Retry(RetryReason::ResponseLostAfterDispatch))
        );
    }

    #[test]
    fn probe_finds_absent_but_the_attempt_budget_is_spent_then_indeterminate() {
        let ours = [
            attempt("at-1", Boundary::SentNoResponse),
            attempt("at-2", Boundary::SentNoResponse),
            attempt("at-3", Boundary::SentNoResponse),
        ];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_probe(
                &f,
                ProbeSeen::Marker(marker(MarkerState::Absent, None)),
                TIME_LEFT,
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::AttemptBudgetSpent)
        );
        assert_eq!(a.attempt_id.as_deref(), Some("at-3"));
    }

    #[test]
    fn interrupted_and_convergent_then_supersede_and_rerun() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::Convergent, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Interrupted, Some("at-1"))),
            TIME_LEFT,
        );
        assert_eq!(
            step.then,
            ProbeAction::Then(Action::Supersede(RetryReason::InterruptedRerun))
        );
    }

    #[test]
    fn interrupted_and_read_only_then_supersede_and_rerun() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::ReadOnly, &ours);
        assert_eq!(
            after_interrupted(&f, Some(&marker(MarkerState::Interrupted, Some("at-1")))),
            Action::Supersede(RetryReason::InterruptedRerun)
        );
    }

    #[test]
    fn interrupted_and_append_only_without_approve_then_indeterminate_until_an_operator_decides() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::AppendOnly, &ours);
        let a = answer(after_interrupted(
            &f,
            Some(&marker(MarkerState::Interrupted, Some("at-1"))),
        ));
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::InterruptedNeedsApproval)
        );
        assert!(!a.code.retryable());
        assert!(
            a.reason.contains("(reboot)") && a.reason.contains("append-only"),
            "{a:?}"
        );
    }

    #[test]
    fn interrupted_and_destructive_with_approve_then_supersede_as_operator_approved() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let mut f = facts(Family::Destructive, &ours);
        f.approved = true;
        assert_eq!(
            after_interrupted(&f, Some(&marker(MarkerState::Interrupted, Some("at-1")))),
            Action::Supersede(RetryReason::OperatorApproved)
        );
    }

    #[test]
    fn interrupted_and_supersede_wanted_but_the_budget_is_spent_then_indeterminate() {
        let ours = [attempt("at-1", Boundary::Started)];
        let mut f = facts(Family::ReadOnly, &ours);
        f.budget = 1;
        let a = answer(
            after_probe(
                &f,
                ProbeSeen::Marker(marker(MarkerState::Interrupted, Some("at-1"))),
                TIME_LEFT,
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::AttemptBudgetSpent)
        );
    }

    #[test]
    fn probe_finds_fenced_then_not_applied_even_after_a_dispatch() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::Destructive, &ours);
        let a = answer(
            after_probe(
                &f,
                ProbeSeen::Marker(marker(MarkerState::Fenced, None)),
                TIME_LEFT,
            )
            .then,
        );
        assert_eq!(verdict_of(&a), (Verdict::NotApplied, ReasonCode::Fenced));
    }

    #[test]
    fn probe_unreachable_with_wait_left_then_record_it_and_probe_again_after_a_pause() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::AppendOnly, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::ConnectFailed {
                problem: "connect: refused".into(),
                message: "refused".into(),
            },
            TIME_LEFT,
        );
        assert_eq!(step.then, ProbeAction::Wait);
        assert_eq!(
            step.record[0],
            Effect::Unreachable("connect: refused".into())
        );
        assert!(matches!(&step.record[1], Effect::Progress(p) if p.contains("probing again")));
    }

    #[test]
    fn probe_unreachable_until_wait_is_spent_then_indeterminate_never_not_applied() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::ConnectFailed {
                problem: "connect: timed out".into(),
                message: "timed out".into(),
            },
            SPENT,
        );
        assert_eq!(
            step.record,
            vec![Effect::Unreachable("connect: timed out".into())]
        );
        let a = answer(step.then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::UnreachableAfterDispatch)
        );
        assert!(a.reason.contains("connect: timed out"), "{a:?}");
    }

    #[test]
    fn probe_gets_no_answer_then_wait_or_indeterminate_by_the_time_left() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::ReadOnly, &ours);
        let seen = ProbeSeen::NoAnswer("lost".into());
        assert_eq!(
            after_probe(&f, seen.clone(), TIME_LEFT).then,
            ProbeAction::Wait
        );
        let a = answer(after_probe(&f, seen, SPENT).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::UnreachableAfterDispatch)
        );
    }

    #[test]
    fn probe_reaches_a_host_with_another_key_then_nothing_is_concluded() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_probe(
            &f,
            ProbeSeen::KeyMismatch("another machine".into()),
            TIME_LEFT,
        );
        assert!(
            step.record.is_empty(),
            "nothing probed there, nothing recorded"
        );
        let a = answer(step.then);
        assert_eq!(verdict_of(&a), (Verdict::Conflict, ReasonCode::HostChanged));
        assert!(!a.code.retryable());
    }

    #[test]
    fn connection_lost_while_following_then_probe_again_at_once_or_indeterminate_when_wait_is_spent(
    ) {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_follow(&f, "at-1", Followed::Lost("reset".into()), TIME_LEFT);
        assert_eq!(step.then, ProbeAction::Again);
        let none_left = Window {
            left: Duration::ZERO,
            pause: Duration::from_millis(250),
        };
        let a = answer(after_follow(&f, "at-1", Followed::Lost("reset".into()), none_left).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::UnreachableAfterDispatch)
        );
    }

    #[test]
    fn command_vanishes_while_followed_then_recorded_as_probed_and_decided_as_interrupted() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::AppendOnly, &ours);
        let m = marker(MarkerState::Interrupted, Some("at-1"));
        let step = after_follow(&f, "at-1", Followed::Interrupted(m.clone()), TIME_LEFT);
        assert_eq!(step.record, vec![Effect::Probed(m)]);
        assert_eq!(
            verdict_of(&answer(step.then)),
            (Verdict::Indeterminate, ReasonCode::InterruptedNeedsApproval)
        );
    }

    #[test]
    fn fenced_while_followed_then_not_applied_and_no_supersede() {
        let ours = [attempt("at-1", Boundary::Refused)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(after_interrupted(
            &f,
            Some(&marker(MarkerState::Fenced, None)),
        ));
        assert_eq!(verdict_of(&a), (Verdict::NotApplied, ReasonCode::Fenced));
    }

    // --- the ledger already holds the exit ---

    #[test]
    fn ledger_holds_the_exit_then_never_claim_again_but_probe_to_replay() {
        // No attempt is begun for a rerun the ledger can answer: the probe is an
        // observation, and nothing records a refused claim that was never sent.
        let mut f = facts(Family::AppendOnly, &[]);
        f.ledger_exit = Some(7);
        f.observed = Some("at-1");
        let step = start(&f);
        assert_eq!(step.then, Action::Probe);
        assert!(step.record.is_empty(), "{:?}", step.record);
        assert_eq!(
            f.current(),
            "at-1",
            "the observation is about the earlier attempt"
        );
        let ours = [attempt("at-2", Boundary::NotSent)];
        assert_eq!(
            start(&facts(Family::AppendOnly, &ours)).then,
            Action::Dispatch
        );
    }

    #[test]
    fn earlier_attempt_reached_the_host_then_probe_before_making_an_attempt() {
        let mut f = facts(Family::Destructive, &[]);
        f.observed = Some("at-1");
        assert_eq!(start(&f).then, Action::Probe);
        // The marker is absent: only now is an attempt made.
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Absent, None)),
            TIME_LEFT,
        );
        assert_eq!(
            step.then,
            ProbeAction::Then(Action::Retry(RetryReason::ResponseLostAfterDispatch))
        );
    }

    #[test]
    fn unapproved_rerun_that_would_run_then_blocked_with_what_approving_does() {
        let need = ApprovalNeeded {
            intent: "rm -rf /srv/old".into(),
            family: Family::Destructive,
            rule: "rm -rf (approve)".into(),
            earlier_attempts: vec![EarlierAttempt {
                attempt_id: "at-1".into(),
                number: 1,
                boundary: Some(Boundary::SentNoResponse),
            }],
            approving_would: ApprovingWould::Run,
            approve_command: None,
        };
        let mut f = facts(Family::Destructive, &[]);
        f.observed = Some("at-1");
        f.held = Some(&need);
        // A completed or running marker is replayed or followed: no approval needed.
        let step = after_probe(
            &f,
            ProbeSeen::Marker(marker(MarkerState::Completed, Some("at-1"))),
            TIME_LEFT,
        );
        assert!(matches!(step.then, ProbeAction::Attach { .. }), "{step:?}");
        // An absent marker would run it: blocked, saying so.
        let a = answer(
            after_probe(
                &f,
                ProbeSeen::Marker(marker(MarkerState::Absent, None)),
                TIME_LEFT,
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Blocked, ReasonCode::ApprovalRequired)
        );
        for word in [
            "rm -rf /srv/old",
            "destructive",
            "rm -rf (approve)",
            "sent_no_response",
            "would run",
        ] {
            assert!(a.reason.contains(word), "{word}: {}", a.reason);
        }
        assert_eq!(
            a.approval.as_ref().map(|n| n.approving_would),
            Some(ApprovingWould::Run)
        );
        // Superseding an interrupted claim says that instead.
        let a = match conclude(&f, Action::Supersede(RetryReason::OperatorApproved)) {
            Action::Answer(a) => a,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            a.approval.map(|n| n.approving_would),
            Some(ApprovingWould::SupersedeInterruptedClaim)
        );
    }

    #[test]
    fn ledger_holds_the_exit_and_the_marker_is_gone_then_replayed_from_the_ledger_not_rerun() {
        let ours = [attempt("at-2", Boundary::Refused)];
        let mut f = facts(Family::AppendOnly, &ours);
        f.ledger_exit = Some(7);
        let a = answer(
            after_probe(
                &f,
                ProbeSeen::Marker(marker(MarkerState::Absent, None)),
                TIME_LEFT,
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Replayed, ReasonCode::ReplayedFromLedger)
        );
        assert_eq!(a.exit, ExitEvidence::Ledger(Some(7)));
    }

    #[test]
    fn ledger_holds_the_exit_and_another_machine_answers_then_host_changed_never_a_replay() {
        // docs/guarantees.md#evidence-identity: a reused name is another machine; an outcome there is not one here.
        let ours = [attempt("at-2", Boundary::Refused)];
        let mut f = facts(Family::AppendOnly, &ours);
        f.ledger_exit = Some(0);
        let a = answer(after_probe(&f, ProbeSeen::KeyMismatch("other key".into()), TIME_LEFT).then);
        assert_eq!(verdict_of(&a), (Verdict::Conflict, ReasonCode::HostChanged));
        assert_eq!(a.exit, ExitEvidence::None);
        assert_eq!(a.reason, "host changed: other key");
    }

    // --- one dispatch, before any probe ---

    #[test]
    fn connect_fails_before_dispatch_with_budget_left_then_record_not_sent_and_back_off() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_dispatch(
            &f,
            Dispatched::NotSent {
                why: "refused".into(),
                code: ReasonCode::ConnectFailed,
                final_failure: false,
            },
        );
        assert_eq!(step.then, Action::Backoff);
        assert_eq!(
            step.record,
            vec![Effect::Boundary {
                boundary: Boundary::NotSent,
                detail: "refused".into()
            }]
        );
    }

    #[test]
    fn connect_fails_until_the_budget_is_spent_and_nothing_left_then_not_applied_and_retryable() {
        let ours = [
            attempt("at-1", Boundary::NotSent),
            attempt("at-2", Boundary::NotSent),
            attempt("at-3", Boundary::NotSent),
        ];
        let f = facts(Family::Destructive, &ours);
        let a = answer(not_sent(&f, "refused", ReasonCode::ConnectFailed, false));
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ConnectFailed)
        );
        assert!(a.code.retryable());
        assert!(a.reason.contains("after 3 attempt(s)"), "{a:?}");
    }

    #[test]
    fn connect_fails_after_an_earlier_dispatch_of_this_run_then_indeterminate_never_not_applied() {
        let ours = [
            attempt("at-1", Boundary::SentNoResponse),
            attempt("at-2", Boundary::NotSent),
        ];
        let mut f = facts(Family::ReadOnly, &ours);
        f.budget = 2;
        let a = answer(not_sent(&f, "refused", ReasonCode::ConnectFailed, false));
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::EarlierDispatchUnknown)
        );
        assert!(a.reason.contains("at-1"), "{a:?}");
    }

    #[test]
    fn connect_fails_after_an_earlier_invocation_dispatched_then_indeterminate() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let mut f = facts(Family::ReadOnly, &ours);
        f.prior_dispatch = Some("at-1");
        let a = answer(not_sent(&f, "bad key", ReasonCode::HostKeyRejected, true));
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::EarlierDispatchUnknown)
        );
    }

    #[test]
    fn connect_failures_that_retrying_cannot_fix_are_final_and_a_refused_connect_is_retried() {
        let stage = |stage| ConnectError::new(stage, "x");
        for final_stage in [
            ConnectStage::HostKey,
            ConnectStage::Auth,
            ConnectStage::Resolve,
            ConnectStage::Config,
            ConnectStage::Timeout,
        ] {
            assert!(connect_is_final(&stage(final_stage)), "{final_stage:?}");
        }
        assert!(!connect_is_final(&stage(ConnectStage::Connect)));
        assert_eq!(
            connect_code(&stage(ConnectStage::HostKey)),
            ReasonCode::HostKeyRejected
        );
        assert_eq!(
            connect_code(&stage(ConnectStage::Auth)),
            ReasonCode::AuthRefused
        );
        assert_eq!(
            connect_code(&stage(ConnectStage::Timeout)),
            ReasonCode::ConnectFailed
        );
    }

    #[test]
    fn host_key_rejected_on_the_first_attempt_then_not_applied_at_once_and_not_retryable() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                Dispatched::NotSent {
                    why: "unknown host key".into(),
                    code: ReasonCode::HostKeyRejected,
                    final_failure: true,
                },
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::HostKeyRejected)
        );
        assert!(!a.code.retryable());
        assert!(a.reason.contains("retrying will not help"), "{a:?}");
    }

    #[test]
    fn connected_to_another_machine_than_the_operation_ran_on_then_not_sent_and_host_changed() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_dispatch(&f, Dispatched::KeyMismatch("key changed".into()));
        assert!(matches!(
            &step.record[..],
            [Effect::Boundary {
                boundary: Boundary::NotSent,
                ..
            }]
        ));
        assert_eq!(
            verdict_of(&answer(step.then)),
            (Verdict::Conflict, ReasonCode::HostChanged)
        );
        let step = after_dispatch(&f, Dispatched::RootChanged("root wiped".into()));
        assert!(matches!(
            &step.record[..],
            [Effect::Refused { refusal, .. }] if refusal.as_str() == "root_changed"
        ));
        assert_eq!(
            verdict_of(&answer(step.then)),
            (Verdict::Conflict, ReasonCode::HostChanged)
        );
    }

    #[test]
    fn shim_never_started_then_not_applied_or_indeterminate_after_an_earlier_dispatch() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_dispatch(&f, Dispatched::NeverStarted("login shell exited".into()));
        assert!(matches!(
            &step.record[..],
            [Effect::Boundary {
                boundary: Boundary::SentNoResponse,
                ..
            }]
        ));
        assert_eq!(
            verdict_of(&answer(step.then)),
            (Verdict::NotApplied, ReasonCode::ShimDidNotStart)
        );
        let ours = [
            attempt("at-1", Boundary::Started),
            attempt("at-2", Boundary::NotSent),
        ];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(after_dispatch(&f, Dispatched::NeverStarted("exited".into())).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::EarlierDispatchUnknown)
        );
    }

    #[test]
    fn response_lost_after_the_claim_ack_then_record_started_and_probe_before_anything_else() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::Destructive, &ours);
        let step = after_dispatch(
            &f,
            Dispatched::Lost {
                started: true,
                reason: "keepalive timeout".into(),
            },
        );
        assert_eq!(step.then, Action::Probe);
        assert_eq!(
            step.record[0],
            Effect::Boundary {
                boundary: Boundary::Started,
                detail: "response lost: keepalive timeout".into()
            }
        );
    }

    #[test]
    fn response_lost_before_the_claim_ack_then_record_sent_no_response_and_probe() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_dispatch(
            &f,
            Dispatched::Lost {
                started: false,
                reason: "reset".into(),
            },
        );
        assert_eq!(step.then, Action::Probe);
        assert!(matches!(
            &step.record[0],
            Effect::Boundary {
                boundary: Boundary::SentNoResponse,
                ..
            }
        ));
    }

    #[test]
    fn exit_received_for_our_attempt_then_completed_with_its_status() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_dispatch(
            &f,
            replied(RunReply {
                superseded: false,
                exit: Some(exit("at-1", 3)),
                refusal: None,
                interrupted: None,
            }),
        );
        assert!(
            step.record.is_empty(),
            "exit_received is recorded with the verdict"
        );
        let a = answer(step.then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Completed, ReasonCode::CommandExited)
        );
        assert_eq!(a.exit, ExitEvidence::Host(exit("at-1", 3)));
    }

    #[test]
    fn claim_finds_completed_then_refused_boundary_and_replayed_noting_a_cancel() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let mut m = marker(MarkerState::Completed, Some("at-1"));
        m.fields.insert("cancelled".into(), "1".into());
        let step = after_dispatch(
            &f,
            replied(RunReply {
                superseded: false,
                exit: Some(exit("at-1", 143)),
                refusal: Some(refusal("completed", &[("replay", "1")], Some(m))),
                interrupted: None,
            }),
        );
        assert_eq!(
            step.record,
            vec![Effect::Refused {
                refusal: crate::ledger::RefusalWord::AlreadyCompleted,
                detail: "already completed on the host".into()
            }]
        );
        let a = answer(step.then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Replayed, ReasonCode::ReplayedFromHost)
        );
        assert!(a.reason.ends_with("stopped by `opmark cancel`"), "{a:?}");
    }

    #[test]
    fn a_call_that_superseded_records_who_allowed_it_before_the_verdict() {
        let ours = [attempt("at-2", Boundary::Started)];
        let reply = RunReply {
            superseded: true,
            exit: Some(exit("at-2", 0)),
            refusal: None,
            interrupted: None,
        };
        let f = facts(Family::Convergent, &ours);
        let step = after_reply(&f, reply.clone());
        assert_eq!(
            step.record,
            vec![Effect::Superseded {
                note: "policy reruns interrupted operations of this family"
            }]
        );
        let mut f = facts(Family::Destructive, &ours);
        f.approved = true;
        assert_eq!(
            after_reply(&f, reply).record,
            vec![Effect::Superseded {
                note: "operator approved superseding the interrupted claim"
            }]
        );
    }

    #[test]
    fn claim_finds_another_attempt_running_then_refused_boundary_and_follow_it() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let step = after_dispatch(
            &f,
            refused_reply(refusal(
                "running",
                &[("state", "running")],
                Some(marker(MarkerState::Running, Some("at-1"))),
            )),
        );
        assert_eq!(step.then, Action::Probe);
        assert_eq!(
            step.record[0],
            Effect::Refused {
                refusal: crate::ledger::RefusalWord::Running,
                detail: "running".into()
            }
        );
        assert!(matches!(&step.record[1], Effect::Progress(p) if p.contains("attempt at-1")));
    }

    #[test]
    fn claim_finds_interrupted_and_append_only_then_indeterminate() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::AppendOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal(
                    "interrupted",
                    &[("state", "interrupted")],
                    Some(marker(MarkerState::Interrupted, Some("at-1"))),
                )),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::InterruptedNeedsApproval)
        );
    }

    #[test]
    fn claim_finds_interrupted_and_convergent_then_supersede() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::Convergent, &ours);
        let step = after_dispatch(
            &f,
            refused_reply(refusal(
                "interrupted",
                &[("state", "interrupted")],
                Some(marker(MarkerState::Interrupted, Some("at-1"))),
            )),
        );
        assert_eq!(step.then, Action::Supersede(RetryReason::InterruptedRerun));
    }

    #[test]
    fn superseding_finds_the_host_disk_full_then_indeterminate_and_evidence_kept() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::Convergent, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal(
                    "interrupted",
                    &[("state", "interrupted"), ("supersede_failed", "no_space")],
                    Some(marker(MarkerState::Interrupted, Some("at-1"))),
                )),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::HostDiskFull)
        );
        assert!(a.reason.contains("(no_space)"), "{a:?}");
    }

    #[test]
    fn claim_finds_fenced_then_not_applied_even_after_an_earlier_dispatch() {
        let ours = [
            attempt("at-1", Boundary::SentNoResponse),
            attempt("at-2", Boundary::NotSent),
        ];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal("fenced", &[("state", "fenced")], None)),
            )
            .then,
        );
        assert_eq!(verdict_of(&a), (Verdict::NotApplied, ReasonCode::Fenced));
    }

    /// A fence taken over a started command (`opmark cancel` of an interrupted claim):
    /// the op id is closed, but "nothing ran" would be false. From a claim, a probe and a
    /// follow alike: unknown, not retryable, and never superseded.
    #[test]
    fn fenced_after_its_command_started_then_indeterminate_never_not_applied() {
        let mut started = marker(MarkerState::Fenced, Some("at-1"));
        started.fields.insert("command_started".into(), "1".into());
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::Convergent, &ours);
        let claimed = answer(
            after_dispatch(
                &f,
                refused_reply(refusal(
                    "fenced",
                    &[("state", "fenced"), ("command_started", "1")],
                    Some(started.clone()),
                )),
            )
            .then,
        );
        let probed = answer(after_probe(&f, ProbeSeen::Marker(started.clone()), TIME_LEFT).then);
        let Action::Answer(followed) = after_interrupted(&f, Some(&started)) else {
            panic!("a fenced marker is answered, never superseded");
        };
        for a in [claimed, probed, followed] {
            assert_eq!(
                verdict_of(&a),
                (Verdict::Indeterminate, ReasonCode::FencedAfterStart),
                "{a:?}"
            );
            assert!(!a.code.retryable());
            assert!(a.reason.contains("opmark resolve"), "{a:?}");
        }
        // The same fence over a command that never started stays not applied.
        let mut never = started;
        never.fields.insert("command_started".into(), "0".into());
        let a = answer(after_probe(&f, ProbeSeen::Marker(never), TIME_LEFT).then);
        assert_eq!(verdict_of(&a), (Verdict::NotApplied, ReasonCode::Fenced));
    }

    /// A claim of `command` with `stdin` as the shim reports it (`fp=`, `stdin_sum=`).
    fn claim_of(command: &str, stdin: Option<&[u8]>) -> MarkerInfo {
        let digest: Option<[u8; 32]> = stdin.map(|s| Sha256::digest(s).into());
        let mut m = marker(MarkerState::Completed, Some("at-0"));
        m.fingerprint = Some(host_fingerprint(&Intent {
            command,
            stdin_sha256: digest,
            secret_names: &[],
            become_user: None,
        }));
        m.fields
            .insert("stdin_sum".into(), digest.map_or("-".into(), hex::encode));
        m
    }

    #[test]
    fn a_host_conflict_says_whether_the_command_the_stdin_or_both_differ() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let mut f = facts(Family::ReadOnly, &ours);
        // This run: `echo hi` with stdin "a".
        f.stdin = Some(b"a");
        let cases = [
            (
                claim_of("echo ho", Some(b"a")),
                Some(Differs::Command),
                "a different command (the stdin is the same)",
            ),
            (
                claim_of("echo hi", Some(b"b")),
                Some(Differs::Stdin),
                "the same command with a different stdin",
            ),
            (
                claim_of("echo hi", None),
                Some(Differs::Stdin),
                "the same command with a different stdin",
            ),
            (
                claim_of("echo ho", None),
                Some(Differs::CommandAndStdin),
                "a different command and a different stdin",
            ),
        ];
        for (claim, differs, words) in cases {
            let reply = refused_reply(refusal("conflict", &[], Some(claim.clone())));
            let a = answer(after_dispatch(&f, reply).then);
            assert_eq!(
                verdict_of(&a),
                (Verdict::Conflict, ReasonCode::ConflictOnHost)
            );
            assert_eq!(a.differs, differs, "{claim:?}");
            assert!(a.reason.contains(words), "{}", a.reason);
            // A probe that finds the same claim says the same.
            let p = answer(after_probe(&f, ProbeSeen::Marker(claim), TIME_LEFT).then);
            assert_eq!(p.differs, differs);
        }
        // A claim from a shim without the stdin digest: it cannot tell, and says so.
        let mut old = claim_of("echo ho", Some(b"a"));
        old.fields.remove("stdin_sum");
        let a = answer(after_dispatch(&f, refused_reply(refusal("conflict", &[], Some(old)))).then);
        assert_eq!(a.differs, None);
        assert!(
            a.reason.contains("a different command or stdin"),
            "{}",
            a.reason
        );
    }

    #[test]
    fn claim_finds_another_fingerprint_then_conflict_on_host() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(after_dispatch(&f, refused_reply(refusal("conflict", &[], None))).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Conflict, ReasonCode::ConflictOnHost)
        );
        assert!(!a.code.retryable());
    }

    #[test]
    fn claim_held_back_as_a_repetition_then_blocked_naming_the_earlier_op() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let earlier = Repetition {
            op_id: "op-0".into(),
            state: "completed".into(),
            at: "2026-12-01T10:00:00Z".into(),
            route: "root@127.0.0.1:22".into(),
            action: "block",
            seen_in: "host",
            because: None,
        };
        let mut f = facts(Family::Destructive, &ours);
        f.repeats = Some(&earlier);
        let held = refusal("repeats", &[("earlier", "op-0")], None);
        let a = answer(after_dispatch(&f, refused_reply(held.clone())).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Blocked, ReasonCode::RepeatsRecentOperation)
        );
        assert!(!a.code.retryable());
        for way in ["--op op-0", "--repeats op-0", "root@127.0.0.1:22"] {
            assert!(a.reason.contains(way), "{way}: {}", a.reason);
        }
        // Without what the shim named (never the case in a run), still blocked.
        f.repeats = None;
        let a = answer(after_dispatch(&f, refused_reply(held)).then);
        assert_eq!(a.code, ReasonCode::RepeatsRecentOperation);
    }

    #[test]
    fn marker_root_full_then_not_applied_host_disk_full() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal("root_unusable", &[("reason", "no_inodes")], None)),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::HostDiskFull)
        );
    }

    #[test]
    fn marker_root_full_after_superseding_then_indeterminate_since_the_old_attempt_may_have_run() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_reply(
                &f,
                RunReply {
                    superseded: true,
                    exit: None,
                    refusal: Some(refusal("root_unusable", &[("reason", "no_space")], None)),
                    interrupted: None,
                },
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::HostDiskFull)
        );
    }

    #[test]
    fn marker_root_unusable_for_another_cause_then_shim_cannot_start() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal(
                    "root_unusable",
                    &[("reason", "not_writable")],
                    None,
                )),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimCannotStart)
        );
        assert!(
            a.reason.contains("root_unusable: reason=not_writable"),
            "{a:?}"
        );
    }

    #[test]
    fn host_without_setsid_f_then_not_applied_naming_the_package() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        for cause in ["no_setsid", "setsid_without_f"] {
            let a = answer(
                after_dispatch(
                    &f,
                    refused_reply(refusal("cannot_start", &[("reason", cause)], None)),
                )
                .then,
            );
            assert_eq!(
                verdict_of(&a),
                (Verdict::NotApplied, ReasonCode::HostMissingSetsid)
            );
        }
    }

    #[test]
    fn host_without_process_identity_then_not_applied_naming_proc() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::Destructive, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal(
                    "cannot_start",
                    &[("reason", "no_process_identity")],
                    None,
                )),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimCannotStart)
        );
        assert!(a.reason.contains("/proc"), "{a:?}");
        assert!(a.reason.contains("nothing ran"), "{a:?}");
    }

    #[test]
    fn shim_refuses_the_request_as_invalid_then_refused_invalid_input() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        for word in ["invalid_op_id", "bad_args"] {
            let a = answer(
                after_dispatch(
                    &f,
                    refused_reply(refusal(word, &[("reason", "offset")], None)),
                )
                .then,
            );
            assert_eq!(verdict_of(&a), (Verdict::Refused, ReasonCode::InvalidInput));
        }
    }

    #[test]
    fn a_refusal_after_an_earlier_attempt_started_then_indeterminate_not_not_applied() {
        let ours = [
            attempt("at-1", Boundary::Started),
            attempt("at-2", Boundary::NotSent),
        ];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal("bad_stdin", &[("reason", "digest_mismatch")], None)),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::ShimCannotStart)
        );
        assert!(
            a.reason.contains("attempt at-1 reached the host earlier"),
            "{a:?}"
        );
        assert!(!a.reason.contains("Check the host with"), "{a:?}");
    }

    #[test]
    fn a_refusal_after_an_earlier_attempt_was_only_not_sent_stays_not_applied() {
        let ours = [
            attempt("at-1", Boundary::NotSent),
            attempt("at-2", Boundary::NotSent),
        ];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal("bad_stdin", &[("reason", "digest_mismatch")], None)),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimCannotStart)
        );
    }

    #[test]
    fn the_command_vanishes_during_the_call_then_recorded_as_probed_and_decided_as_interrupted() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::Destructive, &ours);
        let m = marker(MarkerState::Interrupted, Some("at-1"));
        let step = after_reply(
            &f,
            RunReply {
                superseded: false,
                exit: None,
                refusal: None,
                interrupted: Some(m.clone()),
            },
        );
        assert_eq!(step.record, vec![Effect::Probed(m)]);
        assert_eq!(
            verdict_of(&answer(step.then)),
            (Verdict::Indeterminate, ReasonCode::InterruptedNeedsApproval)
        );
    }

    // --- verdicts before anything is sent (docs/guarantees.md#verdicts) ---

    #[test]
    fn policy_denies_then_refused_and_approval_needed_without_approve_then_blocked() {
        let a = policy_gate(Some("rule #3"), None, true).unwrap();
        assert_eq!(verdict_of(&a), (Verdict::Refused, ReasonCode::PolicyDenied));
        let a = policy_gate(None, Some("rule #4"), false).unwrap();
        assert_eq!(
            verdict_of(&a),
            (Verdict::Blocked, ReasonCode::ApprovalRequired)
        );
        assert_eq!(policy_gate(None, Some("rule #4"), true), None);
        assert_eq!(policy_gate(None, None, false), None);
    }

    fn record(fingerprint: &str, verdict: Option<Verdict>, exit: Option<i32>) -> OperationRecord {
        OperationRecord {
            op_id: "op-1".into(),
            host: "web1".into(),
            family: Family::ReadOnly,
            display: "true".into(),
            fingerprint: fingerprint.into(),
            rule: String::new(),
            session: String::new(),
            state: crate::ledger::OpState::Intended,
            verdict,
            exit_code: exit,
            attempts: 2,
            last_attempt: Some("at-2".into()),
            unresolved: false,
            created_at: "then".into(),
            updated_at: String::new(),
            first_seq: 1,
            last_seq: 2,
            contradictions: 0,
            settled_attempt: None,
            executed: false,
        }
    }

    #[test]
    fn the_ledger_binds_the_op_id_to_another_intent_then_conflict_before_anything_is_sent() {
        let existing = record("hmac-a", None, None);
        let a = ledger_conflict("op-1", "web1", &existing, "hmac-b", "ls /other").unwrap();
        assert_eq!(
            verdict_of(&a),
            (Verdict::Conflict, ReasonCode::ConflictInLedger)
        );
        assert!(a.reason.contains("a different command"), "{a:?}");
        let same = ledger_conflict("op-1", "web1", &existing, "hmac-b", &existing.display);
        assert!(same.unwrap().reason.contains("different stdin"));
        assert_eq!(
            ledger_conflict("op-1", "web1", &existing, "hmac-a", "ls"),
            None
        );
        // A put's stdin is the file: the words say the file changed and how to deliver it.
        let mut put = record("hmac-a", None, None);
        put.display = "opmark-put --mode 0644 -- '/srv/app.conf'".into();
        let changed = ledger_conflict("op-1", "web1", &put, "hmac-b", &put.display).unwrap();
        assert_eq!(changed.verdict, Verdict::Conflict);
        assert!(
            changed.reason.contains("the file changed") && changed.reason.contains("new op id"),
            "{changed:?}"
        );
        assert!(!changed.reason.contains("stdin"), "{changed:?}");
    }

    #[test]
    fn a_rerun_names_its_parent_and_reason_and_knows_what_earlier_runs_left() {
        let e = earlier(None, false);
        assert_eq!(
            (e.first_reason, e.first_parent),
            (RetryReason::FirstAttempt, None)
        );
        let done = record("fp", Some(Verdict::Completed), Some(5));
        let e = earlier(Some(&done), false);
        assert_eq!(e.first_reason, RetryReason::CallerRerun);
        assert_eq!(e.first_parent.as_deref(), Some("at-2"));
        assert_eq!((e.attempt_base, e.ledger_exit), (2, Some(5)));
        assert_eq!(e.prior_dispatch.as_deref(), Some("at-2"));
        assert_eq!(
            earlier(Some(&done), true).first_reason,
            RetryReason::OperatorApproved
        );
        // Closed as not applied: its attempt is known not to have run.
        let closed = record("fp", Some(Verdict::NotApplied), None);
        assert_eq!(earlier(Some(&closed), false).prior_dispatch, None);
    }

    #[test]
    fn a_probe_that_saw_completion_counts_as_the_ledger_holding_the_exit() {
        // `run --detach` answered in_progress; a later probe saw the marker completed and
        // the projection took its exit code: a rerun never claims again (docs/decisions.md#ledger-holds-the-exit).
        let probed = record("fp", Some(Verdict::InProgress), Some(0));
        assert_eq!(earlier(Some(&probed), false).ledger_exit, Some(0));
        let unknown = record("fp", Some(Verdict::Indeterminate), Some(3));
        assert_eq!(earlier(Some(&unknown), false).ledger_exit, Some(3));
        let running = record("fp", Some(Verdict::InProgress), None);
        assert_eq!(earlier(Some(&running), false).ledger_exit, None);
        let closed = record("fp", Some(Verdict::NotApplied), Some(0));
        assert_eq!(earlier(Some(&closed), false).ledger_exit, None);
    }

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
        assert_eq!(
            History::of(&[decided("approved", None)]).final_decision,
            None
        );
        let d = History::of(&[
            decided("abandoned", None),
            decided("applied", Some(3)),
            decided("approved", None),
        ])
        .final_decision
        .unwrap();
        assert_eq!((d.decision, d.exit_code), (Decision::Applied, Some(3)));
        let d = History::of(&[decided("not-applied", None)])
            .final_decision
            .unwrap();
        assert_eq!(d.decision, Decision::NotApplied);
    }

    #[test]
    fn resolved_applied_then_replayed_with_the_operators_exit_and_nothing_contacted() {
        let d = History::of(&[decided("applied", Some(3))])
            .final_decision
            .unwrap();
        let a = operator_decided(&d);
        assert_eq!(
            verdict_of(&a),
            (Verdict::Replayed, ReasonCode::ResolvedApplied)
        );
        assert_eq!(a.exit, ExitEvidence::Ledger(Some(3)));
        let d = History::of(&[decided("applied", None)])
            .final_decision
            .unwrap();
        assert_eq!(operator_decided(&d).exit, ExitEvidence::Ledger(None));
    }

    #[test]
    fn resolved_not_applied_or_abandoned_then_not_applied_for_good() {
        let d = History::of(&[decided("not-applied", None)])
            .final_decision
            .unwrap();
        assert_eq!(
            verdict_of(&operator_decided(&d)),
            (Verdict::NotApplied, ReasonCode::ResolvedNotApplied)
        );
        let d = History::of(&[decided("abandoned", None)])
            .final_decision
            .unwrap();
        let a = operator_decided(&d);
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ResolvedAbandoned)
        );
        assert!(!a.code.retryable());
    }

    // --- interruptions of the client (docs/decisions.md#client-signal) ---

    #[test]
    fn signal_after_the_claim_ack_then_in_progress_and_the_verdict_is_recorded() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::ReadOnly, &ours);
        let i = client_interrupted(&f, ClientSignal::Int, true, Boundary::Started);
        assert_eq!(
            verdict_of(&i.answer),
            (Verdict::InProgress, ReasonCode::ClientInterrupted)
        );
        assert!(i.record_verdict);
        assert!(i.answer.reason.contains("opmark cancel web1 op-1"), "{i:?}");
    }

    #[test]
    fn signal_before_anything_was_sent_then_not_applied_unless_an_earlier_run_stands() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let i = client_interrupted(&f, ClientSignal::Term, false, Boundary::NotSent);
        assert_eq!(
            verdict_of(&i.answer),
            (Verdict::NotApplied, ReasonCode::ClientInterrupted)
        );
        assert!(i.record_verdict);
        let mut f = facts(Family::ReadOnly, &ours);
        f.prior_dispatch = Some("at-1");
        let i = client_interrupted(&f, ClientSignal::Term, false, Boundary::NotSent);
        assert!(
            !i.record_verdict,
            "a not_applied in the ledger would close an operation an earlier run dispatched"
        );
        assert!(
            i.answer.reason.contains("attempt at-1 of an earlier run"),
            "{i:?}"
        );
    }

    // --- the --wait budget (docs/decisions.md#wait-budget) ---

    #[test]
    fn wait_spent_while_connecting_then_not_applied_nothing_sent() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::Destructive, &ours);
        let i = wait_budget_spent(&f, false, Boundary::NotSent, "connecting to web1");
        assert_eq!(
            verdict_of(&i.answer),
            (Verdict::NotApplied, ReasonCode::WaitBudgetSpent)
        );
        assert!(i.answer.code.retryable());
        assert!(i.record_verdict);
        assert!(i.answer.reason.contains("--wait budget"), "{i:?}");
    }

    #[test]
    fn wait_spent_while_connecting_after_an_earlier_dispatch_then_indeterminate() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let mut f = facts(Family::Destructive, &ours);
        f.prior_dispatch = Some("at-0");
        let i = wait_budget_spent(&f, false, Boundary::NotSent, "connecting to web1");
        assert_eq!(
            verdict_of(&i.answer),
            (Verdict::Indeterminate, ReasonCode::WaitBudgetSpent)
        );
        assert!(!i.record_verdict, "an earlier run's attempt stands: {i:?}");
        assert!(i.answer.reason.contains("attempt at-0"), "{i:?}");
    }

    #[test]
    fn wait_spent_while_the_command_runs_then_in_progress_it_keeps_running() {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::Destructive, &ours);
        let i = wait_budget_spent(&f, true, Boundary::Started, "while the command ran");
        assert_eq!(
            verdict_of(&i.answer),
            (Verdict::InProgress, ReasonCode::WaitBudgetSpent)
        );
        assert!(i.record_verdict);
        assert!(i.answer.reason.contains("keeps running"), "{i:?}");
        assert!(i.answer.reason.contains("opmark cancel web1 op-1"), "{i:?}");
    }

    #[test]
    fn detach_after_the_claim_ack_then_in_progress_detached() {
        let ours = [attempt("at-1", Boundary::Started)];
        let a = detached(&facts(Family::ReadOnly, &ours));
        assert_eq!(verdict_of(&a), (Verdict::InProgress, ReasonCode::Detached));
        assert_eq!(a.attempt_id.as_deref(), Some("at-1"));
    }

    #[test]
    fn a_put_or_get_left_running_is_followed_by_the_same_transfer_not_by_run() {
        // `opmark run` refuses a put's or a get's intent: the advice names the verb that
        // takes it.
        let ours = [attempt("at-1", Boundary::Started)];
        for (command, again) in [
            ("echo hi", "`opmark run` with op id op-1"),
            (
                "opmark-get -- '/srv/big.iso'",
                "the same `opmark get` with op id op-1",
            ),
            (
                "opmark-put --mode 0644 -- 'x'",
                "the same `opmark put` with op id op-1",
            ),
        ] {
            let f = Facts {
                command,
                ..facts(Family::ReadOnly, &ours)
            };
            let a = detached(&f);
            assert!(a.reason.contains(again), "{command}: {}", a.reason);
            let i = client_interrupted(&f, ClientSignal::Int, true, Boundary::Started);
            assert!(i.answer.reason.contains(again), "{command}: {i:?}");
        }
    }

    #[test]
    fn the_ledger_fails_after_dispatch_then_indeterminate_pointing_at_the_marker() {
        let ours = [attempt("at-1", Boundary::SentNoResponse)];
        let a = ledger_failed_after_dispatch(&facts(Family::ReadOnly, &ours), "disk full");
        assert_eq!(
            verdict_of(&a),
            (Verdict::Indeterminate, ReasonCode::EarlierDispatchUnknown)
        );
        assert!(a.reason.starts_with("disk full;"), "{a:?}");
    }

    // --- mutation testing (docs/claims.md#mutation-testing): rows the tests above left open ---

    #[test]
    fn shim_never_started_after_attempts_that_were_never_sent_stays_not_applied() {
        // at-1 never got a connection: only an earlier attempt that left could have run.
        let ours = [
            attempt("at-1", Boundary::NotSent),
            attempt("at-2", Boundary::NotSent),
        ];
        let f = facts(Family::ReadOnly, &ours);
        let a =
            answer(after_dispatch(&f, Dispatched::NeverStarted("login shell exited".into())).then);
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimDidNotStart)
        );
        assert_eq!(a.attempt_id.as_deref(), Some("at-2"));
        assert_eq!(a.reason, "login shell exited");
    }

    #[test]
    fn a_replay_says_it_was_stopped_by_cancel_only_when_the_host_says_so() {
        let ours = [attempt("at-2", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        // An earlier attempt's exit that no cancel stopped: a plain replay.
        let plain =
            answer(after_follow(&f, "at-1", Followed::Exit(exit("at-1", 0)), TIME_LEFT).then);
        assert_eq!(
            verdict_of(&plain),
            (Verdict::Replayed, ReasonCode::ReplayedFromHost)
        );
        assert!(!plain.reason.contains("opmark cancel"), "{plain:?}");
        // The exit frame and the claim's marker both say cancelled: said, and kept.
        let mut m = marker(MarkerState::Completed, Some("at-1"));
        m.fields.insert("cancelled".into(), "1".into());
        let mut x = exit("at-1", 143);
        x.cancelled = true;
        let a = answer(
            after_dispatch(
                &f,
                replied(RunReply {
                    superseded: false,
                    exit: Some(x.clone()),
                    refusal: Some(refusal("completed", &[("replay", "1")], Some(m))),
                    interrupted: None,
                }),
            )
            .then,
        );
        assert!(a.reason.ends_with("stopped by `opmark cancel`"), "{a:?}");
        assert_eq!(a.exit, ExitEvidence::Host(x));
    }

    #[test]
    fn sudo_that_cannot_run_the_command_as_the_become_user_then_not_applied_saying_what_to_fix() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::Destructive, &ours);
        for (cause, fix) in [
            ("no_sudo", "the host has no `sudo`"),
            ("become_needs_tty", "`requiretty`"),
            ("become_needs_password", "--secret SUDO_PASSWORD"),
            ("become_wrong_password", "did not accept the password"),
            ("become_refused", "`sudo -l`"),
        ] {
            let a = answer(
                after_dispatch(
                    &f,
                    refused_reply(refusal("cannot_start", &[("reason", cause)], None)),
                )
                .then,
            );
            assert_eq!(
                verdict_of(&a),
                (Verdict::NotApplied, ReasonCode::BecomeRefused),
                "{cause}"
            );
            assert!(a.reason.contains(fix), "{cause}: {}", a.reason);
            assert!(a.reason.contains("nothing ran"), "{cause}: {}", a.reason);
        }
    }

    #[test]
    fn host_without_awk_for_the_secrets_redactor_then_not_applied_naming_awk() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal("cannot_start", &[("reason", "no_awk")], None)),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimCannotStart)
        );
        assert!(a.reason.contains("no `awk`"), "{a:?}");
        assert!(a.reason.contains("without --secret"), "{a:?}");
    }

    #[test]
    fn a_host_lock_not_free_in_time_then_not_applied_naming_it_its_holder_its_command_and_since_when(
    ) {
        let ours = [attempt("at-1", Boundary::Started)];
        let f = facts(Family::Destructive, &ours);
        let busy = |fields: &[(&str, &str)]| {
            answer(after_dispatch(&f, refused_reply(refusal("lock_busy", fields, None))).then)
        };
        let a = busy(&[
            ("lock", "apt"),
            ("holder", "upgrade-1"),
            ("since", "1764892800"),
        ]);
        assert_eq!(verdict_of(&a), (Verdict::NotApplied, ReasonCode::LockBusy));
        assert!(
            a.reason
                .contains("`apt` is held by op upgrade-1 since 2025-12-05T00:00:00Z"),
            "{a:?}"
        );
        assert!(a.reason.contains("nothing ran"), "{a:?}");
        // The holder's command (`cmd=`, hex), redacted and cut as the reply reads it.
        let a = busy(&[
            ("lock", "apt"),
            ("holder", "upgrade-1"),
            ("since", "1764892800"),
            ("cmd", &hex::encode("apt-get -y upgrade")),
        ]);
        assert_eq!(verdict_of(&a), (Verdict::NotApplied, ReasonCode::LockBusy));
        assert!(
            a.reason.contains(
                "`apt` is held by op upgrade-1 (`apt-get -y upgrade`) since 2025-12-05T00:00:00Z"
            ),
            "{a:?}"
        );
        let a = busy(&[
            ("lock", "apt"),
            ("holder", "db-1"),
            (
                "cmd",
                &hex::encode("mysql --password=hunter2 -e 'select 1'"),
            ),
            ("cmd_cut", "1"),
        ]);
        assert!(
            a.reason
                .contains("held by op db-1 (`mysql --password=*** -e 'select 1'…`) ("),
            "{a:?}"
        );
        assert!(!a.reason.contains("hunter2"), "{a:?}");
        // Words the host sent that opmark would never write are not repeated.
        let a = busy(&[("lock", "a/b"), ("holder", "x;y"), ("since", "soon")]);
        assert!(
            a.reason.contains("`?` is held by another operation"),
            "{a:?}"
        );
        // Another capacity: the input is what to change.
        let a = busy(&[
            ("lock", "apt"),
            ("reason", "capacity_differs"),
            ("capacity", "2"),
        ]);
        assert_eq!(verdict_of(&a), (Verdict::Refused, ReasonCode::InvalidInput));
        assert!(a.reason.contains("--lock apt:2"), "{a:?}");
        // A host that cannot hold a lock at all.
        let a = busy(&[("lock", "apt"), ("reason", "cannot_wait")]);
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimCannotStart)
        );
        assert!(a.reason.contains("readlink"), "{a:?}");
    }

    #[test]
    fn shim_cannot_start_for_a_cause_without_its_own_row_then_not_applied_naming_the_cause() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let f = facts(Family::ReadOnly, &ours);
        let a = answer(
            after_dispatch(
                &f,
                refused_reply(refusal(
                    "cannot_start",
                    &[("reason", "setsid_failed")],
                    None,
                )),
            )
            .then,
        );
        assert_eq!(
            verdict_of(&a),
            (Verdict::NotApplied, ReasonCode::ShimCannotStart)
        );
        assert!(a.reason.contains("reason=setsid_failed"), "{a:?}");
        assert!(a.reason.contains("opmark doctor"), "{a:?}");
    }

    #[test]
    fn the_wait_budget_is_named_in_seconds_or_in_milliseconds_when_it_has_a_fraction() {
        let ours = [attempt("at-1", Boundary::NotSent)];
        let mut f = facts(Family::Destructive, &ours);
        let i = wait_budget_spent(&f, false, Boundary::NotSent, "connecting to web1");
        assert!(i.answer.reason.contains("--wait budget (30s)"), "{i:?}");
        f.wait = Duration::from_millis(1500);
        let i = wait_budget_spent(&f, false, Boundary::NotSent, "connecting to web1");
        assert!(i.answer.reason.contains("--wait budget (1500ms)"), "{i:?}");
    }

    #[test]
    fn a_run_dispatches_the_attempt_it_recorded_and_looks_first_only_while_it_has_none() {
        // An earlier invocation's attempt is observed instead of making one; once this run
        // has recorded an attempt of its own, start sends it.
        let ours = [attempt("at-2", Boundary::NotSent)];
        let mut f = facts(Family::Destructive, &ours);
        f.observed = Some("at-1");
        assert_eq!(start(&f).then, Action::Dispatch);
    }
}
