//! `opmark stats`: counts for a dashboard and the health counts (docs/ledger.md#health),
//! as text, one JSON document, or Prometheus's text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::common;
use crate::cli::{GlobalArgs, StatsArgs, StatsFormat};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::family::Family;
use crate::ledger::health::{FamilyCount, SuspectedDuplicate};
use crate::ledger::Stats;

/// Prints the counts ([`crate::ops::stats`]) as text, one JSON document with `--json`
/// or `--format json`, or the Prometheus text format with `--format prometheus`.
pub fn run(global: &GlobalArgs, args: &StatsArgs) -> Result<u8> {
    let format = match (global.json, args.format) {
        (true, Some(asked @ (StatsFormat::Text | StatsFormat::Prometheus))) => {
            let asked = if asked == StatsFormat::Text {
                "text"
            } else {
                "prometheus"
            };
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("--json and --format {asked} ask for two formats; give one of them"),
            ));
        }
        (true, _) => StatsFormat::Json,
        (false, format) => format.unwrap_or_default(),
    };
    let named = match (args.all, args.limit) {
        (true, _) => None,
        (false, n) => Some(n.unwrap_or(crate::ops::stats::NAMED_DUPLICATES)),
    };
    let stats = crate::ops::stats::stats(&common::context(global), args.since, named)?;
    if format == StatsFormat::Json {
        super::common::print_json(&stats)?;
    } else if format == StatsFormat::Prometheus {
        crate::out!("{}", prometheus(&stats, args.since));
    } else {
        if let Some(since) = args.since {
            // Said first, so a window is never read as the whole ledger.
            crate::outln!(
                "{:<22} the last {}: events recorded in it, operations active in it",
                "window",
                crate::duration::format_duration(since)
            );
        }
        crate::out!("{}", text(&stats));
        let unnamed = stats
            .health
            .suspected_duplicates
            .total
            .saturating_sub(stats.health.duplicates.len() as u64);
        if unnamed > 0 {
            crate::outln!(
                "  and {unnamed} more suspected duplicates: opmark stats --all names them"
            );
        }
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

/// `3 (destructive 2, read-only 1)`, or `0`.
fn tally(t: &FamilyCount) -> String {
    if t.total == 0 {
        return "0".to_owned();
    }
    format!("{} ({})", t.total, counts(&t.by_family))
}

fn text(s: &Stats) -> String {
    let h = &s.health;
    let rows: [(&str, String); 14] = [
        ("operations", s.operations.to_string()),
        ("unresolved", s.unresolved.to_string()),
        ("by state", counts(&s.by_state)),
        ("by family", counts(&s.by_family)),
        ("verdicts", counts(&s.verdicts)),
        ("indeterminate given", s.unknown_outcomes.to_string()),
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
    let mut out: String = rows.iter().map(|(k, v)| format!("{k:<22} {v}\n")).collect();
    out.push_str("health:\n");
    let health: [(&str, String); 12] = [
        ("unknown outcomes", tally(&h.unknown_outcomes)),
        (
            "needs human",
            format!(
                "{} (unresolved longer than escalate_after {})",
                tally(&h.needs_human),
                h.escalate_after
            ),
        ),
        ("reconciled by outcome", counts(&h.reconciliations)),
        ("replays", tally(&h.replays)),
        ("retries", tally(&h.retries)),
        ("conflicts", tally(&h.conflicts)),
        ("repetitions held", tally(&h.repetitions_held)),
        ("repetitions declared", tally(&h.repetitions_declared)),
        ("approval interruptions", tally(&h.approval_interruptions)),
        ("contradictions", tally(&h.contradictions)),
        ("suspected duplicates", tally(&h.suspected_duplicates)),
        (
            "duplicates by host",
            counts(&h.suspected_duplicates_by_host),
        ),
    ];
    for (k, v) in health {
        let _ = writeln!(out, "  {k:<22} {v}");
    }
    for d in &h.duplicates {
        let _ = writeln!(
            out,
            "  DUPLICATE on {}: one {} intent executed {} times, as {}",
            super::render::printable(&d.host),
            d.family,
            d.executions,
            named_op_ids(d)
        );
    }
    out
}

/// The op ids the ledger named (the first few), and how many more executed it.
fn named_op_ids(d: &SuspectedDuplicate) -> String {
    let mut named = d
        .op_ids
        .iter()
        .map(|o| super::render::printable(o))
        .collect::<Vec<_>>()
        .join(", ");
    let more = d.executions.saturating_sub(d.op_ids.len() as u64);
    if more > 0 {
        named.push_str(&format!(" and {more} more"));
    }
    named
}

/// A label value as the exposition format quotes it: `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition format (version 0.0.4) for node_exporter's textfile
/// collector: `opmark_` metrics, counters ending in `_total`, gauges for what is true
/// now; every family is written (0 included) so that a series exists before its first
/// event and `increase()` and alerts see it.
fn prometheus(s: &Stats, since: Option<std::time::Duration>) -> String {
    let h = &s.health;
    let mut out = String::new();
    if let Some(since) = since {
        // A window's counts go down as it moves: not what a scrape of counters expects.
        let _ = writeln!(
            out,
            "# opmark stats --since {}: counts over that window only",
            crate::duration::format_duration(since)
        );
    }
    let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP opmark_{name} {help}");
        let _ = writeln!(out, "# TYPE opmark_{name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "opmark_{name}{labels} {value}");
        }
    };
    let by_family = |t: &FamilyCount| -> Vec<(String, u64)> {
        let mut families: BTreeMap<String, u64> = Family::ALL
            .iter()
            .map(|f| (f.as_str().to_owned(), 0))
            .collect();
        families.extend(t.by_family.iter().map(|(k, v)| (k.clone(), *v)));
        families
            .into_iter()
            .map(|(f, n)| (format!("{{family=\"{}\"}}", label(&f)), n))
            .collect()
    };
    let plain = |n: u64| vec![(String::new(), n)];
    metric(
        "operations",
        "gauge",
        "Operations in the ledger (in the window: active in it).",
        plain(s.operations),
    );
    metric(
        "unresolved_operations",
        "gauge",
        "Operations whose outcome is not settled.",
        plain(s.unresolved),
    );
    metric(
        "unknown_outcomes",
        "gauge",
        "Operations dispatched and not settled: they may have run, nobody knows yet.",
        by_family(&h.unknown_outcomes),
    );
    metric(
        "needs_human",
        "gauge",
        "Operations unresolved longer than the policy's escalate_after.",
        by_family(&h.needs_human),
    );
    metric(
        "escalate_after_seconds",
        "gauge",
        "The policy's escalate_after that needs_human was counted with.",
        plain(crate::duration::parse_duration(&h.escalate_after).map_or(0, |d| d.as_secs())),
    );
    metric(
        "suspected_duplicate_effects",
        "gauge",
        "Intents executed under two or more op ids on one host (declared or not).",
        by_family(&h.suspected_duplicates),
    );
    metric(
        "suspected_duplicate_effects_by_host",
        "gauge",
        "Intents executed under two or more op ids, by host.",
        h.suspected_duplicates_by_host
            .iter()
            .map(|(host, n)| (format!("{{host=\"{}\"}}", label(host)), *n))
            .collect(),
    );
    metric(
        "reconciliations_total",
        "counter",
        "Reconcile decisions recorded, by outcome.",
        h.reconciliations
            .iter()
            .map(|(o, n)| (format!("{{outcome=\"{}\"}}", label(o)), *n))
            .collect(),
    );
    for (name, help, t) in [
        (
            "replays_total",
            "Reruns answered from evidence (replayed verdicts); not retries.",
            &h.replays,
        ),
        (
            "retries_total",
            "Attempts after the first of their operation.",
            &h.retries,
        ),
        (
            "conflicts_total",
            "Conflict verdicts recorded.",
            &h.conflicts,
        ),
        (
            "repetitions_held_total",
            "Runs held back as a repetition of another op id's intent.",
            &h.repetitions_held,
        ),
        (
            "repetitions_declared_total",
            "Repetitions declared with --repeats.",
            &h.repetitions_declared,
        ),
        (
            "approval_interruptions_total",
            "Runs blocked for a human's approval.",
            &h.approval_interruptions,
        ),
        (
            "contradictions_total",
            "Contradictions between evidence recorded.",
            &h.contradictions,
        ),
    ] {
        metric(name, "counter", help, by_family(t));
    }
    metric(
        "attempts_total",
        "counter",
        "Attempts dispatched.",
        plain(s.attempts),
    );
    metric(
        "events_total",
        "counter",
        "Events recorded in the ledger.",
        plain(s.events),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_as_the_exposition_format_says() {
        assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label("x\ny"), "x\\ny");
    }

    #[test]
    fn every_family_is_written_and_counters_end_in_total() {
        let mut s = Stats::default();
        s.health.replays.total = 2;
        s.health.replays.by_family.insert("read-only".into(), 2);
        s.health.escalate_after = "1h".into();
        let text = prometheus(&s, None);
        assert!(
            text.contains("opmark_replays_total{family=\"read-only\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("opmark_replays_total{family=\"destructive\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("opmark_escalate_after_seconds 3600\n"),
            "{text}"
        );
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let words: Vec<&str> = line.split(' ').collect();
            assert_eq!(
                words[3] == "counter",
                words[2].ends_with("_total"),
                "{line}"
            );
        }
    }
}
