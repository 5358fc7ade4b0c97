//! The resident host session (docs/host-protocol.md#the-resident-session) against real
//! sshd: reused calls go to one long-lived shim on the host instead of a shim per command;
//! that shim killed or stopped mid-command is a lost connection like any other (probe,
//! then decide, one execution); a host whose shim does not serve is called per call.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::{Lab, Target};

use crate::support::{self, answer, finish_within, fresh_dir, lines, wait_for, Answer, Sealed};

/// `opmark -F <config> -vv` with reuse on.
fn opmark_resident(env: &Sealed, config: &Path) -> Command {
    let mut cmd = env.opmark();
    cmd.arg("-F")
        .arg(config)
        .arg("-vv")
        .env("OPMARK_PERSIST", "5m");
    cmd
}

fn run_resident(env: &Sealed, lab: &Lab, op: &str, command: &str) -> Answer {
    run_resident_with(env, lab.ssh_config(), &lab.targets()[0].alias, op, command)
}

fn run_resident_with(env: &Sealed, config: &Path, alias: &str, op: &str, command: &str) -> Answer {
    answer(
        opmark_resident(env, config)
            .args(["--json", "run", alias, "--op", op, "--"])
            .arg(command)
            .output()
            .unwrap(),
    )
}

/// A test's first call, which starts the keeper, made until the keeper carried it; the
/// op id it ran under is returned with it. A caller waits a few seconds for a keeper it
/// started to listen; on a loaded machine (CI runs the whole suite on 2 cores) a new
/// keeper can take longer, and the caller then rightly goes direct ("connection reuse is
/// off for this run"). That fallback is not what these tests are about, so such a call
/// is made again under a new op id (its command ran once, directly, and is settled).
fn first_call(env: &Sealed, config: &Path, alias: &str, op: &str, cmd: &str) -> (Answer, String) {
    const NO_KEEPER: &str = "connection reuse is off for this run";
    for attempt in 0..4 {
        let op = if attempt == 0 {
            op.to_string()
        } else {
            format!("{op}-{attempt}")
        };
        let a = run_resident_with(env, config, alias, &op, cmd);
        if !a.stderr.contains(NO_KEEPER) {
            return (a, op);
        }
        eprintln!(
            "{op} went direct, the keeper was not up in time: {}",
            a.stderr
        );
    }
    panic!("the keeper did not carry any of four first calls to {alias}");
}

/// The pids of the resident shims serving `target` now: `sh FILE FILE c=TOKEN serve`
/// with FILE the cached shim in its marker root (a loopback target's processes are
/// this machine's).
pub(crate) fn residents(target: &Target) -> Vec<i32> {
    let cache = target.state_home.join("opmark").join("shim");
    let cache = cache.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // From the cache (`sh FILE FILE c=TOKEN serve`), or from the script's text on
        // the first contact (`sh -c TEXT opmark-shim TEXT c=TOKEN h=HASH serve`), under
        // this target's marker root.
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let home = format!("XDG_STATE_HOME={}", target.state_home.display());
        let ours = environ.split(|&b| b == 0).any(|v| v == home.as_bytes());
        let serving = args
            .iter()
            .rev()
            .find(|a| !a.is_empty())
            .is_some_and(|a| a == "serve")
            && (args.get(1).is_some_and(|f| f.starts_with(&cache))
                || (args.get(3).is_some_and(|a| a == "opmark-shim") && ours));
        if serving && state_of(pid).is_some_and(|s| s != 'Z') && under_a_session(pid) {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid`'s parent is an SSH server's session process: a resident is the shell
/// the session runs. A command's supervisor is a fork of the resident (its standby,
/// handed the command) with the same command line, detached under init, and it may still
/// be tidying up just after the run returned (seen: a test counted two residents right
/// after a new keeper's first call).
fn under_a_session(pid: i32) -> bool {
    let Some(parent) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(") ")
                .next()?
                .split(' ')
                .nth(1)?
                .parse::<i32>()
                .ok()
        })
    else {
        return false;
    };
    std::fs::read(format!("/proc/{parent}/cmdline"))
        .is_ok_and(|c| c.starts_with(b"sshd") || c.starts_with(b"dropbear"))
}

/// The process state letter of `pid` (`None`: gone).
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(") ").next()?.chars().next()
}

/// The one resident serving `target` now.
fn the_resident(target: &Target) -> i32 {
    let mut found = Vec::new();
    wait_for("a resident shim", Duration::from_secs(10), || {
        found = residents(target);
        !found.is_empty()
    });
    assert_eq!(found.len(), 1, "one resident per connection: {found:?}");
    found[0]
}

/// `opmark --json mux status`.
fn mux_status(env: &Sealed) -> serde_json::Value {
    let out = env
        .opmark()
        .args(["--json", "keeper", "status"])
        .env("OPMARK_PERSIST", "5m")
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// The resident pid the caller says its request went to (`-vv`).
fn served_by(a: &Answer) -> Option<i32> {
    let (_, rest) = a
        .stderr
        .split_once("went to the host's resident shim (pid ")?;
    rest.split(')').next()?.parse().ok()
}

fn signal_process(pid: &str, signal: &str) {
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), "--", pid])
        .status()
        .unwrap()
        .success());
}

/// A stopped resident, resumed whatever happens to the test.
struct Stopped(i32);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A command that marks its start, sleeps `secs`, then counts its one completion.
fn counted(dir: &Path, secs: u32) -> (String, PathBuf, PathBuf) {
    let started = dir.join("started");
    let count = dir.join("count");
    let command = format!(
        "echo s >> {}; sleep {secs}; echo once >> {}; echo finished",
        started.display(),
        count.display()
    );
    (command, started, count)
}

#[test]
fn reused_calls_from_new_processes_go_to_one_resident_shim() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("resident-reuse");
    let target = &lab.targets()[0];
    let mut served = Vec::new();
    for i in 0..5 {
        let op = format!("resident-{i}");
        let a = if i == 0 {
            first_call(&env, lab.ssh_config(), &target.alias, &op, "echo r0").0
        } else {
            run_resident(&env, &lab, &op, &format!("echo r{i}"))
        };
        assert_eq!(a.verdict(), "completed", "run {i}: {a:?}");
        assert_eq!(a.stdout(), format!("r{i}\n"), "run {i}: {a:?}");
        served.push(served_by(&a).unwrap_or_else(|| panic!("run {i} not resident: {a:?}")));
    }
    // Sequential callers take the same idle resident: no shim started per command.
    assert!(served.iter().all(|p| *p == served[0]), "{served:?}");
    assert_eq!(the_resident(target), served[0]);
    // The keeper's status counts it, idle between calls.
    let held = mux_status(&env);
    assert_eq!(held["connections"][0]["idle_residents"], 1, "{held}");
    assert!(
        held["connections"][0].get("no_resident").is_none(),
        "{held}"
    );
    // The marker each request left is the host's evidence, as for a call of its own.
    let probe = answer(
        opmark_resident(&env, lab.ssh_config())
            .args(["--json", "probe", &target.alias, "resident-3"])
            .output()
            .unwrap(),
    );
    assert_eq!(probe.json["marker_state"], "completed", "{probe:?}");
}

#[test]
fn a_resident_killed_mid_command_is_a_lost_connection_the_command_survives_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("resident-kill");
    let dir = fresh_dir("resident-kill-files");
    let target = &lab.targets()[0];
    // A first call starts the resident, so the next one is served by a known one.
    let (first, _) = first_call(
        &env,
        lab.ssh_config(),
        &target.alias,
        "resident-kill-0",
        "true",
    );
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let resident = the_resident(target);
    let (command, started, count) = counted(&dir, 2);
    let child = opmark_resident(&env, lab.ssh_config())
        .args([
            "--json",
            "run",
            &target.alias,
            "--op",
            "resident-kill-1",
            "--",
        ])
        .arg(&command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the command to start", Duration::from_secs(10), || {
        started.exists()
    });
    // The resident and its request's subshell (its process group, which sshd made);
    // the command's supervisor is in a session of its own.
    signal_process(&format!("-{resident}"), "KILL");
    let a = answer(finish_within(
        child,
        Duration::from_secs(30),
        "a caller whose resident was killed",
    ));
    assert!(
        matches!(a.verdict(), "completed" | "replayed"),
        "probe, then follow or replay: {a:?}"
    );
    assert_eq!(a.exit_code(), Some(0), "{a:?}");
    assert_eq!(lines(&started), 1, "the command started once");
    assert_eq!(lines(&count), 1, "the command ran to its end exactly once");
    assert!(
        a.stderr.contains("lost after dispatch"),
        "reported as a lost connection and probed: {}",
        a.stderr
    );
    assert_eq!(
        a.json["attempts"].as_array().map(Vec::len),
        Some(1),
        "never a second attempt: {a:?}"
    );
    assert!(state_of(resident).is_none_or(|s| s == 'Z'));
    // The next call gets a new resident.
    let next = run_resident(&env, &lab, "resident-kill-2", "true");
    assert_eq!(next.verdict(), "completed", "{next:?}");
    assert_ne!(served_by(&next), Some(resident), "{next:?}");
}

#[test]
fn a_stopped_resident_is_a_lost_connection_within_the_keepalive_budget_then_settles_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("resident-stop");
    let dir = fresh_dir("resident-stop-files");
    let target = &lab.targets()[0];
    // ServerAliveInterval 1, CountMax 1: a budget of 2 s.
    let config = support::fast_loss_config(&lab, &dir);
    let (first, _) = first_call(&env, &config, &target.alias, "resident-stop-0", "true");
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let resident = the_resident(target);
    // Silent for 5 s: only the resident's heartbeat says it is there.
    let (command, started, count) = counted(&dir, 5);
    let child = opmark_resident(&env, &config)
        .args([
            "--json",
            "run",
            &target.alias,
            "--op",
            "resident-stop-1",
            "--",
        ])
        .arg(&command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the command to start", Duration::from_secs(10), || {
        started.exists()
    });
    let stopped_at = Instant::now();
    signal_process(&resident.to_string(), "STOP");
    let _stopped = Stopped(resident);
    let out = finish_within(
        child,
        Duration::from_secs(30),
        "a caller of a stopped resident",
    );
    eprintln!(
        "the caller answered {:?} after the resident was stopped",
        stopped_at.elapsed()
    );
    let a = answer(out);
    assert!(
        a.stderr.contains("lost after dispatch")
            && a.stderr.contains("resident shim")
            && a.stderr.contains("for 2 s")
            && !a.stderr.contains("did not answer"),
        "a lost connection, the keepalive budget's silence from the resident: {}",
        a.stderr
    );
    // The probe went over a new resident (the stopped one never serves again) and
    // followed the command to its end.
    assert!(
        matches!(a.verdict(), "completed" | "replayed"),
        "settled after the loss: {a:?}"
    );
    assert_eq!(a.exit_code(), Some(0), "{a:?}");
    assert_eq!(lines(&started), 1, "the command started once");
    assert_eq!(lines(&count), 1, "the command ran to its end exactly once");
    assert_eq!(
        a.json["attempts"].as_array().map(Vec::len),
        Some(1),
        "{a:?}"
    );
}

#[test]
fn a_host_whose_shim_does_not_serve_is_called_per_call_through_the_keeper() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("resident-off");
    let target = &lab.targets()[0];
    // The operator's switch on the host: the shim refuses `serve`.
    let root = target.state_home.join("opmark");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("resident.off"), b"").unwrap();
    for i in 0..3 {
        let op = format!("per-call-{i}");
        let a = if i == 0 {
            first_call(&env, lab.ssh_config(), &target.alias, &op, "echo p0").0
        } else {
            run_resident(&env, &lab, &op, &format!("echo p{i}"))
        };
        assert_eq!(a.verdict(), "completed", "run {i}: {a:?}");
        assert_eq!(a.stdout(), format!("p{i}\n"), "run {i}: {a:?}");
        assert!(
            a.stderr.contains("through the keeper") && a.stderr.contains("exec on"),
            "per call, through the keeper: {}",
            a.stderr
        );
        assert_eq!(served_by(&a), None, "{a:?}");
    }
    assert!(residents(target).is_empty());
    let held = mux_status(&env);
    assert_eq!(held["connections"][0]["idle_residents"], 0, "{held}");
    assert!(
        held["connections"][0]["no_resident"]
            .as_str()
            .is_some_and(|why| why.contains("resident_off")),
        "the status says why its calls go per call: {held}"
    );
    // Turned back on, the next connection's calls are resident again (a new keeper: the
    // old connection remembers the refusal).
    std::fs::remove_file(root.join("resident.off")).unwrap();
    let _ = env
        .opmark()
        .args(["keeper", "stop"])
        .env("OPMARK_PERSIST", "5m")
        .output();
    let (a, _) = first_call(
        &env,
        lab.ssh_config(),
        &target.alias,
        "per-call-again",
        "true",
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert!(served_by(&a).is_some(), "{a:?}");
}

#[test]
fn a_resident_checks_the_marker_root_id_per_request_not_once_per_channel() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("resident-root");
    let target = &lab.targets()[0];
    let (first, op) = first_call(
        &env,
        lab.ssh_config(),
        &target.alias,
        "resident-root-1",
        "echo once",
    );
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let resident = served_by(&first).unwrap_or_else(|| panic!("not resident: {first:?}"));
    // Another store of evidence behind the same, still running, resident: the root's id
    // changes (a rebuilt root), the resident does not.
    let id_file = target.marker_root().join("root_id");
    let old = std::fs::read_to_string(&id_file).unwrap();
    let new = "0123456789abcdef0123456789abcdef";
    assert_ne!(old.trim(), new);
    std::fs::write(&id_file, format!("{new}\n")).unwrap();
    let again = run_resident(&env, &lab, &op, "echo once");
    assert_eq!(served_by(&again), Some(resident), "{again:?}");
    assert_eq!(
        (again.verdict(), again.code()),
        ("conflict", ("host_changed", false)),
        "the request named the root the operation reached, and the resident refused: {again:?}"
    );
    let reason = again.json["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("is marker root {new}"))
            && reason.contains(&format!("reached marker root {}", old.trim())),
        "{reason}"
    );
}

#[test]
fn a_resident_whose_cached_script_is_gone_hands_the_run_to_a_call_of_its_own_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let target = &lab.targets()[0];
    let (first, _) = first_call(&env, lab.ssh_config(), &target.alias, "gone-0", "true");
    assert_eq!(first.verdict(), "completed", "{first:?}");
    // The first contact's resident runs from the script's text; a new keeper's runs from
    // the host's cache, which the first contact filled.
    let stopped = opmark_resident(&env, lab.ssh_config())
        .args(["keeper", "stop"])
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    wait_for("the first resident to end", Duration::from_secs(10), || {
        residents(target).is_empty()
    });
    let (warm, _) = first_call(&env, lab.ssh_config(), &target.alias, "gone-warm", "true");
    assert_eq!(warm.verdict(), "completed", "{warm:?}");
    let stale = the_resident(target);
    let cmdline = std::fs::read(format!("/proc/{stale}/cmdline")).unwrap();
    assert!(
        cmdline
            .split(|&b| b == 0)
            .nth(1)
            .is_some_and(|a| a.starts_with(b"/")),
        "a resident from the cached file: {}",
        String::from_utf8_lossy(&cmdline)
    );
    // The cached script goes (a wiped root, another version's gc) under the live resident.
    let cache = target.state_home.join("opmark").join("shim");
    for entry in std::fs::read_dir(&cache).unwrap().flatten() {
        std::fs::remove_file(entry.path()).unwrap();
    }
    let count = dir.join("count");
    let command = format!("echo once >> {}; echo done", count.display());
    let child = opmark_resident(&env, lab.ssh_config())
        .args([
            "--json",
            "run",
            &target.alias,
            "--op",
            "gone-1",
            "--",
            &command,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A watchdog, not a speed claim: the stale resident used to cost a 30 s wait and a
    // `not_applied`.
    let a = answer(finish_within(
        child,
        Duration::from_secs(15),
        "a run after the cache went",
    ));
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.stdout(), "done\n", "{a:?}");
    assert_eq!(lines(&count), 1, "it ran once");
    assert!(
        a.stderr.contains("lost its cached script"),
        "the fallback is said at debug level: {a:?}"
    );
    // The stale resident ended; the next run has a resident again.
    wait_for("the stale resident to end", Duration::from_secs(10), || {
        !residents(target).contains(&stale)
    });
    let next = run_resident(&env, &lab, "gone-2", "echo again");
    assert_eq!(next.verdict(), "completed", "{next:?}");
    assert!(served_by(&next).is_some(), "served by a resident: {next:?}");
}
