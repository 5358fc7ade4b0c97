//! Connection reuse across processes (docs/trust.md#the-keeper, docs/findings.md#speed): repeated runs from new processes to
//! one host, OpenSSH with `ControlMaster auto` + `ControlPersist 60` against opmark with
//! its keeper, which serves them through the host's resident shim
//! (docs/host-protocol.md#the-resident-session), and, for comparison, the keeper calling
//! the shim per call (`OPMARK_RESIDENT=0`). Measured A B C A B C (50 calls each, one
//! warm-up each so all start with a live connection), printing medians and ratios; then
//! the same through a relay adding 25 ms each way, with the round trips each reused call
//! waited for; then the resident shim's own time per command on this machine (requests
//! fed to one local `serve` under dash, against `dash -c true`); then the client process's
//! own CPU and fsyncs per reused call (`/proc/self/stat` of its waited children, `strace
//! -c` where strace is); then the keeper's memory with 20 hosts held. A benchmark, never
//! a test (`cargo bench --bench reuse`; `OPMARK_BENCH_BIN` times another build,
//! `OPMARK_BENCH_ROUNDS` sets the rounds).

// Each bench uses part of the shared relay (latency names trips, reuse counts them).
#[allow(dead_code)]
#[path = "common/relay.rs"]
mod relay;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::lab::{Lab, LabSpec, Placement};
use opmark::op_id::OpId;
use opmark::shim::{self, RunCall, Verb};

const HOSTS: usize = 20;
/// The relay's delay each way: a 50 ms round trip.
const ONE_WAY: Duration = Duration::from_millis(25);

fn rounds(default: usize) -> usize {
    std::env::var("OPMARK_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
        .max(1)
}

fn ms(d: Duration) -> String {
    format!("{:>7.1} ms", d.as_secs_f64() * 1e3)
}

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

/// CPU time (user + system) of this process's children that were waited for, so far:
/// `cutime` and `cstime` of /proc/self/stat, in clock ticks (`getconf CLK_TCK`).
fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the line; `rest` starts at field 3.
    let ticks: u64 = [13, 14]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    let per_second: u64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

/// The fsyncs (fsync, fdatasync, sync_file_range, syncfs) `cmd` makes, counted by
/// `strace -f -c`; None without strace.
fn fsyncs(cmd: &mut Command, out: &Path) -> Option<u64> {
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let envs: Vec<_> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let status = Command::new("strace")
        .args([
            "-f",
            "-c",
            "-e",
            "trace=fsync,fdatasync,sync_file_range,syncfs",
            "-o",
        ])
        .arg(out)
        .arg(program)
        .args(args)
        .envs(envs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    if !status.success() {
        return None;
    }
    let table = std::fs::read_to_string(out).ok()?;
    Some(
        table
            .lines()
            .filter_map(|l| {
                let t: Vec<&str> = l.split_whitespace().collect();
                match t.last() {
                    Some(&("fsync" | "fdatasync" | "sync_file_range" | "syncfs")) => {
                        t.get(3)?.parse::<u64>().ok()
                    }
                    _ => None,
                }
            })
            .sum(),
    )
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

/// The resident shim's own time per command on this machine: `run true` requests fed
/// one at a time to one local `serve` under dash (each waits for the previous reply's
/// end frame), against `dash -c true` and the per-call shim started for each.
fn resident_shim_time(base: &Path, n: usize) {
    let state = base.join("shim-state");
    let file = base.join("shim.sh");
    std::fs::write(&file, shim::SCRIPT).unwrap();
    let fp = "0".repeat(64);
    let shim_env = |cmd: &mut Command| {
        cmd.env("OPMARK_SH", "/usr/bin/dash")
            .env("XDG_STATE_HOME", &state)
            .env("OPMARK_ALLOW_VOLATILE_ROOT", "1")
            .env_remove("OPMARK_ROOT");
    };
    fn run_verb<'a>(op: &'a OpId, fp: &'a str) -> Verb<'a> {
        Verb::Run(RunCall {
            op,
            attempt_id: "a1",
            host_fingerprint: fp,
            family: Family::ReadOnly,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command: "true",
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        })
    }
    let mut serve = Command::new("/usr/bin/dash");
    serve.arg(&file).arg(&file).arg("c=00").arg("serve");
    shim_env(&mut serve);
    let mut child = serve
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a local resident");
    let mut input = child.stdin.take().unwrap();
    let mut frames = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let mut next_end = |what: &str| -> String {
        loop {
            line.clear();
            assert!(
                frames.read_line(&mut line).unwrap() > 0,
                "the resident ended ({what})"
            );
            if line.contains(" Z c=") || line.contains(" Q ready") {
                return line.clone();
            }
            assert!(!line.contains(" R "), "refused: {line}");
        }
    };
    next_end("start");
    let (mut bare, mut resident, mut per_call) = (Vec::new(), Vec::new(), Vec::new());
    let pid = std::process::id();
    for i in 0..n {
        let start = Instant::now();
        ok(Command::new("dash").args(["-c", "true"]));
        bare.push(start.elapsed());

        let op = OpId::parse(&format!("res-{i}-{pid}")).unwrap();
        let request = shim::Request::new(&run_verb(&op, &fp), None, None);
        let start = Instant::now();
        input.write_all(&request.bytes).unwrap();
        let end = next_end("request");
        resident.push(start.elapsed());
        assert!(end.contains("status=0"), "{end}");

        let op = OpId::parse(&format!("pc-{i}-{pid}")).unwrap();
        let verb = run_verb(&op, &fp);
        let mut cmd = Command::new("/usr/bin/dash");
        cmd.arg(&file).arg(&file).args(verb.args());
        shim_env(&mut cmd);
        let start = Instant::now();
        let mut c = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(&shim::local_data(&verb, b""))
            .unwrap();
        let out = c.wait_with_output().unwrap();
        per_call.push(start.elapsed());
        assert!(String::from_utf8_lossy(&out.stderr).contains(" X code=0 "));
    }
    drop(input);
    let _ = child.wait();
    let (bare, resident, per_call) = (median(bare), median(resident), median(per_call));
    println!(
        "the host shim's own time for `true` under dash, {n} each, medians:\n  \
         dash -c true:                                {}\n  \
         per-call shim (claim + detach + record):     {}   (+{} over dash -c true)\n  \
         resident shim, one request:                  {}   (+{} over dash -c true; goal <= 6 ms, issue 46)",
        ms(bare),
        ms(per_call),
        ms(per_call.saturating_sub(bare)).trim_start(),
        ms(resident),
        ms(resident.saturating_sub(bare)).trim_start()
    );
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
    let opmark_in = |cfg: &Path, args: &[&str]| {
        let mut cmd = Command::new(&opmark);
        cmd.arg("-F")
            .arg(cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            .env("XDG_CONFIG_HOME", base.join("config"))
            .env("XDG_STATE_HOME", base.join("state"))
            .env("XDG_RUNTIME_DIR", &run_dir)
            .env("OPMARK_PERSIST", "5m")
            .args(args);
        cmd
    };
    let opmark_cmd = |args: &[&str]| opmark_in(&cfg, args);
    let pid = std::process::id();
    let opmark_true = |alias: &str, op: &str| {
        ok(opmark_cmd(&["run", alias, "--op", op, "--", "true"]).stdout(Stdio::null()))
    };
    // The keeper calling the shim per call (a channel and a shim per command).
    let per_call_true = |alias: &str, op: &str| {
        ok(opmark_cmd(&["run", alias, "--op", op, "--", "true"])
            .env("OPMARK_RESIDENT", "0")
            .stdout(Stdio::null()))
    };
    let n = rounds(50);

    // Warm-up: each side makes its connection (and opmark's host caches its shim and
    // starts its resident).
    ssh_mux("target1");
    opmark_true("target1", &format!("warm-{pid}"));
    per_call_true("target1", &format!("warm-pc-{pid}"));
    let (mut ta, mut tb, mut tc) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let start = Instant::now();
        ssh_mux("target1");
        ta.push(start.elapsed());
        let start = Instant::now();
        opmark_true("target1", &format!("reuse-{i}-{pid}"));
        tb.push(start.elapsed());
        let start = Instant::now();
        per_call_true("target1", &format!("reuse-pc-{i}-{pid}"));
        tc.push(start.elapsed());
    }
    let (ssh, ours, per_call) = (median(ta), median(tb), median(tc));
    println!(
        "opmark {}, repeated `true` from new processes, loopback, {n} calls each, A B C, medians:\n  \
         ssh ControlMaster auto, ControlPersist 60:   {}\n  \
         opmark run, keeper + resident shim:          {}   ratio {:.2}x (goal <= 1.5x, issue 46)\n  \
         opmark run, keeper, shim per call:           {}   ratio {:.2}x",
        env!("CARGO_PKG_VERSION"),
        ms(ssh),
        ms(ours),
        ours.as_secs_f64() / ssh.as_secs_f64(),
        ms(per_call),
        per_call.as_secs_f64() / ssh.as_secs_f64()
    );

    // Through the relay: both sides hold a connection through it, then each reused
    // call's round trips are counted from the relay's log.
    let (wan_cfg, relay) = relay::wan1(&lab, &base, ONE_WAY);
    let wan_mux = || {
        ok(Command::new("ssh")
            .arg("-F")
            .arg(&wan_cfg)
            .args(["-o", "BatchMode=yes", "-o", "ControlMaster=auto"])
            .arg("-o")
            .arg(format!("ControlPath={}", control.display()))
            .args(["-o", "ControlPersist=60", "wan1", "true"])
            .stdout(Stdio::null()))
    };
    let wan_run = |op: &str, resident: bool| {
        let mut cmd = opmark_in(&wan_cfg, &["run", "wan1", "--op", op, "--", "true"]);
        if !resident {
            cmd.env("OPMARK_RESIDENT", "0");
        }
        ok(cmd.stdout(Stdio::null()))
    };
    wan_mux();
    wan_run(&format!("wan-warm-{pid}"), true);
    wan_run(&format!("wan-warm-pc-{pid}"), false);
    let wan_n = rounds(10).min(10);
    let (mut ta, mut tb, mut tc) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ra, mut rb, mut rc) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..wan_n {
        relay.clear();
        let start = Instant::now();
        wan_mux();
        ta.push(start.elapsed());
        ra.push(relay.exchanges());
        relay.clear();
        let start = Instant::now();
        wan_run(&format!("wan-{i}-{pid}"), true);
        tb.push(start.elapsed());
        rb.push(relay.exchanges());
        relay.clear();
        let start = Instant::now();
        wan_run(&format!("wan-pc-{i}-{pid}"), false);
        tc.push(start.elapsed());
        rc.push(relay.exchanges());
    }
    let trips = |mut r: Vec<usize>| {
        r.sort();
        r[r.len() / 2]
    };
    let (wssh, wours, wpc) = (median(ta), median(tb), median(tc));
    println!(
        "through a relay adding {} ms each way, reused, {wan_n} calls each, medians:\n  \
         ssh ControlMaster:                           {}   {} round trips per call\n  \
         opmark run, keeper + resident shim:          {}   {} round trips per call (goal <= 1)   ratio {:.2}x\n  \
         opmark run, keeper, shim per call:           {}   {} round trips per call",
        ONE_WAY.as_millis(),
        ms(wssh),
        trips(ra),
        ms(wours),
        trips(rb),
        wours.as_secs_f64() / wssh.as_secs_f64(),
        ms(wpc),
        trips(rc)
    );

    resident_shim_time(&base, rounds(50));

    // The client process's own cost per reused call: its CPU (the keeper is not its
    // child, so not counted) and the fsyncs it makes.
    let before = children_cpu();
    for i in 0..n {
        opmark_true("target1", &format!("cpu-{i}-{pid}"));
    }
    let cpu = (children_cpu() - before) / n as u32;
    let synced = fsyncs(
        &mut opmark_cmd(&[
            "run",
            "target1",
            "--op",
            &format!("sync-{pid}"),
            "--",
            "true",
        ]),
        &base.join("strace.txt"),
    );
    println!(
        "the client process per reused call, {n} calls: CPU {} (user + system; goal <= 6 ms, issue 46), fsyncs {} (goal <= 2)",
        ms(cpu),
        synced.map_or_else(|| "not counted (no strace)".to_owned(), |c| c.to_string())
    );

    // The keeper holding one connection per host.
    for n in 1..=HOSTS {
        opmark_true(&format!("target{n}"), &format!("mem-{n}-{pid}"));
    }
    let keeper = std::fs::read_to_string(run_dir.join("opmark/keeper.pid"))
        .expect("the keeper's pid file")
        .trim()
        .to_string();
    let status = opmark_cmd(&["--json", "keeper", "status"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let held = doc["connections"].as_array().map_or(0, |c| c.len());
    let (rss, hwm) = memory_kib(&keeper);
    println!(
        "keeper memory with {held} hosts held: RSS {:.1} MiB, peak {:.1} MiB (goal <= 30 MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );

    ok(&mut opmark_cmd(&["keeper", "stop"]));
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
