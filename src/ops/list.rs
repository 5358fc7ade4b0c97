//! List: the ledger's operations, most recently active first, filtered.

use std::time::Duration;

use serde::Serialize;

use super::{redacted_error, Context};
use crate::error::{Error, ErrorKind, Result};
use crate::ledger::{History, Ledger, ListFilter, OperationRecord};
pub use crate::ops::show::OperationView;

/// Which operations.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Only those whose outcome is not settled.
    pub unresolved: bool,
    /// Only those on this host.
    pub host: Option<String>,
    /// Only those active within this long.
    pub since: Option<Duration>,
    /// At most this many (at least 1); without it, [`DEFAULT_LIMIT`].
    pub limit: Option<usize>,
    /// Every matching operation (no limit).
    pub all: bool,
}

/// How many operations a list holds unless given a limit or `all`: the newest page, as
/// `git log` pages, so the answer costs the page and not the history.
pub const DEFAULT_LIMIT: usize = 50;

/// One operation as listed: its record, and whether it needs a human.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// The projection's row.
    #[serde(flatten)]
    pub record: OperationRecord,
    /// Observations recorded (`observed` events): JSON `observation_count`, beside the
    /// record's `attempt_count` (docs/ledger.md#observations).
    #[serde(rename = "observation_count")]
    pub observations: u32,
    /// Unresolved for longer than the policy's `escalate_after` (docs/ledger.md#health).
    pub needs_human: bool,
}

impl std::ops::Deref for Listed {
    type Target = OperationRecord;

    fn deref(&self) -> &OperationRecord {
        &self.record
    }
}

/// The operations found.
#[derive(Debug, Clone, Serialize)]
pub struct ListReport {
    /// Most recently active first.
    pub operations: Vec<Listed>,
    /// The policy's `escalate_after` that `needs_human` was decided with.
    #[serde(skip)]
    pub escalate_after: Duration,
    /// Matching operations the page left out: `Some(Some(n))` n of them (the counters
    /// know), `Some(None)` at least one.
    #[serde(skip)]
    pub more: Option<Option<u64>>,
    /// JSON `truncated`: the page left matching operations out (`--all`, or a larger
    /// `--limit`, shows them).
    pub truncated: bool,
    /// JSON `more_count`: how many it left out; `null` when none were, or when the
    /// ledger's counters cannot say without reading the history (then `truncated` says
    /// at least one).
    pub more_count: Option<u64>,
}

/// Reads the operations from the ledger (none when there is no ledger yet).
pub fn list(ctx: &Context, req: &ListRequest) -> Result<ListReport> {
    if req.limit == Some(0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--limit 0 would list nothing; give at least 1, or --all for every operation",
        ));
    }
    let cutoff = super::since_cutoff(req.since)?;
    let escalation = super::stats::Escalation::from_policy(ctx)?;
    let (ledger, path) =
        Ledger::open_existing_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let limit = match (req.all, req.limit) {
        (true, _) => None,
        (false, Some(n)) => Some(n),
        (false, None) => Some(DEFAULT_LIMIT),
    };
    let Some(ledger) = ledger else {
        return Err(redacted_error(super::no_ledger_at(ctx, &path)));
    };
    let (operations, more) =
        page(&ledger, req, cutoff.as_deref(), limit).map_err(|e| redacted_error(e.into()))?;
    // The page's rows only: what it shows costs the page, not the history.
    let operations = operations
        .into_iter()
        .map(|record| {
            let events = ledger.events(&crate::ledger::OpKey::new(
                record.op_id.clone(),
                record.host.clone(),
            ))?;
            Ok(Listed {
                needs_human: escalation.needs_human(&record),
                observations: History::of(&events).observations,
                record,
            })
        })
        .collect::<std::result::Result<Vec<_>, crate::ledger::LedgerError>>()
        .map_err(|e| redacted_error(e.into()))?;
    Ok(ListReport {
        operations,
        escalate_after: escalation.after,
        truncated: more.is_some(),
        more_count: more.flatten(),
        more,
    })
}

/// The newest `limit` matching operations (one more is read to know whether the page
/// left any out), and what it left out.
#[allow(clippy::type_complexity)]
fn page(
    ledger: &Ledger,
    req: &ListRequest,
    cutoff: Option<&str>,
    limit: Option<usize>,
) -> std::result::Result<(Vec<OperationRecord>, Option<Option<u64>>), crate::ledger::LedgerError> {
    let mut filter = ListFilter {
        unresolved: req.unresolved,
        host: req.host.clone(),
        limit: limit.map(|l| l + 1),
        ..Default::default()
    };
    if let Some(cutoff) = cutoff {
        // The window by sequence number (an index range, O(window)), and the rows' own
        // times within it.
        filter.since_seq = Some(ledger.seq_since(cutoff)?);
        filter.since_at = Some(cutoff.to_owned());
    }
    let mut ops = ledger.list(&filter)?;
    let Some(limit) = limit.filter(|l| ops.len() > *l) else {
        return Ok((ops, None));
    };
    ops.truncate(limit);
    let more = match ledger.count_hint(&filter)? {
        Some(total) if total > limit as u64 => Some(total - limit as u64),
        _ => None,
    };
    Ok((ops, Some(more)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Durability, Event, OpKey};

    #[test]
    fn list_pages_the_newest_and_says_how_many_more() {
        let dir = std::env::temp_dir().join(format!(
            "opmark-list-page-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut ledger = Ledger::open(&dir.join("ledger.db")).unwrap();
        for n in 0..(DEFAULT_LIMIT + 7) {
            let intent = Event::Intended {
                session: "s".into(),
                family: crate::family::Family::ReadOnly,
                display: "true".into(),
                fingerprint: format!("fp{n}"),
                rule: "r".into(),
                secrets: Vec::new(),
                become_user: None,
                locks: Vec::new(),
            };
            ledger
                .append(
                    &OpKey::new(format!("op-{n}"), "h"),
                    &intent,
                    Durability::Normal,
                )
                .unwrap();
        }
        let req = ListRequest::default();
        let (ops, more) = page(&ledger, &req, None, Some(DEFAULT_LIMIT)).unwrap();
        assert_eq!(ops.len(), DEFAULT_LIMIT);
        assert_eq!(
            ops[0].op_id,
            format!("op-{}", DEFAULT_LIMIT + 6),
            "newest first"
        );
        assert_eq!(more, Some(Some(7)));
        let (ops, more) = page(&ledger, &req, None, None).unwrap();
        assert_eq!(ops.len(), DEFAULT_LIMIT + 7);
        assert_eq!(more, None);
        let host = ListRequest {
            host: Some("h".into()),
            ..ListRequest::default()
        };
        let (ops, more) = page(&ledger, &host, None, Some(5)).unwrap();
        assert_eq!(ops.len(), 5);
        assert_eq!(more, Some(None));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
