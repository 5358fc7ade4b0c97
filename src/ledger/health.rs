//! The health counts of `opmark stats` (docs/ledger.md#health): what shows policy drift
//! and the incidents the ledger exists to expose, per family.
//!
//! Two kinds of count:
//! - **events** (replays, conflicts, approval interruptions, contradictions, repetitions
//!   held back and declared, reconciliations by outcome): over the whole ledger from the
//!   counters every append keeps ([`count`], named `h/<kind>/<word>/<family>`), over a
//!   window from one pass over the window's events ([`EVENT_KEY`], the same names);
//! - **operations now** (unknown outcomes, needs_human, suspected duplicate effects): from
//!   the projection through its indexes (`operations_unresolved`, `operations_by_intent` on SQLite, `operations_by_fingerprint` on PostgreSQL)
//!   and, over the whole ledger, the `shared_intents` table the schema's triggers keep
//!   (per intent shared by several op ids: how many executed, the strictest family) with
//!   its duplicates tallied by host and family (`duplicate_tallies`).
//!
//! So `stats` costs the counters plus the unresolved operations plus the duplicates it
//! names, never the history; `--since D` adds the window's events.

use std::collections::BTreeMap;

use serde::Serialize;

use super::counters::Counters;
use super::dialect::StatsDialect;
use super::error::LedgerError;
use super::event::Event;
use super::projection::OperationRecord;
use crate::vocab::{Boundary, Verdict};

/// A count, and the same count by family.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FamilyCount {
    /// The count.
    pub total: u64,
    /// By the operation's family (its words as in the policy).
    pub by_family: BTreeMap<String, u64>,
}

impl FamilyCount {
    fn add(&mut self, family: &str, n: u64) {
        if n == 0 {
            return;
        }
        self.total += n;
        *self.by_family.entry(family.to_owned()).or_insert(0) += n;
    }

    fn from_groups(groups: &BTreeMap<String, u64>) -> FamilyCount {
        let mut t = FamilyCount::default();
        for (family, n) in groups {
            t.add(family, *n);
        }
        t
    }
}

/// One intent executed under more than one op id on one host: the same effect twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SuspectedDuplicate {
    /// The host (as the caller named it).
    pub host: String,
    /// The family of the intent's operations (the strictest when they differ).
    pub family: String,
    /// The first [`OP_IDS_NAMED`] op ids that executed it, in the order they ran.
    pub op_ids: Vec<String>,
    /// How many op ids executed it.
    #[serde(rename = "execution_count")]
    pub executions: u64,
}

/// The health counts (docs/ledger.md#health).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Health {
    /// Operations dispatched and not settled: they may have run, nobody knows yet.
    #[serde(rename = "unknown_outcome_tally")]
    pub unknown_outcomes: FamilyCount,
    /// Unresolved operations older than the policy's `escalate_after`.
    #[serde(rename = "needs_human_tally")]
    pub needs_human: FamilyCount,
    /// The `escalate_after` that `needs_human` was counted with (`1h`), set by the
    /// caller that knows the policy.
    pub escalate_after: String,
    /// Reconcile decisions by outcome (`completed`, `fenced`, `still_unknown`, ...).
    #[serde(rename = "reconciliation_outcomes")]
    pub reconciliations: BTreeMap<String, u64>,
    /// `replayed` verdicts: reruns answered from evidence (not retries).
    #[serde(rename = "replay_tally")]
    pub replays: FamilyCount,
    /// Attempts after the first of their operation (replays and follows are not attempts).
    #[serde(rename = "retry_tally")]
    pub retries: FamilyCount,
    /// `conflict` verdicts recorded.
    #[serde(rename = "conflict_tally")]
    pub conflicts: FamilyCount,
    /// Runs held back (blocked or warned) as a repetition of another op id's intent.
    #[serde(rename = "repetition_held_tally")]
    pub repetitions_held: FamilyCount,
    /// Repetitions declared with `--repeats`.
    #[serde(rename = "repetition_declared_tally")]
    pub repetitions_declared: FamilyCount,
    /// `blocked` verdicts: a run stopped for a human's approval.
    #[serde(rename = "approval_interruption_tally")]
    pub approval_interruptions: FamilyCount,
    /// Contradictions between evidence recorded.
    #[serde(rename = "contradiction_tally")]
    pub contradictions: FamilyCount,
    /// Intents executed under two or more op ids on one host (declared or not).
    #[serde(rename = "suspected_duplicate_tally")]
    pub suspected_duplicates: FamilyCount,
    /// The same, by host.
    pub suspected_duplicates_by_host: BTreeMap<String, u64>,
    /// Which: host, family, count and first op ids of each, by host (`stats` names the
    /// first `--limit`, the tallies count every one).
    pub duplicates: Vec<SuspectedDuplicate>,
}

/// The verdicts the health counts keep apart.
const COUNTED_VERDICTS: [Verdict; 3] = [Verdict::Replayed, Verdict::Conflict, Verdict::Blocked];

/// The family word counted for an event of an operation without a row (never expected:
/// every counted event follows an intent).
pub(crate) const NO_FAMILY: &str = "unknown";

/// The counter name of a health event, or `None` for events the health counts skip.
/// `EVENT_KEY`'s SQL gives the same names, so counters and windows agree.
pub(crate) fn key(event: &Event, family: &str) -> Option<String> {
    let word = match event {
        Event::Verdict { verdict, .. } if COUNTED_VERDICTS.contains(verdict) => {
            verdict.as_str().to_owned()
        }
        Event::Reconciled { decision, .. } => decision.as_str().to_owned(),
        Event::Contradiction { .. } => String::new(),
        // Named by kind, so they count from the moment the events exist (EVENTS.md):
        // a held repetition, and a link whose relation is `repeats`.
        // By what the policy did: `block` held it back, `warn` let it run.
        Event::RepetitionHeld { action, .. } => action.clone(),
        other if other.kind() == "linked" => {
            let v = serde_json::to_value(other).ok()?;
            (v.get("relation")?.as_str()? == "repeats").then(String::new)?
        }
        _ => return None,
    };
    Some(format!("{}/{word}/{family}", event.kind()))
}

/// The health events of the whole ledger from its counters (`h/` names).
pub(crate) fn from_counters(counters: &BTreeMap<String, i64>) -> BTreeMap<String, u64> {
    counters
        .iter()
        .filter_map(|(k, n)| Some((k.strip_prefix("h/")?.to_owned(), (*n).max(0) as u64)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The counter of attempts after the first that the shim refused (`h/refused_retry//F`):
/// they ran nothing (a replay, a follow, a conflict, a fenced op), so they are not
/// retries. Older opmark recorded every rerun as an attempt; this keeps `retries` true
/// for those ledgers and for whatever else a shim refuses.
pub(crate) const REFUSED_RETRY: &str = "refused_retry";

/// What one stored event adds to the health counters (called by `append::count`, in the
/// same transaction as the event, with the operation's row before it; `audit verify
/// --full` recounts them).
pub(crate) fn count(
    counts: &mut dyn Counters,
    event: &Event,
    before: Option<&OperationRecord>,
    after: Option<&OperationRecord>,
) {
    let family = after.or(before).map_or(NO_FAMILY, |r| r.family.as_str());
    if let Some(k) = key(event, family) {
        counts.add(&format!("h/{k}"), 1);
    }
    if let (
        Event::BoundaryReached {
            attempt_id,
            boundary: Boundary::Refused,
            ..
        },
        Some(rec),
    ) = (event, before)
    {
        // The attempt is the operation's latest; its number is the attempts so far.
        if rec.attempts > 1 && rec.last_attempt.as_deref() == Some(attempt_id.as_str()) {
            counts.add(&format!("h/{REFUSED_RETRY}//{family}"), 1);
        }
    }
}

/// The SQL (for `dialect`) whose rows are `(name, count)` with the names [`key`] gives,
/// over the events from the window's first sequence number (`dialect.param`) on; `None`
/// for the whole ledger (the migration that counted the history once).
pub(crate) fn event_counts_sql(dialect: &StatsDialect, windowed: bool) -> String {
    let j = dialect.json_text;
    let verdicts = COUNTED_VERDICTS
        .iter()
        .map(|v| format!("'{}'", v.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let window = if windowed {
        format!("e.seq >= {} AND ", dialect.param)
    } else {
        String::new()
    };
    format!(
        "SELECT e.kind || '/' || CASE e.kind
             WHEN 'verdict' THEN {verdict} WHEN 'reconciled' THEN {decision}
             WHEN 'repetition_held' THEN {action} ELSE '' END
             || '/' || COALESCE(o.family, '{NO_FAMILY}'), COUNT(*)
         FROM events e LEFT JOIN operations o ON o.op_id = e.op_id AND o.host = e.host
         WHERE {window}(e.kind IN ('contradiction', 'repetition_held', 'reconciled')
             OR (e.kind = 'verdict' AND {verdict} IN ({verdicts}))
             OR (e.kind = 'linked' AND {relation} = 'repeats'))
         GROUP BY 1",
        verdict = j("e.payload", "verdict"),
        decision = j("e.payload", "decision"),
        relation = j("e.payload", "relation"),
        action = j("e.payload", "action"),
    )
}

/// The SQL (for `dialect`) of the refused retries ([`REFUSED_RETRY`]) by family, named
/// as [`count`] names them; over the window from `dialect.param` when `windowed`.
pub(crate) fn refused_retries_sql(dialect: &StatsDialect, windowed: bool) -> String {
    let j = dialect.json_text;
    let window = if windowed {
        format!("b.seq >= {} AND ", dialect.param)
    } else {
        String::new()
    };
    format!(
        "SELECT '{REFUSED_RETRY}//' || COALESCE(o.family, '{NO_FAMILY}'), COUNT(*)
         FROM events b
         JOIN events d ON d.op_id = b.op_id AND d.host = b.host AND d.kind = 'attempt_dispatched'
             AND {d_attempt} = {b_attempt}
         LEFT JOIN operations o ON o.op_id = b.op_id AND o.host = b.host
         WHERE {window}b.kind = 'boundary_reached' AND {boundary} = 'refused'
             AND CAST({number} AS BIGINT) > 1
         GROUP BY 1",
        d_attempt = j("d.payload", "attempt_id"),
        b_attempt = j("b.payload", "attempt_id"),
        boundary = j("b.payload", "boundary"),
        number = j("d.payload", "number"),
    )
}

/// `(text, count)` rows of a query.
pub(crate) type GroupRead<'a> = &'a dyn Fn(&str) -> Result<BTreeMap<String, u64>, LedgerError>;
/// Rows of four text columns of a query.
pub(crate) type RowsRead<'a> = &'a dyn Fn(&str) -> Result<Vec<[String; 4]>, LedgerError>;
/// Suspected duplicates: the tally, by host, and each named.
type Duplicates = (FamilyCount, BTreeMap<String, u64>, Vec<SuspectedDuplicate>);

/// What the health counts read from a backend: a count, a grouped count, and rows of
/// text columns, each for SQL with the window's first sequence number as its parameter.
pub(crate) struct Reads<'a> {
    /// `(text, count)` rows.
    pub group: GroupRead<'a>,
    /// Rows of four text columns.
    pub rows: RowsRead<'a>,
}

/// The health counts: events from `events` (counters or a window's pass, names as
/// [`key`]), retries by family as `stats` counted them, and the operations now (active
/// since `from_seq` when given) read through `reads`. `needs_human_before`: the UTC RFC
/// 3339 time before which an unresolved operation was created to be flagged. At most
/// `named` suspected duplicates are named (`None`: all).
pub(crate) fn health(
    events: &BTreeMap<String, u64>,
    retries: &BTreeMap<String, u64>,
    reads: &Reads<'_>,
    dialect: &StatsDialect,
    windowed: bool,
    needs_human_before: &str,
    named: Option<usize>,
) -> Result<Health, LedgerError> {
    let mut h = Health::default();
    let mut refused_retries = BTreeMap::new();
    let mut held_blocks: BTreeMap<String, u64> = BTreeMap::new();
    for (name, n) in events {
        let mut parts = name.splitn(3, '/');
        let (Some(kind), Some(word), Some(family)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        match (kind, word) {
            ("verdict", "replayed") => h.replays.add(family, *n),
            ("verdict", "conflict") => h.conflicts.add(family, *n),
            ("verdict", "blocked") => h.approval_interruptions.add(family, *n),
            ("contradiction", _) => h.contradictions.add(family, *n),
            ("repetition_held", "block") => {
                h.repetitions_held.add(family, *n);
                *held_blocks.entry(family.to_owned()).or_insert(0) += n;
            }
            ("linked", _) => h.repetitions_declared.add(family, *n),
            (REFUSED_RETRY, _) => {
                refused_retries.insert(family.to_owned(), *n);
            }
            ("reconciled", decision) => {
                *h.reconciliations.entry(decision.to_owned()).or_insert(0) += n
            }
            _ => {}
        }
    }
    // A repetition held back answers `blocked` too, but no approval would let it run
    // (`--repeats` or the earlier op id does): it is not an approval interruption.
    let approvals: BTreeMap<String, u64> = h
        .approval_interruptions
        .by_family
        .iter()
        .map(|(family, n)| {
            let held = held_blocks.get(family).copied().unwrap_or(0);
            (family.clone(), n.saturating_sub(held))
        })
        .collect();
    h.approval_interruptions = FamilyCount::from_groups(&approvals);
    let tried: BTreeMap<String, u64> = retries
        .iter()
        .map(|(family, n)| {
            let refused = refused_retries.get(family).copied().unwrap_or(0);
            (family.clone(), n.saturating_sub(refused))
        })
        .collect();
    h.retries = FamilyCount::from_groups(&tried);
    let active = if windowed {
        format!(" AND last_seq >= {}", dialect.param)
    } else {
        String::new()
    };
    // Both walk `operations_unresolved`: the unresolved operations, not all of them.
    h.unknown_outcomes = FamilyCount::from_groups(&(reads.group)(&format!(
        "SELECT family, COUNT(*) FROM operations WHERE {} AND attempts > 0{active} GROUP BY family",
        dialect.unresolved
    ))?);
    // The cutoff is a timestamp opmark formatted itself (digits, `-`, `:`, `T`, `.`, `Z`).
    debug_assert!(needs_human_before
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-:.+".contains(c)));
    h.needs_human = FamilyCount::from_groups(&(reads.group)(&format!(
        "SELECT family, COUNT(*) FROM operations
         WHERE {} AND created_at < {}{active} GROUP BY family",
        dialect.unresolved,
        (dialect.stamp)(needs_human_before)
    ))?);
    let (dups, by_host, list) = duplicates(reads, dialect, windowed, named)?;
    h.suspected_duplicates = dups;
    h.suspected_duplicates_by_host = by_host;
    h.duplicates = list;
    Ok(h)
}

/// `text` as an SQL string literal (standard SQL: a quote is doubled), for values the
/// ledger itself holds (a host name, a hex fingerprint).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// How many op ids a suspected duplicate names, in the order they ran: the first few say
/// where to look, [`SuspectedDuplicate::executions`] says how big it is.
pub const OP_IDS_NAMED: usize = 5;

/// The `shared_intents` rows that are suspected duplicate effects: executed under two or
/// more op ids, and not only reads (the partial index `shared_intents_duplicates` on
/// SQLite holds exactly these).
const DUPLICATE_ROWS: &str = "executed > 1 AND family <> 'read-only'";

/// The suspected duplicates by family, from the counters the schema's triggers keep on
/// `shared_intents` (`duplicate_tallies`, a row per host and family): the tallies cost
/// the hosts, not the duplicates.
const TALLY_BY_FAMILY: &str = "SELECT family, CAST(SUM(intents) AS BIGINT) FROM duplicate_tallies
    GROUP BY family HAVING SUM(intents) > 0";

/// The suspected duplicates by host, from the same counters.
const TALLY_BY_HOST: &str = "SELECT host, CAST(SUM(intents) AS BIGINT) FROM duplicate_tallies
    GROUP BY host HAVING SUM(intents) > 0";

/// The first `named` suspected duplicates (all when None), by host and fingerprint: the
/// order of the partial index `shared_intents_duplicates`, so the `LIMIT` stops after
/// the named rather than sorting every duplicate.
fn named_duplicates(named: Option<usize>) -> String {
    let limit = named.map_or_else(String::new, |n| format!(" LIMIT {n}"));
    format!(
        "SELECT host, fingerprint, family, CAST(executed AS TEXT) FROM shared_intents
         WHERE {DUPLICATE_ROWS} ORDER BY host, fingerprint{limit}"
    )
}

/// Intents executed under two or more op ids on one host, at most `named` of them named.
///
/// Over the whole ledger this reads what the schema's triggers keep as operations are
/// written: per intent shared by several op ids, how many executed and the strictest
/// family among those (`shared_intents`), and those tallied by host and family. So the
/// tallies cost the hosts, not the operations or their events, and naming costs the
/// named. A window reads the candidates among the operations active in it.
fn duplicates(
    reads: &Reads<'_>,
    dialect: &StatsDialect,
    windowed: bool,
    named: Option<usize>,
) -> Result<Duplicates, LedgerError> {
    let first_op_ids = |host: &str, fingerprint: &str| -> Result<Vec<String>, LedgerError> {
        Ok((reads.rows)(&format!(
            "SELECT o.op_id, '', '', '' FROM operations o
             WHERE o.host = {} AND {} AND o.executed = 1 ORDER BY o.first_seq LIMIT {OP_IDS_NAMED}",
            literal(host),
            (dialect.same_fingerprint)("o.fingerprint", &literal(fingerprint)),
        ))?
        .into_iter()
        .map(|[op_id, ..]| op_id)
        .collect())
    };
    if !windowed {
        let tally = FamilyCount::from_groups(&(reads.group)(TALLY_BY_FAMILY)?);
        let by_host = (reads.group)(TALLY_BY_HOST)?;
        let mut list = Vec::new();
        for [host, fingerprint, family, executions] in (reads.rows)(&named_duplicates(named))? {
            list.push(SuspectedDuplicate {
                op_ids: first_op_ids(&host, &fingerprint)?,
                executions: executions.parse().unwrap_or(0),
                host,
                family,
            });
        }
        return Ok((tally, by_host, list));
    }
    // Two steps, so each query has one obvious index: the candidates (the recency index,
    // probing the intent index per operation), then each candidate's executed operations
    // by the intent index.
    let candidates = (reads.rows)(&format!(
        "SELECT w.host, w.fingerprint, '', '' FROM operations w WHERE w.last_seq >= {p}
         AND EXISTS (SELECT 1 FROM operations d WHERE d.host = w.host
             AND {same} AND d.op_id <> w.op_id)",
        p = dialect.param,
        same = (dialect.same_fingerprint)("d.fingerprint", "w.fingerprint"),
    ))?;
    let intents: std::collections::BTreeSet<(&str, &str)> = candidates
        .iter()
        .map(|[host, fingerprint, _, _]| (host.as_str(), fingerprint.as_str()))
        .collect();
    let mut tally = FamilyCount::default();
    let mut by_host = BTreeMap::new();
    let mut list = Vec::new();
    for (host, fingerprint) in intents {
        let members = (reads.rows)(&format!(
            "SELECT o.family, o.op_id, '', '' FROM operations o
             WHERE o.host = {} AND {} AND o.executed = 1 ORDER BY o.first_seq",
            literal(host),
            (dialect.same_fingerprint)("o.fingerprint", &literal(fingerprint)),
        ))?;
        if members.len() < 2 {
            continue;
        }
        let strictest = members
            .iter()
            .filter_map(|[f, ..]| f.parse::<crate::family::Family>().ok())
            .max();
        // A read repeated is no duplicate effect (docs/commands.md#operators, `stats`):
        // counting it would teach an operator to ignore the one alarm the ledger exists
        // to raise.
        if strictest == Some(crate::family::Family::ReadOnly) {
            continue;
        }
        let family = strictest.map_or_else(|| members[0][0].clone(), |f| f.as_str().to_owned());
        tally.add(&family, 1);
        *by_host.entry(host.to_owned()).or_insert(0) += 1;
        if named.is_none_or(|n| list.len() < n) {
            list.push(SuspectedDuplicate {
                host: host.to_owned(),
                family,
                executions: members.len() as u64,
                op_ids: members
                    .into_iter()
                    .take(OP_IDS_NAMED)
                    .map(|[_, op_id, ..]| op_id)
                    .collect(),
            });
        }
    }
    Ok((tally, by_host, list))
}

#[cfg(test)]
mod tests {
    use super::super::{Durability, Ledger, OpKey};
    use super::*;
    use crate::family::Family;
    use crate::ledger::Decision;
    use crate::vocab::RetryReason;

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "opmark-health-{name}-{}-{:08x}/ledger.db",
            std::process::id(),
            rand::random::<u32>()
        ))
    }

    fn intended(fp: &str, family: Family) -> Event {
        Event::Intended {
            session: "s".into(),
            family,
            display: "cmd".into(),
            fingerprint: fp.into(),
            rule: "r".into(),
            secrets: Vec::new(),
            become_user: None,
            locks: Vec::new(),
        }
    }

    fn attempt(id: &str, number: u32) -> Event {
        Event::AttemptDispatched {
            attempt_id: id.into(),
            number,
            parent: None,
            reason: RetryReason::FirstAttempt,
        }
    }

    fn boundary(id: &str, boundary: Boundary) -> Event {
        Event::BoundaryReached {
            attempt_id: id.into(),
            boundary,
            detail: "d".into(),
            refusal: None,
        }
    }

    fn verdict(id: &str, verdict: Verdict) -> Event {
        Event::Verdict {
            attempt_id: Some(id.into()),
            verdict,
            exit_code: Some(0),
            reason: "r".into(),
        }
    }

    /// An operation that ran (`a1` started), and then `extra`.
    fn ran(l: &mut Ledger, op: &str, fp: &str, family: Family, extra: &[Event]) {
        let mut events = vec![
            intended(fp, family),
            attempt(&format!("{op}-a1"), 1),
            boundary(&format!("{op}-a1"), Boundary::Started),
            verdict(&format!("{op}-a1"), Verdict::Completed),
        ];
        events.extend_from_slice(extra);
        l.append_many(&OpKey::new(op, "h1"), &events, Durability::Normal)
            .unwrap();
    }

    /// A history with each health event: a replay through a refused second attempt (as
    /// older opmark recorded reruns), a real retry, a conflict, a blocked run, a
    /// reconcile, and one intent run under two op ids.
    fn history(l: &mut Ledger) {
        ran(
            l,
            "replayed",
            "fp-1",
            Family::ReadOnly,
            &[
                attempt("replayed-a2", 2),
                boundary("replayed-a2", Boundary::Refused),
                verdict("replayed-a2", Verdict::Replayed),
            ],
        );
        ran(
            l,
            "retried",
            "fp-2",
            Family::Convergent,
            &[
                attempt("retried-a2", 2),
                boundary("retried-a2", Boundary::ExitReceived),
                verdict("retried-a2", Verdict::Completed),
            ],
        );
        ran(l, "dup-a", "fp-3", Family::Destructive, &[]);
        ran(l, "dup-b", "fp-3", Family::Destructive, &[]);
        let blocked = OpKey::new("blocked", "h1");
        l.append_many(
            &blocked,
            &[
                intended("fp-4", Family::Destructive),
                verdict("x", Verdict::Blocked),
            ],
            Durability::Normal,
        )
        .unwrap();
        let lost = OpKey::new("lost", "h1");
        l.append_many(
            &lost,
            &[
                intended("fp-5", Family::AppendOnly),
                attempt("lost-a1", 1),
                boundary("lost-a1", Boundary::SentNoResponse),
                Event::Reconciled {
                    decision: Decision::NotApplied,
                    detail: "absent; fenced".into(),
                },
            ],
            Durability::Normal,
        )
        .unwrap();
        let open = OpKey::new("open", "h1");
        l.append_many(
            &open,
            &[
                intended("fp-6", Family::AppendOnly),
                attempt("open-a1", 1),
                boundary("open-a1", Boundary::SentNoResponse),
            ],
            Durability::Normal,
        )
        .unwrap();
    }

    fn check(h: &Health) {
        let one = |f: &str| FamilyCount {
            total: 1,
            by_family: [(f.to_owned(), 1)].into(),
        };
        assert_eq!(h.replays, one("read-only"), "{h:?}");
        assert_eq!(
            h.retries,
            one("convergent"),
            "a refused rerun is no retry: {h:?}"
        );
        assert_eq!(h.approval_interruptions, one("destructive"));
        assert_eq!(h.reconciliations, [("not_applied".to_owned(), 1)].into());
        assert_eq!(h.unknown_outcomes, one("append-only"), "{h:?}");
        assert_eq!(h.suspected_duplicates, one("destructive"), "{h:?}");
        assert_eq!(h.duplicates[0].op_ids, ["dup-a", "dup-b"]);
        assert_eq!(
            h.suspected_duplicates_by_host,
            [("h1".to_owned(), 1)].into()
        );
    }

    #[test]
    fn counters_and_a_window_over_everything_count_the_same() {
        let path = scratch("same");
        let mut l = Ledger::open(&path).unwrap();
        history(&mut l);
        let far = "9999-01-01T00:00:00.000000Z";
        let whole = l.stats_with_health(None, far, None).unwrap().health;
        check(&whole);
        assert_eq!(
            whole.needs_human,
            whole.unknown_outcomes.clone(),
            "open is old"
        );
        let window = l
            .stats_with_health(Some("1970-01-01T00:00:00.000000Z"), far, None)
            .unwrap()
            .health;
        assert_eq!(window, whole);
        // Nothing is older than the dawn of time.
        let none = l
            .stats_with_health(None, "1970-01-01T00:00:00.000000Z", None)
            .unwrap()
            .health;
        assert_eq!(none.needs_human, FamilyCount::default());
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_ledger_of_schema_version_3_counts_its_history_once_when_migrated() {
        let path = scratch("migrate4");
        let mut l = Ledger::open(&path).unwrap();
        history(&mut l);
        let far = "9999-01-01T00:00:00.000000Z";
        let before = l.stats_with_health(None, far, None).unwrap();
        // Back to what opmark of schema version 3 left on disk: the text layout, no
        // health counters, no intent index.
        drop(l);
        super::super::tests::as_schema_3(&path, "");
        let old = super::super::tests::open_raw(&path);
        let health_counters: i64 = old
            .query_row(
                "SELECT COUNT(*) FROM counters WHERE name LIKE 'h/%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(health_counters, 0);
        drop(old);
        let l = Ledger::open(&path).unwrap();
        assert_eq!(l.stats_with_health(None, far, None).unwrap(), before);
        let report = l.verify_chain().unwrap();
        assert!(report.intact(), "{report:?}");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// (fingerprint, host) pairs.
    type Intents = Vec<(String, String)>;

    /// The intents under more than one op id on a host, as the whole ledger's GROUP BY
    /// would find them, and as the maintained table holds them.
    fn shared(l: &Ledger) -> (Intents, Intents) {
        let read = |sql: &str| -> Intents {
            let mut stmt = l.conn().prepare(sql).unwrap();
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
            rows.collect::<Result<_, _>>().unwrap()
        };
        (
            read(
                "SELECT fingerprint, host FROM operations GROUP BY fingerprint, host
                 HAVING COUNT(*) > 1 ORDER BY 1, 2",
            ),
            read("SELECT fingerprint, host FROM shared_intents ORDER BY 1, 2"),
        )
    }

    #[test]
    fn thirty_reads_of_one_intent_are_no_duplicate_effect_and_two_destructive_runs_are() {
        let path = scratch("reads");
        let mut l = Ledger::open(&path).unwrap();
        for n in 0..30 {
            ran(
                &mut l,
                &format!("st-{n}"),
                "fp-uptime",
                Family::ReadOnly,
                &[],
            );
        }
        let far = "9999-01-01T00:00:00.000000Z";
        for window in [None, Some("0000-01-01T00:00:00.000000Z")] {
            let h = l.stats_with_health(window, far, None).unwrap().health;
            assert_eq!(h.suspected_duplicates.total, 0, "{window:?}: {h:?}");
            assert!(h.duplicates.is_empty(), "{h:?}");
        }
        ran(&mut l, "rm-1", "fp-rm", Family::Destructive, &[]);
        ran(&mut l, "rm-2", "fp-rm", Family::Destructive, &[]);
        for window in [None, Some("0000-01-01T00:00:00.000000Z")] {
            let h = l.stats_with_health(window, far, None).unwrap().health;
            assert_eq!(h.suspected_duplicates.total, 1, "{window:?}: {h:?}");
            assert_eq!(h.duplicates[0].op_ids, ["rm-1", "rm-2"], "{h:?}");
            assert_eq!(h.duplicates[0].family, "destructive");
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn whole_ledger_duplicates_come_from_the_table_appends_keep_and_a_migration_fills() {
        let path = scratch("shared");
        let mut l = Ledger::open(&path).unwrap();
        history(&mut l);
        let far = "9999-01-01T00:00:00.000000Z";
        let (grouped, kept) = shared(&l);
        assert_eq!(grouped.len(), 1, "{grouped:?}");
        assert_eq!(kept, grouped);
        let before = l.stats_with_health(None, far, None).unwrap();
        check(&before.health);
        // Back to a schema without the table (3, the text layout): opening fills it
        // from the operations.
        drop(l);
        super::super::tests::as_schema_3(&path, "");
        let mut l = Ledger::open(&path).unwrap();
        assert_eq!(shared(&l).1, grouped);
        assert_eq!(l.stats_with_health(None, far, None).unwrap(), before);
        assert!(l.verify_chain().unwrap().intact());
        // A third op id for the shared intent, and a new intent shared by two more.
        ran(&mut l, "dup-c", "fp-3", Family::Destructive, &[]);
        ran(&mut l, "pair-a", "fp-7", Family::Convergent, &[]);
        // pair-a alone shares nothing yet.
        let (grouped, kept) = shared(&l);
        assert_eq!(grouped.len(), 1, "{grouped:?}");
        assert_eq!(kept, grouped);
        ran(&mut l, "pair-b", "fp-7", Family::Convergent, &[]);
        let (grouped, kept) = shared(&l);
        assert_eq!(grouped.len(), 2, "{grouped:?}");
        assert_eq!(kept, grouped);
        let h = l.stats_with_health(None, far, None).unwrap().health;
        assert_eq!(h.suspected_duplicates.total, 2, "{h:?}");
        assert_eq!(h.duplicates[0].op_ids, ["dup-a", "dup-b", "dup-c"]);
        assert_eq!(h.duplicates[1].op_ids, ["pair-a", "pair-b"]);
        // The whole ledger's count reads the table, not the operations: without its
        // row, the intent is no candidate.
        l.conn()
            .execute("DELETE FROM shared_intents WHERE fingerprint = 'fp-7'", [])
            .unwrap();
        let h = l.stats_with_health(None, far, None).unwrap().health;
        assert_eq!(h.suspected_duplicates.total, 1, "{h:?}");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// One operation of intent `fp` sent and never heard of again (no `started`).
    fn lost(l: &mut Ledger, op: &str, fp: &str, family: Family) {
        l.append_many(
            &OpKey::new(op, "h1"),
            &[
                intended(fp, family),
                attempt(&format!("{op}-a1"), 1),
                boundary(&format!("{op}-a1"), Boundary::SentNoResponse),
            ],
            Durability::Normal,
        )
        .unwrap();
    }

    fn kept_counts(l: &Ledger, fp: &str) -> (i64, Option<String>) {
        l.conn()
            .query_row(
                "SELECT executed, family FROM shared_intents WHERE fingerprint = ?1",
                [fp],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
    }

    #[test]
    fn an_intent_counts_as_a_duplicate_once_a_second_op_id_has_started_it() {
        let path = scratch("started");
        let mut l = Ledger::open(&path).unwrap();
        let far = "9999-01-01T00:00:00.000000Z";
        let dups = |l: &Ledger| l.stats_with_health(None, far, None).unwrap().health;
        // Sent twice, run once: the first never reached `started`.
        lost(&mut l, "deploy-1", "fp-deploy", Family::Destructive);
        ran(&mut l, "deploy-2", "fp-deploy", Family::Destructive, &[]);
        assert_eq!(
            kept_counts(&l, "fp-deploy"),
            (1, Some("destructive".into()))
        );
        assert_eq!(dups(&l).suspected_duplicates.total, 0);
        // The first is retried and starts: now it ran under two op ids.
        l.append_many(
            &OpKey::new("deploy-1", "h1"),
            &[
                attempt("deploy-1-a2", 2),
                boundary("deploy-1-a2", Boundary::Started),
            ],
            Durability::Normal,
        )
        .unwrap();
        assert_eq!(
            kept_counts(&l, "fp-deploy"),
            (2, Some("destructive".into()))
        );
        let h = dups(&l);
        assert_eq!(h.suspected_duplicates.total, 1, "{h:?}");
        assert_eq!(h.duplicates[0].op_ids, ["deploy-1", "deploy-2"]);
        assert_eq!(h.duplicates[0].executions, 2);
        // A read that ran twice becomes a duplicate effect once one of its op ids is
        // intended again as destructive (a policy change): the strictest family counts.
        ran(&mut l, "look-1", "fp-look", Family::ReadOnly, &[]);
        ran(&mut l, "look-2", "fp-look", Family::ReadOnly, &[]);
        assert_eq!(dups(&l).suspected_duplicates.total, 1);
        l.append_many(
            &OpKey::new("look-2", "h1"),
            &[intended("fp-look", Family::Destructive)],
            Durability::Normal,
        )
        .unwrap();
        assert_eq!(kept_counts(&l, "fp-look"), (2, Some("destructive".into())));
        assert_eq!(dups(&l).suspected_duplicates.total, 2);
        // Every row equals its recount, and the window (which reads the operations) agrees.
        assert!(l.verify_chain().unwrap().intact());
        let window = l
            .stats_with_health(Some("0000-01-01T00:00:00.000000Z"), far, None)
            .unwrap()
            .health;
        assert_eq!(window.duplicates, dups(&l).duplicates);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn stats_names_at_most_the_duplicates_asked_for_and_five_op_ids_of_each() {
        let path = scratch("named");
        let mut l = Ledger::open(&path).unwrap();
        for n in 0..7 {
            ran(
                &mut l,
                &format!("loop-{n}"),
                "fp-loop",
                Family::AppendOnly,
                &[],
            );
        }
        for d in 0..4 {
            for n in 0..2 {
                let fp = format!("fp-pair-{d}");
                ran(
                    &mut l,
                    &format!("pair-{d}-{n}"),
                    &fp,
                    Family::Convergent,
                    &[],
                );
            }
        }
        let far = "9999-01-01T00:00:00.000000Z";
        for window in [None, Some("0000-01-01T00:00:00.000000Z")] {
            let h = l.stats_with_health(window, far, Some(3)).unwrap().health;
            assert_eq!(h.suspected_duplicates.total, 5, "{window:?}: {h:?}");
            assert_eq!(h.duplicates.len(), 3, "{window:?}: {h:?}");
            let all = l.stats_with_health(window, far, None).unwrap().health;
            assert_eq!(all.duplicates.len(), 5);
            assert_eq!(h.duplicates[..], all.duplicates[..3]);
            let looped = all.duplicates.iter().find(|d| d.family == "append-only");
            let looped = looped.expect("the loop is named");
            assert_eq!(looped.executions, 7);
            assert_eq!(
                looped.op_ids,
                ["loop-0", "loop-1", "loop-2", "loop-3", "loop-4"]
            );
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn the_tallies_are_counters_and_naming_walks_the_index_in_order() {
        let path = scratch("plan");
        let mut l = Ledger::open(&path).unwrap();
        ran(&mut l, "rm-1", "fp-rm", Family::Destructive, &[]);
        ran(&mut l, "rm-2", "fp-rm", Family::Destructive, &[]);
        let plan = |sql: &str| -> String {
            let mut stmt = l
                .conn()
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            let rows = stmt.query_map([], |r| r.get::<_, String>(3)).unwrap();
            rows.collect::<Result<Vec<_>, _>>().unwrap().join("; ")
        };
        // Naming reads the duplicates' index in its order: no sort of every duplicate,
        // so a LIMIT stops after the named, however many there are.
        let named = plan(&named_duplicates(Some(20)));
        assert!(
            named.contains("USING INDEX shared_intents_duplicates")
                && !named.contains("TEMP B-TREE"),
            "{named}"
        );
        // The tallies read the counters, never `shared_intents` or `operations`.
        for sql in [TALLY_BY_FAMILY, TALLY_BY_HOST] {
            let p = plan(sql);
            assert!(
                p.contains("duplicate_tallies")
                    && !p.contains("shared_intents")
                    && !p.contains("operations"),
                "{p}"
            );
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn tallies_follow_intents_in_and_out_of_duplicate_and_verify_names_an_edited_one() {
        let path = scratch("tallies");
        let mut l = Ledger::open(&path).unwrap();
        let far = "9999-01-01T00:00:00.000000Z";
        let tallies = |l: &Ledger| -> Vec<(String, String, i64)> {
            let mut stmt = l
                .conn()
                .prepare("SELECT host, family, intents FROM duplicate_tallies WHERE intents <> 0 ORDER BY 1, 2")
                .unwrap();
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap();
            rows.collect::<Result<_, _>>().unwrap()
        };
        // A lost first attempt is no duplicate; its retry starting makes one.
        lost(&mut l, "deploy-1", "fp-deploy", Family::Destructive);
        ran(&mut l, "deploy-2", "fp-deploy", Family::Destructive, &[]);
        assert_eq!(tallies(&l), []);
        l.append_many(
            &OpKey::new("deploy-1", "h1"),
            &[
                attempt("deploy-1-a2", 2),
                boundary("deploy-1-a2", Boundary::Started),
            ],
            Durability::Normal,
        )
        .unwrap();
        assert_eq!(tallies(&l), [("h1".into(), "destructive".into(), 1)]);
        // Reads repeated are not tallied until a policy change makes them convergent.
        ran(&mut l, "look-1", "fp-look", Family::ReadOnly, &[]);
        ran(&mut l, "look-2", "fp-look", Family::ReadOnly, &[]);
        assert_eq!(tallies(&l).len(), 1);
        l.append_many(
            &OpKey::new("look-2", "h1"),
            &[intended("fp-look", Family::Convergent)],
            Durability::Normal,
        )
        .unwrap();
        assert_eq!(
            tallies(&l),
            [
                ("h1".into(), "convergent".into(), 1),
                ("h1".into(), "destructive".into(), 1)
            ]
        );
        let h = l.stats_with_health(None, far, None).unwrap().health;
        assert_eq!(h.suspected_duplicates.total, 2, "{h:?}");
        assert_eq!(h.suspected_duplicates_by_host.get("h1"), Some(&2));
        assert!(l.verify_chain().unwrap().intact());
        // An edit that hides a duplicate from `stats` is named by `audit verify`.
        l.conn()
            .execute(
                "UPDATE duplicate_tallies SET intents = 0 WHERE family = 'destructive'",
                [],
            )
            .unwrap();
        let h = l.stats_with_health(None, far, None).unwrap().health;
        assert_eq!(h.suspected_duplicates.total, 1, "the edit hides one: {h:?}");
        let named = l
            .verify_chain()
            .unwrap()
            .counters_mismatch
            .unwrap_or_default();
        assert!(
            named.contains("duplicate_tallies: 1 (host, family) tally(ies) differ"),
            "{named}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn audit_verify_names_a_shared_intent_whose_counts_were_edited() {
        let path = scratch("miscount");
        let mut l = Ledger::open(&path).unwrap();
        ran(&mut l, "rm-1", "fp-rm", Family::Destructive, &[]);
        ran(&mut l, "rm-2", "fp-rm", Family::Destructive, &[]);
        assert!(l.verify_chain().unwrap().intact());
        // An edit that would hide the duplicate from `stats`.
        l.conn()
            .execute("UPDATE shared_intents SET executed = 1", [])
            .unwrap();
        let far = "9999-01-01T00:00:00.000000Z";
        let h = l.stats_with_health(None, far, None).unwrap().health;
        assert_eq!(h.suspected_duplicates.total, 0, "the edit hides it");
        let report = l.verify_chain().unwrap();
        let named = report.counters_mismatch.unwrap_or_default();
        assert!(
            named.contains("1 intent(s) whose executions or strictest family differ"),
            "{named}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
