//! A plan before acting: `opmark run --dry-run` (and MCP `plan`) says what `run` would
//! do (run, replay, follow, block and why, refuse) for a fresh op, a finished one, a
//! running one, a held repetition, a command needing approval and a denied one, against
//! a real sshd, and sends nothing but read-only probes and records nothing.

use std::path::Path;

use serde_json::Value;

use crate::support::mcp::McpClient;
use crate::support::{self, fresh_dir, json, run_json, text, Sealed};

/// Every event in the ledger: a plan may not add one.
fn ledger_events(env: &Sealed) -> i64 {
    let db = rusqlite::Connection::open(&env.ledger).unwrap();
    db.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap()
}

/// `run --dry-run --json` of `command` under `op` on target1: its one plan.
fn planned(env: &Sealed, lab: &support::Lab, op: &str, command: &str) -> Value {
    let out = env
        .opmark_with_lab(lab)
        .args([
            "--json",
            "run",
            "--dry-run",
            "target1",
            "--op",
            op,
            "--",
            command,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{op}: {}", text(&out.stderr));
    let doc = json(&out);
    let plans = doc["plans"].as_array().unwrap();
    assert_eq!(plans.len(), 1, "{doc}");
    plans[0].clone()
}

fn would(plan: &Value) -> (&str, &str) {
    (
        plan["would"]["action"].as_str().unwrap(),
        plan["would"]["reason_code"].as_str().unwrap_or("-"),
    )
}

fn marker_exists(lab: &support::Lab, op: &str) -> bool {
    let target = lab.target("target1").unwrap();
    Path::new(&target.marker_root())
        .join("ops")
        .join(op)
        .exists()
}

#[test]
fn dry_run_says_what_run_would_do_and_sends_and_records_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let count = dir.join("count");
    let wipe = format!("echo ran >> {c}; rm -f {c}.nothing", c = count.display());
    // Something in the ledger first, so "records nothing" has a count to keep.
    let done = run_json(
        &env,
        &lab,
        &["target1", "--op", "done-1", "--", "echo done"],
    );
    assert_eq!(done.verdict(), "completed", "{}", done.stderr);
    let wiped = run_json(&env, &lab, &["target1", "--op", "wipe-1", "--", &wipe]);
    assert_eq!(wiped.verdict(), "completed", "{}", wiped.stderr);
    // A command still running, detached.
    let gate = dir.join("gate");
    let slow = format!("while [ ! -e {} ]; do sleep 0.1; done", gate.display());
    let running = run_json(
        &env,
        &lab,
        &["target1", "--op", "slow-1", "--detach", "--", &slow],
    );
    assert_eq!(running.verdict(), "in_progress", "{}", running.stderr);
    let before = ledger_events(&env);

    let fresh = planned(&env, &lab, "fresh-1", "echo hello");
    assert_eq!(would(&fresh), ("run", "-"), "{fresh}");
    assert_eq!(fresh["marker_state"], "absent", "{fresh}");
    assert_eq!(fresh["family"], "read-only", "{fresh}");
    assert!(!marker_exists(&lab, "fresh-1"), "a plan made a marker");

    let finished = planned(&env, &lab, "done-1", "echo done");
    assert_eq!(
        would(&finished),
        ("replay", "replayed_from_host"),
        "{finished}"
    );
    assert_eq!(finished["marker_exit_code"], 0, "{finished}");

    let follow = planned(&env, &lab, "slow-1", &slow);
    assert_eq!(would(&follow), ("follow", "-"), "{follow}");
    assert_eq!(follow["marker_state"], "running", "{follow}");

    let repeated = planned(&env, &lab, "wipe-2", &wipe);
    assert_eq!(
        would(&repeated),
        ("block", "repeats_recent_operation"),
        "{repeated}"
    );
    assert_eq!(repeated["repeats"]["op_id"], "wipe-1", "{repeated}");
    assert!(
        repeated["would"]["why"]
            .as_str()
            .unwrap()
            .contains("--repeats wipe-1"),
        "{repeated}"
    );

    let approval = planned(&env, &lab, "mkfs-1", "mkfs.ext4 /dev/nothing-here");
    assert_eq!(
        would(&approval),
        ("block", "approval_required"),
        "{approval}"
    );
    assert!(approval["approval_rule"].is_string(), "{approval}");
    // Decided without the host: not even a probe.
    assert_eq!(approval["marker_state"], Value::Null, "{approval}");

    let denied = planned(&env, &lab, "deny-1", "rm -rf /");
    assert_eq!(would(&denied), ("refuse", "policy_denied"), "{denied}");
    assert!(denied["deny_rule"].is_string(), "{denied}");

    // The same op id with another command: the ledger's conflict.
    let other = planned(&env, &lab, "done-1", "echo something else");
    assert_eq!(would(&other), ("conflict", "conflict_in_ledger"), "{other}");

    assert_eq!(ledger_events(&env), before, "a plan recorded something");
    for op in ["mkfs-1", "deny-1", "wipe-2"] {
        assert!(!marker_exists(&lab, op), "a plan made the marker of {op}");
    }
    assert_eq!(
        std::fs::read_to_string(&count).unwrap(),
        "ran\n",
        "the destructive command ran again"
    );
    support::schema::validate(
        crate::test_name!(),
        &[(
            "plan",
            [
                &fresh, &finished, &follow, &repeated, &approval, &denied, &other,
            ]
            .iter()
            .map(|p| serde_json::json!({"schema": "opmark/2", "plans": [p]}))
            .collect(),
        )],
    );

    // In words, for a person.
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "run",
            "--dry-run",
            "target1",
            "--op",
            "done-1",
            "--",
            "echo done",
        ])
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(
        said.starts_with("target1: would replay (replayed_from_host)\n"),
        "{said}"
    );
    assert!(said.contains("marker completed"), "{said}");

    // Over MCP, with run's own arguments.
    let mut cmd = env.opmark_with_lab(&lab);
    cmd.arg("mcp");
    let mut client = McpClient::start(cmd);
    let plan = client.structured(
        "plan",
        serde_json::json!({"host": "target1", "op_id": "slow-1", "command": slow}),
    );
    assert_eq!(plan["plans"][0]["would"]["action"], "follow", "{plan}");
    let denied = client.structured(
        "plan",
        serde_json::json!({"host": "target1", "op_id": "deny-2", "command": "rm -rf /"}),
    );
    assert_eq!(denied["plans"][0]["would"]["action"], "refuse", "{denied}");
    assert!(client.close().success());
    assert_eq!(
        ledger_events(&env),
        before,
        "a plan over MCP recorded something"
    );
    std::fs::write(&gate, "").unwrap();
}

#[test]
fn a_plan_sees_a_repetition_another_ledger_made_in_the_hosts_index() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let first = Sealed::new(&format!("{}-a", crate::test_name!()));
    let second = Sealed::new(&format!("{}-b", crate::test_name!()));
    let count = fresh_dir(crate::test_name!()).join("count");
    let wipe = format!("echo ran >> {c}; rm -f {c}.nothing", c = count.display());
    let ran = run_json(&first, &lab, &["target1", "--op", "wipe-a", "--", &wipe]);
    assert_eq!(ran.verdict(), "completed", "{}", ran.stderr);

    // The second ledger knows nothing of wipe-a; the host's index does.
    let plan = planned(&second, &lab, "wipe-b", &wipe);
    assert_eq!(
        would(&plan),
        ("block", "repeats_recent_operation"),
        "{plan}"
    );
    assert_eq!(plan["repeats"]["op_id"], "wipe-a", "{plan}");
    assert_eq!(plan["repeats"]["seen_in"], "host", "{plan}");
    assert!(
        plan["would"]["why"]
            .as_str()
            .unwrap()
            .contains("the host's fingerprint index holds wipe-a"),
        "{plan}"
    );
    assert!(!marker_exists(&lab, "wipe-b"), "a plan made a marker");
    // And run agrees: held, naming the same earlier operation.
    let held = run_json(&second, &lab, &["target1", "--op", "wipe-b", "--", &wipe]);
    assert_eq!(
        held.code(),
        ("repeats_recent_operation", false),
        "{}",
        held.stderr
    );
    assert_eq!(held.json["repeats"]["op_id"], "wipe-a");
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\n");
    support::schema::validate(
        crate::test_name!(),
        &[(
            "plan",
            vec![serde_json::json!({"schema": "opmark/2", "plans": [plan]})],
        )],
    );
}
