//! One operation on one host, end to end: the steps before the first dispatch (policy
//! gate, ledger conflict, operator decisions), then the [`super::driver`] for the rest.

use crate::ledger::fingerprint;
use crate::ledger::{Durability, History, OpKey, Redactor};
use crate::ssh::{self, ConnectStage};
use crate::vocab::{ReasonCode, RetryReason, Verdict};

use super::driver::{self, Runner};
use super::identity::Recorded;
use super::input::{family_and_rule, RunEnv, RunInput};
use super::interrupt::{self, Interrupts};
use super::output::Output;
use super::record::RunLedger;
use super::report::{progress, RunError, RunReport};
use super::{decide, identity, repeat};

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
    // The policy's locks for this command join those the run named (docs/commands.md#host-locks-commands-that-must-not-overlap).
    let mut input = input;
    input.locks = crate::host_lock::HostLock::with_defaults(&input.locks, &classification.locks);
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
    let output = match (&input.prefix, input.live_output) {
        (Some(prefix), true) => Output::prefixed(prefix.clone()),
        _ => Output::new(input.live_output),
    }
    .with_tally(input.tally.clone());
    let output = match &input.stdout_to {
        Some(path) => stdout_file(path)
            .and_then(|f| output.into_file(f))
            .map_err(|e| {
                RunError::LocalIo(format!(
                    "cannot write the output to {} ({e}); nothing was sent",
                    path.display()
                ))
            })?,
        None => output,
    };
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
        redactor,
        attempts: Vec::new(),
        budget: input.attempts.unwrap_or(family_policy.attempts).max(1),
        after_interrupted: family_policy.after_interrupted,
        output,
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
        put_spooled: 0,
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
                let answer =
                    decide::repetition_held(&found, &runner.key.op_id, &runner.key.host, None);
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

/// The local file a run's stdout goes to: made, or opened as it is and never truncated
/// here (its bytes are the stream's start).
fn stdout_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}
