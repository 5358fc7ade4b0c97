//! Connection reuse across opmark processes (docs/trust.md#the-keeper) against real sshd: one connection
//! for many runs, the keeper's death is a lost connection (probe, then decide), a stale
//! socket is replaced before anything is sent, other users and bad directories are
//! refused, the keeper exits when idle, and concurrent callers share it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::Lab;

use crate::support::{
    self, answer, finish_within, fresh_dir, lines, log_len, text, Answer, Sealed,
};

/// `opmark -F lab` with reuse on (`persist`).
fn opmark_persisting(env: &Sealed, lab: &Lab, persist: &str) -> Command {
    let mut cmd = env.opmark_with_lab(lab);
    cmd.env("OPMARK_PERSIST", persist);
    cmd
}

fn run_reusing(env: &Sealed, lab: &Lab, op: &str, command: &str) -> Answer {
    answer(
        opmark_persisting(env, lab, "5m")
            .args(["--json", "run", "target1", "--op", op, "--", command])
            .output()
            .unwrap(),
    )
}

/// sshd's "Accepted publickey" lines (one per authentication) after byte `from`.
fn authentications(lab: &Lab, from: u64) -> usize {
    let log = std::fs::read(&lab.targets()[0].log).unwrap_or_default();
    let from = (from as usize).min(log.len());
    String::from_utf8_lossy(&log[from..])
        .matches("Accepted publickey")
        .count()
}

fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_alive(pid: i32) -> bool {
    // A zombie is gone for our purposes.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

fn kill9(pid: i32) {
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    wait_until(Duration::from_secs(5), "the keeper to die", || {
        !pid_alive(pid)
    });
}

/// The keeper's socket file name (it carries the keeper protocol's version).
fn socket_name() -> String {
    format!("keeper-v{}.sock", opmark::ssh::keeper::wire::VERSION)
}

#[test]
fn two_hundred_sequential_runs_from_new_processes_authenticate_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-200");
    let from = log_len(&lab);
    for i in 0..200 {
        // One intent per op id: `echo $((6*7))` is destructive by the shipped policy (an
        // arithmetic expansion), so the same text under a new op id would be held back
        // as a repetition (docs/guarantees.md#repetitions).
        let a = run_reusing(
            &env,
            &lab,
            &format!("reuse-{i}"),
            &format!("echo $((6*7)); : {i}"),
        );
        assert_eq!(a.verdict(), "completed", "run {i}: {a:?}");
        assert_eq!(a.stdout(), "42\n", "run {i}: {a:?}");
    }
    assert_eq!(
        authentications(&lab, from),
        1,
        "200 runs through the keeper must authenticate once"
    );
    let status = opmark_persisting(&env, &lab, "5m")
        .args(["keeper", "status"])
        .output()
        .unwrap();
    let said = text(&status.stdout);
    assert!(
        said.contains("1 connection(s)") && said.contains("used 20"),
        "{said}"
    );
}

#[test]
fn without_reuse_every_run_authenticates_and_no_keeper_starts() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-off");
    let from = log_len(&lab);
    for i in 0..2 {
        let a = answer(
            opmark_persisting(&env, &lab, "0")
                .args([
                    "--json",
                    "run",
                    "target1",
                    "--op",
                    &format!("off-{i}"),
                    "--",
                    "true",
                ])
                .output()
                .unwrap(),
        );
        assert_eq!(a.verdict(), "completed", "{a:?}");
    }
    assert_eq!(authentications(&lab, from), 2);
    assert!(
        !env.keeper_dir().exists(),
        "no keeper directory with reuse off"
    );
}

#[test]
fn killing_the_keeper_mid_command_probes_and_never_runs_twice() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-kill");
    let dir = fresh_dir("keeper-kill-files");
    let started = dir.join("started");
    let count = dir.join("count");
    let command = format!(
        "echo s >> {}; sleep 2; echo once >> {}; echo finished",
        started.display(),
        count.display()
    );
    let child = opmark_persisting(&env, &lab, "5m")
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            "kill-keeper",
            "--",
            &command,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the command to start", || {
        started.exists()
    });
    let pid = env.keeper_pid().expect("a keeper runs");
    kill9(pid);
    let a = answer(child.wait_with_output().unwrap());
    assert!(
        matches!(a.verdict(), "completed" | "replayed"),
        "a lost keeper is a lost connection: probe, then re-attach or replay: {a:?}"
    );
    assert_eq!(a.exit_code(), Some(0), "{a:?}");
    assert_eq!(lines(&started), 1, "the command started once");
    assert_eq!(lines(&count), 1, "the command ran to its end exactly once");
    assert!(
        a.stderr.contains("lost after dispatch") && a.stderr.contains("keeper"),
        "the loss is reported as one, naming the keeper, and probed: {}",
        a.stderr
    );
    assert!(
        !a.stderr.contains("reuse is off"),
        "the probe reaches a new keeper: {}",
        a.stderr
    );
    let new_pid = env.keeper_pid().expect("the probe started a new keeper");
    assert_ne!(new_pid, pid);
}

#[test]
fn a_stale_socket_is_replaced_before_anything_is_sent() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-stale");
    assert_eq!(
        run_reusing(&env, &lab, "stale-1", "true").verdict(),
        "completed"
    );
    let pid = env.keeper_pid().expect("a keeper runs");
    kill9(pid);
    let socket = env.keeper_dir().join(socket_name());
    assert!(socket.exists(), "kill -9 leaves the socket behind");
    let a = run_reusing(&env, &lab, "stale-2", "echo fresh");
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.stdout(), "fresh\n");
    let attempts = a.json["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "no retry, no lost attempt: {a:?}");
    assert_eq!(attempts[0]["boundary"], "exit_received", "{a:?}");
    assert!(!a.stderr.contains("reuse is off"), "{}", a.stderr);
    let new_pid = env.keeper_pid().expect("a new keeper runs");
    assert_ne!(new_pid, pid);
}

#[test]
fn a_keeper_directory_open_to_others_is_refused_and_the_run_connects_itself() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-mode");
    let dir = env.keeper_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = run_reusing(&env, &lab, "mode-1", "echo direct");
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.stdout(), "direct\n");
    assert!(
        a.stderr.contains("connection reuse is off") && a.stderr.contains("chmod 700"),
        "the refusal names the problem and the fix: {}",
        a.stderr
    );
    assert!(
        env.keeper_pid().is_none(),
        "no keeper in a directory open to others"
    );
    assert!(!dir.join(socket_name()).exists());
}

#[test]
fn another_user_cannot_use_the_keeper() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    if !support::require_root("another_user_cannot_use_the_keeper")
        || !support::require_tools(
            "another_user_cannot_use_the_keeper",
            &["setpriv", "python3"],
        )
    {
        return;
    }
    let env = Sealed::new("keeper-uid");
    assert_eq!(
        run_reusing(&env, &lab, "uid-1", "true").verdict(),
        "completed"
    );
    let pid = env.keeper_pid().expect("a keeper runs");
    // Open the walls on purpose (what a careless chmod would do), so that only the
    // keeper's SO_PEERCRED check stands between another user and the connection.
    let dir = env.keeper_dir();
    let socket = dir.join(socket_name());
    let mut p = dir.clone();
    while p != Path::new("/") {
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode | 0o711)).unwrap();
        p.pop();
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    // As `nobody`: connect, say hello in the keeper's protocol, print what comes back.
    let hello = r#"import socket,struct,sys
s=socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body=b'J{"kind":"hello","version":VERSION}'
try:
    s.sendall(struct.pack('>I',len(body))+body)
    s.settimeout(5)
    print('ANSWER', repr(s.recv(4096)))
except (BrokenPipeError, ConnectionResetError):
    print('ANSWER', repr(b''))"#
        .replace("VERSION", &opmark::ssh::keeper::wire::VERSION.to_string());
    let hello = hello.as_str();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            hello,
        ])
        .arg(&socket)
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(
        said.contains("ANSWER b''"),
        "the keeper must close on another uid without answering: {said} {}",
        text(&out.stderr)
    );
    // The same hello from our own uid is answered: the check above is what refused.
    let out = Command::new("/usr/bin/python3")
        .args(["-c", hello])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(text(&out.stdout).contains("hello"), "{}", text(&out.stdout));
    assert!(pid_alive(pid), "the keeper goes on serving its own user");
    // And a caller refuses a keeper directory it does not own.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_opmark"))
        .args(["keeper", "status"])
        .env("XDG_RUNTIME_DIR", dir.parent().unwrap())
        .env("OPMARK_PERSIST", "5m")
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("not to you"),
        "{} {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn the_keeper_exits_after_its_persist_time_idle() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-idle");
    let a = answer(
        opmark_persisting(&env, &lab, "1s")
            .args(["--json", "run", "target1", "--op", "idle-1", "--", "true"])
            .output()
            .unwrap(),
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    let pid = env.keeper_pid().expect("a keeper runs");
    wait_until(Duration::from_secs(10), "the idle keeper to exit", || {
        !pid_alive(pid)
    });
    assert!(
        !env.keeper_dir().join(socket_name()).exists(),
        "it removes its socket"
    );
}

#[test]
fn twenty_concurrent_callers_share_the_keeper_within_max_sessions() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-20");
    let from = log_len(&lab);
    let children: Vec<_> = (0..20)
        .map(|i| {
            opmark_persisting(&env, &lab, "5m")
                .args([
                    "--json",
                    "run",
                    "target1",
                    "--op",
                    &format!("concurrent-{i}"),
                    "--",
                    &format!("sleep 1; echo {i}"),
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // A caller that finds no keeper listening within its start wait (a loaded machine:
    // 20 processes start one keeper at once) goes direct, correctly, and says so; its
    // connection is its own, not the keeper's.
    let mut direct: usize = 0;
    for (i, child) in children.into_iter().enumerate() {
        let a = answer(child.wait_with_output().unwrap());
        assert_eq!(a.verdict(), "completed", "caller {i}: {a:?}");
        assert_eq!(a.stdout(), format!("{i}\n"));
        assert_eq!(
            a.json["attempts"].as_array().unwrap().len(),
            1,
            "no channel refused by MaxSessions: {a:?}"
        );
        if a.stderr.contains("connection reuse is off for this run") {
            eprintln!("caller {i} went direct: {}", a.stderr.trim());
            direct += 1;
        }
    }
    assert!(
        direct <= 5,
        "{direct} of 20 callers found no keeper: too few shared one to test sharing"
    );
    let carried = 20 - direct;
    let need = carried.div_ceil(10);
    let auths = authentications(&lab, from).saturating_sub(direct);
    assert!(
        (need..=need + 1).contains(&auths),
        "{carried} channels at once through the keeper need {need} connections of 10 (sshd MaxSessions), got {auths} (and {direct} direct callers' own)"
    );
}

#[test]
fn keeper_stop_ends_the_keeper_and_status_says_so_under_either_name() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-stop");
    let none = opmark_persisting(&env, &lab, "5m")
        .args(["keeper", "status"])
        .output()
        .unwrap();
    assert!(text(&none.stdout).contains("no connection keeper is running"));
    assert!(env.keeper_pid().is_none(), "status never starts a keeper");
    // The first call starts the keeper; on a loaded machine it may rightly go direct
    // before the new keeper listens, and then holds no connection of the keeper's: such
    // a call is made again under a new op id.
    for attempt in 0..4 {
        let a = run_reusing(&env, &lab, &format!("stop-{attempt}"), "true");
        assert_eq!(a.verdict(), "completed", "{a:?}");
        if !a.stderr.contains("connection reuse is off for this run") {
            break;
        }
    }
    let pid = env.keeper_pid().expect("a keeper runs");
    let status = opmark_persisting(&env, &lab, "5m")
        .args(["--json", "keeper", "status"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(doc["running"], true, "{doc}");
    assert_eq!(doc["connections"].as_array().unwrap().len(), 1, "{doc}");
    // `mux`, the command's older name, still reaches it.
    let stop = opmark_persisting(&env, &lab, "5m")
        .args(["mux", "stop"])
        .output()
        .unwrap();
    assert!(
        text(&stop.stdout).contains("stopped"),
        "{}",
        text(&stop.stdout)
    );
    wait_until(Duration::from_secs(5), "the keeper to exit", || {
        !pid_alive(pid)
    });
}

#[test]
fn a_connection_unused_for_the_persist_time_closes_while_the_keeper_serves_others() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let env = Sealed::new("keeper-expiry");
    let run_on = |host: &str, op: &str| {
        answer(
            opmark_persisting(&env, &lab, "2s")
                .args(["--json", "run", host, "--op", op, "--", "true"])
                .output()
                .unwrap(),
        )
    };
    assert_eq!(run_on("target1", "expiry-1").verdict(), "completed");
    let held = |env: &Sealed| -> Vec<String> {
        let out = opmark_persisting(env, &lab, "2s")
            .args(["--json", "keeper", "status"])
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        doc["connections"]
            .as_array()
            .map(|c| {
                c.iter()
                    .map(|c| c["destination"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let pid = env.keeper_pid().expect("a keeper runs");
    // Keep the keeper busy with target2 (never idle for 2 s) until target1's connection,
    // unused since the first run, is gone.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut i = 0;
    loop {
        i += 1;
        assert_eq!(
            run_on("target2", &format!("expiry-2-{i}")).verdict(),
            "completed"
        );
        let now = held(&env);
        if !now.iter().any(|d| d.contains("target1")) {
            assert!(now.iter().any(|d| d.contains("target2")), "{now:?}");
            break;
        }
        assert!(Instant::now() < deadline, "target1 is still held: {now:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(env.keeper_pid(), Some(pid), "the same keeper all along");
}

#[test]
fn a_bad_persist_value_is_refused_with_the_accepted_forms() {
    let env = Sealed::new("keeper-bad-persist");
    let out = env
        .opmark()
        .args(["--persist", "five", "keeper", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("--persist") && said.contains("5m"), "{said}");
    assert!(env.keeper_pid().is_none());
}

#[test]
fn a_connection_is_never_reused_across_ssh_configs_or_changed_known_hosts() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-configs");
    let dir = fresh_dir("keeper-configs-files");
    // The same host through another config file: same destination, another config.
    let other = dir.join("ssh_config");
    std::fs::write(&other, format!("Include {}\n", lab.ssh_config().display())).unwrap();
    let run_with = |cfg: &Path, op: &str| {
        let mut cmd = env.opmark();
        cmd.env("OPMARK_PERSIST", "5m")
            .arg("-F")
            .arg(cfg)
            .args(["--json", "run", "target1", "--op", op, "--", "true"]);
        let a = answer(cmd.output().unwrap());
        assert_eq!(a.verdict(), "completed", "{a:?}");
    };
    let from = log_len(&lab);
    run_with(lab.ssh_config(), "cfg-1");
    run_with(lab.ssh_config(), "cfg-2");
    assert_eq!(
        authentications(&lab, from),
        1,
        "same config: one connection"
    );
    run_with(&other, "cfg-3");
    assert_eq!(
        authentications(&lab, from),
        2,
        "another ssh config never reuses the first config's connection"
    );
    run_with(lab.ssh_config(), "cfg-4");
    assert_eq!(authentications(&lab, from), 2, "each config keeps its own");
    // known_hosts rewritten (same content, new file): the host key is checked again.
    let kh = lab.known_hosts();
    let content = std::fs::read(kh).unwrap();
    std::fs::remove_file(kh).unwrap();
    std::fs::write(kh, content).unwrap();
    run_with(lab.ssh_config(), "cfg-5");
    assert_eq!(
        authentications(&lab, from),
        3,
        "a changed known_hosts gets a connection checked against it"
    );
}

#[test]
fn megabytes_of_stdin_and_output_cross_the_keeper_intact() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-bytes");
    let input: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
    let digest = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(&input))
    };
    let mut child = opmark_persisting(&env, &lab, "5m")
        .args([
            "run",
            "target1",
            "--op",
            "bytes-in",
            "--stdin",
            "--",
            "sha256sum",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(&digest),
        "{}",
        text(&out.stdout)
    );
    let out = opmark_persisting(&env, &lab, "5m")
        .args([
            "run",
            "target1",
            "--op",
            "bytes-out",
            "--",
            "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo end >&2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), 3_000_001);
    assert!(out.stdout[..3_000_000].iter().all(|&b| b == b'a'));
    assert!(text(&out.stderr).contains("end"), "{}", text(&out.stderr));
    assert!(env.keeper_pid().is_some(), "both went through the keeper");
}

/// Sends `signal` (`STOP`, `CONT`) to `pid`.
fn signal(pid: i32, signal: &str) {
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// A stopped keeper, resumed whatever happens to the test (then killed with its
/// environment).
struct Stopped(i32);

impl Stopped {
    fn keeper(pid: i32) -> Stopped {
        signal(pid, "STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// `opmark -F <config detecting a dead link in 2 s>` with reuse on.
fn fast_loss(env: &Sealed, lab: &Lab, dir: &Path) -> Command {
    let mut cmd = env.opmark();
    cmd.arg("-F")
        .arg(support::fast_loss_config(lab, dir))
        .env("OPMARK_PERSIST", "5m");
    cmd
}

#[test]
fn a_stopped_keeper_mid_command_is_a_lost_connection_within_the_keepalive_budget() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-sigstop");
    let dir = fresh_dir("keeper-sigstop-files");
    let alias = lab.targets()[0].alias.clone();
    let started = dir.join("started");
    let count = dir.join("count");
    // Silent while the keeper is stopped: only a deadline on the keeper link notices.
    let command = format!(
        "echo s >> {}; sleep 5; echo once >> {}; echo finished",
        started.display(),
        count.display()
    );
    let child = fast_loss(&env, &lab, &dir)
        .args(["--json", "run", &alias, "--op", "stopped-keeper", "--"])
        .arg(&command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the command to start", || {
        started.exists()
    });
    let pid = env.keeper_pid().expect("a keeper runs");
    let stopped_at = Instant::now();
    let _stopped = Stopped::keeper(pid);
    // Budget 2 s (ServerAliveInterval 1, CountMax 1), a 3 s hello to the stopped keeper
    // on the way to a direct connection, then the probe and the follow to the command's
    // end (5 s after it started): well under 20 s; before the fix it waited for good.
    let out = finish_within(
        child,
        Duration::from_secs(20),
        "a caller of a stopped keeper",
    );
    let took = stopped_at.elapsed();
    eprintln!("the caller answered {took:?} after the keeper was stopped");
    let a = answer(out);
    assert!(
        matches!(a.verdict(), "completed" | "replayed"),
        "the probe over a direct connection follows or replays: {a:?}"
    );
    assert_eq!(a.exit_code(), Some(0), "{a:?}");
    assert_eq!(lines(&started), 1, "the command started once");
    assert_eq!(lines(&count), 1, "the command ran to its end exactly once");
    assert!(
        a.stderr.contains("lost after dispatch") && a.stderr.contains("did not answer"),
        "reported as a lost connection, naming the silent keeper: {}",
        a.stderr
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    let attempts = a.json["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "never a second attempt: {a:?}");
}

#[test]
fn a_stopped_keeper_before_dispatch_means_a_direct_connection_and_the_run_completes() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-sigstop-before");
    let dir = fresh_dir("keeper-sigstop-before-files");
    let alias = lab.targets()[0].alias.clone();
    let first = answer(
        fast_loss(&env, &lab, &dir)
            .args(["--json", "run", &alias, "--op", "before-1", "--", "true"])
            .output()
            .unwrap(),
    );
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let pid = env.keeper_pid().expect("a keeper runs");
    let _stopped = Stopped::keeper(pid);
    let count = dir.join("count");
    let child = fast_loss(&env, &lab, &dir)
        .args(["--json", "run", &alias, "--op", "before-2", "--"])
        .arg(format!("echo once >> {}; echo direct", count.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let a = answer(finish_within(
        child,
        Duration::from_secs(15),
        "a run while the keeper is stopped",
    ));
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.stdout(), "direct\n");
    assert_eq!(lines(&count), 1);
    assert_eq!(a.json["attempts"].as_array().unwrap().len(), 1, "{a:?}");
    assert!(
        a.stderr.contains("connection reuse is off for this run"),
        "the fallback is said: {}",
        a.stderr
    );
}

#[test]
fn verbose_traces_the_callers_side_the_same_with_and_without_the_keeper() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("keeper-verbose");
    let alias = lab.targets()[0].alias.clone();
    // Direct, through a new keeper, through the same keeper again.
    for (i, persist) in ["0", "5m", "5m"].into_iter().enumerate() {
        let out = opmark_persisting(&env, &lab, persist)
            .args([
                "-vv",
                "run",
                &alias,
                "--op",
                &format!("verbose-{i}"),
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let said = text(&out.stderr);
        // Direct: one exec per call; through the keeper: one request to the host's
        // resident shim (docs/host-protocol.md#the-resident-session).
        let call: &[&str] = if persist == "0" {
            &[
                "exec on",
                "the host accepted the exec request",
                "exit status 0",
            ]
        } else {
            &[
                "resident request to the connection keeper",
                "went to the host's resident shim",
                "end of the request, status 0",
            ]
        };
        for line in ["connecting to", "connected to", "verdict completed"]
            .iter()
            .chain(call)
        {
            assert!(
                said.contains(line),
                "persist {persist}: no `{line}` in: {said}"
            );
        }
        if persist != "0" {
            assert!(said.contains("through the keeper"), "{said}");
        }
    }
    // -v alone: where it connected and the verdict.
    let out = opmark_persisting(&env, &lab, "5m")
        .args(["-v", "run", &alias, "--op", "verbose-v", "--", "true"])
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert!(
        said.contains("through the connection keeper") && said.contains("verdict completed"),
        "{said}"
    );
}

#[test]
fn a_hundred_callers_through_one_keeper_are_all_served_once_and_nothing_is_left_after() {
    // More callers than the keeper's 8 connections x 10 channels: the last ones wait for
    // room, and the room that frees up is held by idle residents once the first callers
    // are done. Those waiters used to wait on the first connection for good.
    const CALLERS: usize = 100;
    const ROOM: usize = 80;
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let gate = dir.join("gate");
    let warm = answer(
        opmark_persisting(&env, &lab, "5s")
            .args(["--json", "run", "target1", "--op", "warm", "--", "true"])
            .output()
            .unwrap(),
    );
    assert_eq!(warm.verdict(), "completed", "{warm:?}");
    let started = dir.join("started");
    let command = |i: usize| {
        format!(
            "echo {i} >> {}; echo ran >> {}/ran-{i}; while [ ! -e {} ]; do sleep 0.1; done",
            started.display(),
            dir.display(),
            gate.display()
        )
    };
    let callers: Vec<(Instant, std::process::Child)> = (0..CALLERS)
        .map(|i| {
            let child = opmark_persisting(&env, &lab, "5s")
                .args(["--json", "run", "target1", "--op", &format!("many-{i}")])
                .args(["--wait", "20s", "--", &command(i)])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (Instant::now(), child)
        })
        .collect();
    // The keeper full: then the command of every caller that got room can end.
    let full = Instant::now() + Duration::from_secs(60);
    while support::lines(&started) < ROOM && Instant::now() < full {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "{} commands started when the gate opened",
        support::lines(&started)
    );
    std::fs::write(&gate, "").unwrap();
    // Each caller answers within its budget, its last look and a loaded machine's room.
    for (i, (spawned, child)) in callers.into_iter().enumerate() {
        let bound = Duration::from_secs(20 + 3 + 15).saturating_sub(spawned.elapsed());
        let a = answer(support::finish_within(child, bound, &format!("caller {i}")));
        assert!(
            matches!(a.verdict(), "completed" | "in_progress" | "indeterminate"),
            "caller {i}: {a:?}"
        );
    }
    // Every operation is then served (the waiters too), and ran once.
    for i in 0..CALLERS {
        let child = opmark_persisting(&env, &lab, "5s")
            .args(["--json", "run", "target1", "--op", &format!("many-{i}")])
            .args(["--", &command(i)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let a = answer(support::finish_within(
            child,
            Duration::from_secs(60),
            &format!("rerun of many-{i}"),
        ));
        assert!(
            matches!(a.verdict(), "completed" | "replayed") && a.exit_code() == Some(0),
            "many-{i}: {a:?}"
        );
        assert_eq!(
            support::lines(&dir.join(format!("ran-{i}"))),
            1,
            "many-{i} ran once"
        );
    }
    // Nothing is left once the keeper's persist time has passed.
    let pid = env.keeper_pid();
    wait_until(Duration::from_secs(30), "the keeper to exit", || {
        pid.is_none_or(|p| !pid_alive(p))
    });
    let target = lab.target("target1").unwrap();
    wait_until(Duration::from_secs(15), "no resident left", || {
        crate::resident::residents(target).is_empty()
    });
}

#[test]
fn a_keeper_holds_no_descriptor_of_its_caller_so_a_process_substitution_ends_with_the_run() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = crate::support::fresh_dir(crate::test_name!());
    let (log, ended) = (dir.join("stderr.log"), dir.join("reader-ended"));
    // bash leaves the substitution's pipe open in the command as fd 63: a keeper that
    // kept it would hold `tee` open for as long as it lives (5 minutes here).
    let cmd = opmark_persisting(&env, &lab, "5m");
    let opmark = format!("{:?}", cmd.get_program());
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    let line = format!(
        "{opmark} {} run target1 --op subst-1 -- 'echo out; echo err >&2' 2> >(tee {} >/dev/null; touch {})",
        args.join(" "),
        log.display(),
        ended.display()
    );
    // Files, not pipes, for bash's own output: the substitution's shell holds bash's
    // stdout until its reader ends, and a pipe here would turn the bug into a hang.
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let status = cmd
        .get_envs()
        .fold(Command::new("bash"), |mut b, (k, v)| {
            match v {
                Some(v) => b.env(k, v),
                None => b.env_remove(k),
            };
            b
        })
        .args(["-c", &line])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&stderr).unwrap()
    );
    assert_eq!(std::fs::read_to_string(&stdout).unwrap(), "out\n");
    let keeper = env.keeper_pid().expect("the run started a keeper");
    crate::support::wait_for(
        "the process substitution's reader to see the end of its input",
        Duration::from_secs(10),
        || ended.exists(),
    );
    assert!(
        std::fs::read_to_string(&log).unwrap().contains("err"),
        "the command's stderr went through the substitution"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{keeper}")).exists(),
        "the keeper is still alive: the reader ended because it holds no end of the pipe"
    );
}
