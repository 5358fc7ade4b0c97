//! One operation's lifecycle (docs/decisions.md): classify, record the intent,
//! dispatch attempts through the shim, and, after a lost connection, probe the marker
//! before anything else. Read top-down:
//!
//! - this file: the public surface ([`RunInput`], [`RunReport`], [`run`]) and the steps
//!   before the first dispatch (policy gate, ledger conflict, operator decisions);
//! - [`decide`]: THE decision table. Every retry and every verdict is decided there, by
//!   pure functions of what the run knows and what it just observed; its header maps
//!   the rows of docs/decisions.md#after-a-lost-connection and the verdict rules to code, and each is a unit test;
//! - `driver`: the I/O around the table (connect, call the shim through [`crate::host`],
//!   probe, follow, record in the ledger, pause), which asks [`decide`] at every step;
//! - [`reply`]: the shim's answer to a `run` call, read once into types (refusal reasons
//!   as an enum) for [`decide`];
//! - [`record`]: the ledger as a run writes it (strict before dispatch, verdict-preserving
//!   after);
//! - [`interrupt`]: SIGINT/SIGTERM/SIGHUP to the client, answered by [`run_interruptible`];
//! - [`output`]: the caller's view of the output (offsets for re-attach, digests);
//! - [`identity`]: which machine an operation ran on, and the host key check;
//! - [`fleet`]: one operation on many hosts (docs/decisions.md#fleets): forks, failure budget,
//!   rolling batches, the combined answer;
//! - [`reconcile`]: what later evidence settles, for `opmark reconcile`.

pub mod decide;
mod driver;
pub mod fleet;
pub mod identity;
pub mod interrupt;
pub mod output;
pub mod plan;
pub mod reconcile;
pub mod record;
pub mod repeat;
pub mod reply;

use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::family::Family;
use crate::ledger::fingerprint::{self, InstallationKey, Intent};
use crate::ledger::{Durability, History, Ledger, LedgerError, OpKey, Redactor};
use crate::op_id::OpId;
use crate::policy::{Classification, Policy};
use crate::ssh::{self, ConnectStage, HostSpec, Pool};
use crate::vocab::{Boundary, ReasonCode, RetryReason, Verdict};

use driver::Runner;
use identity::Recorded;
use interrupt::Interrupts;
use output::Output;
use record::{LedgerWriteError, RunLedger};

pub use decide::connect_code;

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
    /// `--secret`: the command's secret environment variables, read.
    pub secrets: crate::secret::Secrets,
    /// `--become USER`: run the command as USER through sudo on the host.
    pub become_user: Option<String>,
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
    /// `--approval FILE`: a signed approval, parsed (not yet verified).
    pub approval: Option<crate::approval::Token>,
    /// Stream output live (plain mode) instead of keeping it for JSON.
    pub live_output: bool,
    /// Per-stream output cap on the host.
    pub output_cap: u64,
    /// Live output lines start with this (`host: `) when several hosts run.
    pub prefix: Option<String>,
    /// `--detach`: answer `in_progress` (reason code `detached`) once the shim has
    /// acknowledged the claim, leaving the command running.
    pub detach: bool,
    /// `--repeats OP` / `--amends OP` (docs/guarantees.md#repetitions), ids checked.
    pub declared: repeat::Declared,
    /// What `wait` bounds besides the connects before dispatch and the probe windows.
    pub wait_scope: WaitScope,
    /// Counts the output delivered, for a caller reporting progress meanwhile.
    pub tally: Option<std::sync::Arc<output::OutputBytes>>,
}

/// What the `--wait` budget bounds (docs/decisions.md#wait-budget). It always bounds the
/// connects before anything is sent and every probe window after a loss; the scopes
/// differ on a command that is connected and running when it is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitScope {
    /// The command line without `--wait`: a connected command streams to its end, as
    /// with ssh.
    Probes,
    /// The command line with `--wait D`: the whole invocation. Spent while the command
    /// runs, one last probe bounded by [`LAST_LOOK`] decides between `in_progress` (the
    /// marker says running) and `indeterminate` (the host said nothing).
    Invocation,
    /// MCP: a tool call never outlasts its budget. Spent while the command runs, the
    /// answer is `in_progress` at once (no look: the caller's timeout is hard).
    Call,
}

/// `--wait` (and MCP's `wait`) when not given.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// The bound of the last look at the marker when a command-line `--wait` runs out while
/// the command runs: what the budget may be overshot by (a probe on a live connection
/// takes a round trip; a cut link is what this bounds).
pub const LAST_LOOK: Duration = Duration::from_secs(3);

impl RunInput {
    /// The canonical intent: the command and the digest of the stdin it is given.
    pub fn intent(&self) -> Intent<'_> {
        Intent {
            command: &self.command,
            stdin_sha256: self.stdin.as_ref().map(|s| Sha256::digest(s).into()),
            secret_names: self.secrets.names(),
            become_user: self.become_user.as_deref(),
        }
    }
}

/// The family a run uses and the rule that decided it: the policy's, made stricter (never
/// milder) by `--class`.
pub(crate) fn family_and_rule(
    classification: &Classification,
    class: Option<Family>,
) -> (Family, String) {
    let family = class.map_or(classification.family, |class| {
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
    /// A fleet's shared commit of the writes before dispatch (`None`: each its own).
    pub group: Option<&'a fleet::CommitGroup>,
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

/// One observation this invocation recorded (a replay, a follow, a look that made no
/// attempt), as `run --json` reports it (docs/ledger.md#observations).
#[derive(Debug, Clone, Serialize)]
pub struct ObservationReport {
    /// `replay_from_ledger`, `replay_from_host`, `follow`, `probe`.
    pub kind: crate::ledger::ObservationKind,
    /// What it read.
    pub reading: String,
    /// What it did to the operation's state.
    pub effect: String,
}

/// The answer of `opmark run` (the `--json` document, docs/guarantees.md#the-command-line-contract).
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
    /// Captured stdout (lossy UTF-8 in the document; empty in plain mode, where it was
    /// streamed), spooled to a file beyond a megabyte.
    pub stdout: output::Captured,
    /// Captured stderr.
    pub stderr: output::Captured,
    /// Every attempt this invocation made (execution tries that may start the command;
    /// a replay or a follow makes none).
    pub attempts: Vec<AttemptSummary>,
    /// What this invocation observed instead of (or besides) running: replays, follows.
    pub observations: Vec<ObservationReport>,
    /// `blocked`: what a human decides on (intent, family, rule, earlier attempts, what
    /// approving would do); null otherwise.
    pub approval_needed: Option<decide::ApprovalNeeded>,
    /// The ledger fingerprint of the intent.
    pub fingerprint: String,
    /// Why this verdict, in words an agent can log.
    pub reason: String,
    /// Why this verdict, for machines (stable snake_case, docs/guarantees.md#verdicts).
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
    /// The replay came from a tombstone: gc collected the output on the host, only the
    /// exit status is left (docs/host-protocol.md#tombstones).
    pub output_collected: bool,
    /// False when the command ran but its output cannot be had: the ledger holds only the
    /// exit status (the marker is gone, `replayed_from_ledger`) or gc collected it
    /// (`output_collected`). `stdout`/`stderr` are then empty and `truncated` says nothing:
    /// an empty string must not read as "it printed nothing".
    pub output_available: bool,
    /// The host's exit record says `opmark cancel` stopped the command (its exit code is
    /// then the signal's, 143 or 137, not the command's own).
    pub cancelled: bool,
    /// The earlier operation this run repeats (the same intent on the same host under
    /// another op id within the family's window), when the policy blocked or warned
    /// about it (docs/guarantees.md#repetitions); null otherwise.
    pub repeats: Option<repeat::Repetition>,
    /// `conflict_on_host`: whether the command, the stdin or both differ from the intent
    /// the host's claim holds; null for any other verdict, or when the claim does not
    /// say (a shim older than the claim's stdin digest).
    pub conflict_differs: Option<crate::vocab::Differs>,
}

impl RunReport {
    /// The process exit status for this report (docs/guarantees.md#verdicts).
    pub fn exit_status(&self) -> u8 {
        match self.verdict.reserved_exit_code() {
            Some(code) => code,
            None => self.exit_code.map_or(0, |c| (c & 0xff) as u8),
        }
    }
}

/// Why a run stopped without a verdict (every other outcome, a lost connection included,
/// is a verdict in the [`RunReport`]). Converted to the CLI's error at the edge (`ops`).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The ledger failed where the run cannot go on without it (before dispatch: a run
    /// never sends what it could not record).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The ssh config is malformed or unsupported: the user's to fix (exit 246), never a
    /// "safe to retry" verdict.
    #[error("{0}")]
    Config(String),
    /// A step the decisions rule out happened, or the shim broke the protocol.
    #[error("{0}")]
    Internal(String),
}

/// Runs one operation end to end. Errors are opmark's own failures (ledger, policy);
/// every outcome about the operation, unknown included, is a verdict in the report.
pub async fn run(env: RunEnv<'_>, input: RunInput) -> Result<RunReport, RunError> {
    run_interruptible(env, input, &Interrupts::never()).await
}

/// [`run`], stopped by the first of `interrupts` (docs/guarantees.md#interruptions-and-cancel): what was reached is
/// recorded (a `client_interrupted` event, then the verdict) and the report says
/// `in_progress` when this invocation's request may have reached the host (the command
/// keeps running, detached by design) or `not_applied` when nothing was sent, with the
/// reason code `client_interrupted`. Nothing is sent once a signal has been seen.
pub async fn run_interruptible(
    env: RunEnv<'_>,
    input: RunInput,
    interrupts: &Interrupts,
) -> Result<RunReport, RunError> {
    // The budget of the whole invocation starts now (docs/decisions.md#wait-budget).
    let deadline = std::time::Instant::now() + input.wait;
    let classification = env.policy.classify(&input.command);
    let (family, rule) = family_and_rule(&classification, input.class);
    let redactor = Redactor::with_patterns(env.policy.redact_patterns());
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
            return Err(RunError::Config(e.to_string()));
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
        ledger: RunLedger::new(env.ledger, env.group),
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
        }
        .with_tally(input.tally.clone()),
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
        repeat_window: family_policy.repeat_window,
        on_repeat: family_policy.on_repeat,
        repeats: None,
        deadline,
        input,
        observed: None,
        first_reason: RetryReason::FirstAttempt,
        held: None,
        was_unresolved: true,
        followed: None,
        observations: Vec::new(),
        probed_completed: None,
        approved: false,
        signed: None,
        spent: None,
        repeat_because: format!(
            "it is {family} by {rule}, and `on_repeat = \"block\"` under [families.{family}] in {origin} holds such repetitions back for its repeat_window; change the rule or that setting there",
            origin = env.policy.origin(),
        ),
    };

    // Who may approve (docs/trust.md#the-approval-flow): where approvals are signed only
    // a verified token counts, and `--approve NOTE` is not an approval.
    let signers =
        match crate::approval::required(env.policy) {
            Some(path) => Some(crate::approval::AllowedSigners::load(&path).map_err(|e| {
                RunError::Config(format!("{e} (the approvers of signed approvals)"))
            })?),
            None => None,
        };
    if runner.input.approval.is_some() && signers.is_none() {
        return Ok(runner.report(decide::Answer::new(
            Verdict::Refused,
            None,
            ReasonCode::InvalidInput,
            "--approval was given, but no approvers are configured (the policy's `approvers`, \
             or /etc/opmark/allowed_signers), so a signed approval has nothing to be checked \
             against; approvals here are self-service (--approve NOTE). Nothing was recorded or sent",
        )));
    }
    let mut approved = signers.is_none() && runner.input.approve.is_some();
    if let Some(answer) = decide::policy_gate(classification.deny.as_deref(), None, approved) {
        // A denial is final and says nothing about the host: it is not recorded, so a
        // rejected command never becomes an operation to list, reconcile or count (a
        // `blocked` one is, below: it waits for a human's decision on this op id).
        return Ok(runner.report(answer));
    }

    // The ledger guards the op id: a different intent under it is a conflict before
    // anything is sent. An earlier attempt becomes this run's first parent.
    let existing = runner.ledger.operation(&runner.key)?;
    if let (Some(token), Some(signers)) = (runner.input.approval.clone(), &signers) {
        if existing.is_none() && classification.approval.is_none() {
            return Ok(runner.report(decide::Answer::new(
                Verdict::Refused,
                None,
                ReasonCode::InvalidInput,
                "--approval was given for a run that needs no approval (no rule asks for one, \
                 and nothing of this op id is held); drop --approval. Nothing was recorded or sent",
            )));
        }
        let events = match &existing {
            Some(_) => runner.ledger.events(&runner.key)?,
            None => Vec::new(),
        };
        match signed_approval(&token, signers, &runner, &events) {
            Ok(signed) => {
                approved = true;
                runner.signed = Some(signed);
            }
            // Spent: a rerun after a lost connection presents the same token again, and
            // must still replay or follow; only a hold is refused, naming the use.
            Err((ReasonCode::ApprovalUsed, why)) => runner.spent = Some(why),
            Err((code, why)) => {
                return Ok(runner.report(decide::Answer::new(
                    Verdict::Blocked,
                    None,
                    code,
                    format!("{why}; nothing was recorded or sent, and the run stays held"),
                )))
            }
        }
    }
    runner.approved = approved;
    let earlier = decide::earlier(existing.as_ref(), approved);
    runner.attempt_base = earlier.attempt_base;
    runner.prior_dispatch = earlier.prior_dispatch;
    runner.ledger_exit = earlier.ledger_exit;
    runner.first_reason = earlier.first_reason;
    runner.was_unresolved = existing.as_ref().is_none_or(|r| r.unresolved);
    let mut history = History::default();
    if let Some(existing) = &existing {
        let conflict = decide::ledger_conflict(
            &runner.key.op_id,
            &runner.key.host,
            existing,
            &ledger_fp,
            &runner.display,
        );
        if let Some(answer) = conflict {
            return Ok(runner.report(answer));
        }
        let events = runner.ledger.events(&runner.key)?;
        history = History::of(&events);
        // An operator's decision is terminal (docs/decisions.md#operator-decision): answer it, contact nothing.
        if let Some(decision) = &history.final_decision {
            return runner.finish(decide::operator_decided(decision));
        }
        runner.identity = identity::recorded(&events);
        // An earlier attempt reached the host (or the ledger holds the exit): look at the
        // marker before making an attempt; a replay or a follow is an observation.
        if runner.ledger_exit.is_some() || history.reached_host() {
            runner.observed = earlier.first_parent.clone();
        }
    }
    // Approval is asked for only when something may run: a run that can only replay or
    // follow goes on, held to that (docs/decisions.md#approvals).
    if let (Some(rule), false) = (classification.approval.as_deref(), approved) {
        let need = decide::ApprovalNeeded {
            intent: runner.display.clone(),
            family,
            rule: rule.to_owned(),
            earlier_attempts: history
                .attempts
                .iter()
                .map(|a| decide::EarlierAttempt {
                    attempt_id: a.attempt_id.clone(),
                    number: a.number,
                    boundary: a.boundary,
                })
                .collect(),
            approving_would: decide::ApprovingWould::Run,
            approve_command: signers.as_ref().map(|_| {
                format!(
                    "opmark approve {} {} --intent {} --note 'WHY'",
                    runner.key.op_id, runner.key.host, runner.host_fp
                )
            }),
        };
        if runner.observed.is_none() {
            let answer = runner.with_spent_token(decide::blocked(need, &runner.key.host));
            runner.record_closed_intent(&answer)?;
            return Ok(runner.report(answer));
        }
        runner.held = Some(need);
    }

    // Declarations first (a bad one sends nothing), then the ledger half of the
    // repetition check (docs/guarantees.md#repetitions): only for an operation that has
    // not run yet; one that has is itself the earlier operation of its intent.
    let declared = runner.input.declared.clone();
    let not_run_yet = existing
        .as_ref()
        .is_none_or(|r| r.attempts == 0 || r.verdict == Some(Verdict::Blocked));
    if let Some(why) = repeat::check_declared(&runner.key, &ledger_fp, &declared, |k| {
        runner.ledger.operation(k)
    })? {
        return Ok(runner.report(decide::Answer::new(
            Verdict::Refused,
            None,
            ReasonCode::InvalidInput,
            why,
        )));
    }
    if not_run_yet {
        let found = repeat::in_ledger(
            runner.ledger.view(),
            &runner.key,
            &ledger_fp,
            runner.repeat_window,
            runner.on_repeat,
            &declared,
        )?;
        if let Some(mut found) = found {
            found.because = Some(runner.repeat_because.clone());
            found.route = match &resolved {
                Ok(dest) if found.route.ends_with("(no connection recorded)") => {
                    dest.route().describe()
                }
                _ => found.route,
            };
            runner.repeats = Some(found.clone());
            if found.action == "block" {
                let answer = found.held(&runner.key.op_id, &runner.key.host, None);
                runner.record_held(&found, &answer)?;
                return Ok(runner.report(answer));
            }
        }
    }

    let dest = match resolved {
        Ok(dest) => dest,
        Err(e) => {
            runner.begin(earlier.first_reason, earlier.first_parent)?;
            return runner.unresolvable(&e.message);
        }
    };
    // The handshake overlaps the durable writes below; nothing is sent before them.
    runner.pool.prewarm(&dest);
    if runner.observed.is_none() {
        runner.begin(earlier.first_reason, earlier.first_parent)?;
    }
    runner.record_links()?;
    if let Some(found) = runner.repeats.clone() {
        // Warned, and running: said before anything leaves.
        runner
            .ledger
            .append(&runner.key, &found.event(), Durability::Normal)?;
        progress(&found.warning(&runner.key.op_id, &runner.key.host));
    }
    // Biased: once a signal is in, the run is never polled again, so nothing more leaves.
    // `--detach` leaves at the claim acknowledgement, which the observer announces.
    let driven = tokio::select! {
        biased;
        signal = interrupts.wait() => Driven::Signalled(signal),
        report = runner.drive(&dest) => Driven::Done(Box::new(report)),
        () = started.notified(), if detach => Driven::Detached,
    };
    match driven {
        Driven::Signalled(signal) => runner.interrupted(signal),
        Driven::Detached => runner.detached(),
        // After dispatch with a ledger that stopped taking writes (a retry could not be
        // recorded, so it was not sent): the caller still gets a verdict, and it claims
        // no more than the evidence.
        Driven::Done(done) => match *done {
            Err(e) if runner.ledger.failed().is_some() => Ok(runner.ledger_failed(&e.to_string())),
            other => other,
        },
    }
}

/// How driving a run ended.
enum Driven {
    /// The decisions reached a verdict (or opmark itself failed).
    Done(Box<Result<RunReport, RunError>>),
    /// A signal stopped the client first.
    Signalled(interrupt::ClientSignal),
    /// `--detach`, and the shim acknowledged the claim.
    Detached,
}

/// A fresh attempt id: `at-<16 hex>` (same charset as op ids, safe on the host).
pub fn new_attempt_id() -> String {
    format!("at-{:016x}", rand::random::<u64>())
}

/// opmark's own progress line on stderr.
pub fn progress(message: &str) {
    crate::logging::say(format_args!("opmark: {message}"));
}

/// Fault points of the crash tests: see [`crate::fault`].
pub(crate) use crate::fault::point as fault_point;

/// Checks a signed approval against the approvers and this exact run
/// (docs/trust.md#the-approval-flow): the signature, the expiry, the binding (op id, host,
/// intent, family, marker root) and that its nonce never let an attempt run. The error
/// names the cause and picks the reason code.
fn signed_approval(
    token: &crate::approval::Token,
    signers: &crate::approval::AllowedSigners,
    runner: &Runner<'_>,
    events: &[crate::ledger::StoredEvent],
) -> Result<driver::SignedUse, (ReasonCode, String)> {
    use crate::approval::ApprovalError;
    let signer = signers
        .verify(token)
        .map_err(|e| (ReasonCode::ApprovalInvalid, e.to_string()))?;
    let s = &token.statement;
    if time::OffsetDateTime::now_utc().unix_timestamp() >= s.expires {
        return Err((
            ReasonCode::ApprovalExpired,
            ApprovalError::Expired(s.expires_at()).to_string(),
        ));
    }
    let recorded_root = identity::recorded(events)
        .roots
        .last()
        .map(|(_, r)| r.clone());
    let mismatch = |field: &'static str, token: &str, here: &str| {
        (
            ReasonCode::ApprovalMismatch,
            ApprovalError::Mismatch {
                field,
                token: token.to_owned(),
                here: here.to_owned(),
            }
            .to_string(),
        )
    };
    if s.op_id != runner.key.op_id {
        return Err(mismatch("op id", &s.op_id, &runner.key.op_id));
    }
    if s.host != runner.key.host {
        return Err(mismatch("host", &s.host, &runner.key.host));
    }
    if s.fingerprint != runner.ledger_fp {
        return Err(mismatch(
            "intent (command or stdin)",
            &format!("fingerprint {}", &s.fingerprint[..12]),
            &format!(
                "fingerprint {}",
                &runner.ledger_fp[..12.min(runner.ledger_fp.len())]
            ),
        ));
    }
    if let Some(h) = &s.host_fingerprint {
        if *h != runner.host_fp {
            return Err(mismatch(
                "intent (command or stdin)",
                &format!("host fingerprint {}", &h[..12]),
                &format!(
                    "host fingerprint {}",
                    &runner.host_fp[..12.min(runner.host_fp.len())]
                ),
            ));
        }
    }
    if s.family != runner.family {
        return Err(mismatch(
            "family",
            &s.family.to_string(),
            &runner.family.to_string(),
        ));
    }
    if let (Some(want), Some(have)) = (&s.marker_root, &recorded_root) {
        if want != have {
            return Err(mismatch("marker root", want, have));
        }
    }
    let mut used_by: Option<String> = None;
    for e in events {
        match &e.event {
            crate::ledger::Event::Approved { nonce: Some(n), .. } if *n == s.nonce => {
                used_by = Some("(not recorded)".to_owned());
            }
            crate::ledger::Event::AttemptDispatched { attempt_id, .. }
                if used_by.as_deref() == Some("(not recorded)") =>
            {
                used_by = Some(attempt_id.clone());
            }
            _ => {}
        }
    }
    if let Some(attempt) = used_by {
        return Err((
            ReasonCode::ApprovalUsed,
            ApprovalError::Used {
                op: runner.key.op_id.clone(),
                attempt,
            }
            .to_string(),
        ));
    }
    Ok(driver::SignedUse {
        principal: signer.principal,
        key: signer.key,
        nonce: s.nonce.clone(),
        note: s.note.clone(),
    })
}
