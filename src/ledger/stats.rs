//! The counts of `opmark stats` ([`Stats`]): from the counters every append keeps, or
//! over a window of the chain, the same queries on both backends.

use std::collections::BTreeMap;

use serde::Serialize;

use super::dialect::StatsDialect;
use super::error::LedgerError;
use super::health;

/// Counts for a dashboard (`opmark stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Events in the ledger (JSON `event_count`: `events` is a list in `show`).
    #[serde(rename = "event_count")]
    pub events: u64,
    /// Operations in the ledger (JSON `operation_count`: `operations` is a list in `list`).
    #[serde(rename = "operation_count")]
    pub operations: u64,
    /// Operations by current state.
    pub by_state: BTreeMap<String, u64>,
    /// Operations by family.
    pub by_family: BTreeMap<String, u64>,
    /// Operations whose outcome is not settled (JSON `unresolved_count`: `unresolved` is
    /// an operation's flag in `list`).
    #[serde(rename = "unresolved_count")]
    pub unresolved: u64,
    /// Verdict events by verdict.
    pub verdicts: BTreeMap<String, u64>,
    /// `indeterminate` verdicts given (unknown outcomes).
    pub unknown_outcomes: u64,
    /// Reconcile decisions recorded.
    pub reconciliations: u64,
    /// `conflict` verdicts recorded: op ids the host's marker binds to another intent.
    /// A conflict with this ledger's own record is answered before anything is written
    /// (the operation's history belongs to its first intent), so it is not counted here.
    pub conflicts_on_host: u64,
    /// `blocked` verdicts given (approval asked).
    pub approvals_asked: u64,
    /// Operator decisions recorded.
    pub operator_decisions: u64,
    /// Contradictions between evidence recorded (docs/ledger.md#contradictions); JSON
    /// `contradiction_count` (`contradictions` is a list in `show`).
    #[serde(rename = "contradiction_count")]
    pub contradictions: u64,
    /// Operations with at least one contradiction.
    pub contradicted_operations: u64,
    /// Attempts dispatched (JSON `attempt_count`: `attempts` is a list in `run`, `show`).
    #[serde(rename = "attempt_count")]
    pub attempts: u64,
    /// Attempts after the first, by the operation's family.
    pub retries_by_family: BTreeMap<String, u64>,
    /// The health counts per family (docs/ledger.md#health); empty from
    /// [`Ledger::stats`](super::Ledger::stats), filled by [`Ledger::stats_with_health`](super::Ledger::stats_with_health).
    pub health: health::Health,
}

impl Stats {
    /// The counts from the counters every append keeps (see `append::count`).
    pub(crate) fn from_counters(counters: &BTreeMap<String, i64>) -> Stats {
        let get = |name: &str| counters.get(name).copied().unwrap_or(0).max(0) as u64;
        let by = |prefix: &str| -> BTreeMap<String, u64> {
            counters
                .iter()
                .filter_map(|(k, v)| {
                    let key = k.strip_prefix(prefix)?.strip_prefix('/')?;
                    (*v > 0).then(|| (key.to_owned(), *v as u64))
                })
                .collect()
        };
        let verdicts = by("verdict");
        Stats {
            events: get("events"),
            operations: get("operations"),
            by_state: by("state"),
            by_family: by("family"),
            unresolved: get("unresolved"),
            unknown_outcomes: verdicts.get("indeterminate").copied().unwrap_or(0),
            conflicts_on_host: verdicts.get("conflict").copied().unwrap_or(0),
            approvals_asked: verdicts.get("blocked").copied().unwrap_or(0),
            verdicts,
            reconciliations: get("kind/reconciled"),
            operator_decisions: get("kind/operator_decision"),
            contradictions: get("kind/contradiction"),
            contradicted_operations: get("contradicted"),
            attempts: get("kind/attempt_dispatched"),
            retries_by_family: by("retries"),
            health: health::Health::default(),
        }
    }

    /// The counts over a window: the events from a sequence number on (`dialect.param`)
    /// and the operations active in it. O(window) through the primary key and the
    /// recency index.
    pub(crate) fn query_window(
        count: impl Fn(&str) -> Result<u64, LedgerError>,
        group: impl Fn(&str) -> Result<BTreeMap<String, u64>, LedgerError>,
        dialect: &StatsDialect,
    ) -> Result<Stats, LedgerError> {
        let p = dialect.param;
        let events_of = |kind: &str| {
            count(&format!(
                "SELECT COUNT(*) FROM events WHERE seq >= {p} AND kind = '{kind}'"
            ))
        };
        let ops =
            |cond: &str| format!("SELECT COUNT(*) FROM operations WHERE last_seq >= {p}{cond}");
        let verdicts = group(&format!(
            "SELECT {}, COUNT(*) FROM events WHERE seq >= {p} AND kind = 'verdict' GROUP BY 1",
            dialect.verdict
        ))?;
        Ok(Stats {
            events: count(&format!("SELECT COUNT(*) FROM events WHERE seq >= {p}"))?,
            operations: count(&ops(""))?,
            by_state: group(&format!(
                "SELECT state, COUNT(*) FROM operations WHERE last_seq >= {p} GROUP BY state"
            ))?,
            by_family: group(&format!(
                "SELECT family, COUNT(*) FROM operations WHERE last_seq >= {p} GROUP BY family"
            ))?,
            unresolved: count(&ops(&format!(" AND {}", dialect.unresolved)))?,
            unknown_outcomes: verdicts.get("indeterminate").copied().unwrap_or(0),
            conflicts_on_host: verdicts.get("conflict").copied().unwrap_or(0),
            approvals_asked: verdicts.get("blocked").copied().unwrap_or(0),
            verdicts,
            reconciliations: events_of("reconciled")?,
            operator_decisions: events_of("operator_decision")?,
            contradictions: events_of("contradiction")?,
            contradicted_operations: count(&ops(" AND contradictions > 0"))?,
            attempts: events_of("attempt_dispatched")?,
            retries_by_family: group(&format!(
                "SELECT o.family, COUNT(*) FROM events e
                 JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
                 WHERE e.seq >= {p} AND e.kind = 'attempt_dispatched' AND {} > 1
                 GROUP BY o.family",
                dialect.attempt_number
            ))?,
            health: health::Health::default(),
        })
    }
}
