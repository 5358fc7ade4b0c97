//! `opmark stats`: counts for a dashboard.

use std::collections::BTreeMap;

use super::common;
use crate::cli::GlobalArgs;
use crate::error::{exit_code, Result};
use crate::ledger::Stats;

/// Prints the counts ([`crate::ops::stats`]) as text, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs) -> Result<u8> {
    let stats = crate::ops::stats::stats(&common::context(global))?;
    if global.json {
        super::common::print_json(&stats)?;
    } else {
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
