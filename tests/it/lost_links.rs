//! What a caller is told when the link to the host goes: a command-line `--wait` bounds
//! the whole invocation (a cut used to cost the keepalive budget and a whole probe window
//! on top of it), and a cut is reported as the silence it is, with word while the probe
//! waits (it used to blame a healthy connection keeper, then say nothing for 30 s).

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, answer, Lab, Sealed};

/// A command that prints `started`, then waits for `gate` to exist and exits 4: it runs
/// as long as the test wants, whatever the machine's load.
fn gated(gate: &std::path::Path) -> String {
    format!(
        "echo started; while [ ! -e {} ]; do sleep 0.05; done; exit 4",
        gate.display()
    )
}

fn spawn_run_through(
    env: &Sealed,
    lab: &Lab,
    cfg: Option<&std::path::Path>,
    args: &[&str],
) -> Child {
    let mut cmd = match cfg {
        Some(cfg) => {
            let mut cmd = env.opmark();
            cmd.arg("-F").arg(cfg);
            cmd
        }
        None => env.opmark_with_lab(lab),
    };
    cmd.arg("--json")
        .arg("run")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_wait_of_5s_answers_within_the_budget_and_the_last_look_after_a_silent_cut() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/cut-5s");
    let gate = dir.join("gate");
    // The lab's own keepalives (8 s to notice a dead link) outlast the budget: the
    // budget, not the keepalives, must end this run.
    let begun = Instant::now();
    let child = spawn_run_through(
        &env,
        &lab,
        None,
        &[
            "target1",
            "--op",
            "cut-5s",
            "--wait",
            "5s",
            "--",
            &gated(&gate),
        ],
    );
    support::wait_for("the command to start", Duration::from_secs(20), || {
        marker.join("started").exists()
    });
    lab.cut("target1").unwrap();
    // The budget, plus the last look's bound (3 s), plus room for a loaded machine to
    // start and stop a process; before the fix this took 14 s (keepalives, then a whole
    // probe window).
    let bound = Duration::from_secs(5 + 3 + 3);
    let left = bound.saturating_sub(begun.elapsed());
    let a = answer(support::finish_within(
        child,
        left,
        "run --wait 5s over a cut link",
    ));
    assert_eq!(a.verdict(), "indeterminate", "no claim without word: {a:?}");
    assert_eq!(a.code(), ("unreachable_after_dispatch", true), "{a:?}");
    assert!(a.stderr.contains("one last look"), "{a:?}");
    assert!(
        a.json["reason"]
            .as_str()
            .is_some_and(|m| m.contains("may have run")),
        "{a:?}"
    );

    // The command ran on: once the link is back, the same op id replays its exit.
    std::fs::write(&gate, "").unwrap();
    lab.restore("target1").unwrap();
    support::wait_for("the exit record", Duration::from_secs(20), || {
        marker.join("exit").exists()
    });
    let again = support::run_json(
        &env,
        &lab,
        &["target1", "--op", "cut-5s", "--", &gated(&gate)],
    );
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!(again.exit_code(), Some(4), "{again:?}");
}

#[test]
fn a_wait_spent_on_a_live_link_answers_in_progress_and_the_command_runs_on() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let gate = dir.join("gate");
    let a = support::run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "long-1",
            "--wait",
            "2s",
            "--",
            &gated(&gate),
        ],
    );
    assert_eq!(a.verdict(), "in_progress", "{a:?}");
    assert_eq!(a.code(), ("wait_budget_spent", true), "{a:?}");
    assert_eq!(a.status, 240, "{a:?}");
    assert_eq!(a.stdout(), "started\n", "what it printed so far: {a:?}");
    let said = a.json["reason"].as_str().unwrap_or_default();
    assert!(said.contains("keeps running"), "{a:?}");
    // The last look found it running and recorded so.
    let shown = support::json(
        &env.opmark()
            .args(["--json", "show", "long-1"])
            .output()
            .unwrap(),
    );
    assert!(
        shown.to_string().contains("marker running"),
        "the look is evidence: {shown:#}"
    );

    std::fs::write(&gate, "").unwrap();
    let again = support::run_json(
        &env,
        &lab,
        &["target1", "--op", "long-1", "--", &gated(&gate)],
    );
    assert_eq!(again.exit_code(), Some(4), "{again:?}");
    assert_eq!(again.stdout(), "started\n", "every byte once: {again:?}");
}

#[test]
fn a_wait_of_0s_looks_once_at_an_earlier_run_and_never_cuts_a_command_of_its_own() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let gate = dir.join("gate");
    let opener = format!("sleep 1; touch {}", gate.display());
    let mut opens = std::process::Command::new("sh")
        .args(["-c", &opener])
        .spawn()
        .unwrap();
    let a = support::run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "zero-1",
            "--wait",
            "0s",
            "--",
            &gated(&gate),
        ],
    );
    opens.wait().unwrap();
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.exit_code(), Some(4), "{a:?}");
}

#[test]
fn a_cut_through_the_keeper_is_reported_as_silence_with_word_while_the_probe_waits() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let cfg = support::fast_loss_config(&lab, &dir);
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/kept-1");
    let gate = dir.join("gate");
    let mut cmd = env.opmark();
    let mut child = cmd
        .env("OPMARK_PERSIST", "5m")
        .arg("-F")
        .arg(&cfg)
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            "kept-1",
            "--",
            &gated(&gate),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = support::StderrLines::of(&mut child);
    support::wait_for("the command to start", Duration::from_secs(20), || {
        if let Ok(Some(status)) = child.try_wait() {
            std::thread::sleep(Duration::from_millis(200));
            panic!("the run ended early ({status}): {}", said.so_far());
        }
        marker.join("started").exists()
    });
    assert!(env.keeper_pid().is_some(), "the run went through a keeper");
    lab.cut("target1").unwrap();
    let lost = said.wait_for("lost after dispatch", Duration::from_secs(30));
    assert!(
        lost.contains("no word from") || lost.contains("keepalive timeout"),
        "the loss is named as the silence observed: {lost}"
    );
    assert!(
        !lost.contains("did not answer") && !lost.contains("stopped or hung"),
        "a healthy keeper is not blamed: {lost}"
    );
    // While the host stays cut, the client keeps saying what it waits for.
    let waiting = said.wait_for("s left", Duration::from_secs(15));
    assert!(waiting.contains("target1"), "{waiting}");

    lab.restore("target1").unwrap();
    std::fs::write(&gate, "").unwrap();
    let out = support::finish_within(child, Duration::from_secs(60), "run after the restore");
    let a = answer(std::process::Output {
        stderr: said.all().into_bytes(),
        ..out
    });
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.exit_code(), Some(4), "{a:?}");
}
