//! `opmark stats`: counts for a dashboard.

use std::collections::BTreeMap;

use super::common::redacted_error;
use crate::cli::{GlobalArgs, StatsArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{Ledger, Stats};

/// Prints the counts as text, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &StatsArgs) -> Result<u8> {
    let cutoff = args
        .since
        .map(|since| {
            crate::ledger::stamp_before(since).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    "--since reaches back before any possible date; use a shorter duration such as 30d",
                )
            })
        })
        .transpose()?;
    let (ledger, _path) =
        Ledger::open_existing_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let stats = match &ledger {
        Some(l) => match &cutoff {
            None => l.stats(),
            Some(cutoff) => l.stats_since(cutoff),
        }
        .map_err(|e| redacted_error(e.into()))?,
        None => Stats::default(),
    };
    if global.json {
        super::common::print_json(&stats)?;
    } else {
        if let Some(cutoff) = &cutoff {
            // Said first, so a window is never read as the whole ledger.
            crate::outln!(
                "{:<19} events since {cutoff}, operations active since",
                "window"
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
