//! Connection reuse across processes (docs/trust.md#the-keeper, docs/findings.md#speed): repeated runs from new processes to
//! one host, OpenSSH with `ControlMaster auto` + `ControlPersist 60` against opmark with
//! its keeper, measured A B A B (50 calls each, one warm-up each so both start with a
//! live connection), printing medians and the ratio. Then the keeper's memory with 20
//! hosts held. A benchmark, never a test (`cargo bench --bench reuse`;
//! `OPMARK_BENCH_BIN` times another build).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::{Lab, LabSpec, Placement};

const ROUNDS: usize = 50;
const HOSTS: usize = 20;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ok(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `VmRSS` and `VmHWM` of `pid` in KiB.
fn memory_kib(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-reuse");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let lab = Lab::start(&LabSpec {
        count: HOSTS,
        placement: Placement::Loopback,
        dir: base.join("lab"),
    })
    .expect("start loopback sshd targets (is openssh-server installed?)");
    let cfg = lab.ssh_config().to_path_buf();
    let opmark: PathBuf = std::env::var_os("OPMARK_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_opmark")));
    let run_dir = base.join("run");
    let control = base.join("cm-%C");

    let ssh_mux = |alias: &str| {
        ok(Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-o", "BatchMode=yes", "-o", "ControlMaster=auto"])
            .arg("-o")
            .arg(format!("ControlPath={}", control.display()))
            .args(["-o", "ControlPersist=60", alias, "true"])
            .stdout(Stdio::null()))
    };
    let opmark_cmd = |args: &[&str]| {
        let mut cmd = Command::new(&opmark);
        cmd.arg("-F")
            .arg(&cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            .env("XDG_CONFIG_HOME", base.join("config"))
            .env("XDG_STATE_HOME", base.join("state"))
            .env("XDG_RUNTIME_DIR", &run_dir)
            .env("OPMARK_PERSIST", "5m")
            .args(args);
        cmd
    };
    let pid = std::process::id();
    let opmark_true = |alias: &str, op: &str| {
        ok(opmark_cmd(&["run", alias, "--op", op, "--", "true"]).stdout(Stdio::null()))
    };

    // Warm-up: each side makes its connection (and opmark's host caches its shim).
    ssh_mux("target1");
    opmark_true("target1", &format!("warm-{pid}"));
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let start = Instant::now();
        ssh_mux("target1");
        ta.push(start.elapsed());
        let start = Instant::now();
        opmark_true("target1", &format!("reuse-{i}-{pid}"));
        tb.push(start.elapsed());
    }
    let (ssh, ours) = (median(ta), median(tb));
    println!(
        "repeated `true` from new processes, {ROUNDS} calls each, A B A B, medians:\n  \
         ssh ControlMaster auto, ControlPersist 60: {:>7.1} ms\n  \
         opmark run with its keeper:                {:>7.1} ms   ratio {:.2}x (goal <= 1.0x)",
        ssh.as_secs_f64() * 1e3,
        ours.as_secs_f64() * 1e3,
        ours.as_secs_f64() / ssh.as_secs_f64()
    );

    // The keeper holding one connection per host.
    for n in 1..=HOSTS {
        opmark_true(&format!("target{n}"), &format!("mem-{n}-{pid}"));
    }
    let keeper = std::fs::read_to_string(run_dir.join("opmark/keeper.pid"))
        .expect("the keeper's pid file")
        .trim()
        .to_string();
    let status = opmark_cmd(&["--json", "mux", "status"]).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let held = doc["connections"].as_array().map_or(0, |c| c.len());
    let (rss, hwm) = memory_kib(&keeper);
    println!(
        "keeper memory with {held} hosts held: RSS {:.1} MiB, peak {:.1} MiB (goal <= 30 MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );

    ok(&mut opmark_cmd(&["mux", "stop"]));
    let _ = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .arg("-o")
        .arg(format!("ControlPath={}", control.display()))
        .args(["-O", "exit", "target1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    drop(lab);
}
