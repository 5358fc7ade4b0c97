//! Reconcile: probe the hosts of unresolved operations and record what the evidence
//! settles (the decisions live in `operation::reconcile`). Contradicted operations (see
//! docs/ledger.md#contradictions) in scope are reported too: evidence that disagrees is never settled away.

use serde::Serialize;

use super::reach::reach;
use super::{block_on, load_policy, open_existing_ledger, Context, HostOptions};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{ListFilter, OpKey, OperationRecord};
use crate::op_id::OpId;
use crate::operation::reconcile::{self, Candidate, Outcome};
use crate::text::printable;

/// Which operations.
#[derive(Debug, Clone, Default)]
pub struct ReconcileRequest {
    /// Only these op ids, unchecked (default: every unresolved one).
    pub ops: Vec<String>,
    /// Only operations on this host.
    pub host: Option<String>,
    /// At most this many operations contacted (at least 1), the most recently active
    /// first as `list` orders them; the rest wait for the next reconcile. None: all.
    pub limit: Option<usize>,
}

/// What reconcile found and decided.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileReport {
    /// The operations contacted, with the evidence and the decision.
    pub operations: Vec<Outcome>,
    /// Named operations that were already settled (not contacted).
    pub already_settled: Vec<Outcome>,
    /// Operations still unresolved after this reconcile (JSON `unresolved_count`:
    /// `unresolved` is an operation's flag in `list`).
    #[serde(rename = "unresolved_count")]
    pub unresolved: usize,
    /// Unresolved operations in scope that `--limit` left for a later reconcile (not
    /// contacted, not counted in `unresolved_count`); 0 without a limit.
    #[serde(rename = "not_contacted_count")]
    pub not_contacted: usize,
    /// Operations in scope whose evidence contradicts itself (a person must look).
    pub contradicted: Vec<Contradicted>,
    /// Operations this reconcile left unresolved that have been unresolved longer than
    /// the policy's `escalate_after` (docs/ledger.md#health): evidence will not settle
    /// them by waiting; a person decides (`opmark resolve`).
    #[serde(rename = "needs_human_operations")]
    pub needs_human: Vec<NeedsHuman>,
}

/// An operation left unresolved for longer than `escalate_after`.
#[derive(Debug, Clone, Serialize)]
pub struct NeedsHuman {
    pub op_id: String,
    pub host: String,
    /// When it was intended (UTC).
    pub since: String,
    /// Its state now.
    pub state: String,
}

impl ReconcileReport {
    /// 0 when everything in scope is settled and uncontradicted, else 1 (operations a
    /// limit left uncontacted are not settled).
    pub fn exit_status(&self) -> u8 {
        if self.unresolved == 0 && self.not_contacted == 0 && self.contradicted.is_empty() {
            exit_code::OK
        } else {
            exit_code::FINDINGS
        }
    }
}

/// An operation whose evidence disagrees with what the ledger settled.
#[derive(Debug, Clone, Serialize)]
pub struct Contradicted {
    pub op_id: String,
    pub host: String,
    pub contradictions: u32,
    /// The exit code the ledger keeps (the first settled one).
    pub exit_code: Option<i32>,
}

/// Reconciles; `progress(done, total)` is told after each operation.
pub fn reconcile(
    ctx: &Context,
    req: &ReconcileRequest,
    mut progress: impl FnMut(usize, usize),
) -> Result<ReconcileReport> {
    let ops = req
        .ops
        .iter()
        .map(|o| OpId::parse(o).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    if req.limit == Some(0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--limit 0 would reconcile nothing; give at least 1, or leave it out for every unresolved operation",
        ));
    }
    let policy = load_policy(ctx)?;
    let escalation = super::stats::Escalation::from_policy(ctx)?;
    let mut ledger = open_existing_ledger(ctx, &policy)?;

    let mut records = Vec::new();
    let mut already = Vec::new();
    if ops.is_empty() {
        records = ledger.list(&ListFilter {
            unresolved: true,
            host: req.host.clone(),
            limit: None,
            ..Default::default()
        })?;
    } else {
        for op in &ops {
            let found: Vec<_> = ledger
                .operations_by_id(op.as_str())?
                .into_iter()
                .filter(|r| req.host.as_ref().is_none_or(|h| *h == r.host))
                .collect();
            if found.is_empty() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "no operation `{op}`{} in the ledger {}; `opmark list` shows what is recorded. Nothing was reconciled",
                        req.host
                            .as_deref()
                            .map(|h| format!(" on host `{}`", printable(h)))
                            .unwrap_or_default(),
                        ledger.path().display()
                    ),
                ));
            }
            for r in found {
                if r.unresolved {
                    records.push(r);
                } else {
                    already.push(Outcome {
                        op_id: r.op_id.clone(),
                        host: r.host.clone(),
                        before: r.state.clone(),
                        evidence: "not contacted".into(),
                        decision: "already_settled".into(),
                        settled: true,
                        exit_code: r.exit_code,
                        root_id: None,
                        detail: "the operation is already settled; nothing to do".into(),
                    });
                }
            }
        }
    }
    // The newest first (the order `list` shows), so a limited reconcile takes what an
    // operator just saw; the rest are counted, not contacted.
    let not_contacted = match req.limit {
        Some(limit) if records.len() > limit => {
            let left = records.len() - limit;
            records.truncate(limit);
            left
        }
        _ => 0,
    };
    let mut candidates = Vec::with_capacity(records.len());
    for record in records {
        let events = ledger.events(&OpKey::new(record.op_id.clone(), record.host.clone()))?;
        candidates.push(Candidate { record, events });
    }
    let outcomes = if candidates.is_empty() {
        Vec::new()
    } else {
        block_on(reconcile::reconcile(
            &mut ledger,
            candidates,
            |c, route| reach(ctx, &c.record.host, &HostOptions::default(), route),
            &mut progress,
        ))??
    };
    let contradicted: Vec<Contradicted> = ledger
        .list(&ListFilter {
            // Through the partial index of contradicted rows: O(contradicted), not history.
            contradicted: true,
            host: req.host.clone(),
            limit: None,
            ..Default::default()
        })?
        .into_iter()
        .filter(|r| r.contradictions > 0)
        .filter(|r| ops.is_empty() || ops.iter().any(|o| o.as_str() == r.op_id))
        .map(|r: OperationRecord| Contradicted {
            op_id: r.op_id,
            host: r.host,
            contradictions: r.contradictions,
            exit_code: r.exit_code,
        })
        .collect();
    let mut unresolved = 0;
    let mut needs_human = Vec::new();
    for o in &outcomes {
        let key = OpKey::new(o.op_id.clone(), o.host.clone());
        let Some(r) = ledger.operation(&key)?.filter(|r| r.unresolved) else {
            continue;
        };
        unresolved += 1;
        if escalation.needs_human(&r) {
            needs_human.push(NeedsHuman {
                op_id: r.op_id,
                host: r.host,
                since: r.created_at,
                state: r.state.to_string(),
            });
        }
    }
    Ok(ReconcileReport {
        operations: outcomes,
        already_settled: already,
        unresolved,
        not_contacted,
        contradicted,
        needs_human,
    })
}
