//! A plan before acting (`opmark run --dry-run`, MCP `plan`): what `run` would do with
//! this op id, command and host, decided from what can be read without acting (the
//! policy, the ledger, and the marker's state from a read-only probe), in the order
//! `run` takes its own decisions ([`super::run_interruptible`], then [`super::decide`]).
//! A pure function of those facts; the reading is `ops::plan`'s.

use serde::Serialize;

use crate::family::Family;
use crate::ledger::history::FinalDecision;
use crate::ledger::Decision;
use crate::policy::AfterInterrupted;
use crate::shim::{MarkerInfo, MarkerState};
use crate::vocab::{ReasonCode, Verdict};

/// What `run` would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WouldDo {
    /// Claim the op id and run the command.
    Run,
    /// Answer from the host's record (or the ledger's): nothing runs again.
    Replay,
    /// Attach to the command that is running and stream it.
    Follow,
    /// Move an interrupted claim aside (kept for audit) and run the command again.
    SupersedeAndRun,
    /// Hold: a human must approve (or the repetition be declared) first.
    Block,
    /// Refuse: the policy denies the command.
    Refuse,
    /// Refuse: the op id is bound to another intent.
    Conflict,
    /// Answer that nothing ran or will run under this op id.
    NotApplied,
    /// Stop with an unknown outcome, for a human to settle.
    Indeterminate,
    /// Connect and decide then: the host could not be probed now.
    Unknown,
}

impl WouldDo {
    /// The word, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            WouldDo::Run => "run",
            WouldDo::Replay => "replay",
            WouldDo::Follow => "follow",
            WouldDo::SupersedeAndRun => "supersede_and_run",
            WouldDo::Block => "block",
            WouldDo::Refuse => "refuse",
            WouldDo::Conflict => "conflict",
            WouldDo::NotApplied => "not_applied",
            WouldDo::Indeterminate => "indeterminate",
            WouldDo::Unknown => "unknown",
        }
    }
}

/// The ledger's facts about this (op id, host).
#[derive(Debug, Clone, Default)]
pub struct LedgerFacts {
    /// The ledger knows the operation.
    pub known: bool,
    /// It is bound to another intent (fingerprint) than this run's.
    pub other_intent: bool,
    /// An operator's final decision.
    pub decision: Option<FinalDecision>,
    /// The exit the ledger holds (the operation completed).
    pub exit_code: Option<i32>,
    /// An earlier attempt reached the host (or a claim of it was seen there).
    pub reached_host: bool,
    /// It has not run yet (no attempt, or only held): the repetition check applies.
    pub not_run_yet: bool,
}

/// The facts a plan is made from.
#[derive(Debug, Clone)]
pub struct PlanFacts<'a> {
    /// The family `run` would use.
    pub family: Family,
    /// The policy's rule for an interrupted claim of that family.
    pub after_interrupted: AfterInterrupted,
    /// The rule that denies the command.
    pub deny: Option<&'a str>,
    /// The rule that asks for approval.
    pub approval: Option<&'a str>,
    /// An approval would count (`--approve` where approvals are self-service, or a signed
    /// token presented: `run` checks its signature and binding then).
    pub approved: bool,
    /// The ledger's facts.
    pub ledger: &'a LedgerFacts,
    /// An earlier operation of the same intent in the repetition window, whether the
    /// policy blocks (`true`) or warns, and where it was seen (`ledger`, or `host`: the
    /// host's fingerprint index).
    pub repeats: Option<(&'a str, bool, &'a str)>,
    /// The marker, or why it could not be probed.
    pub marker: Option<&'a Result<MarkerInfo, String>>,
    /// The plain fingerprint this run would claim with.
    pub host_fp: &'a str,
}

/// What `run` would do, with the reason code it would answer with (none for a run or a
/// follow, whose verdict depends on the command) and why, in words.
#[derive(Debug, Clone, Serialize)]
pub struct Would {
    pub action: WouldDo,
    /// The verdict it would answer with, where the facts decide it.
    pub verdict: Option<Verdict>,
    pub reason_code: Option<ReasonCode>,
    pub why: String,
}

impl Would {
    fn new(
        action: WouldDo,
        verdict: Option<Verdict>,
        code: Option<ReasonCode>,
        why: String,
    ) -> Self {
        Would {
            action,
            verdict,
            reason_code: code,
            why,
        }
    }
}

impl Would {
    /// The host is not the machine, user or marker root the operation's attempts
    /// reached: `run` answers `conflict` (`host_changed`) and concludes nothing.
    pub fn host_changed(why: String) -> Would {
        Would::new(
            WouldDo::Conflict,
            Some(Verdict::Conflict),
            Some(ReasonCode::HostChanged),
            format!("{why}; nothing would be sent"),
        )
    }
}

/// Whether the facts decide before the marker is needed: `Some` is the answer without a
/// probe (nothing at all is sent for it).
pub fn before_probe(f: &PlanFacts<'_>) -> Option<Would> {
    if let Some(rule) = f.deny {
        return Some(Would::new(
            WouldDo::Refuse,
            Some(Verdict::Refused),
            Some(ReasonCode::PolicyDenied),
            format!("the policy denies this command ({rule}); nothing would be recorded or sent"),
        ));
    }
    if f.ledger.other_intent {
        return Some(Would::new(
            WouldDo::Conflict,
            Some(Verdict::Conflict),
            Some(ReasonCode::ConflictInLedger),
            "the ledger binds this op id on this host to another command or stdin; nothing would be sent (`opmark show` has the recorded intent)".into(),
        ));
    }
    if let Some(d) = &f.ledger.decision {
        let (action, verdict, code) = match d.decision {
            Decision::Applied => (
                WouldDo::Replay,
                Verdict::Replayed,
                ReasonCode::ResolvedApplied,
            ),
            Decision::Abandoned => (
                WouldDo::NotApplied,
                Verdict::NotApplied,
                ReasonCode::ResolvedAbandoned,
            ),
            _ => (
                WouldDo::NotApplied,
                Verdict::NotApplied,
                ReasonCode::ResolvedNotApplied,
            ),
        };
        return Some(Would::new(
            action,
            Some(verdict),
            Some(code),
            format!(
                "operator {} resolved this operation as {}: that decision is final, nothing would be sent",
                d.by,
                d.decision.as_str().replace('_', "-")
            ),
        ));
    }
    let observed = f.ledger.exit_code.is_some() || f.ledger.reached_host;
    if let (Some(rule), false, false) = (f.approval, f.approved, observed) {
        return Some(held_for_approval(rule));
    }
    if let (true, Some((earlier, true, seen_in))) = (f.ledger.not_run_yet, f.repeats) {
        let holds = if seen_in == "host" {
            "the host's fingerprint index holds"
        } else {
            "the ledger holds"
        };
        return Some(Would::new(
            WouldDo::Block,
            Some(Verdict::Blocked),
            Some(ReasonCode::RepeatsRecentOperation),
            format!(
                "{holds} {earlier}, the same command on this host within the repetition window, and the policy holds such repetitions back: rerun with --op {earlier} for the same effect (it replays), or --repeats {earlier} to do it again"
            ),
        ));
    }
    None
}

fn held_for_approval(rule: &str) -> Would {
    Would::new(
        WouldDo::Block,
        Some(Verdict::Blocked),
        Some(ReasonCode::ApprovalRequired),
        format!("the policy requires approval for this command ({rule}); nothing would be sent until a human approves"),
    )
}

/// What `run` would do given the marker (after [`before_probe`] found nothing final).
pub fn after_probe(f: &PlanFacts<'_>) -> Would {
    let held = f.approval.filter(|_| !f.approved);
    let marker = match f.marker {
        None => {
            return Would::new(
                WouldDo::Unknown,
                None,
                None,
                "the marker was not probed".into(),
            )
        }
        Some(Err(why)) => {
            return Would::new(
                WouldDo::Unknown,
                None,
                None,
                format!(
                    "the host could not be probed now ({why}); `run` would connect and decide then"
                ),
            )
        }
        Some(Ok(marker)) => marker,
    };
    let same = marker
        .fingerprint
        .as_deref()
        .is_none_or(|fp| fp == f.host_fp);
    let conflict = || {
        Would::new(
            WouldDo::Conflict,
            Some(Verdict::Conflict),
            Some(ReasonCode::ConflictOnHost),
            "the host's marker binds this op id to another command or stdin; nothing would run"
                .into(),
        )
    };
    match marker.state {
        MarkerState::Absent if f.ledger.exit_code.is_some() => Would::new(
            WouldDo::Replay,
            Some(Verdict::Replayed),
            Some(ReasonCode::ReplayedFromLedger),
            "the ledger holds this operation's exit and the host no longer has its marker: the exit would be replayed from the ledger, nothing would run".into(),
        ),
        MarkerState::Absent => match held {
            Some(rule) => held_for_approval(rule),
            None => Would::new(
                WouldDo::Run,
                None,
                None,
                "no marker on the host: the op id would be claimed and the command run".into(),
            ),
        },
        MarkerState::Completed if !same => conflict(),
        MarkerState::Completed => Would::new(
            WouldDo::Replay,
            Some(Verdict::Replayed),
            Some(ReasonCode::ReplayedFromHost),
            format!(
                "the host's marker says it completed{}: its output and exit would be replayed, nothing would run",
                marker
                    .exit_code
                    .map_or_else(String::new, |c| format!(" with exit {c}"))
            ),
        ),
        MarkerState::Running if !same => conflict(),
        MarkerState::Running => Would::new(
            WouldDo::Follow,
            None,
            None,
            "the command is running on the host: `run` would attach and stream it, nothing would start again".into(),
        ),
        MarkerState::Interrupted if !same => conflict(),
        MarkerState::Interrupted => {
            let rerun = f.approved
                || (f.after_interrupted == AfterInterrupted::Rerun
                    && matches!(f.family, Family::ReadOnly | Family::Convergent));
            match (rerun, held) {
                (true, Some(rule)) => held_for_approval(rule),
                (true, None) => Would::new(
                    WouldDo::SupersedeAndRun,
                    None,
                    None,
                    format!(
                        "an interrupted claim is on the host ({}): being {}, it would be moved aside (kept for audit) and the command run again",
                        marker.why.as_deref().unwrap_or("its process is gone"),
                        f.family
                    ),
                ),
                (false, _) => Would::new(
                    WouldDo::Indeterminate,
                    Some(Verdict::Indeterminate),
                    Some(ReasonCode::InterruptedNeedsApproval),
                    format!(
                        "an interrupted claim is on the host and the command is {}: whether it took effect is unknown, so `run` would stop for a human (rerun with approval to run it again)",
                        f.family
                    ),
                ),
            }
        }
        MarkerState::Fenced if marker.started_before_fence() => Would::new(
            WouldDo::Indeterminate,
            Some(Verdict::Indeterminate),
            Some(ReasonCode::FencedAfterStart),
            "the op id is fenced, but its command had started before: nothing would run, and the outcome stays unknown".into(),
        ),
        MarkerState::Fenced => Would::new(
            WouldDo::NotApplied,
            Some(Verdict::NotApplied),
            Some(ReasonCode::Fenced),
            "the op id is fenced on the host: nothing would ever run under it".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn marker(state: &str, fp: &str) -> Result<MarkerInfo, String> {
        let mut fields = BTreeMap::new();
        fields.insert("state".to_owned(), state.to_owned());
        fields.insert("fp".to_owned(), fp.to_owned());
        Ok(MarkerInfo::from_fields(fields).unwrap())
    }

    fn facts<'a>(
        ledger: &'a LedgerFacts,
        marker: Option<&'a Result<MarkerInfo, String>>,
    ) -> PlanFacts<'a> {
        PlanFacts {
            family: Family::Destructive,
            after_interrupted: AfterInterrupted::Block,
            deny: None,
            approval: None,
            approved: false,
            ledger,
            repeats: None,
            marker,
            host_fp: "fp1",
        }
    }

    #[test]
    fn a_denied_command_is_refused_before_anything_else() {
        let ledger = LedgerFacts {
            other_intent: true,
            ..Default::default()
        };
        let f = PlanFacts {
            deny: Some("rule #3"),
            ..facts(&ledger, None)
        };
        assert_eq!(before_probe(&f).unwrap().action, WouldDo::Refuse);
    }

    #[test]
    fn approval_holds_a_fresh_op_but_not_one_that_only_replays_or_follows() {
        let fresh = LedgerFacts::default();
        let f = PlanFacts {
            approval: Some("rule #1"),
            ..facts(&fresh, None)
        };
        let w = before_probe(&f).unwrap();
        assert_eq!(
            (w.action, w.reason_code),
            (WouldDo::Block, Some(ReasonCode::ApprovalRequired))
        );
        let ran = LedgerFacts {
            known: true,
            reached_host: true,
            ..Default::default()
        };
        let running = marker("running", "fp1");
        let f = PlanFacts {
            approval: Some("rule #1"),
            ..facts(&ran, Some(&running))
        };
        assert!(before_probe(&f).is_none());
        assert_eq!(after_probe(&f).action, WouldDo::Follow);
    }

    #[test]
    fn the_marker_decides_run_replay_follow_conflict_and_fence() {
        let fresh = LedgerFacts::default();
        for (state, fp, want) in [
            ("absent", "", WouldDo::Run),
            ("completed", "fp1", WouldDo::Replay),
            ("completed", "fp2", WouldDo::Conflict),
            ("running", "fp1", WouldDo::Follow),
            ("interrupted", "fp1", WouldDo::Indeterminate),
            ("fenced", "fp1", WouldDo::NotApplied),
        ] {
            let m = marker(state, fp);
            let m = match (state, m) {
                ("absent", Ok(mut m)) => {
                    m.fingerprint = None;
                    Ok(m)
                }
                (_, m) => m,
            };
            assert_eq!(
                after_probe(&facts(&fresh, Some(&m))).action,
                want,
                "{state} {fp}"
            );
        }
        let unreachable = Err("connection refused".to_owned());
        assert_eq!(
            after_probe(&facts(&fresh, Some(&unreachable))).action,
            WouldDo::Unknown
        );
    }

    #[test]
    fn an_interrupted_convergent_claim_is_rerun_and_a_held_one_blocks() {
        let fresh = LedgerFacts::default();
        let m = marker("interrupted", "fp1");
        let f = PlanFacts {
            family: Family::Convergent,
            after_interrupted: AfterInterrupted::Rerun,
            ..facts(&fresh, Some(&m))
        };
        assert_eq!(after_probe(&f).action, WouldDo::SupersedeAndRun);
    }

    #[test]
    fn a_blocking_repetition_holds_only_an_operation_that_has_not_run() {
        let fresh = LedgerFacts {
            not_run_yet: true,
            ..Default::default()
        };
        let f = PlanFacts {
            repeats: Some(("deploy-1", true, "ledger")),
            ..facts(&fresh, None)
        };
        let w = before_probe(&f).unwrap();
        assert_eq!(w.reason_code, Some(ReasonCode::RepeatsRecentOperation));
        assert!(w.why.contains("--repeats deploy-1"), "{}", w.why);
        let warned = PlanFacts {
            repeats: Some(("deploy-1", false, "ledger")),
            ..facts(&fresh, None)
        };
        assert!(before_probe(&warned).is_none());
    }
}
