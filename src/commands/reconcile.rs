//! `opmark reconcile [OP...] [--host H]`: probe the hosts of unresolved operations and
//! record what the evidence settles (the decisions live in `operation::reconcile`).
//! Contradicted operations (SPEC section 3) in scope are reported too, and keep the exit
//! status at 1: evidence that disagrees is never settled away.

use std::io::{IsTerminal, Write};

use serde::Serialize;

use super::common;
use super::reach::reach;
use super::render::{fit, printable};
use crate::cli::{GlobalArgs, HostArgs, ReconcileArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{ListFilter, OpKey, OperationRecord};
use crate::op_id::OpId;
use crate::operation::identity;
use crate::operation::reconcile::{self, Candidate, Outcome};

#[derive(Serialize)]
struct Report<'a> {
    operations: &'a [Outcome],
    /// Named operations that were already settled (not contacted).
    already_settled: &'a [Outcome],
    /// Operations still unresolved after this reconcile.
    unresolved: usize,
    /// Operations in scope whose evidence contradicts itself (a person must look).
    contradicted: &'a [Contradicted],
}

#[derive(Serialize)]
struct Contradicted {
    op_id: String,
    host: String,
    contradictions: u32,
    /// The exit code the ledger keeps (the first settled one).
    exit_code: Option<i32>,
}

/// Reconciles and prints a table (or one JSON document); exit 1 when anything stays
/// unresolved.
pub fn run(global: &GlobalArgs, args: &ReconcileArgs) -> Result<u8> {
    let ops = args
        .ops
        .iter()
        .map(|o| OpId::parse(o).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    let policy = common::load_policy(global)?;
    let mut ledger = common::open_ledger(global, &policy)?;

    let mut records = Vec::new();
    let mut already = Vec::new();
    if ops.is_empty() {
        records = ledger.list(&ListFilter {
            unresolved: true,
            host: args.host.clone(),
            limit: None,
            ..Default::default()
        })?;
    } else {
        for op in &ops {
            let found: Vec<_> = ledger
                .operations_by_id(op.as_str())?
                .into_iter()
                .filter(|r| args.host.as_ref().is_none_or(|h| *h == r.host))
                .collect();
            if found.is_empty() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "no operation `{op}`{} in the ledger {}; `opmark list` shows what is recorded. Nothing was reconciled",
                        args.host
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
    let mut candidates = Vec::with_capacity(records.len());
    for record in records {
        let events = ledger.events(&OpKey::new(record.op_id.clone(), record.host.clone()))?;
        candidates.push(Candidate { record, events });
    }
    let outcomes = if candidates.is_empty() {
        Vec::new()
    } else {
        // Drawn only for a person watching: a pipe or a JSON reader gets the answer only.
        let show_progress = !global.json && std::io::stderr().is_terminal();
        let outcomes = common::block_on(reconcile::reconcile(
            &mut ledger,
            candidates,
            |c, route| reach(global, &c.record.host, &HostArgs::default(), route),
            |done, total| {
                if show_progress {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[Kopmark: reconciled {done}/{total} operations")
                        .and_then(|()| err.flush());
                }
            },
        ))??;
        if show_progress {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
        outcomes
    };
    let contradicted: Vec<Contradicted> = ledger
        .list(&ListFilter {
            // Through the partial index of contradicted rows: O(contradicted), not history.
            contradicted: true,
            host: args.host.clone(),
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
    for o in &outcomes {
        let key = OpKey::new(o.op_id.clone(), o.host.clone());
        if ledger.operation(&key)?.is_some_and(|r| r.unresolved) {
            unresolved += 1;
        }
    }
    if global.json {
        common::print_json(&Report {
            operations: &outcomes,
            already_settled: &already,
            unresolved,
            contradicted: &contradicted,
        })?;
    } else {
        print!("{}", table(&outcomes, &already, unresolved));
        for c in &contradicted {
            println!(
                "C {} on {}: CONTRADICTED ({} contradiction{} between evidence; the ledger keeps exit {}); see `opmark show {}`",
                printable(&c.op_id),
                printable(&c.host),
                c.contradictions,
                if c.contradictions == 1 { "" } else { "s" },
                c.exit_code.map_or("unknown".to_owned(), |e| e.to_string()),
                printable(&c.op_id)
            );
        }
    }
    Ok(if unresolved == 0 && contradicted.is_empty() {
        exit_code::OK
    } else {
        exit_code::FINDINGS
    })
}

fn table(outcomes: &[Outcome], already: &[Outcome], unresolved: usize) -> String {
    let all: Vec<&Outcome> = outcomes.iter().chain(already).collect();
    if all.is_empty() {
        return "no unresolved operations; nothing to reconcile\n".to_owned();
    }
    let col = |f: &dyn Fn(&Outcome) -> usize, min: usize, max: usize| {
        all.iter().map(|o| f(o)).max().unwrap_or(0).clamp(min, max)
    };
    let op_w = col(&|o| o.op_id.chars().count(), 2, 20);
    let host_w = col(&|o| o.host.chars().count(), 4, 12);
    let before_w = col(&|o| o.before.to_string().chars().count(), 6, 14);
    let ev_w = col(&|o| o.evidence.chars().count(), 8, 22);
    let mut out = format!(
        "  {:op_w$} {:host_w$} {:before_w$} {:ev_w$} DECISION\n",
        "OP", "HOST", "BEFORE", "EVIDENCE"
    );
    for o in &all {
        out.push_str(&format!(
            "{} {:op_w$} {:host_w$} {:before_w$} {:ev_w$} {}\n",
            if o.settled { " " } else { "!" },
            fit(&printable(&o.op_id), op_w),
            fit(&printable(&o.host), host_w),
            fit(&printable(&o.before.to_string()), before_w),
            fit(&printable(&o.evidence), ev_w),
            printable(o.decision.as_str()),
        ));
    }
    let open: Vec<&&Outcome> = all.iter().filter(|o| !o.settled).collect();
    for o in &open {
        // The store of evidence its attempts reached (in full in --json's root_id).
        let root = o.root_id.as_deref().map_or_else(String::new, |r| {
            format!(" [marker root {}]", printable(identity::short_root(r)))
        });
        out.push_str(&format!(
            "! {} on {}{root}: {}\n",
            printable(&o.op_id),
            printable(&o.host),
            printable(&o.detail)
        ));
    }
    out.push_str(&format!(
        "{} reconciled, {unresolved} still unresolved (marked !)\n",
        outcomes.len()
    ));
    out
}
