//! Interruptions of `opmark run` and `opmark cancel` end to end (docs/guarantees.md#interruptions-and-cancel): the
//! real binary against real sshd targets, signals sent to the real process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{self, fresh_dir, lines, listed, probe_state, show, text, Sealed};

/// A spawned `opmark run` whose stderr is read line by line as it comes (a test waits
/// for a line before acting), stdout kept whole.
struct Running {
    /// Taken by `finish`; killed on drop otherwise (a failed test leaves no process).
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(env: &Sealed, lab: &Lab, args: &[&str]) -> Running {
        let mut child = env
            .opmark_with_lab(lab)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child: Some(child),
            lines,
            seen: Vec::new(),
        }
    }

    fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child().id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{sig}");
    }

    /// Waits until the process catches signal number `num` (its handler is installed:
    /// before that the default action would kill it). Read from /proc's SigCgt mask.
    fn wait_until_catching(&self, name: &str, num: u32) {
        let status = format!("/proc/{}/status", self.child().id());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let caught = std::fs::read_to_string(&status)
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("SigCgt:"))
                        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                })
                .is_some_and(|mask| mask & (1 << (num - 1)) != 0);
            if caught {
                return;
            }
            assert!(Instant::now() < deadline, "SIG{name} is never caught");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (with a deadline) for a stderr line containing `needle`.
    fn wait_for_line(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.seen.iter().any(|l| l.contains(needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no stderr line with `{needle}`; seen: {:#?}", self.seen),
            }
        }
    }

    /// Waits up to `limit` for the process to end; `None` if it is still running.
    fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the end; the exit code, stdout and every stderr line.
    fn finish(mut self) -> (Option<i32>, String, String) {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        (out.status.code(), text(&out.stdout), self.seen.join("\n"))
    }
}

impl Running {
    fn child(&self) -> &Child {
        self.child.as_ref().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn stdout_json(stdout: &str) -> Value {
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"))
}

fn output_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

fn target1_marker(lab: &Lab, op: &str) -> PathBuf {
    lab.target("target1")
        .unwrap()
        .marker_root()
        .join("ops")
        .join(op)
}

/// Waits until the client has recorded the shim's claim acknowledgement (boundary
/// `started`): the host's start gate can be seen a moment before the client hears of it.
fn wait_until_client_saw_started(env: &Sealed, op: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // Not recorded at all yet is fine too: `show` fails until the intent is in.
    let page = |op: &str| text(&env.opmark().args(["show", op]).output().unwrap().stdout);
    while !page(op).contains("boundary started") {
        assert!(Instant::now() < deadline, "{op}: started never recorded");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn record(lab: &Lab, op: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(target1_marker(lab, op).join("exit")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
}

fn cancel(env: &Sealed, lab: &Lab, op: &str, grace: &str) -> (Value, Option<i32>) {
    let out = env
        .opmark_with_lab(lab)
        .args(["--json", "cancel", "target1", op, "--grace", grace])
        .output()
        .unwrap();
    (output_json(&out), out.status.code())
}

fn run_on_target1(env: &Sealed, lab: &Lab, op: &str, cmd: &str) -> (Value, Option<i32>) {
    let out = env
        .opmark_with_lab(lab)
        .args(["--json", "run", "target1", "--op", op, "--", cmd])
        .output()
        .unwrap();
    (output_json(&out), out.status.code())
}

#[test]
fn sigint_leaves_the_command_running_and_says_how_to_follow_or_cancel_it() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("sigint");
    let dir = fresh_dir("sigint");
    let (gate, done) = (dir.join("gate"), dir.join("done"));
    // Waits for the test's word rather than a fixed sleep, so "still running when the
    // client left" holds on any machine.
    let cmd = format!(
        "while [ ! -e {} ]; do sleep 0.1; done; echo done >> {}",
        gate.display(),
        done.display()
    );
    let run = Running::start(&env, &lab, &["run", "target1", "--op", "int-1", "--", &cmd]);
    wait_until_client_saw_started(&env, "int-1");
    run.signal("INT");
    let (code, _, stderr) = run.finish();
    assert_eq!(code, Some(130), "{stderr}");
    assert!(!done.exists(), "the command was still waiting");
    for needle in [
        "int-1",
        "keeps running on the host",
        "`opmark run` with op id int-1 follows or replays it",
        "`opmark cancel target1 int-1` stops it",
    ] {
        assert!(stderr.contains(needle), "`{needle}` missing in: {stderr}");
    }
    assert!(
        show(&env, "int-1").contains("client interrupted by SIGINT at boundary started"),
        "{}",
        show(&env, "int-1")
    );

    // Detached by design: the command finishes without its client.
    std::fs::write(&gate, "").unwrap();
    wait_for_file(&done);
    let (again, code) = run_on_target1(&env, &lab, "int-1", &cmd);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(code, Some(0), "{again}");
    assert_eq!(lines(&done), 1, "ran once");
}

#[test]
fn sigterm_prints_the_json_document_first_with_in_progress() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("sigterm");
    let run = Running::start(
        &env,
        &lab,
        &[
            "--json", "run", "target1", "--op", "term-1", "--", "sleep 60",
        ],
    );
    wait_until_client_saw_started(&env, "term-1");
    run.signal("TERM");
    let (code, stdout, stderr) = run.finish();
    assert_eq!(code, Some(143), "{stderr}");
    let doc = stdout_json(&stdout);
    assert_eq!(doc["verdict"], "in_progress", "{doc}");
    assert_eq!(doc["reason_code"], "client_interrupted", "{doc}");
    assert_eq!(doc["retryable"], true, "{doc}");
    assert_eq!(doc["attempts"][0]["boundary"], "started", "{doc}");
    assert!(stderr.contains("term-1"), "{stderr}");
    let row = listed(&env, "term-1");
    assert_eq!(row["unresolved"], true, "still running: {row}");

    let (cancelled, code) = cancel(&env, &lab, "term-1", "5s");
    assert_eq!(code, Some(0), "{cancelled}");
    assert_eq!(cancelled["cancel_outcome"], "cancelled", "{cancelled}");
}

#[test]
fn sighup_exits_129_and_leaves_the_command_running() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("sighup");
    let run = Running::start(
        &env,
        &lab,
        &["run", "target1", "--op", "hup-1", "--", "sleep 60"],
    );
    wait_until_client_saw_started(&env, "hup-1");
    run.signal("HUP");
    let (code, _, stderr) = run.finish();
    assert_eq!(code, Some(129), "{stderr}");
    let probe = env
        .opmark_with_lab(&lab)
        .args(["probe", "target1", "hup-1"])
        .output()
        .unwrap();
    assert!(
        text(&probe.stdout).starts_with("running"),
        "{}",
        text(&probe.stdout)
    );
    let (cancelled, _) = cancel(&env, &lab, "hup-1", "5s");
    assert_eq!(cancelled["cancel_outcome"], "cancelled", "{cancelled}");
}

/// Holds the ledger's write lock, as a busy concurrent writer would.
fn lock_ledger(env: &Sealed) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(&env.ledger).unwrap();
    conn.busy_timeout(Duration::from_secs(20)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    conn
}

fn warm_up_ledger(env: &Sealed, lab: &Lab) {
    let (doc, _) = run_on_target1(env, lab, "warm-up", "true");
    assert_eq!(doc["verdict"], "completed", "{doc}");
}

#[test]
fn a_second_sigint_exits_at_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("double-int");
    warm_up_ledger(&env, &lab);
    let mut run = Running::start(
        &env,
        &lab,
        &["run", "target1", "--op", "twice", "--", "sleep 60"],
    );
    // Once `started` is recorded, the run's only pending write is the interruption.
    wait_until_client_saw_started(&env, "twice");
    // Recording the first SIGINT now waits on the ledger; only a second one can end it.
    let lock = lock_ledger(&env);
    run.signal("INT");
    run.wait_for_line("SIGINT again exits at once");
    run.signal("INT");
    let status = run.exited_within(Duration::from_secs(15));
    drop(lock);
    let status = status.expect("the second SIGINT did not end the run while the ledger was busy");
    assert_eq!(status.code(), Some(130));
    let (_, _, stderr) = run.finish();
    assert!(stderr.contains("SIGINT again: exiting at once"), "{stderr}");
    assert!(stderr.contains("twice"), "names the op: {stderr}");
    let (cancelled, _) = cancel(&env, &lab, "twice", "5s");
    assert_eq!(cancelled["cancel_outcome"], "cancelled", "{cancelled}");
}

#[test]
fn sigint_before_dispatch_sends_nothing() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("before-dispatch");
    let fx = fresh_dir("before-dispatch").join("effect");
    warm_up_ledger(&env, &lab);
    // The intent and attempt are recorded before dispatch: with the ledger busy, the run
    // is held before anything can leave.
    let lock = lock_ledger(&env);
    let cmd = format!("echo ran >> {}", fx.display());
    let op = "early";
    let mut run = Running::start(
        &env,
        &lab,
        &["--json", "run", "target1", "--op", op, "--", &cmd],
    );
    run.wait_until_catching("INT", 2);
    run.signal("INT");
    run.wait_for_line("recording how far the operation got");
    drop(lock);
    let (code, stdout, stderr) = run.finish();
    assert_eq!(code, Some(130), "{stderr}");
    let doc = stdout_json(&stdout);
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert_eq!(doc["reason_code"], "client_interrupted", "{doc}");
    assert!(
        doc["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["boundary"] == "not_sent"),
        "{doc}"
    );
    assert!(
        !target1_marker(&lab, op).exists(),
        "nothing reached the host"
    );
    assert!(!fx.exists());
    // Nothing of it can run later either: the op id is free, and a rerun runs it once.
    let (again, code) = run_on_target1(&env, &lab, op, &cmd);
    assert_eq!(again["verdict"], "completed", "{again}");
    assert_eq!(code, Some(0));
    assert_eq!(lines(&fx), 1);
}

#[test]
fn cancel_stops_a_running_command_and_it_never_runs_again() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-running");
    let fx = fresh_dir("cancel-running").join("effect");
    let cmd = format!("echo ran >> {}; sleep 60", fx.display());
    let run = Running::start(&env, &lab, &["run", "target1", "--op", "c-1", "--", &cmd]);
    wait_until_client_saw_started(&env, "c-1");
    run.signal("INT");
    let (code, _, stderr) = run.finish();
    assert_eq!(code, Some(130), "{stderr}");

    let (doc, code) = cancel(&env, &lab, "c-1", "5s");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["schema"], "opmark/2", "{doc}");
    assert_eq!(doc["cancel_outcome"], "cancelled", "{doc}");
    assert_eq!(doc["marker_state"], "completed", "{doc}");
    assert_eq!(doc["exit_code"], 143, "TERM under the host's sh: {doc}");
    assert_eq!(doc["cancelled"], true, "{doc}");
    assert_eq!(record(&lab, "c-1", "cancelled").as_deref(), Some("1"));
    let row = listed(&env, "c-1");
    assert_eq!(row["state"], "cancelled", "{row}");
    assert_eq!(row["unresolved"], false, "the exit is known: {row}");
    let page = show(&env, "c-1");
    assert!(page.contains("cancel by"), "{page}");
    assert!(page.contains("cancelled, exit 143"), "{page}");

    let (again, code) = run_on_target1(&env, &lab, "c-1", &cmd);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(again["exit_code"], 143, "{again}");
    assert_eq!(code, Some(143));
    assert!(
        again["reason"].as_str().unwrap().contains("opmark cancel"),
        "{again}"
    );
    assert_eq!(lines(&fx), 1, "nothing re-ran");
}

#[test]
fn a_following_run_reports_the_cancelled_status_as_its_own() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-followed");
    // The command itself is up (not just its supervisor) before the TERM goes out.
    let ready = fresh_dir("cancel-followed").join("ready");
    let cmd = format!("touch {}; sleep 60", ready.display());
    let run = Running::start(
        &env,
        &lab,
        &["--json", "run", "target1", "--op", "followed", "--", &cmd],
    );
    wait_for_file(&ready);
    let (doc, _) = cancel(&env, &lab, "followed", "5s");
    assert_eq!(doc["cancel_outcome"], "cancelled", "{doc}");
    let (code, stdout, stderr) = run.finish();
    let answer = stdout_json(&stdout);
    assert_eq!(answer["verdict"], "completed", "{answer} {stderr}");
    assert_eq!(answer["exit_code"], 143, "{answer}");
    assert_eq!(code, Some(143));
}

#[test]
fn a_command_that_ignores_term_is_killed_after_the_grace() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-stubborn");
    // Ready only once TERM is ignored, so the cancel can never beat the trap.
    let ready = fresh_dir("cancel-stubborn").join("ready");
    let cmd = format!("trap '' TERM; touch {}; sleep 60", ready.display());
    let run = Running::start(
        &env,
        &lab,
        &["--json", "run", "target1", "--op", "stubborn", "--", &cmd],
    );
    wait_for_file(&ready);
    let (doc, code) = cancel(&env, &lab, "stubborn", "1s");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["cancel_outcome"], "cancelled", "{doc}");
    assert_eq!(doc["exit_code"], 137, "KILL after the grace: {doc}");
    assert_eq!(doc["grace_ms"], 1000, "{doc}");
    assert_eq!(record(&lab, "stubborn", "timed_out").as_deref(), Some("0"));
    let (_, stdout, _) = run.finish();
    assert_eq!(stdout_json(&stdout)["exit_code"], 137);
}

#[test]
fn cancel_of_an_absent_op_fences_it_so_a_later_run_is_not_applied() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-absent");
    let fx = fresh_dir("cancel-absent").join("effect");
    let command = format!("echo ran >> {}", fx.display());
    // The ledger knows the op (its attempt left, no answer came); the host has no marker.
    crate::operators::record_lost_dispatch(&env, "target1", "ghost", &command, true);
    let (doc, code) = cancel(&env, &lab, "ghost", "1s");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["cancel_outcome"], "fenced", "{doc}");
    assert_eq!(doc["was"], "absent", "{doc}");
    assert_eq!(doc["marker_state"], "fenced", "{doc}");
    // The delayed original arrives after the cancel: it cannot run.
    let (late, code) = run_on_target1(&env, &lab, "ghost", &command);
    assert_eq!(late["verdict"], "not_applied", "{late}");
    assert_eq!(late["reason_code"], "fenced", "{late}");
    assert_eq!(code, Some(241));
    assert!(!fx.exists(), "nothing ran");
    assert!(show(&env, "ghost").contains("fenced:absent"));
}

/// docs/guarantees.md#interruptions-and-cancel: a cancel of an op id this ledger does not know (a typo, say) sends
/// nothing without --force, with an error naming the fix; the op id stays free on the
/// host. With --force it is cancelled (fenced, being absent).
#[test]
fn cancel_of_an_op_id_the_ledger_does_not_know_needs_force_and_fences_only_with_it() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-unknown");
    let (first, _) = run_on_target1(&env, &lab, "deploy-42", "true");
    assert_eq!(first["verdict"], "completed", "{first}");
    // A typo of a known op id, and one recorded only on another host.
    for (op, needle) in [
        ("deploy-24", "no operation `deploy-24` is in the ledger"),
        ("elsewhere", "is not recorded on `target1`"),
    ] {
        if op == "elsewhere" {
            crate::operators::record_lost_dispatch(&env, "target9", op, "true", true);
        }
        let out = env
            .opmark_with_lab(&lab)
            .args(["cancel", "target1", op])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(245), "{op}: {err}");
        assert!(err.contains(needle), "{op}: {err}");
        assert!(err.contains("Nothing was sent"), "{err}");
        assert!(
            err.contains(&format!("opmark cancel target1 {op} --force")),
            "{err}"
        );
        assert!(
            !target1_marker(&lab, op).exists(),
            "{op}: nothing reached the host"
        );
        assert_eq!(probe_state(&env, &lab, op), "absent", "{op}");
    }
    let out = env
        .opmark_with_lab(&lab)
        .args(["--json", "cancel", "target1", "deploy-24", "--force"])
        .output()
        .unwrap();
    let doc = output_json(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(doc["cancel_outcome"], "fenced", "{doc}");
    assert_eq!(doc["was"], "absent", "{doc}");
    assert_eq!(probe_state(&env, &lab, "deploy-24"), "fenced");
}

#[test]
fn cancel_of_a_completed_op_says_so_and_changes_nothing() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-done");
    let (first, _) = run_on_target1(&env, &lab, "done", "exit 3");
    assert_eq!(first["verdict"], "completed", "{first}");
    let before = std::fs::read_to_string(target1_marker(&lab, "done").join("exit")).unwrap();
    let out = env
        .opmark_with_lab(&lab)
        .args(["cancel", "target1", "done"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout)
            .contains("had already completed (exit 3); nothing was signalled, nothing changed"),
        "{}",
        text(&out.stdout)
    );
    let after = std::fs::read_to_string(target1_marker(&lab, "done").join("exit")).unwrap();
    assert_eq!(before, after, "the exit record is untouched");
    assert_eq!(listed(&env, "done")["state"], "completed");
    let (again, code) = run_on_target1(&env, &lab, "done", "exit 3");
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(code, Some(3));
    assert!(show(&env, "done").contains("already_completed"));
}

#[test]
fn cancel_refuses_bad_input_before_sending_anything() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-bad");
    for (args, code, needle) in [
        (vec!["cancel", "target1", "bad op"], 245, "operation id"),
        (
            vec!["cancel", "target1", "op-1", "--grace", "2h"],
            245,
            "1h limit",
        ),
        (
            vec!["cancel", "target1", "op-1", "--grace", "5"],
            2,
            "no unit",
        ),
    ] {
        let out = env.opmark_with_lab(&lab).args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert!(
        !lab.target("target1")
            .unwrap()
            .marker_root()
            .join("ops")
            .join("op-1")
            .exists(),
        "nothing reached the host"
    );
}

/// `opmark --json run target1 --op OP --detach -- CMD`: returns once the host claimed it.
fn detach(env: &Sealed, lab: &Lab, op: &str, cmd: &str) {
    let out = env
        .opmark_with_lab(lab)
        .args([
            "--json", "run", "target1", "--op", op, "--detach", "--", cmd,
        ])
        .output()
        .unwrap();
    assert_eq!(output_json(&out)["verdict"], "in_progress");
}

/// A `KEY=value` of a marker file of `op`.
fn marker_value(lab: &Lab, op: &str, file: &str, key: &str) -> String {
    let text = std::fs::read_to_string(target1_marker(lab, op).join(file)).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} missing in {text}"))
        .to_owned()
}

#[test]
fn a_crashed_ops_pid_reused_by_another_ops_supervisor_is_interrupted_and_cancel_leaves_that_op_alone(
) {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-pid-reuse");
    let dir = fresh_dir("cancel-pid-reuse");
    let (ready, finished) = (dir.join("ready"), dir.join("finished"));
    let live_cmd = format!(
        "touch {}; sleep 3; touch {}",
        ready.display(),
        finished.display()
    );
    detach(&env, &lab, "live-1", &live_cmd);
    wait_for_file(&ready);
    let live_supervisor = marker_value(&lab, "live-1", "proc", "pid");

    // The crashed op: ran once, then its host crashed mid-command (no exit record) and
    // its supervisor's pid now belongs to the live op's supervisor, which leads a
    // session of its own with a later start time: what a pid namespace restarted after
    // a crash hands out. The test forges exactly that record.
    let (done, _) = run_on_target1(&env, &lab, "dead-1", "true");
    assert_eq!(done["verdict"], "completed", "{done}");
    let dead_supervisor = marker_value(&lab, "dead-1", "proc", "pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Path::new(&format!("/proc/{dead_supervisor}")).exists() {
        assert!(Instant::now() < deadline, "the supervisor never exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    std::fs::remove_file(target1_marker(&lab, "dead-1").join("exit")).unwrap();
    std::fs::write(
        target1_marker(&lab, "dead-1").join("proc"),
        format!("pid={live_supervisor}\nstart=1\nboot={}\n", boot.trim()),
    )
    .unwrap();

    let probe = output_json(
        &env.opmark_with_lab(&lab)
            .args(["--json", "probe", "target1", "dead-1"])
            .output()
            .unwrap(),
    );
    assert_eq!(probe["marker_state"], "interrupted", "{probe}");
    let (doc, code) = cancel(&env, &lab, "dead-1", "1s");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["cancel_outcome"], "fenced", "{doc}");
    assert_eq!(doc["was"], "interrupted", "{doc}");

    // The other op was not signalled: a following run sees it end with its own exit.
    let (live, code) = run_on_target1(&env, &lab, "live-1", &live_cmd);
    assert_eq!(live["exit_code"], 0, "{live}");
    assert_eq!(code, Some(0), "{live}");
    assert!(finished.exists(), "the live op's command did its work");
    assert_eq!(record(&lab, "live-1", "cancelled").as_deref(), Some("0"));
}

#[test]
fn a_cancel_racing_natural_completion_never_says_stopped_for_a_command_that_did_its_work() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-race");
    let dir = fresh_dir("cancel-race");
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..10u64 {
        let op = format!("race-{i}");
        let (ready, end) = (dir.join(format!("ready-{i}")), dir.join(format!("end-{i}")));
        let cmd = format!(
            "touch {}; sleep 0.8; touch {}",
            ready.display(),
            end.display()
        );
        detach(&env, &lab, &op, &cmd);
        wait_for_file(&ready);
        // From inside the command's run to past its own end (a cancel takes a connection
        // first): 0 to 900 ms after it is up.
        std::thread::sleep(Duration::from_millis(100 * i));
        let (doc, code) = cancel(&env, &lab, &op, "1s");
        assert_eq!(code, Some(0), "{doc}");
        let outcome = doc["cancel_outcome"].as_str().unwrap().to_owned();
        let message = doc["reason"].as_str().unwrap();
        if outcome == "cancelled" {
            assert!(
                [143, 137].contains(&doc["exit_code"].as_i64().unwrap()),
                "delay {i}: stopped means died of the cancel's signal: {doc}"
            );
            assert!(message.contains("was stopped"), "{doc}");
        } else {
            assert_eq!(outcome, "already_completed", "delay {i}: {doc}");
            assert_eq!(doc["cancelled"], false, "{doc}");
        }
        if end.exists() && doc["exit_code"] == 0 {
            assert_ne!(
                outcome, "cancelled",
                "delay {i}: a command that finished its work was called stopped: {doc}"
            );
            assert!(!message.contains("stopped, exit 0"), "{doc}");
        }
        let kind = if message.contains("ended by itself") {
            "ended_by_itself_while_pending".to_owned()
        } else {
            outcome
        };
        *seen.entry(kind).or_default() += 1;
    }
    eprintln!("cancel race through sshd: {seen:?}");
    assert!(seen.contains_key("cancelled"), "{seen:?}");
}

/// The host crashed under a running command (its supervisor's whole session died, no exit
/// record), and `opmark cancel` then fenced the interrupted marker. The command had
/// started, so the fence closes the op id without settling what it did: every later
/// answer, from this ledger or a fresh one, is `indeterminate`/`fenced_after_start`,
/// never `not_applied` "nothing ran"; reconcile asks a human, and `resolve --as applied`
/// is the way out.
#[test]
fn a_cancel_that_fences_a_crashed_command_that_had_started_leaves_its_outcome_unknown() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cancel-fence-started");
    let dir = fresh_dir("cancel-fence-started");
    let started = dir.join("started");
    let cmd = format!("touch {}; sleep 60", started.display());
    detach(&env, &lab, "crash-1", &cmd);
    wait_for_file(&started);
    let sid = marker_value(&lab, "crash-1", "proc", "pid");
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-s", &sid])
        .status()
        .unwrap();
    assert!(killed.success(), "no process in session {sid}");
    support::wait_for(
        "the crashed op to read interrupted",
        Duration::from_secs(20),
        || probe_state(&env, &lab, "crash-1") == "interrupted",
    );

    let (doc, code) = cancel(&env, &lab, "crash-1", "1s");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["cancel_outcome"], "fenced", "{doc}");
    assert_eq!(doc["was"], "interrupted", "{doc}");

    let fresh = Sealed::new("cancel-fence-started-fresh");
    for (who, env) in [("this ledger", &env), ("a fresh ledger", &fresh)] {
        let (doc, code) = run_on_target1(env, &lab, "crash-1", &cmd);
        assert_eq!(doc["verdict"], "indeterminate", "{who}: {doc}");
        assert_eq!(doc["reason_code"], "fenced_after_start", "{who}: {doc}");
        assert_eq!(doc["retryable"], false, "{who}: {doc}");
        assert_eq!(code, Some(242), "{who}: {doc}");
    }
    let out = env
        .opmark_with_lab(&lab)
        .args(["--json", "reconcile"])
        .output()
        .unwrap();
    let rec = text(&out.stdout);
    assert!(
        rec.contains("crash-1") && rec.contains("interrupted_needs_decision"),
        "{rec}"
    );

    // The operator's word settles it for this ledger.
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "resolve",
            "crash-1",
            "--host",
            "target1",
            "--as",
            "applied",
            "--note",
            "checked the host",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (doc, _) = run_on_target1(&env, &lab, "crash-1", &cmd);
    assert_eq!(doc["verdict"], "replayed", "{doc}");
    assert_eq!(doc["reason_code"], "resolved_applied", "{doc}");
}
