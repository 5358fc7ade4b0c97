//! The host matrix: the hosts people point opmark at, as docker targets built here with
//! no registry: the lab's Debian image (debootstrap: Debian's userland, OpenSSH), a
//! busybox userland (Debian's static busybox as every tool, as on Alpine: no util-linux
//! setsid -f, no stdbuf) with OpenSSH's sshd and one user per login shell, and the same
//! userland with dropbear as the server. On every cell the core cases run: run and
//! replay, the command's view as `ssh HOST CMD` gives it (umask, `$0`, file modes),
//! live output, `--timeout`, output far past the cap, cancel, gc, probe and doctor; and
//! on one cell per host kind (two on busybox) the chaos test's docker variant: runs hit
//! mid-command by a frozen host (docker pause), a silent link cut or a killed client,
//! each re-attached or followed, counting executions (never two), and a container crash
//! read as interrupted. A cell the shim cannot serve is
//! refused before anything runs, with the reason and the fix.
//!
//! Tool rule: docker (and for the Debian cell debootstrap), busybox-static, sshd or
//! dropbear missing: skip locally, fail in CI. Each image is built once per machine
//! (cached by its recipe hash) and once per test process at most.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use opmark::lab::{login_shells, shell_user, DockerSpec, HostKind, Lab, LabSpec, Placement};
use serde_json::Value;

use crate::support::{self, fast_loss_config, fresh_dir, json, lines, text, wait_for, Sealed};

/// A one-target docker lab of `kind`, or None (after SKIP) when a tool is missing.
pub(crate) fn matrix_lab(name: &str, kind: HostKind) -> Option<Lab> {
    let mut tools = vec!["docker", "ssh", "ssh-keygen", "ldd", "nsenter", "nft"];
    match kind {
        HostKind::Debian => tools.push("debootstrap"),
        HostKind::Busybox => tools.extend(["busybox", "sshd"]),
        HostKind::Dropbear => tools.extend(["busybox", "dropbear"]),
    }
    if !support::require_tools(name, &tools) || !support::require_root(name) {
        return None;
    }
    let engine = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    if !engine.is_ok_and(|o| o.status.success()) {
        support::skip_or_fail(name, "the Docker engine does not answer `docker version`");
        return None;
    }
    let spec = LabSpec {
        count: 1,
        placement: Placement::Docker,
        dir: fresh_dir(name).join("lab"),
    };
    let options = DockerSpec { image: None, kind };
    let started = Instant::now();
    let lab = Lab::start_docker(&spec, &options)
        .unwrap_or_else(|e| panic!("{name}: {} lab did not start: {e}", kind.as_str()));
    eprintln!(
        "{name}: {} lab up in {:.1} s (image {:?})",
        kind.as_str(),
        started.elapsed().as_secs_f64(),
        lab.image()
    );
    Some(lab)
}

/// One cell: a host kind and the login (user@target1, or target1 for root).
struct Cell<'a> {
    lab: &'a Lab,
    env: &'a Sealed,
    /// What the commands are given as the host (`sh-dash@target1`, `target1`).
    dest: String,
    /// The login shell's name (ash, bash, ... fish), for what differs in syntax.
    shell: &'static str,
    /// A label for messages and op ids.
    label: String,
}

impl Cell<'_> {
    fn opmark(&self) -> Command {
        self.env.opmark_with_lab(self.lab)
    }

    fn op(&self, what: &str) -> String {
        format!("mx-{}-{what}", self.label)
    }

    /// `opmark --json run DEST --op OP [EXTRA...] -- CMD`: (exit code, document).
    fn run(&self, op: &str, extra: &[&str], cmd: &str) -> (Option<i32>, Value) {
        let out = self
            .opmark()
            .args(["--json", "run", &self.dest, "--op", op])
            .args(extra)
            .args(["--", cmd])
            .output()
            .unwrap();
        (out.status.code(), json(&out))
    }

    /// Starts `opmark ARGS...` (with ssh config `cfg` instead of the lab's when given).
    fn spawn(&self, cfg: Option<&PathBuf>, args: &[&str]) -> std::process::Child {
        let mut c = match cfg {
            Some(cfg) => {
                let mut c = self.env.opmark();
                c.arg("-F").arg(cfg);
                c
            }
            None => self.opmark(),
        };
        c.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// An effect file the command appends to: (path in the container, path here). On
    /// the marker volume, which every user of the image may write.
    fn effect(&self, what: &str) -> (String, PathBuf) {
        let name = format!("fx-{}-{what}", self.label);
        let here = self
            .lab
            .marker_root_on_host("target1")
            .unwrap()
            .parent()
            .unwrap()
            .join(&name);
        (format!("/var/lib/opmark-lab/{name}"), here)
    }

    fn ssh(&self, cmd: &str) -> std::process::Output {
        support::ssh(self.lab)
            .args(["-o", "ConnectTimeout=5", &self.dest, cmd])
            .output()
            .unwrap()
    }

    fn probe(&self, op: &str) -> Value {
        let out = self
            .opmark()
            .args(["--json", "probe", &self.dest, op])
            .output()
            .unwrap();
        json(&out)
    }
}

/// Run, replay, and the command's view compared with `ssh DEST CMD`'s.
fn run_replay_and_as_ssh_would(c: &Cell) {
    let (fx, fx_here) = c.effect("once");
    // $0 as the login shell sets it for -c (fish has no $0: its own name instead).
    let zero = if c.shell == "fish" {
        "status current-command"
    } else {
        "echo $0"
    };
    let view = |file: &str| {
        format!(
            "umask; {zero}; touch {file}; ls -l {file} | cut -c1-10; echo ran >> {fx}; echo err >/dev/stderr; exit 3"
        )
    };
    let by_ssh = c.ssh(&view(&format!("/tmp/mx-ssh-{}", c.label)));
    assert_eq!(
        by_ssh.status.code(),
        Some(3),
        "{}: ssh: {}",
        c.label,
        text(&by_ssh.stderr)
    );
    assert_eq!(lines(&fx_here), 1, "{}: ssh ran it", c.label);
    let cmd = view(&format!("/tmp/mx-op-{}", c.label));
    let op = c.op("once");
    let (code, first) = c.run(&op, &[], &cmd);
    assert_eq!(first["verdict"], "completed", "{}: {first}", c.label);
    assert_eq!(code, Some(3), "{}: {first}", c.label);
    assert_eq!(
        first["stdout"].as_str(),
        Some(text(&by_ssh.stdout).as_str()),
        "{}: umask, $0 and file modes as under ssh",
        c.label
    );
    assert_eq!(first["stderr"], "err\n", "{}: {first}", c.label);
    let (code, again) = c.run(&op, &[], &cmd);
    assert_eq!(again["verdict"], "replayed", "{}: {again}", c.label);
    assert_eq!(
        (code, &again["stdout"]),
        (Some(3), &first["stdout"]),
        "{}",
        c.label
    );
    assert_eq!(
        lines(&fx_here),
        2,
        "{}: ran once by opmark, once by ssh",
        c.label
    );
    let probe = c.probe(&op);
    assert_eq!(probe["marker_state"], "completed", "{}: {probe}", c.label);
    assert_eq!(probe["exit_code"], 3, "{}: {probe}", c.label);
}

/// Five lines one second apart: the first reaches the caller while the command runs.
fn live_output(c: &Cell) {
    let cmd = "echo line1; sleep 1; echo line2; sleep 1; echo line3; sleep 1; echo line4; sleep 1; echo line5";
    let op = c.op("live");
    let started = Instant::now();
    let mut child = c.spawn(None, &["run", &c.dest, "--op", &op, "--", cmd]);
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send((line, Instant::now()));
        }
    });
    let arrivals: Vec<(String, Instant)> = rx.iter().collect();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}: {}", c.label, text(&out.stderr));
    let got: Vec<&str> = arrivals.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        got,
        ["line1", "line2", "line3", "line4", "line5"],
        "{}",
        c.label
    );
    // Live, not buffered: the five lines are a second apart on the host, so a buffered
    // capture hands them over together (spread near zero) while a live one spreads them
    // over about four seconds. The spread is the proof; when the first line arrives after
    // the start depends on the machine's load (the image and login shell start first),
    // so it is printed, not asserted.
    let first = arrivals[0].1 - started;
    let spread = arrivals[4].1 - arrivals[0].1;
    eprintln!("{}: first line after {first:?}, spread {spread:?}", c.label);
    assert!(
        spread > Duration::from_millis(2500),
        "{}: lines came together ({spread:?})",
        c.label
    );
}

/// What happens to a run mid-command in [`chaos_round`].
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The host freezes (docker pause) longer than the client's keepalives allow.
    Pause,
    /// The link drops silently (nftables in the container's namespace).
    Cut,
    /// The client dies (SIGKILL); a rerun of the same op id follows the command.
    KillClient,
}

/// One run hit by `fault` mid-command: the client (waiting, --wait) re-attaches, or a
/// rerun follows, and gets every byte once and the true status; the command ran once.
fn chaos_round(c: &Cell, cfg: &PathBuf, n: usize, fault: Fault) {
    let (fx, fx_here) = c.effect(&format!("chaos{n}"));
    let cmd = format!("echo ran >> {fx}; echo first; sleep 4; echo second; exit 6");
    let op = c.op(&format!("chaos{n}"));
    let args = [
        "--json", "run", &c.dest, "--op", &op, "--wait", "60s", "--", &cmd,
    ];
    let mut child = c.spawn(Some(cfg), &args);
    wait_for("the command to start", Duration::from_secs(20), || {
        lines(&fx_here) == 1
    });
    let out = match fault {
        Fault::Pause | Fault::Cut => {
            if matches!(fault, Fault::Pause) {
                c.lab.pause("target1").unwrap();
            } else {
                c.lab.cut("target1").unwrap();
            }
            std::thread::sleep(Duration::from_secs(3));
            c.lab.resume("target1").unwrap();
            c.lab.restore("target1").unwrap();
            child.wait_with_output().unwrap()
        }
        Fault::KillClient => {
            child.kill().unwrap();
            child.wait().unwrap();
            c.spawn(Some(cfg), &args).wait_with_output().unwrap()
        }
    };
    let doc = json(&out);
    let want = match fault {
        Fault::KillClient => ["replayed", "completed"],
        _ => ["completed", "completed"],
    };
    assert!(
        want.contains(&doc["verdict"].as_str().unwrap_or_default()),
        "{} {fault:?}: {doc}\n{}",
        c.label,
        text(&out.stderr)
    );
    assert_eq!(doc["exit_code"], 6, "{} {fault:?}: {doc}", c.label);
    assert_eq!(
        doc["stdout"], "first\nsecond\n",
        "{} {fault:?}: every byte once: {doc}",
        c.label
    );
    assert_eq!(
        lines(&fx_here),
        1,
        "{} {fault:?}: run {n} executed twice",
        c.label
    );
}

/// A container crash (every process killed, started again) mid-command: interrupted,
/// told by the recorded pid and start time.
fn crash_reads_interrupted(c: &Cell) {
    let (fx, fx_here) = c.effect("crash");
    let cmd = format!("echo ran >> {fx}; sleep 60");
    let op = c.op("crash");
    let child = c.spawn(
        None,
        &[
            "--json",
            "run",
            &c.dest,
            "--op",
            &op,
            "--class",
            "append-only",
            "--",
            &cmd,
        ],
    );
    wait_for("the command to start", Duration::from_secs(20), || {
        lines(&fx_here) == 1
    });
    c.lab.crash("target1").unwrap();
    let out = child.wait_with_output().unwrap();
    let doc = json(&out);
    assert_eq!(doc["verdict"], "indeterminate", "{}: {doc}", c.label);
    let probe = c.probe(&op);
    assert_eq!(probe["marker_state"], "interrupted", "{}: {probe}", c.label);
    assert_eq!(probe["why"], "process_gone", "{}: {probe}", c.label);
    let (_, again) = c.run(&op, &["--class", "append-only"], &cmd);
    assert_eq!(
        again["verdict"], "indeterminate",
        "{}: no re-run unapproved",
        c.label
    );
    assert_eq!(lines(&fx_here), 1, "{}", c.label);
}

/// Cancel stops a running command for good; gc then collects what finished.
fn cancel_then_gc(c: &Cell) {
    let (fx, fx_here) = c.effect("cancel");
    let cmd = format!("echo ran >> {fx}; sleep 60; echo never >> {fx}");
    let op = c.op("cancel");
    let child = c.spawn(None, &["--json", "run", &c.dest, "--op", &op, "--", &cmd]);
    wait_for("the command to start", Duration::from_secs(20), || {
        lines(&fx_here) == 1
    });
    let out = c
        .opmark()
        .args(["--json", "cancel", &c.dest, &op, "--grace", "2s"])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["cancel_outcome"], "cancelled", "{}: {doc}", c.label);
    let ran = child.wait_with_output().unwrap();
    assert!(!ran.status.success(), "{}", c.label);
    assert_eq!(
        lines(&fx_here),
        1,
        "{}: stopped before its second line",
        c.label
    );
    // root's marker root is on the volume, seen from here: a failed-start leftover long
    // past retention (what a supervisor that never came up leaves) for gc to reclaim,
    // with the host's own find -mmin (busybox's on the busybox kinds).
    let leftover = format!("{}.100.at-x.failed-start", c.op("lost"));
    let root_cell = !c.dest.contains('@');
    if root_cell {
        let dir = c
            .lab
            .marker_root_on_host("target1")
            .unwrap()
            .join("superseded")
            .join(&leftover);
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("touch")
            .args(["-d", "2000-01-01"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let out = c
        .opmark()
        .args(["--json", "gc", &c.dest, "--older-than", "3650d"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {}",
        c.label,
        text(&out.stderr)
    );
    let gc = json(&out);
    // Within retention: every marker kept (the finished ones and the cancelled one).
    assert!(
        gc["kept"].as_u64().is_some_and(|k| k >= 2),
        "{}: {gc}",
        c.label
    );
    if root_cell {
        assert!(
            gc.to_string().contains(&leftover) && gc.to_string().contains("failed_start_reclaimed"),
            "{}: the leftover reclaimed: {gc}",
            c.label
        );
    }
    let probe = c.probe(&c.op("once"));
    assert_eq!(
        probe["marker_state"], "completed",
        "{}: a finished marker still says completed: {probe}",
        c.label
    );
}

/// `--timeout`: a command that ignores TERM is killed after the grace; what it wrote
/// before reaches the caller (the sweeps spare the captures) and the record says so.
fn timeout_keeps_what_was_written(c: &Cell) {
    let cmd = match c.shell {
        "tcsh" | "fish" => "echo early; sleep 30",
        _ => "trap '' TERM; echo early; sleep 30; echo never",
    };
    let (_, doc) = c.run(&c.op("timeout"), &["--timeout", "1s"], cmd);
    assert_eq!(doc["timed_out"], true, "{}: {doc}", c.label);
    assert_eq!(doc["stdout"], "early\n", "{}: {doc}", c.label);
}

/// The `--timeout` sweeps (TERM, then KILL after the grace) spare the captures: output
/// written after the KILL by a process the sweep cannot reach (one that made a session
/// of its own, still holding the command's stdout) is captured, as ssh would deliver it.
/// A capture killed by the sweep would lose it.
fn timeout_sweep_spares_the_captures(c: &Cell) {
    let cmd = "trap '' TERM; setsid sh -c 'sleep 4; echo late' & echo early; sleep 30";
    let (_, doc) = c.run(&c.op("spare"), &["--timeout", "1s"], cmd);
    assert_eq!(doc["timed_out"], true, "{}: {doc}", c.label);
    assert_eq!(doc["stdout"], "early\nlate\n", "{}: {doc}", c.label);
}

/// Output far past the cap: the live stream whole, the copy kept for replays exactly
/// the cap (spill segments through the capture, dd per read where there is no stdbuf).
fn big_output_is_whole_live_and_capped_for_replay(c: &Cell) {
    let total = 3 * 1_048_576 + 4321;
    let cmd = format!("head -c {total} /dev/zero | tr '\\0' a");
    let op = c.op("big");
    for (n, want) in [(0, total), (1, 65_536)] {
        let (code, doc) = c.run(&op, &["--output-cap", "64k"], &cmd);
        assert_eq!(
            code,
            Some(0),
            "{}: {}",
            c.label,
            &doc.to_string()[..200.min(doc.to_string().len())]
        );
        let out = doc["stdout"].as_str().unwrap();
        assert_eq!(out.len(), want, "{}: call {n}", c.label);
        assert!(out.bytes().all(|b| b == b'a'), "{}", c.label);
        assert_eq!(doc["dropped"][0], total - 65_536, "{}: call {n}", c.label);
    }
}

fn doctor_passes(c: &Cell) -> Value {
    let out = c
        .opmark()
        .args(["--json", "doctor", &c.dest])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["ok"], true, "{}: {doc}", c.label);
    doc
}

/// Two runs holding one host lock (`--lock`) at once: the second waits on the host for
/// the first's end, so the intervals the commands record never overlap; busybox's
/// `ln`, `readlink` and `sort` are all the lock needs.
fn a_lock_holds_one_command_at_a_time(c: &Cell) {
    let (fx, fx_here) = c.effect("locked");
    let ops = [c.op("lock-a"), c.op("lock-b")];
    std::thread::scope(|s| {
        for op in &ops {
            let cmd = format!(
                "read a _ </proc/uptime; sleep 1; read b _ </proc/uptime; echo \"$a $b\" >> {fx}; : {op}"
            );
            s.spawn(move || {
                let (_, doc) = c.run(op, &["--lock", "mx", "--lock-wait", "60s"], &cmd);
                assert_eq!(doc["verdict"], "completed", "{}: {doc}", c.label);
            });
        }
    });
    let held = support::uptime_intervals(&fx_here);
    assert_eq!(held.len(), 2, "{}: {held:?}", c.label);
    assert_eq!(support::most_at_once(&held), 1, "{}: {held:?}", c.label);
}

/// `opmark put` to the cell's host: the file arrives whole with its mode (busybox's
/// `sha256sum`, `head`, `sync FILE` and `mv` are all a put needs), the same op id replays,
/// the same content under a new op id is not written again, `opmark get` reads it back
/// whole, and `put -r` delivers a tree whose directories the host makes.
fn a_put_arrives_whole_and_replays(c: &Cell) {
    let (remote, here) = c.effect("put");
    let dir = fresh_dir(&format!("mx-put-{}", c.label));
    let local = dir.join("content");
    // Over 1 MiB: linked into place from the checked spool where the host allows it
    // (docs/host-protocol.md#files), a path of its own on each host kind.
    let bytes: Vec<u8> = (0..1_200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &bytes).unwrap();
    let put = |op: &str| {
        let out = c
            .opmark()
            .args(["--json", "put"])
            .arg(&local)
            .arg(format!("{}:{remote}", c.dest))
            .args(["--op", op, "--mode", "644"])
            .output()
            .unwrap();
        json(&out)
    };
    let first = put(&c.op("put-1"));
    assert_eq!(first["verdict"], "completed", "{}: {first}", c.label);
    assert_eq!(
        first["file"]["delivered"], "written",
        "{}: {first}",
        c.label
    );
    assert_eq!(std::fs::read(&here).unwrap(), bytes, "{}", c.label);
    let again = put(&c.op("put-1"));
    assert_eq!(again["verdict"], "replayed", "{}: {again}", c.label);
    let other = put(&c.op("put-2"));
    assert_eq!(
        other["file"]["delivered"], "unchanged",
        "{}: {other}",
        c.label
    );
    // And read back by `opmark get`, checked by the digest the host computed.
    let back = dir.join("back");
    let out = c
        .opmark()
        .args(["--json", "get"])
        .arg(format!("{}:{remote}", c.dest))
        .arg(&back)
        .args(["--op", &c.op("get-1")])
        .output()
        .unwrap();
    let got = json(&out);
    assert_eq!(got["file"]["saved"], true, "{}: {got}", c.label);
    assert_eq!(std::fs::read(&back).unwrap(), bytes, "{}", c.label);

    // A tree with -r: each file its own operation, the directories made by the host
    // (`mkdir -p`, `sync DIR`: busybox has both).
    let (tree_remote, tree_here) = c.effect("tree");
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    std::fs::write(tree.join("a.txt"), b"a\n").unwrap();
    std::fs::write(tree.join("sub/deeper/b.bin"), &bytes[..5000]).unwrap();
    let out = c
        .opmark()
        .args(["--json", "put", "-r"])
        .arg(format!("{}/.", tree.display()))
        .arg(format!("{}:{tree_remote}/", c.dest))
        .args(["--op", &c.op("tree-1")])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["summary"]["written_count"], 2, "{}: {doc}", c.label);
    assert_eq!(
        std::fs::read(tree_here.join("sub/deeper/b.bin")).unwrap(),
        &bytes[..5000],
        "{}",
        c.label
    );
    assert_eq!(std::fs::read(tree_here.join("a.txt")).unwrap(), b"a\n");

    // And the tree read back with get -r: the host lists it (`find . -type f -print0`,
    // busybox's too), each file its own operation.
    let back_tree = dir.join("back-tree");
    std::fs::create_dir_all(&back_tree).unwrap();
    let out = c
        .opmark()
        .args(["--json", "get", "-r"])
        .arg(format!("{}:{tree_remote}/.", c.dest))
        .arg(&back_tree)
        .args(["--op", &c.op("tree-back")])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["summary"]["read_count"], 2, "{}: {doc}", c.label);
    assert_eq!(
        std::fs::read(back_tree.join("sub/deeper/b.bin")).unwrap(),
        &bytes[..5000],
        "{}",
        c.label
    );
    assert_eq!(std::fs::read(back_tree.join("a.txt")).unwrap(), b"a\n");
}

/// Every core case on one cell.
fn core_cases(c: &Cell, faults: bool) {
    let started = Instant::now();
    let doc = doctor_passes(c);
    assert_eq!(
        doc["facts"]["detach"], "setsid_setsid",
        "{}: {doc}",
        c.label
    );
    run_replay_and_as_ssh_would(c);
    a_put_arrives_whole_and_replays(c);
    live_output(c);
    cancel_then_gc(c);
    timeout_keeps_what_was_written(c);
    if faults {
        big_output_is_whole_live_and_capped_for_replay(c);
        timeout_sweep_spares_the_captures(c);
        let cfg = fast_loss_config(c.lab, &fresh_dir(&format!("mx-cfg-{}", c.label)));
        // The chaos test's docker variant, small: each run hit mid-command by another
        // fault, each executed exactly once.
        for (n, fault) in [Fault::Pause, Fault::Cut, Fault::KillClient]
            .into_iter()
            .enumerate()
        {
            chaos_round(c, &cfg, n, fault);
        }
        crash_reads_interrupted(c);
        a_lock_holds_one_command_at_a_time(c);
    }
    eprintln!(
        "{}: core cases in {:.1} s",
        c.label,
        started.elapsed().as_secs_f64()
    );
}

fn cell<'a>(
    lab: &'a Lab,
    env: &'a Sealed,
    kind: HostKind,
    shell: &'static str,
    root: bool,
) -> Cell<'a> {
    Cell {
        lab,
        env,
        dest: if root {
            "target1".into()
        } else {
            format!("{}@target1", shell_user(shell))
        },
        shell,
        label: format!(
            "{}-{shell}{}",
            kind.as_str(),
            if root { "-root" } else { "" }
        ),
    }
}

#[test]
fn matrix_debian_openssh_bash_serves_every_core_case() {
    let Some(lab) = matrix_lab(crate::test_name!(), HostKind::Debian) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    core_cases(&cell(&lab, &env, HostKind::Debian, "bash", true), true);
}

#[test]
fn matrix_busybox_openssh_serves_every_login_shell() {
    let Some(lab) = matrix_lab(crate::test_name!(), HostKind::Busybox) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let shells = login_shells(HostKind::Busybox);
    let names: Vec<&str> = shells.iter().map(|(n, _)| *n).collect();
    for wanted in ["ash", "bash", "dash", "zsh"] {
        if !names.contains(&wanted) {
            support::skip_or_fail(
                crate::test_name!(),
                &format!("{wanted} is not installed here"),
            );
        }
    }
    // root (busybox ash) and dash get the fault cases, which freeze or crash the whole
    // container, one after the other; then every other login shell the rest, side by
    // side.
    core_cases(&cell(&lab, &env, HostKind::Busybox, "ash", true), true);
    core_cases(&cell(&lab, &env, HostKind::Busybox, "dash", false), true);
    std::thread::scope(|scope| {
        for (shell, _) in shells.iter().filter(|(s, _)| *s != "dash") {
            let (lab, env) = (&lab, &env);
            scope.spawn(move || {
                core_cases(&cell(lab, env, HostKind::Busybox, shell, false), false);
            });
        }
    });
    // The refused cell: a login shell that runs no commands. Refused before anything
    // ran, with the reason and the fix; doctor says which check and how to fix it.
    let c = cell(&lab, &env, HostKind::Busybox, "false", false);
    let (fx, fx_here) = c.effect("refused");
    let (code, doc) = c.run(&c.op("refused"), &[], &format!("echo ran >> {fx}"));
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert_eq!(code, Some(241), "{doc}");
    assert_eq!(doc["reason_code"], "shim_did_not_start", "{doc}");
    assert_eq!(doc["retryable"], false, "{doc}");
    assert!(
        doc["reason"].as_str().unwrap().contains("opmark doctor"),
        "{doc}"
    );
    assert_eq!(lines(&fx_here), 0, "nothing ran");
    let out = c
        .opmark()
        .args(["--json", "doctor", &c.dest])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["ok"], false, "{doc}");
    let shim = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "shim")
        .unwrap();
    assert_eq!(shim["status"], "fail", "{doc}");
    assert!(
        shim["fix"].as_str().unwrap().contains("login user's shell"),
        "{doc}"
    );
}

#[test]
fn matrix_busybox_dropbear_serves_every_core_case() {
    let Some(lab) = matrix_lab(crate::test_name!(), HostKind::Dropbear) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    core_cases(&cell(&lab, &env, HostKind::Dropbear, "ash", true), true);
}

#[test]
fn matrix_busybox_command_keeps_sigint_and_sigquit_default_as_under_ssh() {
    let Some(lab) = matrix_lab(crate::test_name!(), HostKind::Busybox) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    for shell in ["ash", "dash"] {
        let c = cell(&lab, &env, HostKind::Busybox, shell, shell == "ash");
        // The command's own view: the signals it ignores, and whether INT can be trapped.
        let cmd = "grep SigIgn /proc/self/status; trap 'echo caught' INT; kill -INT $$; echo after";
        let by_ssh = c.ssh(cmd);
        let (_, doc) = c.run(&c.op("signals"), &[], cmd);
        assert_eq!(doc["verdict"], "completed", "{}: {doc}", c.label);
        assert_eq!(
            doc["stdout"].as_str(),
            Some(text(&by_ssh.stdout).as_str()),
            "{}: dispositions as under ssh",
            c.label
        );
        assert!(
            text(&by_ssh.stdout).starts_with("SigIgn:\t0000000000000000\ncaught\n"),
            "{}: {}",
            c.label,
            text(&by_ssh.stdout)
        );
    }
}
