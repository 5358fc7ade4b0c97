//! `opmark stats`: counts for a dashboard.

use std::collections::BTreeMap;

use super::common;
use crate::cli::{GlobalArgs, StatsArgs};
use crate::error::{exit_code, Result};
use crate::ledger::Stats;

/// Prints the counts ([`crate::ops::stats`]) as text, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &StatsArgs) -> Result<u8> {
    let stats = crate::ops::stats::stats(&common::context(global), args.since)?;
    if global.json {
        super::common::print_json(&stats)?;
    } else {
        if let Some(since) = args.since {
            // Said first, so a window is never read as the whole ledger.
            crate::outln!(
                "{:<19} the last {}: events recorded in it, operations active in it",
                "window",
                humantime(since)
            );
        }
        crate::out!("{}", text(&stats));
    }
    Ok(exit_code::OK)
}

fn counts(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "-".to_owned();
    }
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn text(s: &Stats) -> String {
    let rows: [(&str, String); 14] = [
        ("operations", s.operations.to_string()),
        ("unresolved", s.unresolved.to_string()),
        ("by state", counts(&s.by_state)),
        ("by family", counts(&s.by_family)),
        ("verdicts", counts(&s.verdicts)),
        ("unknown outcomes", s.unknown_outcomes.to_string()),
        ("reconciliations", s.reconciliations.to_string()),
        // Only conflicts found on the host are recorded (see `Stats::conflicts_on_host`).
        ("conflicts on host", s.conflicts_on_host.to_string()),
        ("approvals asked", s.approvals_asked.to_string()),
        ("operator decisions", s.operator_decisions.to_string()),
        (
            "contradictions",
            format!(
                "{} (in {} operations)",
                s.contradictions, s.contradicted_operations
            ),
        ),
        ("attempts", s.attempts.to_string()),
        ("retries by family", counts(&s.retries_by_family)),
        ("events", s.events.to_string()),
    ];
    rows.iter().map(|(k, v)| format!("{k:<19} {v}\n")).collect()
}

/// `3600s` as people wrote it: the largest whole unit.
fn humantime(d: std::time::Duration) -> String {
    let s = d.as_secs();
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if s >= len && s.is_multiple_of(len) {
            return format!("{}{unit}", s / len);
        }
    }
    format!("{s}s")
}
