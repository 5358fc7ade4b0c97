//! Repetitions (docs/guarantees.md#repetitions): the same intent on the same host under
//! another op id within the family's `repeat_window`, the failure an op id alone cannot
//! stop (an agent that lost its op id and minted a new one). Looked for in the ledger
//! here, before anything is sent, and on the host by the shim's fingerprint index at the
//! claim (docs/host-protocol.md#the-fingerprint-index). What a found one does is the
//! policy's `on_repeat`: `block` answers `blocked` (`repeats_recent_operation`) naming the
//! earlier operation and the two ways forward, `warn` runs and says so, `allow` is silent.
//! A repetition declared with `--repeats OP` (or an amendment of an operation of the same
//! intent, `--amends OP`) is no surprise: it runs, and both operations show the link.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

use super::decide::Answer;
use crate::ledger::{Event, LedgerError, LinkRelation, OpKey, OperationRecord};
use crate::policy::OnRepeat;
use crate::vocab::{ReasonCode, Verdict};

/// An earlier operation this run repeats: the run document's `repeats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repetition {
    /// The earlier operation's id.
    pub op_id: String,
    /// Its state when seen: the ledger's state, or the host marker's (`running`,
    /// `completed`, `interrupted`, `claiming`).
    pub state: String,
    /// When it was intended (ledger) or claimed (host), UTC RFC 3339.
    pub at: String,
    /// How its host was reached, in words.
    pub route: String,
    /// What the policy did about it: `block` or `warn`.
    pub action: &'static str,
    /// Where it was seen: `ledger`, or `host` (the shim's fingerprint index: another
    /// ledger, another machine).
    pub seen_in: &'static str,
    /// Which setting holds it back and where to change it (the family, the rule that
    /// gave it, the policy file), for the `blocked` reason; not part of the document.
    #[serde(skip)]
    pub because: Option<String>,
}

impl Repetition {
    /// The ledger event recording it.
    pub fn event(&self) -> Event {
        Event::RepetitionHeld {
            earlier_op: self.op_id.clone(),
            earlier_state: self.state.clone(),
            earlier_at: self.at.clone(),
            route: self.route.clone(),
            seen_in: self.seen_in.into(),
            action: self.action.into(),
        }
    }

    /// The `blocked` answer (docs/guarantees.md#repetitions): names the earlier operation,
    /// its state, when and where, and the two ways forward.
    pub fn held(&self, op: &str, host: &str, attempt: Option<String>) -> Answer {
        Answer::new(
            Verdict::Blocked,
            attempt,
            ReasonCode::RepeatsRecentOperation,
            format!(
                "this command already ran on {host} under op {earlier} ({state}, at {at}, via {route}; seen in the {seen}) and its family does not repeat safely{because}; nothing was sent for op {op}. If you meant the same effect, rerun with --op {earlier} (it replays or follows that operation); if you mean to do it again, rerun with --repeats {earlier}",
                earlier = self.op_id,
                state = self.state,
                at = self.at,
                route = self.route,
                seen = self.seen_in,
                because = self.because.as_deref().map_or(String::new(), |b| format!(" ({b})")),
            ),
        )
    }

    /// The line said on stderr when the policy warns.
    pub fn warning(&self, op: &str, host: &str) -> String {
        format!(
            "warning: op {op} repeats op {earlier} on {host} ({state}, at {at}; seen in the {seen}): the same command under a new op id runs again. Rerun with --op {earlier} to replay it instead, or --repeats {earlier} to say the repetition is meant",
            earlier = self.op_id,
            state = self.state,
            at = self.at,
            seen = self.seen_in,
        )
    }

    /// A repetition the shim's fingerprint index found (its `R repeats` refusal or `W`
    /// warning fields): `earlier`, `earlier_state`, `earlier_at` (epoch seconds).
    pub fn from_host(
        fields: &std::collections::BTreeMap<String, String>,
        route: String,
        action: &'static str,
    ) -> Repetition {
        let field = |k: &str| fields.get(k).cloned().unwrap_or_else(|| "unknown".into());
        let at = fields
            .get("earlier_at")
            .and_then(|t| t.parse::<i64>().ok())
            .and_then(epoch_stamp)
            .unwrap_or_else(|| field("earlier_at"));
        Repetition {
            op_id: field("earlier"),
            state: field("earlier_state"),
            at,
            route,
            action,
            seen_in: "host",
            because: None,
        }
    }
}

/// Epoch seconds as a UTC RFC 3339 stamp.
fn epoch_stamp(secs: i64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp(secs).ok()?;
    t.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// What a run declared about repetitions: `--repeats OP`, `--amends OP`.
#[derive(Debug, Clone, Default)]
pub struct Declared {
    /// `--repeats`.
    pub repeats: Option<String>,
    /// `--amends`.
    pub amends: Option<String>,
}

impl Declared {
    /// The op ids declared, for the shim (`-` when none).
    pub fn ops(&self) -> Vec<String> {
        self.repeats.iter().chain(&self.amends).cloned().collect()
    }

    /// The links to record: (relation of this operation, the other op id).
    pub fn links(&self) -> Vec<(LinkRelation, String)> {
        let mut links = Vec::new();
        if let Some(op) = &self.repeats {
            links.push((LinkRelation::Repeats, op.clone()));
        }
        if let Some(op) = &self.amends {
            links.push((LinkRelation::Amends, op.clone()));
        }
        links
    }
}

/// What the ledger holds that bears on this run's declarations and repetitions.
pub trait LedgerView {
    /// See [`crate::ledger::Ledger::same_intent_since`].
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError>;
    /// One operation's events.
    fn events_of(&self, key: &OpKey) -> Result<Vec<Event>, LedgerError>;
}

impl LedgerView for crate::ledger::Ledger {
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        crate::ledger::Ledger::same_intent_since(self, fingerprint, host, op_id, since)
    }
    fn events_of(&self, key: &OpKey) -> Result<Vec<Event>, LedgerError> {
        Ok(self.events(key)?.into_iter().map(|e| e.event).collect())
    }
}

/// An earlier operation that may have had the effect: it has attempts, and its verdict
/// is not one that says nothing ran (held back, refused, closed as not applied).
fn may_have_run(record: &OperationRecord) -> bool {
    record.attempts > 0
        && !matches!(
            record.verdict,
            Some(Verdict::Blocked | Verdict::Refused | Verdict::NotApplied)
        )
}

/// The declared op ids and, through their own recorded `repeats`/`amends` links, the ops
/// they declared (a repetition of a declared repetition is declared too).
fn declared_closure(
    ledger: &dyn LedgerView,
    host: &str,
    declared: &Declared,
) -> Result<BTreeSet<String>, LedgerError> {
    let mut known: BTreeSet<String> = declared.ops().into_iter().collect();
    let mut todo: Vec<String> = known.iter().cloned().collect();
    // Bounded: a chain longer than this is not worth reading before every run.
    for _ in 0..16 {
        let Some(op) = todo.pop() else { break };
        for event in ledger.events_of(&OpKey::new(op, host))? {
            if let Event::Linked {
                relation: LinkRelation::Repeats | LinkRelation::Amends,
                other_op,
                ..
            } = event
            {
                if known.insert(other_op.clone()) {
                    todo.push(other_op);
                }
            }
        }
    }
    Ok(known)
}

/// The ledger half of the check: the earliest operation of the same intent on the same
/// host under another op id, intended within `window`, that may have run and was not
/// declared; `None` when the policy allows repetitions or there is none.
pub fn in_ledger(
    ledger: &dyn LedgerView,
    key: &OpKey,
    ledger_fp: &str,
    window: Duration,
    action: OnRepeat,
    declared: &Declared,
) -> Result<Option<Repetition>, LedgerError> {
    let action = match action {
        OnRepeat::Allow => return Ok(None),
        OnRepeat::Warn => "warn",
        OnRepeat::Block => "block",
    };
    if window.is_zero() {
        return Ok(None);
    }
    let since = crate::ledger::stamp_before(window).unwrap_or_default();
    let found = ledger.same_intent_since(ledger_fp, &key.host, &key.op_id, &since)?;
    let candidates: Vec<&OperationRecord> = found.iter().filter(|r| may_have_run(r)).collect();
    if candidates.is_empty() {
        return Ok(None);
    }
    let declared = declared_closure(ledger, &key.host, declared)?;
    let Some(earlier) = candidates
        .into_iter()
        .find(|r| !declared.contains(&r.op_id))
    else {
        return Ok(None);
    };
    let route = ledger
        .events_of(&OpKey::new(earlier.op_id.clone(), earlier.host.clone()))?
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::Connected { route, .. } => Some(route.describe()),
            _ => None,
        })
        .unwrap_or_else(|| format!("{} (no connection recorded)", earlier.host));
    Ok(Some(Repetition {
        op_id: earlier.op_id.clone(),
        state: earlier.state.to_string(),
        at: earlier.created_at.clone(),
        route,
        action,
        seen_in: "ledger",
        because: None,
    }))
}

/// Why a declaration cannot be taken, checked before anything is sent: `--repeats` of an
/// operation the ledger holds on this host with another intent (it would repeat nothing),
/// or of the run's own op id.
pub fn check_declared(
    key: &OpKey,
    ledger_fp: &str,
    declared: &Declared,
    other: impl Fn(&OpKey) -> Result<Option<OperationRecord>, LedgerError>,
) -> Result<Option<String>, LedgerError> {
    for (relation, op) in declared.links() {
        let flag = match relation {
            LinkRelation::Repeats => "--repeats",
            _ => "--amends",
        };
        if *op == key.op_id {
            return Ok(Some(format!(
                "{flag} {op} names this run's own op id; name the EARLIER operation it {}; nothing was sent",
                if relation == LinkRelation::Repeats { "repeats" } else { "replaces" }
            )));
        }
        if relation == LinkRelation::Repeats {
            if let Some(record) = other(&OpKey::new(op.clone(), key.host.clone()))? {
                if record.fingerprint != ledger_fp {
                    return Ok(Some(format!(
                        "--repeats {op}: op {op} on {} is a different command or stdin (`opmark show {op}`), so this run repeats nothing of it; use --amends {op} if this command replaces that one, or drop --repeats; nothing was sent",
                        key.host
                    )));
                }
            }
        }
    }
    Ok(None)
}
