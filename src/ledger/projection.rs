//! The `operations` projection: current state of each operation, folded from its events
//! in the same transaction that appends them.
//!
//! This file is the ONE place that decides whether an operation is *unresolved*, and
//! whether an observation *contradicts* what the ledger already holds ([`contradiction`]).
//! The fold ([`fold`]) is pure, so `audit verify` can replay every row from its events.

use serde::Serialize;

use super::event::{ClaimSeen, Event, Observed};
use super::words::{Decision, OpState, ProbeState};
use crate::family::Family;
use crate::vocab::{Verdict, HOST_CHANGED_PREFIX};

/// One operation's current state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationRecord {
    /// Operation id.
    pub op_id: String,
    /// Host.
    pub host: String,
    /// Family from the (latest) intent.
    pub family: Family,
    /// Redacted command.
    pub display: String,
    /// Ledger (HMAC) fingerprint of the intent.
    pub fingerprint: String,
    /// Policy rule that decided the family.
    pub rule: String,
    /// Session of the latest intent.
    pub session: String,
    /// Lifecycle state: `intended`, `dispatched`, a boundary name, `exit_received`,
    /// `superseded`, `fenced`, a verdict name, `reconciled:<decision>`, `resolved:<decision>`,
    /// `client_interrupted`, `cancelled` (stopped or fenced by `opmark cancel`).
    pub state: OpState,
    /// The latest verdict.
    pub verdict: Option<Verdict>,
    /// The latest known exit code.
    pub exit_code: Option<i32>,
    /// Attempts dispatched so far (JSON `attempt_count`: `attempts` is the list of them
    /// in `run` and `show`).
    #[serde(rename = "attempt_count")]
    pub attempts: u32,
    /// Id of the latest attempt.
    pub last_attempt: Option<String>,
    /// The outcome is not settled (see [`unresolved_after`]).
    pub unresolved: bool,
    /// Time of the first intent.
    pub created_at: String,
    /// Time of the latest event.
    pub updated_at: String,
    /// Sequence number of the first intent.
    pub first_seq: u64,
    /// Sequence number of the latest event.
    pub last_seq: u64,
    /// Contradictions recorded between evidence (0 when all evidence agrees); JSON
    /// `contradiction_count` (`contradictions` is the list of them in `show`).
    #[serde(rename = "contradiction_count")]
    pub contradictions: u32,
    /// The attempt whose exit the settling verdict returned, when it named one.
    pub settled_attempt: Option<String>,
    /// An attempt reached `started` or an exit was received: the command ran on the host
    /// at least once (what `stats` counts a suspected duplicate effect by).
    pub executed: bool,
}

/// THE unresolved rule. Given whether the operation was unresolved before `event`, is it
/// unresolved after it?
///
/// Unresolved = intended or dispatched without a final verdict, or the last verdict is
/// `indeterminate`/`in_progress`, with no later operator decision or reconcile that
/// settled it. A new attempt or a supersede reopens a settled operation.
pub fn unresolved_after(was_unresolved: bool, event: &Event) -> bool {
    match event {
        Event::Intended { .. } | Event::AttemptDispatched { .. } | Event::Superseded { .. } => true,
        // Another machine, user or marker root (docs/guarantees.md#evidence-identity): nothing was sent, nothing is
        // known better than before.
        Event::Verdict {
            verdict: Verdict::Conflict,
            reason,
            ..
        } if reason.starts_with(HOST_CHANGED_PREFIX) => was_unresolved,
        Event::Verdict { verdict, .. } => {
            matches!(verdict, Verdict::Indeterminate | Verdict::InProgress)
        }
        Event::Reconciled { decision, .. } | Event::OperatorDecision { decision, .. } => {
            was_unresolved && !decision.settles()
        }
        Event::SessionStarted { .. }
        | Event::BoundaryReached { .. }
        | Event::ExitReceived { .. }
        | Event::Probed { .. }
        | Event::Observed { .. }
        | Event::Approved { .. }
        | Event::Connected { .. }
        | Event::MarkerRoot { .. }
        | Event::Linked { .. }
        | Event::RepetitionHeld { .. }
        | Event::Contradiction { .. }
        | Event::Fenced { .. }
        | Event::ClientInterrupted { .. } => was_unresolved,
        Event::Cancelled { result, .. } => was_unresolved && !result.settles(),
    }
}

/// Why an append was refused by the projection.
#[derive(Debug)]
pub(crate) enum AppendRefused {
    /// The op id on this host is already bound to another fingerprint.
    FingerprintConflict,
}

/// The exit the ledger holds as settled truth: the operation's verdict is `completed` or
/// `replayed` with a known exit code.
fn settled_exit(rec: &OperationRecord) -> Option<i32> {
    match rec.verdict {
        Some(Verdict::Completed | Verdict::Replayed) => rec.exit_code,
        _ => None,
    }
}

/// Does `event` disagree with other evidence? Returns (expected, seen).
///
/// - A probe that finds a completed marker without a claim record: an exit can only follow
///   a claim, so one of the two records was removed or forged.
/// - Against the settled truth (a `completed`/`replayed` verdict with its exit code and
///   attempt): a later probe that finds the marker completed with another exit code or by
///   another attempt, or running or interrupted again, or an exit received with another
///   code. An `absent` marker is not a contradiction: `gc` removes finished markers.
/// - Against an operator's `not_applied`/`abandoned` decision: a later probe that finds
///   the op id claimed on the host (see [`decision_contradiction`]).
pub fn contradiction(rec: &OperationRecord, event: &Event) -> Option<(Observed, Observed)> {
    evidence_contradiction(rec, event).or_else(|| decision_contradiction(rec, event))
}

/// Against an operator's `not_applied` or `abandoned` decision (which may stand unfenced
/// when the host could not be reached): a later probe that finds the op id claimed
/// (running, completed or interrupted) on the host. Kept apart from
/// [`evidence_contradiction`], which the fold also asks, so that the projection of
/// ledgers written before this rule replays unchanged.
fn decision_contradiction(rec: &OperationRecord, event: &Event) -> Option<(Observed, Observed)> {
    let OpState::Resolved(decision) = &rec.state else {
        return None;
    };
    if !matches!(decision, Decision::NotApplied | Decision::Abandoned) {
        return None;
    }
    match event {
        Event::Probed {
            state,
            exit_code,
            claim,
            ..
        } if state.shows_claim() => Some((
            Observed {
                state: format!("resolved:{decision}"),
                exit_code: None,
                attempt: None,
            },
            Observed {
                state: state.to_string(),
                exit_code: *exit_code,
                attempt: claim.as_ref().and_then(|c| c.attempt.clone()),
            },
        )),
        _ => None,
    }
}

/// Evidence against evidence: see [`contradiction`].
fn evidence_contradiction(rec: &OperationRecord, event: &Event) -> Option<(Observed, Observed)> {
    if let Event::Probed {
        state,
        exit_code,
        claim: Some(ClaimSeen { attempt: None }),
        ..
    } = event
    {
        if *state == ProbeState::Completed {
            return Some((
                Observed {
                    state: "a claim record with the exit record".to_owned(),
                    exit_code: None,
                    attempt: None,
                },
                Observed {
                    state: "completed without a claim record".to_owned(),
                    exit_code: *exit_code,
                    attempt: None,
                },
            ));
        }
    }
    let settled = settled_exit(rec)?;
    let expected = Observed {
        state: "completed".to_owned(),
        exit_code: Some(settled),
        attempt: rec.settled_attempt.clone(),
    };
    let seen = match event {
        Event::Probed {
            state,
            exit_code,
            claim,
            ..
        } => {
            let holder = claim.as_ref().and_then(|c| c.attempt.clone());
            let other_attempt = matches!(
                (&holder, &rec.settled_attempt),
                (Some(seen), Some(settled)) if seen != settled
            );
            match state {
                ProbeState::Completed if *exit_code != Some(settled) || other_attempt => Observed {
                    state: state.to_string(),
                    exit_code: *exit_code,
                    attempt: holder,
                },
                ProbeState::Running | ProbeState::Interrupted => Observed {
                    state: state.to_string(),
                    exit_code: *exit_code,
                    attempt: holder,
                },
                _ => return None,
            }
        }
        Event::ExitReceived {
            exit_code: Some(code),
            attempt_id,
            ..
        } if *code != settled => Observed {
            state: "exit_received".to_owned(),
            exit_code: Some(*code),
            attempt: Some(attempt_id.clone()),
        },
        _ => return None,
    };
    Some((expected, seen))
}

/// Turns the row before `event` (`None`: no operation yet) into the row after it, in
/// place; refused, it leaves the row as it was. Pure: the same events always fold to the
/// same row, which is what `audit verify` checks. In place because `audit verify --full`
/// folds every event of the history: moving the row in and out took a tenth of its
/// checking thread.
pub(crate) fn fold(
    row: &mut Option<OperationRecord>,
    (op_id, host): (&str, &str),
    event: &Event,
    seq: u64,
    at: &str,
) -> Result<(), AppendRefused> {
    let Some(rec) = row else {
        // Only an intent creates an operation; other events about an unknown operation
        // (a probe of a foreign op id, a session notice) stay in the event log only.
        if let Event::Intended {
            session,
            family,
            display,
            fingerprint,
            rule,
            ..
        } = event
        {
            *row = Some(OperationRecord {
                op_id: op_id.to_owned(),
                host: host.to_owned(),
                family: *family,
                display: display.clone(),
                fingerprint: fingerprint.clone(),
                rule: rule.clone(),
                session: session.clone(),
                state: OpState::Intended,
                verdict: None,
                exit_code: None,
                attempts: 0,
                last_attempt: None,
                unresolved: true,
                created_at: at.to_owned(),
                updated_at: at.to_owned(),
                first_seq: seq,
                last_seq: seq,
                contradictions: 0,
                settled_attempt: None,
                executed: false,
            });
        }
        return Ok(());
    };
    if let Event::Intended { fingerprint, .. } = event {
        if *fingerprint != rec.fingerprint {
            return Err(AppendRefused::FingerprintConflict);
        }
    }

    // Evidence that contradicts the settled truth never rewrites it (its own
    // `contradiction` event follows it in the chain).
    let contradicts = evidence_contradiction(rec, event).is_some();
    rec.unresolved = unresolved_after(rec.unresolved, event);
    rec.updated_at.clear();
    rec.updated_at.push_str(at);
    rec.last_seq = seq;
    match event {
        // A completed marker's exit is the host's record of the outcome: until a verdict
        // settles it, it is the best exit the ledger knows (so `list` shows what a
        // reconcile settled on, not null). A settled exit is never rewritten by a probe.
        Event::Probed {
            state,
            exit_code: Some(code),
            ..
        } if *state == ProbeState::Completed && !contradicts && settled_exit(rec).is_none() => {
            rec.exit_code = Some(*code);
        }
        Event::SessionStarted { .. }
        | Event::Probed { .. }
        | Event::Observed { .. }
        | Event::Approved { .. }
        | Event::Connected { .. }
        | Event::MarkerRoot { .. }
        // A link or a held repetition is about other operations: this one's state stays.
        | Event::Linked { .. }
        | Event::RepetitionHeld { .. } => {}
        Event::Intended {
            session,
            family,
            display,
            rule,
            ..
        } => {
            // The same intent again (a new `run` of the same op id): keep the history,
            // take the newest policy decision.
            rec.session = session.clone();
            rec.family = *family;
            rec.display = display.clone();
            rec.rule = rule.clone();
            rec.state = OpState::Intended;
        }
        Event::AttemptDispatched { attempt_id, .. } => {
            rec.attempts += 1;
            rec.last_attempt = Some(attempt_id.clone());
            rec.state = OpState::Dispatched;
        }
        Event::BoundaryReached { boundary, .. } => {
            rec.state = OpState::boundary(*boundary);
            rec.executed |= *boundary == crate::vocab::Boundary::Started;
        }
        // Even an exit that contradicts the settled one says the command ran.
        Event::ExitReceived { .. } if contradicts => rec.executed = true,
        Event::ExitReceived { exit_code, .. } => {
            rec.executed = true;
            rec.state = OpState::ExitReceived;
            rec.exit_code = *exit_code;
        }
        Event::Reconciled { decision, .. } => rec.state = OpState::Reconciled(decision.clone()),
        Event::OperatorDecision { decision, .. } => rec.state = OpState::Resolved(decision.clone()),
        Event::Fenced { .. } => rec.state = OpState::Fenced,
        Event::Superseded { .. } => rec.state = OpState::Superseded,
        Event::Contradiction { .. } => rec.contradictions += 1,
        // The verdict that follows says what the caller was told.
        Event::ClientInterrupted { .. } => rec.state = OpState::ClientInterrupted,
        Event::Cancelled {
            result, exit_code, ..
        } => {
            // Only what changed the host shows as the state (killed, or fenced before it
            // could run); "already ..." is an observation.
            if result.changed_the_host() {
                rec.state = OpState::Cancelled;
            }
            if exit_code.is_some() {
                rec.exit_code = *exit_code;
            }
        }
        // Nothing was sent or concluded (docs/guarantees.md#evidence-identity): the operation stays what it was, its
        // exit (the ledger's memory that it ran) included.
        Event::Verdict {
            verdict: Verdict::Conflict,
            reason,
            ..
        } if reason.starts_with(HOST_CHANGED_PREFIX) => {}
        Event::Verdict {
            attempt_id,
            verdict,
            exit_code,
            ..
        } => {
            let settled = settled_exit(rec);
            let rewrites_settled = matches!(verdict, Verdict::Completed | Verdict::Replayed)
                && settled.is_some()
                && exit_code.is_some()
                && *exit_code != settled;
            // A later verdict that reports another exit than the settled one (a replay of
            // an edited marker) keeps the first truth; the probe that saw the other exit
            // already recorded the contradiction.
            if !rewrites_settled {
                if settled.is_none() && exit_code.is_some() {
                    // This verdict settles the exit: later evidence is checked against it.
                    rec.settled_attempt = attempt_id.clone();
                }
                rec.state = OpState::verdict(*verdict);
                rec.verdict = Some(*verdict);
                if exit_code.is_some() {
                    rec.exit_code = *exit_code;
                }
            }
        }
    }
    Ok(())
}

pub(crate) const COLUMNS: &str = "op_id, host, family, display, fingerprint, rule, session, state, verdict, exit_code, attempts, last_attempt, unresolved, created_at, updated_at, first_seq, last_seq, contradictions, settled_attempt, executed";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::RetryReason;

    fn verdict(v: Verdict) -> Event {
        Event::Verdict {
            attempt_id: None,
            verdict: v,
            exit_code: None,
            reason: String::new(),
        }
    }

    fn decided(d: &str) -> Event {
        Event::OperatorDecision {
            by: "op".into(),
            decision: d.into(),
            note: String::new(),
            exit_code: None,
        }
    }

    #[test]
    fn a_host_changed_conflict_leaves_the_operation_as_it_was() {
        let changed = Event::Verdict {
            attempt_id: None,
            verdict: Verdict::Conflict,
            exit_code: None,
            reason: format!("{HOST_CHANGED_PREFIX}host key for h is now SHA256:b"),
        };
        assert!(unresolved_after(true, &changed));
        assert!(!unresolved_after(false, &changed));
        // Any other conflict is a final verdict, as before.
        assert!(!unresolved_after(true, &verdict(Verdict::Conflict)));
    }

    #[test]
    fn unresolved_until_a_final_verdict() {
        let dispatched = Event::AttemptDispatched {
            attempt_id: "a".into(),
            number: 1,
            parent: None,
            reason: RetryReason::FirstAttempt,
        };
        assert!(unresolved_after(false, &dispatched));
        assert!(!unresolved_after(true, &verdict(Verdict::Completed)));
        assert!(!unresolved_after(true, &verdict(Verdict::NotApplied)));
        assert!(unresolved_after(true, &verdict(Verdict::Indeterminate)));
        assert!(unresolved_after(true, &verdict(Verdict::InProgress)));
    }

    fn cancel(result: &str) -> Event {
        Event::Cancelled {
            by: "op".into(),
            grace_ms: 10_000,
            result: crate::ledger::CancelResult::from(result),
            exit_code: None,
            detail: String::new(),
        }
    }

    #[test]
    fn a_cancel_settles_only_what_it_proves() {
        assert!(!unresolved_after(true, &cancel("cancelled")));
        assert!(!unresolved_after(true, &cancel("fenced:absent")));
        assert!(!unresolved_after(true, &cancel("fenced:not_started")));
        // An interrupted claim may have had effects; fencing it proves nothing about them.
        assert!(unresolved_after(true, &cancel("fenced:interrupted")));
        assert!(unresolved_after(true, &cancel("still_running")));
        assert!(unresolved_after(true, &cancel("unknown")));
        assert!(!unresolved_after(false, &cancel("already_completed")));
    }

    #[test]
    fn only_settling_decisions_resolve() {
        assert!(!unresolved_after(true, &decided("applied")));
        assert!(!unresolved_after(true, &decided("abandoned")));
        assert!(unresolved_after(true, &decided("approved")));
        assert!(unresolved_after(true, &decided("something-new")));
        // A decision never reopens a settled operation.
        assert!(!unresolved_after(false, &decided("approved")));
        let probe = Event::Probed {
            attempt_id: None,
            state: ProbeState::Completed,
            exit_code: Some(0),
            detail: String::new(),
            claim: None,
        };
        assert!(
            unresolved_after(true, &probe),
            "a probe alone settles nothing"
        );
    }
}
