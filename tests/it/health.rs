//! Health (docs/ledger.md#health) against a real sshd: a scripted mix of outcomes, then
//! each count of `opmark stats` (text, JSON, Prometheus parsed by `prometheus_client`),
//! `--since` leaving the older ones out, and `needs_human` in list, stats and reconcile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{self, json, run_json as run, text, Answer, Sealed};

/// The shipped policy with another `escalate_after`, written beside the environment.
fn policy_escalating_after(env: &Sealed, after: &str) -> PathBuf {
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("command-classes.toml"))
            .unwrap();
    assert!(
        shipped.contains("\nescalate_after = \"1h\"\n"),
        "shipped 1h"
    );
    let path = env.root.join(format!("policy-{after}.toml"));
    std::fs::write(
        &path,
        shipped.replacen(
            "\nescalate_after = \"1h\"\n",
            &format!("\nescalate_after = \"{after}\"\n"),
            1,
        ),
    )
    .unwrap();
    path
}

/// `opmark --json stats EXTRA...` with `policy`.
fn stats_json(env: &Sealed, policy: &Path, extra: &[&str]) -> Value {
    let out = env
        .opmark()
        .arg("--policy")
        .arg(policy)
        .args(["--json", "stats"])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    json(&out)
}

/// A tally as JSON: `{"total": n, "by_family": {family: n}}`.
fn tally(by_family: &[(&str, u64)]) -> Value {
    let mut map = BTreeMap::new();
    for (f, n) in by_family {
        *map.entry(f.to_string()).or_insert(0u64) += n;
    }
    serde_json::json!({
        "total": by_family.iter().map(|(_, n)| n).sum::<u64>(),
        "by_family": map,
    })
}

/// The Prometheus text format read by the reference parser (`prometheus_client`):
/// sample name with its sorted labels (`name{k=v,...}`) to value, plus the metric
/// families' declared types; None (after SKIP) when the module is missing locally.
fn parse_prometheus(
    test: &str,
    exposition: &str,
) -> Option<(BTreeMap<String, f64>, BTreeMap<String, String>)> {
    const PY: &str = r#"
import json, sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    sys.exit(77)
samples, types = {}, {}
for family in text_string_to_metric_families(sys.stdin.read()):
    types[family.name] = family.type
    for s in family.samples:
        labels = ",".join("%s=%s" % kv for kv in sorted(s.labels.items()))
        samples["%s{%s}" % (s.name, labels)] = s.value
print(json.dumps({"samples": samples, "types": types}))
"#;
    let mut child = Command::new("python3")
        .args(["-c", PY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.code() == Some(77) {
        support::skip_or_fail(test, "python3 module prometheus_client");
        return None;
    }
    assert!(
        out.status.success(),
        "prometheus_client refused the exposition:\n{}\n---\n{exposition}",
        text(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let samples = doc["samples"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect();
    let types = doc["types"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    Some((samples, types))
}

/// A run killed by the `OPMARK_FAULT` test hook at `point`.
fn killed_run(env: &Sealed, lab: &Lab, point: &str, op: &str, cmd: &str) {
    let out = env
        .opmark_with_lab(lab)
        .env("OPMARK_FAULT", point)
        .args(["--json", "run", "target1", "--op", op, "--", cmd])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None, "{point}: killed by a signal");
}

#[test]
fn stats_counts_each_health_count_after_a_scripted_mix_of_outcomes() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    if !support::require_tool("python3") {
        return;
    }
    let test = crate::test_name!();
    let env = Sealed::new(test);
    let other = Sealed::new(&format!("{test}-other"));
    let soon = policy_escalating_after(&env, "2s");
    let shipped = policy_escalating_after(&env, "1h");
    let gate = env.root.join("gate");
    let mut family: BTreeMap<&str, String> = BTreeMap::new();
    let mut fam = |op: &'static str, a: &Answer| {
        family.insert(op, a.json["family"].as_str().unwrap().to_owned());
    };

    // --- before the window -------------------------------------------------------------
    let old = run(&env, &lab, &["target1", "--op", "old-1", "--", "echo old"]);
    assert_eq!(old.verdict(), "completed", "{old:?}");
    fam("old-1", &old);
    let again = run(&env, &lab, &["target1", "--op", "old-1", "--", "echo old"]);
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    // A client killed while its command runs: dispatched, never settled. The command
    // waits for the gate, so reconcile later finds it still running.
    let stuck_cmd = format!("while [ ! -e {} ]; do sleep 0.1; done", gate.display());
    killed_run(&env, &lab, "after_started", "stuck-1", &stuck_cmd);
    let older_end = Instant::now();
    // Everything above is older than the window below and than escalate_after 2s.
    std::thread::sleep(Duration::from_secs(3));

    // --- in the window ----------------------------------------------------------------
    let done = run(
        &env,
        &lab,
        &["target1", "--op", "done-1", "--", "echo done"],
    );
    assert_eq!(done.verdict(), "completed", "{done:?}");
    fam("done-1", &done);
    let replay = run(
        &env,
        &lab,
        &["target1", "--op", "done-1", "--", "echo done"],
    );
    assert_eq!(replay.verdict(), "replayed", "{replay:?}");
    assert_eq!(replay.exit_code(), Some(0));

    // A client killed after its attempt was dispatched, then the same op id again:
    // the rerun is the operation's second attempt (a retry).
    killed_run(&env, &lab, "after_dispatch", "kill-1", "echo killed");
    let retried = run(
        &env,
        &lab,
        &["target1", "--op", "kill-1", "--", "echo killed"],
    );
    assert!(
        matches!(retried.verdict(), "completed" | "replayed"),
        "{retried:?}"
    );
    fam("kill-1", &retried);
    // When the killed client's command had ended before the rerun probed, the rerun
    // replays it: one replay more, in the window too.
    let kill_replayed: &[(&str, u64)] = if retried.verdict() == "replayed" {
        &[("kill-1", 1)]
    } else {
        &[]
    };
    // Only a rerun that ran the command is a retry: one that replayed was refused by the
    // shim (nothing ran), and stats does not count it (CI failed on counting it once).
    let kill_retried: &[(&str, u64)] = if retried.verdict() == "completed" {
        &[("kill-1", 1)]
    } else {
        &[]
    };
    let tries = retried.json["attempts"].as_array().unwrap();
    assert_eq!(tries.last().unwrap()["number"], 2, "{retried:?}");

    // Another client bound the op id to another intent on the host: a conflict here.
    let first = run(
        &other,
        &lab,
        &["target1", "--op", "shared-1", "--", "echo first"],
    );
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let conflict = run(
        &env,
        &lab,
        &["target1", "--op", "shared-1", "--", "echo second"],
    );
    assert_eq!(conflict.code(), ("conflict_on_host", false), "{conflict:?}");
    fam("shared-1", &conflict);

    let blocked = run(
        &env,
        &lab,
        &["target1", "--op", "format-1", "--", "mkfs.ext4 /dev/vdz"],
    );
    assert_eq!(blocked.verdict(), "blocked", "{blocked:?}");
    fam("format-1", &blocked);

    // An edited exit record, then a probe: a contradiction.
    let edited = run(&env, &lab, &["target1", "--op", "edit-1", "--", "true"]);
    assert_eq!(edited.verdict(), "completed", "{edited:?}");
    fam("edit-1", &edited);
    let exit = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/edit-1/exit");
    let record = std::fs::read_to_string(&exit).unwrap();
    std::fs::write(&exit, record.replacen("code=0", "code=9", 1)).unwrap();
    let probe = env
        .opmark_with_lab(&lab)
        .args(["probe", "target1", "edit-1"])
        .output()
        .unwrap();
    assert_eq!(probe.status.code(), Some(0), "{}", text(&probe.stderr));

    // One effectful intent executed under two op ids on one host: a suspected duplicate
    // effect. The same read twice is not one.
    let dup = "mkdir -p /tmp/opmark-health-dup";
    let dup_a = run(&env, &lab, &["target1", "--op", "dup-a", "--", dup]);
    let dup_b = run(&env, &lab, &["target1", "--op", "dup-b", "--", dup]);
    for op in ["read-a", "read-b"] {
        let read = run(
            &env,
            &lab,
            &["target1", "--op", op, "--", "cat /etc/hostname"],
        );
        assert_eq!(read.verdict(), "completed", "{read:?}");
    }
    assert_eq!(dup_a.verdict(), "completed", "{dup_a:?}");
    assert_eq!(dup_b.verdict(), "completed", "{dup_b:?}");
    fam("dup-a", &dup_a);

    // The same destructive intent under a new op id: held back (a `blocked` that no
    // approval lifts, so not an approval interruption), then repeated deliberately.
    let wipe = "rm -f /tmp/opmark-health-never-there";
    let rep = run(&env, &lab, &["target1", "--op", "rep-1", "--", wipe]);
    assert_eq!(rep.verdict(), "completed", "{rep:?}");
    assert_eq!(rep.json["family"], "destructive", "{rep:?}");
    let held = run(&env, &lab, &["target1", "--op", "rep-2", "--", wipe]);
    assert_eq!(held.code(), ("repeats_recent_operation", false), "{held:?}");
    let declared = run(
        &env,
        &lab,
        &["target1", "--op", "rep-3", "--repeats", "rep-1", "--", wipe],
    );
    assert_eq!(declared.verdict(), "completed", "{declared:?}");

    // A dispatch that never arrived, reconciled (fenced: not applied), and the stuck one,
    // which reconcile finds still running and cannot settle: it needs a human.
    crate::operators::record_lost_dispatch(&env, "target1", "lost-1", "echo lost", true);
    let rec = env
        .opmark_with_lab(&lab)
        .arg("--policy")
        .arg(&soon)
        .args(["--json", "reconcile", "lost-1", "stuck-1"])
        .output()
        .unwrap();
    let rec_doc = json(&rec);
    let decision = |op: &str| -> String {
        rec_doc["operations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["op_id"] == op)
            .unwrap_or_else(|| panic!("{op} not reconciled: {rec_doc}"))["decision"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(decision("lost-1"), "not_applied", "{rec_doc}");
    let stuck_decision = decision("stuck-1");
    assert_eq!(rec_doc["unresolved_count"], 1, "{rec_doc}");
    let flagged = rec_doc["needs_human_operations"].as_array().unwrap();
    assert_eq!(flagged.len(), 1, "{rec_doc}");
    assert_eq!(flagged[0]["op_id"], "stuck-1", "{rec_doc}");
    let rec_text = text(
        &env.opmark_with_lab(&lab)
            .arg("--policy")
            .arg(&soon)
            .args(["reconcile", "stuck-1"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        rec_text.contains("H stuck-1 on target1: NEEDS A HUMAN"),
        "{rec_text}"
    );
    // That second reconcile is one more reconciliation of the stuck operation.
    let stuck_reconciles = 2;

    // --- the counts ---------------------------------------------------------------------
    let f = |op: &str| family[op].as_str();
    let all = stats_json(&env, &soon, &[]);
    let h = &all["health"];
    assert_eq!(h["escalate_after"], "2s", "{h}");
    let replays = |ops: &[(&str, u64)]| -> Value {
        let counted: Vec<(&str, u64)> = ops
            .iter()
            .chain(kill_replayed)
            .map(|(op, n)| (f(op), *n))
            .collect();
        tally(&counted)
    };
    assert_eq!(
        h["replay_tally"],
        replays(&[("old-1", 1), ("done-1", 1)]),
        "{h}"
    );
    assert_eq!(
        h["retry_tally"],
        tally(
            &kill_retried
                .iter()
                .map(|(op, n)| (f(op), *n))
                .collect::<Vec<_>>()
        ),
        "replays are not retries: {h}"
    );
    assert_eq!(h["conflict_tally"], tally(&[(f("shared-1"), 1)]), "{h}");
    assert_eq!(
        h["approval_interruption_tally"],
        tally(&[(f("format-1"), 1)]),
        "{h}"
    );
    assert_eq!(h["contradiction_tally"], tally(&[(f("edit-1"), 1)]), "{h}");
    let mut reconciled = BTreeMap::new();
    reconciled.insert("not_applied".to_owned(), 1u64);
    *reconciled.entry(stuck_decision.clone()).or_insert(0) += stuck_reconciles;
    assert_eq!(
        h["reconciliation_outcomes"],
        serde_json::json!(reconciled),
        "{h}"
    );
    assert_eq!(
        h["repetition_held_tally"],
        tally(&[("destructive", 1)]),
        "{h}"
    );
    assert_eq!(
        h["repetition_declared_tally"],
        tally(&[("destructive", 1)]),
        "{h}"
    );
    // The stuck one is dispatched and unsettled, and older than 2s.
    assert_eq!(
        h["unknown_outcome_tally"],
        tally(&[("destructive", 1)]),
        "{h}"
    );
    assert_eq!(h["needs_human_tally"], tally(&[("destructive", 1)]), "{h}");
    // Declared or not, one intent executed under two op ids is a suspected duplicate.
    assert_eq!(
        h["suspected_duplicate_tally"],
        tally(&[(f("dup-a"), 1), ("destructive", 1)]),
        "{h}"
    );
    assert_eq!(h["suspected_duplicates_by_host"]["target1"], 2, "{h}");
    let named: Vec<&Value> = h["duplicates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["op_ids"])
        .collect();
    assert!(
        named.contains(&&serde_json::json!(["dup-a", "dup-b"]))
            && named.contains(&&serde_json::json!(["rep-1", "rep-3"])),
        "{h}"
    );
    // `--limit` names fewer, never counts fewer; the text says how many it left out.
    let one = stats_json(&env, &soon, &["--limit", "1"]);
    assert_eq!(
        one["health"]["duplicates"].as_array().map(Vec::len),
        Some(1),
        "{one}"
    );
    assert_eq!(
        one["health"]["suspected_duplicate_tally"],
        h["suspected_duplicate_tally"]
    );
    assert_eq!(
        stats_json(&env, &soon, &["--all"])["health"]["duplicates"],
        h["duplicates"]
    );
    let short = env
        .opmark()
        .arg("--policy")
        .arg(&soon)
        .args(["stats", "--limit", "1"])
        .output()
        .unwrap();
    let short = text(&short.stdout);
    assert_eq!(short.matches("DUPLICATE on").count(), 1, "{short}");
    assert!(
        short.contains("and 1 more suspected duplicates: opmark stats --all names them"),
        "{short}"
    );
    for bad in [&["--limit", "1", "--all"][..], &["--limit", "some"][..]] {
        let out = env.opmark().arg("stats").args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "usage error for {bad:?}");
        assert!(
            text(&out.stderr).contains("--limit"),
            "{}",
            text(&out.stderr)
        );
    }
    // With the shipped escalate_after (1h) nothing is old enough to need a human.
    let later = stats_json(&env, &shipped, &[]);
    assert_eq!(later["health"]["needs_human_tally"], tally(&[]), "{later}");
    assert_eq!(later["health"]["escalate_after"], "1h");

    // The text says the same.
    let page = text(
        &env.opmark()
            .arg("--policy")
            .arg(&soon)
            .arg("stats")
            .output()
            .unwrap()
            .stdout,
    );
    let row = |name: &str| -> String {
        // The health rows, after the ledger's own (which has a `retries by family`).
        page.lines()
            .skip_while(|l| *l != "health:")
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name:?} row:\n{page}"))
            .trim_start()[name.len()..]
            .trim()
            .to_owned()
    };
    let tally_text = |t: &Value| -> String {
        if t["total"] == 0 {
            return "0".into();
        }
        let parts: Vec<String> = t["by_family"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!("{} ({})", t["total"], parts.join(", "))
    };
    for (name, key) in [
        ("replays", "replay_tally"),
        ("retries", "retry_tally"),
        ("conflicts", "conflict_tally"),
        ("approval interruptions", "approval_interruption_tally"),
        ("repetitions held", "repetition_held_tally"),
        ("repetitions declared", "repetition_declared_tally"),
        ("unknown outcomes", "unknown_outcome_tally"),
        ("suspected duplicates", "suspected_duplicate_tally"),
    ] {
        assert_eq!(row(name), tally_text(&h[key]), "{name}:\n{page}");
    }
    assert!(
        row("needs human").starts_with(&format!("{} (", tally_text(&h["needs_human_tally"]))),
        "{page}"
    );
    assert!(page.contains("DUPLICATE on target1: one "), "{page}");
    assert!(page.contains("executed 2 times, as dup-a, dup-b"), "{page}");
    assert!(
        !page.contains("read-a"),
        "a repeated read is no duplicate: {page}"
    );

    // --- the window leaves the older events out ----------------------------------------
    // Its edge falls between the older runs and the sleep's end, whatever the time since.
    let edge = older_end + Duration::from_millis(1500);
    let since = format!("{}ms", edge.elapsed().as_millis() + 1);
    let window = stats_json(&env, &soon, &["--since", &since]);
    let w = &window["health"];
    assert_eq!(
        w["replay_tally"],
        replays(&[("done-1", 1)]),
        "old-1's replay is older: {w}"
    );
    assert_eq!(w["retry_tally"], h["retry_tally"], "{w}");
    assert_eq!(w["conflict_tally"], h["conflict_tally"], "{w}");
    assert_eq!(
        w["approval_interruption_tally"], h["approval_interruption_tally"],
        "{w}"
    );
    assert_eq!(w["contradiction_tally"], h["contradiction_tally"], "{w}");
    assert_eq!(
        w["repetition_held_tally"], h["repetition_held_tally"],
        "{w}"
    );
    assert_eq!(
        w["repetition_declared_tally"], h["repetition_declared_tally"],
        "{w}"
    );
    assert_eq!(
        w["reconciliation_outcomes"], h["reconciliation_outcomes"],
        "{w}"
    );
    assert_eq!(
        w["suspected_duplicate_tally"], h["suspected_duplicate_tally"],
        "{w}"
    );
    assert_eq!(
        window["operation_count"].as_u64().unwrap() + 1,
        all["operation_count"].as_u64().unwrap(),
        "old-1 was not active in the window: {window}"
    );
    // A window that starts after everything: nothing in it (the gauges count the
    // operations active in it).
    let empty = stats_json(&env, &soon, &["--since", "1ms"]);
    let e = &empty["health"];
    for key in [
        "replay_tally",
        "retry_tally",
        "conflict_tally",
        "suspected_duplicate_tally",
        "unknown_outcome_tally",
    ] {
        assert_eq!(e[key], tally(&[]), "{key}: {e}");
    }

    // --- Prometheus, read by the reference parser --------------------------------------
    let prom = env
        .opmark()
        .arg("--policy")
        .arg(&soon)
        .args(["stats", "--format", "prometheus"])
        .output()
        .unwrap();
    assert_eq!(prom.status.code(), Some(0), "{}", text(&prom.stderr));
    let exposition = text(&prom.stdout);
    let Some((samples, types)) = parse_prometheus(test, &exposition) else {
        return;
    };
    let sample = |name: &str, labels: &str| -> f64 {
        *samples
            .get(&format!("{name}{{{labels}}}"))
            .unwrap_or_else(|| panic!("no {name}{{{labels}}} in:\n{exposition}"))
    };
    let fam_label = |op: &str| format!("family={}", f(op));
    assert_eq!(
        sample("opmark_replays_total", &fam_label("done-1")),
        h["replay_tally"]["by_family"][f("done-1")]
            .as_f64()
            .unwrap()
    );
    // No retry (the rerun replayed) may leave the series out.
    assert_eq!(
        samples
            .get(&format!("opmark_retries_total{{{}}}", fam_label("kill-1")))
            .copied()
            .unwrap_or(0.0),
        h["retry_tally"]["by_family"][f("kill-1")]
            .as_f64()
            .unwrap_or(0.0)
    );
    assert_eq!(
        sample("opmark_conflicts_total", &fam_label("shared-1")),
        1.0
    );
    assert_eq!(
        sample("opmark_approval_interruptions_total", "family=destructive"),
        1.0
    );
    assert_eq!(
        sample("opmark_contradictions_total", &fam_label("edit-1")),
        1.0
    );
    assert_eq!(
        sample("opmark_reconciliations_total", "outcome=not_applied"),
        1.0
    );
    assert_eq!(sample("opmark_needs_human", "family=destructive"), 1.0);
    assert_eq!(sample("opmark_needs_human", "family=read-only"), 0.0);
    assert_eq!(sample("opmark_unknown_outcomes", "family=destructive"), 1.0);
    assert_eq!(
        sample("opmark_suspected_duplicate_effects", &fam_label("dup-a")),
        1.0
    );
    assert_eq!(
        sample("opmark_suspected_duplicate_effects_by_host", "host=target1"),
        2.0
    );
    assert_eq!(sample("opmark_escalate_after_seconds", ""), 2.0);
    assert_eq!(
        sample("opmark_repetitions_held_total", "family=destructive"),
        1.0
    );
    assert_eq!(
        sample("opmark_repetitions_declared_total", "family=destructive"),
        1.0
    );
    assert_eq!(types["opmark_replays"], "counter", "{types:?}");
    assert_eq!(types["opmark_needs_human"], "gauge", "{types:?}");
    assert_eq!(
        types["opmark_suspected_duplicate_effects"], "gauge",
        "{types:?}"
    );

    // --- needs_human in list ----------------------------------------------------------
    let list = json(
        &env.opmark()
            .arg("--policy")
            .arg(&soon)
            .args(["--json", "list"])
            .output()
            .unwrap(),
    );
    let flagged: Vec<&str> = list["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["needs_human"] == true)
        .map(|o| o["op_id"].as_str().unwrap())
        .collect();
    assert_eq!(flagged, ["stuck-1"], "{list}");
    let table = text(
        &env.opmark()
            .arg("--policy")
            .arg(&soon)
            .arg("list")
            .output()
            .unwrap()
            .stdout,
    );
    let stuck_row = table.lines().find(|l| l.contains("stuck-1")).unwrap();
    assert!(stuck_row.starts_with('H'), "{table}");
    assert!(table.contains("1 NEEDS A HUMAN (marked H"), "{table}");
    let relaxed = json(
        &env.opmark()
            .arg("--policy")
            .arg(&shipped)
            .args(["--json", "list"])
            .output()
            .unwrap(),
    );
    assert!(
        relaxed["operations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["needs_human"] == false),
        "{relaxed}"
    );

    // The stuck command ends; the chain of all this still verifies.
    std::fs::write(&gate, "").unwrap();
    let verify = env
        .opmark()
        .args(["audit", "verify", "--full"])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stderr));
}

#[test]
fn stats_format_takes_text_json_or_prometheus_and_refuses_anything_else() {
    let env = Sealed::new(crate::test_name!());
    crate::support::empty_ledger(&env);
    let bad = env
        .opmark()
        .args(["stats", "--format", "yaml"])
        .output()
        .unwrap();
    assert_ne!(bad.status.code(), Some(0));
    let err = text(&bad.stderr);
    assert!(err.contains("invalid value 'yaml'"), "{err}");
    assert!(err.contains("prometheus"), "names the values: {err}");
    let as_json = json(
        &env.opmark()
            .args(["stats", "--format", "json"])
            .output()
            .unwrap(),
    );
    let with_flag = json(&env.opmark().args(["--json", "stats"]).output().unwrap());
    assert_eq!(as_json, with_flag);
    let both = env
        .opmark()
        .args(["--json", "stats", "--format", "prometheus"])
        .output()
        .unwrap();
    assert_ne!(both.status.code(), Some(0), "two formats asked");
    // An empty ledger still writes every series, at zero.
    let prom = text(
        &env.opmark()
            .args(["stats", "--format", "prometheus"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        prom.contains("opmark_needs_human{family=\"destructive\"} 0\n"),
        "{prom}"
    );
    assert!(
        prom.contains("# TYPE opmark_retries_total counter\n"),
        "{prom}"
    );
}

#[test]
fn a_bad_escalate_after_in_the_policy_file_stops_stats_list_and_reconcile_naming_the_key() {
    let env = Sealed::new(crate::test_name!());
    let path = policy_escalating_after(&env, "soon");
    for cmd in [&["stats"][..], &["list"], &["reconcile"]] {
        let out = env
            .opmark()
            .arg("--policy")
            .arg(&path)
            .args(cmd)
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{cmd:?}");
        let err = text(&out.stderr);
        assert!(err.contains("escalate_after"), "{cmd:?}: {err}");
        assert!(err.contains("write a duration like"), "{cmd:?}: {err}");
    }
}
