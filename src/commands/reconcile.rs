//! `opmark reconcile [OP...] [--host H]`: probe the hosts of unresolved operations and
//! record what the evidence settles (the decisions live in `operation::reconcile`).
//! Contradicted operations (docs/ledger.md#contradictions) in scope are reported too, and keep the exit
//! status at 1: evidence that disagrees is never settled away. The work is
//! [`crate::ops::reconcile`]'s; this file draws its progress and its table.

use std::io::{IsTerminal, Write};

use super::common;
use super::render::{fit, printable};
use crate::cli::{GlobalArgs, ReconcileArgs};
use crate::error::Result;
use crate::operation::identity;
use crate::operation::reconcile::Outcome;
use crate::ops::reconcile::{reconcile, ReconcileRequest};

/// Reconciles and prints a table (or one JSON document); exit 1 when anything stays
/// unresolved.
pub fn run(global: &GlobalArgs, args: &ReconcileArgs) -> Result<u8> {
    // Drawn only for a person watching: a pipe or a JSON reader gets the answer only.
    let show_progress = !global.json && std::io::stderr().is_terminal();
    let mut drawn = false;
    let report = reconcile(
        &common::context(global),
        &ReconcileRequest {
            ops: args.ops.clone(),
            host: args.host.clone(),
        },
        |done, total| {
            if show_progress {
                drawn = true;
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[Kopmark: reconciled {done}/{total} operations")
                    .and_then(|()| err.flush());
            }
        },
    )?;
    if drawn {
        let _ = write!(std::io::stderr(), "\r\x1b[K");
    }
    if global.json {
        common::print_json(&report)?;
    } else {
        crate::out!(
            "{}",
            table(
                &report.operations,
                &report.already_settled,
                report.unresolved
            )
        );
        for c in &report.contradicted {
            crate::outln!(
                "C {} on {}: CONTRADICTED ({} contradiction{} between evidence; the ledger keeps exit {}); see `opmark show {}`",
                printable(&c.op_id),
                printable(&c.host),
                c.contradictions,
                if c.contradictions == 1 { "" } else { "s" },
                c.exit_code.map_or("unknown".to_owned(), |e| e.to_string()),
                printable(&c.op_id)
            );
        }
        for h in &report.needs_human {
            crate::outln!(
                "H {} on {}: NEEDS A HUMAN (unresolved since {}, longer than escalate_after; state {}); decide with `opmark resolve {} --host {} --as applied|not-applied|abandoned --note WHY`",
                printable(&h.op_id),
                printable(&h.host),
                super::render::to_second(&h.since),
                printable(&h.state),
                printable(&h.op_id),
                printable(&h.host),
            );
        }
    }
    Ok(report.exit_status())
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
