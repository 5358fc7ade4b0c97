//! Operator commands against real sshd targets: reconcile after a link cut and after an
//! attempt that never arrived, resolve of each kind, gc on markers of every state, and
//! doctor on unusable marker roots.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::ledger::fingerprint::{ledger_fingerprint, Intent};
use opmark::ledger::{Durability, Event, Ledger, OpKey};
use opmark::op_id::OpId;
use opmark::shim::Verb;
use opmark::vocab::{Boundary, RetryReason};
use serde_json::Value;

use crate::support::{
    self, event_count, json, lines, output, probe_state, text, wait_for, Lab, Sealed,
};

fn marker(lab: &Lab, alias: &str, op: &str) -> PathBuf {
    lab.target(alias)
        .unwrap()
        .marker_root()
        .join("ops")
        .join(op)
}

/// Records, straight through the library, an operation whose attempt was dispatched but
/// never answered: what a client that crashed (or lost its link) right after dispatch
/// leaves behind. Nothing is sent to the host.
pub(crate) fn record_lost_dispatch(
    env: &Sealed,
    host: &str,
    op: &str,
    command: &str,
    dispatched: bool,
) {
    let mut ledger = Ledger::open(&env.ledger).unwrap();
    let key = ledger.key().clone();
    let intent = Intent {
        command,
        stdin_sha256: None,
        secret_names: &[],
        become_user: None,
    };
    let mut events = vec![Event::Intended {
        session: "s-lost-client".into(),
        family: Family::Destructive,
        display: command.into(),
        fingerprint: ledger_fingerprint(&intent, &key),
        rule: "test: written by hand".into(),
        secrets: Vec::new(),
        become_user: None,
        locks: Vec::new(),
    }];
    if dispatched {
        events.push(Event::AttemptDispatched {
            attempt_id: format!("at-lost-{op}"),
            number: 1,
            parent: None,
            reason: RetryReason::FirstAttempt,
        });
        events.push(Event::BoundaryReached {
            attempt_id: format!("at-lost-{op}"),
            boundary: Boundary::SentNoResponse,
            detail: "connection lost before the shim answered".into(),
            refusal: None,
        });
    }
    ledger
        .append_many(&OpKey::new(op, host), &events, Durability::Full)
        .unwrap();
}

#[test]
fn reconcile_settles_a_run_left_indeterminate_by_a_link_cut() {
    let Some(lab) = support::netns_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    // The command ends when the test opens its gate, after the run has answered: a cut
    // that comes late on a busy machine cannot let the exit status through first.
    let gate = env.root.join("gate");
    let cmd = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; echo done; exit 5",
        gate.display()
    );
    let child: Child = env
        .opmark_with_lab(&lab)
        .args([
            "--json", "run", "target1", "--op", "cut-1", "--wait", "2s", "--", &cmd,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client, not just the host, must have seen the start (the page below shows that
    // boundary): the shim's frame can trail the start gate on a busy machine.
    wait_for(
        "the started boundary in the ledger",
        Duration::from_secs(30),
        || {
            let out = output(env.opmark().args(["--json", "show", "cut-1"]));
            serde_json::from_slice::<Value>(&out.stdout)
                .is_ok_and(|doc| doc["attempts"][0]["boundary"] == "started")
        },
    );
    lab.cut("target1").unwrap();
    let cut_at = Instant::now();
    let out = child.wait_with_output().unwrap();
    eprintln!("run answered {:?} after the cut", cut_at.elapsed());
    lab.restore("target1").unwrap();
    let doc = json(&out);
    assert_eq!(doc["verdict"], "indeterminate", "{doc}");
    assert_eq!(out.status.code(), Some(242));
    assert!(doc["exit_code"].is_null());

    let list = json(&output(env.opmark().args([
        "--json",
        "list",
        "--unresolved",
    ])));
    assert_eq!(list["operations"].as_array().unwrap().len(), 1, "{list}");

    // The command goes on without the client; wait for its exit record on the host.
    std::fs::write(&gate, "").unwrap();
    let exit_record = marker(&lab, "target1", "cut-1").join("exit");
    wait_for("the exit record", Duration::from_secs(15), || {
        exit_record.exists()
    });
    let t = Instant::now();
    let out = output(env.opmark_with_lab(&lab).args(["--json", "reconcile"]));
    eprintln!("reconcile of 1 operation took {:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = json(&out);
    let row = &doc["operations"][0];
    assert_eq!(row["decision"], "completed", "{doc}");
    assert_eq!(row["exit_code"], 5);
    assert_eq!(row["before"], "indeterminate");
    assert_eq!(doc["unresolved_count"], 0);

    // Reconciling again finds nothing to do.
    let again = output(env.opmark_with_lab(&lab).arg("reconcile"));
    assert_eq!(again.status.code(), Some(0));
    assert!(text(&again.stdout).contains("nothing to reconcile"));

    let show = output(env.opmark().args(["show", "cut-1"]));
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
    let page = text(&show.stdout);
    for needle in [
        "intended",
        "dispatched",
        "boundary started",
        "verdict indeterminate",
        "probe: marker completed, exit 5",
        "reconciled: completed",
        "exit 5",
    ] {
        assert!(page.contains(needle), "show lacks {needle:?}:\n{page}");
    }
    assert!(page.lines().all(|l| l.chars().count() <= 80), "{page}");
    // The outcome comes first, then attempts and observations before the timeline.
    assert!(
        page.lines()
            .nth(1)
            .unwrap()
            .contains("outcome      completed, exit 5"),
        "{page}"
    );
    let at = |s: &str| page.find(s).unwrap_or_else(|| panic!("no {s:?}:\n{page}"));
    assert!(at("\nattempts:") < at("\nobservations (UTC):"));
    assert!(at("\nobservations (UTC):") < at("\ntimeline (UTC):"));
    let doc = json(&output(env.opmark().args(["--json", "show", "cut-1"])));
    assert_eq!(doc["outcome"]["exit_code"], 5, "{doc}");
    assert_eq!(doc["outcome"]["unresolved"], false);
    assert_eq!(doc["attempts"][0]["boundary"], "started");
    let changes: Vec<&str> = doc["observations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["changed"].as_str().unwrap())
        .collect();
    assert_eq!(changes.last(), Some(&"settled"), "{doc}");
}

#[test]
fn reconcile_fences_an_attempt_that_never_arrived_so_a_late_run_cannot_run() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let effect = env.root.join("effect");
    let command = format!("touch {}", effect.display());
    record_lost_dispatch(&env, "target1", "lost-1", &command, true);
    record_lost_dispatch(&env, "target1", "never-sent", &command, false);

    let out = output(env.opmark_with_lab(&lab).args(["--json", "reconcile"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = json(&out);
    let rows = doc["operations"].as_array().unwrap();
    let row = |op: &str| rows.iter().find(|r| r["op_id"] == op).unwrap().clone();
    assert_eq!(row("lost-1")["decision"], "not_applied", "{doc}");
    assert_eq!(row("lost-1")["evidence"], "absent; fenced");
    assert_eq!(row("never-sent")["decision"], "not_applied");
    assert_eq!(
        row("never-sent")["evidence"],
        "no attempt was ever dispatched"
    );
    assert!(marker(&lab, "target1", "lost-1").join("fenced").exists());
    // The intent-only operation was closed without contacting the host.
    assert!(!marker(&lab, "target1", "never-sent").exists());

    // The delayed original, from this client and from another one with its own ledger.
    let other = Sealed::new(&format!("{}-other", crate::test_name!()));
    for client in [&env, &other] {
        let out = output(
            client
                .opmark_with_lab(&lab)
                .args(["--json", "run", "target1", "--op", "lost-1", "--", &command]),
        );
        let doc = json(&out);
        assert_eq!(doc["verdict"], "not_applied", "{doc}");
        assert_eq!(out.status.code(), Some(241));
    }
    assert!(!effect.exists(), "a fenced operation ran");

    let show = text(&output(env.opmark().args(["show", "lost-1"])).stdout);
    assert!(show.contains("fenced"), "{show}");
    assert!(show.contains("reconciled: not_applied"), "{show}");
}

#[test]
fn resolve_records_each_kind_visible_in_show_and_the_chain_still_verifies() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    for op in ["op-applied", "op-not-applied", "op-abandoned"] {
        record_lost_dispatch(&env, "target1", op, &format!("echo {op}"), true);
    }
    let done = output(
        env.opmark_with_lab(&lab)
            .args(["--json", "run", "target1", "--op", "op-done", "--", "true"]),
    );
    assert_eq!(json(&done)["verdict"], "completed");

    for (op, how) in [
        ("op-applied", "applied"),
        ("op-not-applied", "not-applied"),
        ("op-abandoned", "abandoned"),
    ] {
        let out = output(env.opmark_with_lab(&lab).args([
            "resolve",
            op,
            "--host",
            "target1",
            "--as",
            how,
            "--note",
            &format!("checked {op} by hand"),
            "--by",
            "alice",
        ]));
        assert_eq!(out.status.code(), Some(0), "{op}: {}", text(&out.stderr));
        let show = text(&output(env.opmark().args(["show", op])).stdout);
        let decided = how.replace('-', "_");
        assert!(
            show.contains(&format!("operator alice decided {decided}")),
            "{show}"
        );
        let doc = json(&output(env.opmark().args(["--json", "show", op])));
        let last = &doc["events"].as_array().unwrap().last().unwrap()["event"];
        assert_eq!(last["kind"], "operator_decision", "{doc}");
        assert_eq!(last["note"], format!("checked {op} by hand"));
    }
    assert!(marker(&lab, "target1", "op-not-applied")
        .join("fenced")
        .exists());
    assert!(!marker(&lab, "target1", "op-applied").exists());
    let list = json(&output(env.opmark().args([
        "--json",
        "list",
        "--unresolved",
    ])));
    assert_eq!(list["operations"].as_array().unwrap().len(), 0, "{list}");

    // The host says op-done completed: not-applied is refused and nothing is recorded.
    let before = event_count(&env, "op-done");
    let out = output(env.opmark_with_lab(&lab).args([
        "resolve",
        "op-done",
        "--host",
        "target1",
        "--as",
        "not-applied",
        "--note",
        "wrong",
    ]));
    assert_eq!(out.status.code(), Some(245));
    assert!(
        text(&out.stderr).contains("completed"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(event_count(&env, "op-done"), before);
    assert!(!marker(&lab, "target1", "op-done").join("fenced").exists());

    // Unknown operation, and a known one on the wrong host.
    let out = output(env.opmark_with_lab(&lab).args([
        "resolve", "nope", "--host", "target1", "--as", "applied", "--note", "x",
    ]));
    assert_eq!(out.status.code(), Some(245));
    assert!(text(&out.stderr).contains("no operation `nope`"));
    let out = output(env.opmark_with_lab(&lab).args([
        "resolve",
        "op-done",
        "--host",
        "elsewhere",
        "--as",
        "applied",
        "--note",
        "x",
    ]));
    assert_eq!(out.status.code(), Some(245));
    assert!(text(&out.stderr).contains("recorded on: target1"));

    let verify = output(env.opmark().args(["audit", "verify"]));
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stdout));
}

/// Starts a long command through opmark, waits for its start gate, and kills the client
/// (the command goes on, detached). Returns the supervisor's pid.
fn start_detached(env: &Sealed, lab: &Lab, op: &str) -> i32 {
    // One intent per op id: the same destructive command under another op id would be
    // held back as a repetition (docs/guarantees.md#repetitions).
    let command = format!("sleep 60; : {op}");
    let mut child = env
        .opmark_with_lab(lab)
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            op,
            "--class",
            "destructive",
            "--",
            &command,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let m = marker(lab, "target1", op);
    wait_for("the start gate", Duration::from_secs(15), || {
        m.join("started").exists() && m.join("proc").exists()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let proc_record = std::fs::read_to_string(m.join("proc")).unwrap();
    proc_record
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|p| p.parse().ok())
        .expect("pid= in the proc record")
}

/// Rewrites `key=` in a marker record, as if it had been written long ago.
fn age_record(path: &Path, key: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let aged: String = text
        .lines()
        .map(|l| {
            if l.starts_with(&format!("{key}=")) {
                format!("{key}=86400\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(text, aged, "{key} not in {}", path.display());
    std::fs::write(path, aged).unwrap();
}

#[test]
fn gc_removes_only_old_completed_and_fenced_markers() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ok = |op: &str| {
        let out = output(
            env.opmark_with_lab(&lab)
                .args(["--json", "run", "target1", "--op", op, "--", "true"]),
        );
        assert_eq!(json(&out)["verdict"], "completed");
    };
    ok("old-done");
    age_record(
        &marker(&lab, "target1", "old-done").join("exit"),
        "ended_at",
    );
    let op = OpId::parse("old-fenced").unwrap();
    let fence = support::ssh_shim(
        &lab,
        "target1",
        &Verb::Fence {
            op: &op,
            force: false,
        },
    );
    assert!(fence.status.success(), "{}", text(&fence.stderr));
    age_record(
        &marker(&lab, "target1", "old-fenced").join("fenced"),
        "fenced_at",
    );
    let running = start_detached(&env, &lab, "still-running");
    let interrupted = start_detached(&env, &lab, "interrupted");
    support::kill_group(interrupted.try_into().unwrap());
    wait_for("the interrupted state", Duration::from_secs(10), || {
        probe_state(&env, &lab, "interrupted") == "interrupted"
    });
    ok("recent-done");
    assert_eq!(probe_state(&env, &lab, "still-running"), "running");

    // Shorter than the policy's strictest minimum: refused, naming it.
    let out = output(
        env.opmark_with_lab(&lab)
            .args(["gc", "target1", "--older-than", "1s"]),
    );
    assert_eq!(out.status.code(), Some(245));
    let err = text(&out.stderr);
    assert!(
        err.contains("min_retention") && err.contains("destructive"),
        "{err}"
    );

    let all = [
        "old-done",
        "old-fenced",
        "still-running",
        "interrupted",
        "recent-done",
    ];
    let removed = |doc: &Value| {
        let mut ops: Vec<String> = doc["removed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["op"].as_str().unwrap().to_owned())
            .collect();
        ops.sort();
        ops
    };
    let out = output(env.opmark_with_lab(&lab).args([
        "--json",
        "gc",
        "target1",
        "--older-than",
        "3650d",
        "--dry-run",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(removed(&json(&out)), ["old-done", "old-fenced"]);
    for op in all {
        assert!(marker(&lab, "target1", op).exists(), "dry run removed {op}");
    }

    let out = output(env.opmark_with_lab(&lab).args([
        "--json",
        "gc",
        "target1",
        "--older-than",
        "3650d",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = json(&out);
    assert_eq!(removed(&doc), ["old-done", "old-fenced"]);
    assert_eq!(doc["kept"], 3);
    // docs/host-protocol.md#tombstones: what stays is a tombstone (no output), read as before.
    for (op, state) in [("old-done", "completed"), ("old-fenced", "fenced")] {
        assert!(!marker(&lab, "target1", op).join("out").exists(), "{op}");
        assert_eq!(probe_state(&env, &lab, op), state, "{op}");
    }
    for op in ["still-running", "interrupted", "recent-done"] {
        assert!(marker(&lab, "target1", op).exists(), "{op} removed");
    }
    assert_eq!(probe_state(&env, &lab, "still-running"), "running");
    assert_eq!(probe_state(&env, &lab, "interrupted"), "interrupted");
    support::kill_group(running.try_into().unwrap());
}

/// Unmounts on drop, so a failed assertion does not leave a tmpfs behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn doctor_json(env: &Sealed, lab: &Lab) -> (Option<i32>, Value) {
    let out = output(
        env.opmark_with_lab(lab)
            .args(["--json", "doctor", "target1"]),
    );
    (out.status.code(), json(&out))
}

fn failed(doc: &Value) -> Vec<String> {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| {
            assert!(!c["fix"].as_str().unwrap().is_empty(), "no fix: {c}");
            c["name"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn doctor_flags_an_unwritable_and_a_tmpfs_marker_root() {
    let Some(mut lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let target = lab.target("target1").unwrap().clone();
    let (code, doc) = doctor_json(&env, &lab);
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(failed(&doc), Vec::<String>::new());

    // The marker root is a file: nothing can be created under it (root or not).
    let root = target.marker_root();
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, "not a directory").unwrap();
    let (code, doc) = doctor_json(&env, &lab);
    assert_eq!(code, Some(1), "{doc}");
    assert_eq!(failed(&doc), ["writable"], "{doc}");
    std::fs::remove_file(&root).unwrap();

    if !support::require_root(crate::test_name!()) {
        return;
    }
    // A lab target declares itself disposable, which makes a volatile root acceptable;
    // a real host does not.
    lab.set_disposable("target1", false).unwrap();
    let status = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=4m,mode=0700",
            "opmark-doctor-test",
        ])
        .arg(&target.state_home)
        .status()
        .unwrap();
    assert!(status.success(), "mount tmpfs");
    let _mounted = Mounted(target.state_home.clone());
    let (code, doc) = doctor_json(&env, &lab);
    assert_eq!(code, Some(1), "{doc}");
    assert_eq!(failed(&doc), ["persistent", "space"], "{doc}");
    assert_eq!(doc["facts"]["fstype"], "tmpfs");
}

/// `opmark run --json` of `op` with `command`, through the lab's config.
fn run_op(env: &Sealed, lab: &Lab, op: &str, command: &str) -> (Option<i32>, Value) {
    let out = output(
        env.opmark_with_lab(lab)
            .args(["--json", "run", "target1", "--op", op, "--", command]),
    );
    (out.status.code(), json(&out))
}

fn attempts_recorded(env: &Sealed, op: &str) -> usize {
    let doc = json(&output(env.opmark().args(["--json", "show", op])));
    doc["attempts"].as_array().unwrap().len()
}

#[test]
fn after_resolve_applied_a_run_replays_the_decision_and_runs_nothing() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let effect = env.root.join("effect");
    let command = format!("touch {}", effect.display());
    // Two operations whose only attempt never answered: the marker is absent, so a run
    // that dispatched would claim it and run the command.
    record_lost_dispatch(&env, "target1", "applied-plain", &command, true);
    record_lost_dispatch(&env, "target1", "applied-exit", &command, true);
    for (op, extra) in [("applied-plain", None), ("applied-exit", Some("3"))] {
        let mut args = vec![
            "resolve",
            op,
            "--host",
            "target1",
            "--as",
            "applied",
            "--note",
            "done by hand",
        ];
        if let Some(code) = extra {
            args.extend(["--exit", code]);
        }
        let out = output(env.opmark_with_lab(&lab).args(&args));
        assert_eq!(out.status.code(), Some(0), "{op}: {}", text(&out.stderr));
    }
    for _ in 0..2 {
        let (status, doc) = run_op(&env, &lab, "applied-plain", &command);
        assert_eq!(doc["verdict"], "replayed", "{doc}");
        assert!(doc["exit_code"].is_null(), "{doc}");
        assert_eq!(doc["reason_code"], "resolved_applied", "{doc}");
        assert_eq!(doc["retryable"], false);
        assert_eq!(status, Some(0), "{doc}");

        let (status, doc) = run_op(&env, &lab, "applied-exit", &command);
        assert_eq!(doc["verdict"], "replayed", "{doc}");
        assert_eq!(doc["exit_code"], 3, "{doc}");
        assert_eq!(doc["reason_code"], "resolved_applied", "{doc}");
        assert_eq!(status, Some(3), "the exit status the operator vouched for");
    }
    assert!(!effect.exists(), "a resolved operation ran");
    for op in ["applied-plain", "applied-exit"] {
        assert!(
            !marker(&lab, "target1", op).exists(),
            "{op}: the host was contacted"
        );
        assert_eq!(attempts_recorded(&env, op), 1, "{op}: no new attempt");
    }
    let list = json(&output(env.opmark().args([
        "--json",
        "list",
        "--unresolved",
    ])));
    assert_eq!(list["operations"].as_array().unwrap().len(), 0, "{list}");

    // --exit belongs to applied only, and must be an exit status.
    for args in [
        ["--as", "abandoned", "--exit", "3"],
        ["--as", "applied", "--exit", "300"],
    ] {
        let out = output(
            env.opmark_with_lab(&lab)
                .args([
                    "resolve",
                    "applied-plain",
                    "--host",
                    "target1",
                    "--note",
                    "x",
                ])
                .args(args),
        );
        assert_eq!(out.status.code(), Some(245), "{args:?}");
        assert!(
            text(&out.stderr).contains("--exit"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn after_resolve_not_applied_or_abandoned_a_run_is_not_applied_and_runs_nothing() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let effect = env.root.join("effect");
    let command = format!("touch {}", effect.display());
    for (op, how, code) in [
        ("gave-up", "abandoned", "resolved_abandoned"),
        ("never-happened", "not-applied", "resolved_not_applied"),
    ] {
        record_lost_dispatch(&env, "target1", op, &command, true);
        let out = output(env.opmark_with_lab(&lab).args([
            "resolve", op, "--host", "target1", "--as", how, "--note", "decided",
        ]));
        assert_eq!(out.status.code(), Some(0), "{op}: {}", text(&out.stderr));
        assert!(
            marker(&lab, "target1", op).join("fenced").exists(),
            "{op}: the marker is fenced, so no client can run it"
        );
        for _ in 0..2 {
            let (status, doc) = run_op(&env, &lab, op, &command);
            assert_eq!(doc["verdict"], "not_applied", "{op}: {doc}");
            assert_eq!(doc["reason_code"], code, "{op}: {doc}");
            assert_eq!(doc["retryable"], false, "{op}");
            assert_eq!(status, Some(241), "{op}");
        }
        assert_eq!(attempts_recorded(&env, op), 1, "{op}: nothing dispatched");
    }
    assert!(!effect.exists(), "a resolved operation ran");
    let list = json(&output(env.opmark().args([
        "--json",
        "list",
        "--unresolved",
    ])));
    assert_eq!(list["operations"].as_array().unwrap().len(), 0, "{list}");
}

/// The projection row of `op` on target1, read straight from the ledger.
fn row(env: &Sealed, op: &str) -> opmark::ledger::OperationRecord {
    Ledger::open(&env.ledger)
        .unwrap()
        .operation(&OpKey::new(op, "target1"))
        .unwrap()
        .expect("the operation is recorded")
}

/// Issue 24 row 7: a host that affirms the command is running, or completed, refuses
/// `resolve --as abandoned` and `--as not-applied`: the message says so, nothing is
/// recorded and nothing is fenced, and the operation stays unresolved for reconcile.
#[test]
fn resolve_abandoned_or_not_applied_is_refused_while_the_host_says_running_or_completed() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let supervisor = start_detached(&env, &lab, "still-going");
    let (status, doc) = run_op(&env, &lab, "finished", "true");
    assert_eq!(
        (status, doc["verdict"].as_str()),
        (Some(0), Some("completed"))
    );
    for (op, says) in [("still-going", "is running"), ("finished", "completed")] {
        for how in ["abandoned", "not-applied"] {
            let before = event_count(&env, op);
            let out = output(env.opmark_with_lab(&lab).args([
                "resolve", op, "--host", "target1", "--as", how, "--note", "gave up",
            ]));
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(245), "{op} {how}: {err}");
            assert!(err.contains(&format!("the host says {op} {says}")), "{err}");
            assert!(err.contains("nothing was recorded"), "{err}");
            assert!(!text(&out.stdout).contains("recorded:"), "{op} {how}");
            assert_eq!(
                event_count(&env, op),
                before,
                "{op} {how}: nothing recorded"
            );
            assert!(
                !marker(&lab, "target1", op).join("fenced").exists(),
                "{op} {how}: nothing fenced"
            );
        }
    }
    assert!(
        !row(&env, "still-going")
            .state
            .to_string()
            .starts_with("resolved"),
        "no decision in the projection"
    );
    // Later runs follow the running command rather than answer `not_applied`.
    let doc = json(&output(env.opmark_with_lab(&lab).args([
        "--json",
        "run",
        "target1",
        "--op",
        "still-going",
        "--class",
        "destructive",
        "--wait",
        "0s",
        "--",
        "sleep 60; : still-going",
    ])));
    assert_eq!(doc["verdict"], "in_progress", "{doc}");
    support::kill_group(supervisor.try_into().unwrap());
}

/// Only an unreachable host lets `resolve --as abandoned` stand: recorded with a probe
/// that says the host was not reached, and when the host is back and a probe finds the
/// command running, that evidence is a contradiction of the decision, never silent.
#[test]
fn resolve_abandoned_stands_only_for_an_unreachable_host_and_later_evidence_contradicts_it() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let supervisor = start_detached(&env, &lab, "on-a-dead-host");
    lab.stop_sshd("target1").unwrap();
    let abandon = [
        "--json",
        "resolve",
        "on-a-dead-host",
        "--host",
        "target1",
        "--as",
        "abandoned",
        "--note",
        "the host is gone",
    ];
    // The command may still be running behind what looks like a dead host: it takes
    // --force, and says why.
    let held = output(env.opmark_with_lab(&lab).args(abandon));
    assert_eq!(held.status.code(), Some(247), "{}", text(&held.stderr));
    assert!(
        text(&held.stderr).contains("--force"),
        "{}",
        text(&held.stderr)
    );
    let out = output(env.opmark_with_lab(&lab).args(abandon).arg("--force"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = json(&out);
    assert!(
        doc["fence"].as_str().unwrap().starts_with("not fenced: "),
        "{doc}"
    );
    let show = json(&output(env.opmark().args([
        "--json",
        "show",
        "on-a-dead-host",
    ])));
    let kinds: Vec<&str> = show["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"]["kind"].as_str())
        .collect();
    assert!(
        kinds.ends_with(&["probed", "operator_decision"]),
        "{kinds:?}"
    );
    let probed = &show["events"].as_array().unwrap()[kinds.len() - 2]["event"];
    assert_eq!(probed["state"], "unreachable", "{probed}");
    assert_eq!(row(&env, "on-a-dead-host").contradictions, 0);

    lab.start_sshd("target1").unwrap();
    assert_eq!(probe_state(&env, &lab, "on-a-dead-host"), "running");
    let rec = row(&env, "on-a-dead-host");
    assert_eq!(rec.contradictions, 1, "{rec:?}");
    assert_eq!(
        rec.state.to_string(),
        "resolved:abandoned",
        "the decision stays"
    );
    let out = output(env.opmark().args(["audit", "verify"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    support::kill_group(supervisor.try_into().unwrap());
}

/// An ssh config in which `alias` names the lab target `to`, with the lab's client key
/// and known_hosts (which trusts every lab target's key).
fn config_pointing(lab: &Lab, dir: &Path, alias: &str, to: &str) -> PathBuf {
    let t = lab.target(to).unwrap();
    let path = dir.join(format!("ssh_config-{alias}-to-{to}"));
    std::fs::write(
        &path,
        format!(
            "Host {alias}\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            t.addr,
            t.port,
            t.user,
            lab.client_key().display(),
            lab.known_hosts().display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_host_presenting_another_key_under_the_same_alias_is_never_probed_fenced_or_run_on() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = env.root.join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let to_b = config_pointing(&lab, &dir, "target1", "target2");
    let effect = env.root.join("effect");
    let command = format!("touch {}", effect.display());
    // The client dies right after its request left for target1 (A): nothing about the
    // marker is known, which is what makes reconcile fence an absent one.
    let crashed = output(
        env.opmark_with_lab(&lab)
            .env("OPMARK_FAULT", "after_dispatch")
            .args(["--json", "run", "target1", "-i"])
            .arg(lab.client_key())
            .args(["--op", "moved-1", "--", &command]),
    );
    assert_eq!(crashed.status.code(), None, "killed by its fault point");
    let shown = json(&output(env.opmark().args(["--json", "show", "moved-1"])));
    let key_a = shown["attempts"][0]["host_key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(key_a.starts_with("SHA256:"), "{shown}");
    let on_b = marker(&lab, "target2", "moved-1");

    // The same alias now leads to B, whose key is trusted too.
    let out = output(
        env.opmark()
            .arg("-F")
            .arg(&to_b)
            .args(["--json", "reconcile"]),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc = json(&out);
    let row = &doc["operations"][0];
    assert_eq!(row["decision"], "host_changed", "{doc}");
    assert_eq!(row["settled"], false);
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("host key for target1 is now SHA256:")
            && detail.contains(&format!("but operation moved-1 ran against {key_a}"))
            && detail.contains("another machine"),
        "{detail}"
    );
    assert!(!on_b.exists(), "reconcile fenced (or touched) B");

    // probe and resolve through B refuse too; nothing recorded, nothing fenced.
    let before = event_count(&env, "moved-1");
    let out = output(env.opmark().arg("-F").arg(&to_b).args([
        "resolve",
        "moved-1",
        "--host",
        "target1",
        "--as",
        "not-applied",
        "--note",
        "x",
    ]));
    // As `run` answers it (docs/guarantees.md#evidence-identity): conflict, host_changed, exit 243.
    assert_eq!(out.status.code(), Some(243), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .starts_with("opmark: conflict: host changed: host key for target1 is now"),
        "{}",
        text(&out.stderr)
    );
    let out = output(
        env.opmark()
            .arg("-F")
            .arg(&to_b)
            .args(["--json", "probe", "target1", "moved-1"]),
    );
    assert_eq!(out.status.code(), Some(243), "{}", text(&out.stderr));
    let doc = json(&out);
    assert_eq!(
        (&doc["verdict"], &doc["reason_code"]),
        (&"conflict".into(), &"host_changed".into()),
        "{doc}"
    );
    assert_eq!(event_count(&env, "moved-1"), before);
    // gc holds the host to the key of the newest operation the ledger has on it.
    std::fs::create_dir_all(on_b.parent().unwrap()).unwrap();
    std::fs::create_dir(&on_b).unwrap();
    std::fs::write(on_b.join("fenced"), "fenced_at=86400\n").unwrap();
    let out =
        output(
            env.opmark()
                .arg("-F")
                .arg(&to_b)
                .args(["gc", "target1", "--older-than", "3650d"]),
        );
    assert_eq!(out.status.code(), Some(243), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("host changed: host key for target1 is now"),
        "{}",
        text(&out.stderr)
    );
    assert!(on_b.join("fenced").exists(), "gc removed a marker on B");
    std::fs::remove_dir_all(&on_b).unwrap();
    assert!(!on_b.exists(), "resolve or probe touched B");

    // A rerun through B is refused before anything is sent (docs/guarantees.md#evidence-identity: conflict).
    let out = output(env.opmark().arg("-F").arg(&to_b).args([
        "--json", "run", "target1", "--op", "moved-1", "--", &command,
    ]));
    let doc = json(&out);
    assert_eq!(doc["verdict"], "conflict", "{doc}");
    assert_eq!(doc["reason_code"], "host_changed", "{doc}");
    assert_eq!(doc["retryable"], false);
    assert_eq!(doc["attempts"][0]["boundary"], "not_sent", "{doc}");
    assert!(!on_b.exists(), "run claimed on B");
    let list = json(&output(env.opmark().args([
        "--json",
        "list",
        "--unresolved",
    ])));
    assert_eq!(list["operations"].as_array().unwrap().len(), 1, "{list}");

    // Without the override, reconcile goes the recorded way, to A, and settles there.
    let out = output(env.opmark().args(["--json", "reconcile"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(marker(&lab, "target1", "moved-1").exists());
    assert!(!on_b.exists());
}

#[test]
fn reconcile_reaches_an_op_made_with_identity_and_port_flags_without_them() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let a = lab.target("target1").unwrap().clone();
    // An alias that knows the address and the known_hosts, but neither port nor key.
    let bare = env.root.join("ssh_config");
    std::fs::write(
        &bare,
        format!(
            "Host box\n  HostName {}\n  User {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            a.addr,
            a.user,
            lab.known_hosts().display()
        ),
    )
    .unwrap();
    let port = a.port.to_string();
    let crashed = output(
        env.opmark()
            .arg("-F")
            .arg(&bare)
            .env("OPMARK_FAULT", "after_started")
            .args(["--json", "run", "box", "-p", &port, "-i"])
            .arg(lab.client_key())
            .args(["--op", "flagged-1", "--", "echo hi; exit 4"]),
    );
    assert_eq!(crashed.status.code(), None, "killed by its fault point");
    let exit_record = marker(&lab, "target1", "flagged-1").join("exit");
    wait_for("the exit record", Duration::from_secs(15), || {
        exit_record.exists()
    });

    // No -F, no -p, no -i: the ledger knows the way.
    let out = output(env.opmark().args(["--json", "reconcile"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let doc = json(&out);
    assert_eq!(doc["operations"][0]["decision"], "completed", "{doc}");
    assert_eq!(doc["operations"][0]["exit_code"], 4);

    // show names the route and the key each attempt saw; no key material.
    let doc = json(&output(env.opmark().args(["--json", "show", "flagged-1"])));
    let attempt = &doc["attempts"][0];
    assert_eq!(attempt["route"]["port"], a.port, "{doc}");
    assert_eq!(attempt["route"]["alias"], "box");
    assert_eq!(
        attempt["route"]["identities"][0],
        lab.client_key().display().to_string()
    );
    assert_eq!(
        attempt["route"]["config"],
        bare.display().to_string(),
        "{doc}"
    );
    assert!(attempt["host_key"].as_str().unwrap().starts_with("SHA256:"));
    let page = text(&output(env.opmark().args(["show", "flagged-1"])).stdout);
    assert!(
        page.contains(&format!("reached {}@{}:{}", a.user, a.addr, a.port)),
        "{page}"
    );
    assert!(page.contains("host key SHA256:"), "{page}");
    let key = std::fs::read_to_string(lab.client_key()).unwrap();
    let ledger = std::fs::read(&env.ledger).unwrap();
    let body = key
        .lines()
        .nth(1)
        .expect("a private key body line")
        .as_bytes();
    assert!(
        !ledger.windows(body.len()).any(|w| w == body),
        "key material in the ledger"
    );
}

/// `opmark --json gc target1 ARGS...`, its JSON document.
fn gc_json(env: &Sealed, lab: &Lab, args: &[&str]) -> Value {
    let out = output(
        env.opmark_with_lab(lab)
            .args(["--json", "gc", "target1"])
            .args(args),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    json(&out)
}

/// `(op, action)` of each entry a gc document lists.
fn gc_actions(doc: &Value) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = doc["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap().to_owned(),
                r["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    all.sort();
    all
}

#[test]
fn gc_after_a_detached_run_completed_unsettled_then_a_rerun_replays_and_never_runs_twice() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = support::fresh_dir(crate::test_name!()).join("count");
    let cmd = format!("echo ran; echo x >> {}", count.display());
    // Issue 24 row 1: `run --detach` completes on the host, the ledger never hears of it.
    let out = output(env.opmark_with_lab(&lab).args([
        "--json", "run", "target1", "--op", "det-1", "--detach", "--", &cmd,
    ]));
    assert_eq!(
        json(&out)["verdict"],
        "in_progress",
        "{}",
        text(&out.stderr)
    );
    let m = marker(&lab, "target1", "det-1");
    wait_for("the exit record", Duration::from_secs(15), || {
        m.join("exit").exists()
    });
    // Past every retention.
    age_record(&m.join("exit"), "ended_at");

    let doc = gc_json(&env, &lab, &["--older-than", "3650d"]);
    let settled = doc["settled_first"].as_array().unwrap();
    assert_eq!(settled.len(), 1, "{doc}");
    assert_eq!(settled[0]["op_id"], "det-1", "{doc}");
    assert_eq!(settled[0]["exit_code"], 0, "{doc}");
    assert_eq!(
        gc_actions(&doc),
        [("det-1".to_owned(), "collected".to_owned())],
        "{doc}"
    );
    assert!(!m.join("out").exists(), "the output was collected");
    // Another ledger sharing the host (a colleague's, a CI runner's) never heard of the
    // run: only what gc left on the host keeps its rerun from running the command again.
    let stranger = Sealed::new("gc-detached-stranger");
    let (_, theirs) = run_op(&stranger, &lab, "det-1", &cmd);
    assert_eq!(lines(&count), 1, "ran again after gc: {theirs}");
    assert_eq!(
        (theirs["verdict"].as_str(), theirs["exit_code"].as_i64()),
        (Some("replayed"), Some(0)),
        "{theirs}"
    );

    let (code, again) = run_op(&env, &lab, "det-1", &cmd);
    assert_eq!(code, Some(0), "{again}");
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(again["exit_code"], 0, "{again}");
    assert_eq!(again["output_collected"], true, "{again}");
    assert_eq!(again["stdout"], "", "{again}");
    assert_eq!(again["output_available"], false, "{again}");
    assert!(
        again["reason"]
            .as_str()
            .unwrap()
            .contains("output was collected"),
        "{again}"
    );
    assert_eq!(lines(&count), 1, "ran once");
    // `show` keeps the first execution: the attempt that ran, and nothing after it that
    // got past `refused` (the rerun is answered from evidence).
    let shown = json(&output(env.opmark().args(["--json", "show", "det-1"])));
    let attempts = shown["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["boundary"], "started", "{shown}");
    assert_eq!(attempts[0]["reason"], "first_attempt", "{shown}");
    assert!(
        attempts[1..].iter().all(|a| a["boundary"] == "refused"),
        "{shown}"
    );
    let probe = json(&output(
        env.opmark_with_lab(&lab)
            .args(["--json", "probe", "target1", "det-1"]),
    ));
    assert_eq!(probe["marker_state"], "completed", "{probe}");
    assert_eq!(probe["output_collected"], true, "{probe}");
}

#[test]
fn tombstones_alone_stop_a_rerun_survive_gc_and_go_only_with_tombstones_older_than() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let count = dir.join("count");
    let cmd = format!("echo x >> {}; exit 4", count.display());
    let (_, first) = run_op(&env, &lab, "tomb-1", &cmd);
    assert_eq!(first["verdict"], "completed", "{first}");
    let m = marker(&lab, "target1", "tomb-1");
    age_record(&m.join("exit"), "ended_at");
    // The shim's own gc, without `opmark gc` settling anything first: the tombstone alone
    // must hold. A second ledger that never saw the run then reruns it.
    let gc = support::ssh_shim(
        &lab,
        "target1",
        &Verb::Gc {
            older_than: Duration::from_secs(3650 * 86_400),
            dry_run: false,
            tombstones_older_than: None,
        },
    );
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(m.join("claim").exists() && !m.join("out").exists());
    let stranger = Sealed::new("tombstones-stranger");
    let (code, again) = run_op(&stranger, &lab, "tomb-1", &cmd);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(
        (code, again["exit_code"].as_i64()),
        (Some(4), Some(4)),
        "{again}"
    );
    assert_eq!(again["output_collected"], true, "{again}");
    assert_eq!(lines(&count), 1, "never ran twice");

    // Failed-start leftovers and cached shims of other versions, long past retention.
    let root = lab.target("target1").unwrap().marker_root();
    let leftover = root.join("superseded/lost-1.100.at-x.failed-start");
    std::fs::create_dir_all(&leftover).unwrap();
    let old_shim = root.join("shim").join(format!("{}.sh", "0".repeat(64)));
    std::fs::create_dir_all(old_shim.parent().unwrap()).unwrap();
    std::fs::write(&old_shim, "# an older shim\n").unwrap();
    // Another version's cached shim that a live resident still runs from (as `sh FILE
    // FILE c=TOKEN serve`; here a process that names it the same way).
    let in_use = root.join("shim").join(format!("{}.sh", "1".repeat(64)));
    std::fs::write(&in_use, "# an older shim a resident still uses\n").unwrap();
    let resident = Killed(
        Command::new("sh")
            .arg("-c")
            .arg("while :; do sleep 1; done")
            .arg(&in_use)
            .arg(&in_use)
            .arg("serve")
            .spawn()
            .unwrap(),
    );
    let cached: Vec<PathBuf> = std::fs::read_dir(root.join("shim"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| *p != old_shim && *p != in_use)
        .collect();
    // A put's partial content nobody resumed, and one a put may still resume.
    let spool = root.join("spool");
    let (stale_upload, fresh_upload) =
        (spool.join("put-gone.at-x.1"), spool.join("put-live.at-y.2"));
    std::fs::write(&stale_upload, "half").unwrap();
    std::fs::write(&fresh_upload, "half").unwrap();
    for p in [&leftover, &old_shim, &in_use, &stale_upload] {
        let st = Command::new("touch")
            .args(["-d", "2000-01-01"])
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    }

    // A later gc keeps the tombstone, reclaims the leftovers, never the shim it runs.
    let doc = gc_json(&env, &lab, &["--older-than", "3650d"]);
    let actions = gc_actions(&doc);
    assert!(
        actions.contains(&(
            "lost-1.100.at-x.failed-start".to_owned(),
            "failed_start_reclaimed".to_owned()
        )),
        "{doc}"
    );
    assert!(
        actions.contains(&(
            format!("{}.sh", "0".repeat(64)),
            "shim_reclaimed".to_owned()
        )),
        "{doc}"
    );
    assert!(
        actions.contains(&("put-gone.at-x.1".to_owned(), "spool_reclaimed".to_owned())),
        "{doc}"
    );
    assert!(!stale_upload.exists() && fresh_upload.exists(), "{doc}");
    assert!(!actions.iter().any(|(op, _)| op == "tomb-1"), "{doc}");
    assert!(!leftover.exists() && !old_shim.exists());
    assert!(
        in_use.exists() && !doc.to_string().contains(&"1".repeat(64)),
        "a shim a live resident runs from is never reclaimed: {doc}"
    );
    // Once no resident runs from it, it goes like any other version's.
    drop(resident);
    assert!(cached.iter().all(|p| p.exists()), "the current shim stays");
    assert_eq!(probe_state(&env, &lab, "tomb-1"), "completed");

    // Shorter than policy: refused like --older-than.
    let out = output(env.opmark_with_lab(&lab).args([
        "gc",
        "target1",
        "--older-than",
        "3650d",
        "--tombstones-older-than",
        "1s",
    ]));
    assert_eq!(out.status.code(), Some(245), "{}", text(&out.stderr));
    assert!(m.exists());

    let doc = gc_json(
        &env,
        &lab,
        &["--older-than", "3650d", "--tombstones-older-than", "3650d"],
    );
    assert_eq!(
        gc_actions(&doc),
        [
            (
                format!("{}.sh", "1".repeat(64)),
                "shim_reclaimed".to_owned()
            ),
            ("tomb-1".to_owned(), "tombstone_removed".to_owned())
        ],
        "{doc}"
    );
    assert!(!m.exists(), "the tombstone went");
    // The ledger that saw the run still holds its exit: replayed, not run.
    let (_, after) = run_op(&env, &lab, "tomb-1", &cmd);
    assert_eq!(after["verdict"], "replayed", "{after}");
    assert_eq!(lines(&count), 1, "never ran twice");
}

#[test]
fn reconcile_limit_contacts_the_newest_and_counts_the_rest_for_next_time() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    // Two operations still running: unresolved, and left so by a reconcile.
    for op in ["lim-old", "lim-new"] {
        let command = format!("sleep 30; : {op}");
        let out = output(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", op, "--detach", "--", &command,
        ]));
        assert_eq!(
            json(&out)["verdict"],
            "in_progress",
            "{}",
            text(&out.stdout)
        );
    }
    let out = output(
        env.opmark_with_lab(&lab)
            .args(["--json", "reconcile", "--limit", "1"]),
    );
    let doc = json(&out);
    assert_eq!(out.status.code(), Some(1), "{doc}");
    let contacted: Vec<&str> = doc["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op_id"].as_str().unwrap())
        .collect();
    assert_eq!(contacted, ["lim-new"], "the most recently active: {doc}");
    assert_eq!(doc["not_contacted_count"], 1, "{doc}");
    assert!(
        text(&out.stderr).is_empty(),
        "JSON says it, stderr stays quiet"
    );
    // The text form says what was left and how to get it.
    let out = output(
        env.opmark_with_lab(&lab)
            .args(["reconcile", "--limit", "1"]),
    );
    assert!(
        text(&out.stderr).contains("1 more unresolved operation not contacted (--limit)"),
        "{}",
        text(&out.stderr)
    );
    let all = json(&output(
        env.opmark_with_lab(&lab).args(["--json", "reconcile"]),
    ));
    assert_eq!(all["operations"].as_array().unwrap().len(), 2, "{all}");
    assert_eq!(all["not_contacted_count"], 0, "{all}");
    for op in ["lim-old", "lim-new"] {
        output(env.opmark_with_lab(&lab).args(["cancel", "target1", op]));
    }
}

/// A child process killed (and reaped) when the test is done with it, panics included.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
