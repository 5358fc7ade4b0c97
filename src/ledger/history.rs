//! One operation's history: ONE walk over its events that every reader shares: `run`
//! (the operator's final word), `reconcile` (which attempts are ours, whether a claim was
//! ever seen on the host), `show` (attempts, the last word, the best-known exit) and the
//! "unresolved" replay of the projection's rule.
//!
//! The projection itself folds event by event inside the append transaction
//! ([`super::projection::fold`]); the rules both apply ([`super::projection::unresolved_after`],
//! [`Decision::settles`]) live in one place each, so the history and the projection
//! cannot disagree about what settles an operation.

use serde::Serialize;

use super::event::{Event, StoredEvent};
use super::projection::unresolved_after;
use super::words::{Decision, RefusalWord};
use crate::ssh::Route;
use crate::vocab::{Boundary, RetryReason, Verdict};

/// One attempt as its events tell it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// 1, 2, ...
    pub number: u32,
    /// Attempt id.
    pub attempt_id: String,
    /// The attempt it retried.
    pub parent: Option<String>,
    /// Why it was made.
    pub reason: RetryReason,
    /// The furthest boundary observed.
    pub boundary: Option<Boundary>,
    /// Its exit code, when received.
    pub exit_code: Option<i32>,
    /// When it was dispatched.
    pub dispatched_at: String,
    /// The last event about it.
    pub last_seen_at: String,
    /// How it reached the host, when it connected (docs/guarantees.md#host-identity).
    pub route: Option<Route>,
    /// The host key fingerprint it saw (`SHA256:...`), when it connected.
    pub host_key: Option<String>,
    /// The marker root id its shim reported (docs/guarantees.md#evidence-identity), when it did.
    pub root_id: Option<String>,
}

/// An operator's decision that settles an operation for good (docs/decisions.md#operator-decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalDecision {
    /// `applied`, `not_applied` or `abandoned`.
    pub decision: Decision,
    /// Who decided.
    pub by: String,
    /// Their note.
    pub note: String,
    /// `resolve --exit N`.
    pub exit_code: Option<i32>,
    /// When it was recorded.
    pub at: String,
}

/// An approval used to let something run (`Event::Approved`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Approval {
    /// Who approved (user and session).
    pub by: String,
    /// The note given with `--approve`.
    pub note: String,
    /// The signing key's fingerprint, for a signed approval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// When it was recorded.
    pub at: String,
}

/// Who had the last word on the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastWord {
    /// A verdict given to a caller.
    Verdict(Verdict),
    /// A reconcile decision.
    Reconciled(Decision),
    /// An operator's decision (never `approved`, which decides nothing about the outcome).
    Resolved {
        /// The decision.
        decision: Decision,
        /// Who decided.
        by: String,
    },
    /// `opmark cancel` stopped it or fenced it before it could run.
    Cancelled {
        /// Who cancelled.
        by: String,
    },
}

impl LastWord {
    /// `completed`, `reconciled:<decision>`, `resolved:<decision>`, `cancelled`.
    pub fn name(&self) -> String {
        match self {
            LastWord::Verdict(v) => v.as_str().to_owned(),
            LastWord::Reconciled(d) => format!("reconciled:{d}"),
            LastWord::Resolved { decision, .. } => format!("resolved:{decision}"),
            LastWord::Cancelled { .. } => "cancelled".to_owned(),
        }
    }
}

/// What an operation's events say, folded once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The attempts, in dispatch order.
    pub attempts: Vec<Attempt>,
    /// A claim of the op id was seen on the host: an attempt of ours started or exited
    /// there, was refused by an existing claim, or a probe found one. If the marker is now
    /// absent, the evidence was removed: it was not "never made".
    pub claim_seen: bool,
    /// The latest final operator decision.
    pub final_decision: Option<FinalDecision>,
    /// The last word on the outcome and when it was said (cleared by a new attempt).
    pub last_word: Option<(LastWord, String)>,
    /// The best-known exit code (received, recorded on the host, in a verdict or a cancel).
    pub exit_code: Option<i32>,
    /// The projection's unresolved rule replayed over the events.
    pub unresolved: bool,
    /// Observations recorded (`Event::Observed`: replays, follows): counted apart from
    /// the attempts, which are execution tries only.
    pub observations: u32,
    /// The approvals used to let something run, oldest first.
    pub approvals: Vec<Approval>,
}

impl History {
    /// Folds `events` (one operation's, in order).
    pub fn of(events: &[StoredEvent]) -> History {
        let mut h = History::default();
        for e in events {
            h.push(e);
        }
        h
    }

    /// Whether any attempt was dispatched (so the host may have been contacted).
    pub fn dispatched(&self) -> bool {
        !self.attempts.is_empty()
    }

    /// The id of the latest attempt.
    pub fn last_attempt(&self) -> Option<&str> {
        self.attempts.last().map(|a| a.attempt_id.as_str())
    }

    /// Does the ledger know that an earlier attempt reached the host (a claim, an exit,
    /// or a refusal by an existing claim)? Then a rerun can be answered from evidence.
    pub fn reached_host(&self) -> bool {
        self.claim_seen
            || self.attempts.iter().any(|a| {
                matches!(
                    a.boundary,
                    Some(Boundary::SentNoResponse | Boundary::Started | Boundary::ExitReceived)
                )
            })
    }

    /// Was `attempt_id` made by this ledger?
    pub fn is_ours(&self, attempt_id: &str) -> bool {
        self.attempts.iter().any(|a| a.attempt_id == attempt_id)
    }

    fn push(&mut self, e: &StoredEvent) {
        self.unresolved = unresolved_after(self.unresolved, &e.event);
        match &e.event {
            Event::AttemptDispatched {
                attempt_id,
                number,
                parent,
                reason,
            } => {
                self.attempts.push(Attempt {
                    number: *number,
                    attempt_id: attempt_id.clone(),
                    parent: parent.clone(),
                    reason: *reason,
                    boundary: None,
                    exit_code: None,
                    dispatched_at: e.at.clone(),
                    last_seen_at: e.at.clone(),
                    route: None,
                    host_key: None,
                    root_id: None,
                });
                self.last_word = None;
                return;
            }
            Event::BoundaryReached {
                boundary,
                detail,
                refusal,
                ..
            } => match boundary {
                Boundary::Started | Boundary::ExitReceived => self.claim_seen = true,
                Boundary::Refused => {
                    let refusal = refusal
                        .clone()
                        .unwrap_or_else(|| RefusalWord::from_legacy_detail(detail));
                    self.claim_seen |= refusal.proves_claim();
                }
                Boundary::NotSent | Boundary::SentNoResponse => {}
            },
            Event::ExitReceived { exit_code, .. } => {
                self.claim_seen = true;
                self.exit_code = exit_code.or(self.exit_code);
            }
            Event::Probed {
                state, exit_code, ..
            } => {
                self.claim_seen |= state.shows_claim();
                if *state == super::words::ProbeState::Completed && exit_code.is_some() {
                    self.exit_code = *exit_code;
                }
            }
            Event::Verdict {
                verdict, exit_code, ..
            } => {
                if exit_code.is_some() {
                    self.exit_code = *exit_code;
                }
                self.last_word = Some((LastWord::Verdict(*verdict), e.at.clone()));
            }
            Event::Observed { .. } => self.observations += 1,
            Event::Approved { by, note, key, .. } => self.approvals.push(Approval {
                by: by.clone(),
                note: note.clone(),
                key: key.clone(),
                at: e.at.clone(),
            }),
            Event::Reconciled { decision, .. } => {
                self.last_word = Some((LastWord::Reconciled(decision.clone()), e.at.clone()));
            }
            Event::OperatorDecision {
                by,
                decision,
                note,
                exit_code,
            } => {
                if *decision != Decision::Approved {
                    self.last_word = Some((
                        LastWord::Resolved {
                            decision: decision.clone(),
                            by: by.clone(),
                        },
                        e.at.clone(),
                    ));
                }
                if decision.is_final_by_operator() {
                    self.final_decision = Some(FinalDecision {
                        decision: decision.clone(),
                        by: by.clone(),
                        note: note.clone(),
                        exit_code: *exit_code,
                        at: e.at.clone(),
                    });
                }
            }
            Event::Cancelled {
                by,
                result,
                exit_code,
                ..
            } if result.changed_the_host() => {
                if exit_code.is_some() {
                    self.exit_code = *exit_code;
                }
                self.last_word = Some((LastWord::Cancelled { by: by.clone() }, e.at.clone()));
            }
            _ => {}
        }
        self.note_attempt_event(e);
    }

    /// Events that belong to an attempt (not probes or verdicts, which only name one).
    fn note_attempt_event(&mut self, e: &StoredEvent) {
        if matches!(e.event, Event::Probed { .. } | Event::Verdict { .. }) {
            return;
        }
        let Some(id) = e.event.attempt_id() else {
            return;
        };
        let Some(a) = self.attempts.iter_mut().rev().find(|a| a.attempt_id == id) else {
            return;
        };
        let furthest = |a: &Attempt, b: Boundary| Some(a.boundary.map_or(b, |old| old.max(b)));
        match &e.event {
            Event::BoundaryReached { boundary, .. } | Event::ClientInterrupted { boundary, .. } => {
                a.boundary = furthest(a, *boundary)
            }
            Event::ExitReceived { exit_code, .. } => {
                a.boundary = furthest(a, Boundary::ExitReceived);
                a.exit_code = *exit_code;
            }
            Event::Connected {
                route, host_key, ..
            } => {
                a.route = Some(route.clone());
                a.host_key = Some(host_key.clone());
            }
            Event::MarkerRoot { root_id, .. } => a.root_id = Some(root_id.clone()),
            _ => {}
        }
        a.last_seen_at = e.at.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::words::ProbeState;

    fn stored(seq: u64, event: Event) -> StoredEvent {
        StoredEvent {
            seq,
            op_id: "op".into(),
            host: "h".into(),
            at: format!("2026-11-30T10:00:0{seq}.000000Z"),
            event,
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    fn decided(decision: &str, exit_code: Option<i32>) -> Event {
        Event::OperatorDecision {
            by: "alice".into(),
            decision: decision.into(),
            note: "n".into(),
            exit_code,
        }
    }

    fn dispatched(id: &str) -> Event {
        Event::AttemptDispatched {
            attempt_id: id.into(),
            number: 1,
            parent: None,
            reason: RetryReason::FirstAttempt,
        }
    }

    fn refused(detail: &str, refusal: Option<RefusalWord>) -> Event {
        Event::BoundaryReached {
            attempt_id: "at-1".into(),
            boundary: Boundary::Refused,
            detail: detail.into(),
            refusal,
        }
    }

    fn of(events: Vec<Event>) -> History {
        let stored: Vec<StoredEvent> = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| stored(i as u64 + 1, e))
            .collect();
        History::of(&stored)
    }

    #[test]
    fn the_latest_final_decision_counts_and_an_approval_is_not_one() {
        assert_eq!(of(vec![decided("approved", None)]).final_decision, None);
        let h = of(vec![
            decided("abandoned", None),
            decided("applied", Some(3)),
            decided("approved", None),
        ]);
        let d = h.final_decision.unwrap();
        assert_eq!((d.decision, d.exit_code), (Decision::Applied, Some(3)));
        assert_eq!(d.by, "alice");
        let d = of(vec![decided("not-applied", None)])
            .final_decision
            .unwrap();
        assert_eq!(d.decision, Decision::NotApplied, "the old spelling reads");
    }

    #[test]
    fn a_typed_refusal_decides_whether_a_claim_was_seen() {
        // The detail is free text for people; the typed reason is what counts.
        let h = of(vec![
            dispatched("at-1"),
            refused("running since ten", Some(RefusalWord::Fenced)),
        ]);
        assert!(!h.claim_seen);
        let h = of(vec![
            dispatched("at-1"),
            refused("whatever words", Some(RefusalWord::Conflict)),
        ]);
        assert!(h.claim_seen);
    }

    #[test]
    fn refusals_written_before_the_typed_reason_still_read_from_their_detail() {
        for (detail, seen) in [
            ("running", true),
            ("completed", true),
            ("interrupted", true),
            ("conflict", true),
            ("already completed on the host", true),
            ("fenced", false),
            (
                "not claimed: the ledger already holds this operation's exit; probing to replay",
                false,
            ),
        ] {
            let h = of(vec![dispatched("at-1"), refused(detail, None)]);
            assert_eq!(h.claim_seen, seen, "{detail}");
        }
    }

    #[test]
    fn a_probe_that_finds_a_claim_counts_and_unreachable_does_not() {
        let probe = |state: ProbeState, code| Event::Probed {
            attempt_id: None,
            state,
            exit_code: code,
            detail: String::new(),
            claim: None,
        };
        let h = of(vec![
            dispatched("at-1"),
            probe(ProbeState::Unreachable, None),
        ]);
        assert!(!h.claim_seen && h.dispatched());
        let h = of(vec![
            dispatched("at-1"),
            probe(ProbeState::Completed, Some(4)),
        ]);
        assert!(h.claim_seen);
        assert_eq!(h.exit_code, Some(4));
    }

    #[test]
    fn attempts_keep_their_furthest_boundary_and_a_new_attempt_clears_the_last_word() {
        let h = of(vec![
            dispatched("at-1"),
            Event::BoundaryReached {
                attempt_id: "at-1".into(),
                boundary: Boundary::Started,
                detail: String::new(),
                refusal: None,
            },
            Event::BoundaryReached {
                attempt_id: "at-1".into(),
                boundary: Boundary::SentNoResponse,
                detail: String::new(),
                refusal: None,
            },
            Event::Verdict {
                attempt_id: Some("at-1".into()),
                verdict: Verdict::Indeterminate,
                exit_code: None,
                reason: String::new(),
            },
        ]);
        assert_eq!(h.attempts.len(), 1);
        assert_eq!(h.attempts[0].boundary, Some(Boundary::Started));
        assert_eq!(h.attempts[0].last_seen_at, "2026-11-30T10:00:03.000000Z");
        assert_eq!(
            h.last_word.as_ref().map(|(w, _)| w.name()),
            Some("indeterminate".to_owned())
        );
        assert!(h.unresolved);
        assert!(h.is_ours("at-1") && !h.is_ours("at-2"));
        let h = of(vec![
            dispatched("at-1"),
            Event::Reconciled {
                decision: Decision::NotApplied,
                detail: String::new(),
            },
        ]);
        assert_eq!(
            h.last_word.as_ref().map(|(w, _)| w.name()),
            Some("reconciled:not_applied".to_owned())
        );
        assert!(!h.unresolved);
        let h = of(vec![
            dispatched("at-1"),
            Event::Reconciled {
                decision: Decision::NotApplied,
                detail: String::new(),
            },
            dispatched("at-2"),
        ]);
        assert_eq!(h.last_word, None);
        assert!(h.unresolved);
        assert_eq!(h.last_attempt(), Some("at-2"));
    }
}
