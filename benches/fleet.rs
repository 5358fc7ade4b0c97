//! One command on 20 loopback targets, in one go, by opmark and by its peers (see
//! docs/findings.md#speed, issue 18): `opmark run` with 20 hosts, `xargs -P20 ssh`, parallel-ssh
//! (Debian's `pssh`) and `ansible -m raw`. Prints medians, ratios to parallel-ssh, the
//! peak memory of the 20-host opmark run (`/usr/bin/time -v`) and the machine's load.
//! A peer that is not installed is skipped with a message. A benchmark, never a test
//! (`cargo bench --bench fleet`; `OPMARK_BENCH_BIN=PATH` times another opmark build).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::{Lab, LabSpec, Placement};

const HOSTS: usize = 20;
const ROUNDS: usize = 5;
const REMOTE: &str = "uptime";

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median wall time of `ROUNDS` runs of `make(round)`, after one warm-up run.
fn time(mut make: impl FnMut(usize) -> Command) -> Duration {
    ok(&mut make(usize::MAX));
    median(
        (0..ROUNDS)
            .map(|i| {
                let mut cmd = make(i);
                let start = Instant::now();
                ok(&mut cmd);
                start.elapsed()
            })
            .collect(),
    )
}

fn ok(cmd: &mut Command) {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("load average"))
        .count();
    // pssh prints its own status lines; the others print one uptime line per host.
    assert!(lines >= HOSTS, "{cmd:?}: only {lines} hosts answered");
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `OPMARK_BENCH_BIN` (another build, for before/after), else this tree's release build,
/// else its debug build.
fn opmark_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("OPMARK_BENCH_BIN") {
        return PathBuf::from(bin);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let release = root.join("target/release/opmark");
    if release.exists() {
        release
    } else {
        root.join("target/debug/opmark")
    }
}

/// Peak resident memory (KiB) and CPU time (user + system) of one run, from GNU time.
fn peak_and_cpu(cmd: &Command) -> Option<(u64, f64)> {
    let mut timed = Command::new("/usr/bin/time");
    timed.arg("-v").arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            timed.env(k, v);
        }
    }
    let out = timed.stdin(Stdio::null()).output().ok()?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    let field = |name: &str| -> Option<f64> {
        report.lines().find_map(|l| {
            l.trim()
                .strip_prefix(name)
                .and_then(|v| v.trim().parse().ok())
        })
    };
    let peak = field("Maximum resident set size (kbytes):")?;
    let cpu = field("User time (seconds):")? + field("System time (seconds):")?;
    Some((peak as u64, cpu))
}

/// The commits that wrote the attempts of op `op` on its hosts, and the hosts: one
/// transaction stamps all its events with one record time (microseconds), so the distinct
/// times of the `attempt_dispatched` events are the commits.
fn commits_before_dispatch(ledger: &Path, op: &str) -> Result<(usize, usize), String> {
    use opmark::ledger::{Event, Ledger, OpKey};
    let ledger = Ledger::open(ledger).map_err(|e| e.to_string())?;
    let records = ledger.operations_by_id(op).map_err(|e| e.to_string())?;
    let mut times = std::collections::BTreeSet::new();
    for r in &records {
        let events = ledger
            .events(&OpKey::new(op, r.host.clone()))
            .map_err(|e| e.to_string())?;
        for e in events {
            if let Event::AttemptDispatched { .. } = e.event {
                times.insert(e.at);
            }
        }
    }
    Ok((times.len(), records.len()))
}

fn main() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-fleet");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let lab = Lab::start(&LabSpec {
        count: HOSTS,
        placement: Placement::Loopback,
        dir: base.join("lab"),
    })
    .expect("start 20 loopback sshd targets (is openssh-server installed?)");
    let cfg = lab.ssh_config().to_path_buf();
    let hosts: Vec<String> = lab.targets().iter().map(|t| t.alias.clone()).collect();
    let hosts_file = base.join("hosts");
    std::fs::write(&hosts_file, hosts.join("\n") + "\n").unwrap();
    let opmark = opmark_binary();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let opmark_cmd = |i: usize| {
        let mut c = Command::new(&opmark);
        c.arg("-F")
            .arg(&cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            // Cold figures: every run makes its own connections (reuse is benches/reuse.rs).
            .env("OPMARK_PERSIST", "0")
            .env("XDG_CONFIG_HOME", base.join("config"))
            // Its memory of which hosts have the shim stays in the bench's directory.
            .env("XDG_STATE_HOME", base.join("state"))
            .arg("run")
            .args(&hosts)
            .args([
                "--op",
                &format!("bench-{i}-{}", std::process::id()),
                "--",
                REMOTE,
            ]);
        c
    };
    let mut rows: Vec<(&str, Option<Duration>)> = Vec::new();
    rows.push(("opmark run (20 hosts)", Some(time(opmark_cmd))));
    let commits = commits_before_dispatch(
        &base.join("ledger.db"),
        &format!("bench-0-{}", std::process::id()),
    );
    let peak = peak_and_cpu(&opmark_cmd(usize::MAX - 1));

    rows.push((
        "xargs -P20 ssh",
        Some(time(|_| {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                &format!(
                    "xargs -P20 -I{{}} ssh -F {} -o BatchMode=yes {{}} {REMOTE} < {}",
                    cfg.display(),
                    hosts_file.display()
                ),
            ]);
            c
        })),
    ));

    let pssh = ["parallel-ssh", "pssh"].into_iter().find(|t| have(t));
    rows.push((
        "parallel-ssh -p 20",
        pssh.map(|tool| {
            time(|_| {
                let mut c = Command::new(tool);
                c.args(["-p", "20", "-i", "-h"])
                    .arg(&hosts_file)
                    .args(["-x", &format!("-F {} -o BatchMode=yes", cfg.display())])
                    .arg(REMOTE);
                c
            })
        }),
    ));

    let ansible = have("ansible").then(|| {
        std::fs::create_dir_all(base.join("ansible")).unwrap();
        time(|_| {
            let mut c = Command::new("ansible");
            c.args(["all", "-i"])
                .arg(&hosts_file)
                .args(["-f", "20", "-m", "raw", "-a", REMOTE])
                .env(
                    "ANSIBLE_SSH_ARGS",
                    format!("-F {} -o BatchMode=yes", cfg.display()),
                )
                .env("ANSIBLE_LOCAL_TEMP", base.join("ansible"))
                .env("ANSIBLE_HOME", base.join("ansible"));
            c
        })
    });
    rows.push(("ansible -f20 -m raw", ansible));

    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let reference = rows[2].1;
    println!(
        "opmark {} ({}), {HOSTS} loopback targets, `{REMOTE}`, {ROUNDS} rounds, medians",
        env!("CARGO_PKG_VERSION"),
        opmark.display()
    );
    for (name, took) in &rows {
        match (took, reference) {
            (Some(t), Some(r)) => println!(
                "  {name:<24} {}  {:.2}x parallel-ssh",
                secs(*t),
                t.as_secs_f64() / r.as_secs_f64()
            ),
            (Some(t), None) => println!("  {name:<24} {}", secs(*t)),
            (None, _) => println!("  {name:<24} skipped: not installed"),
        }
    }
    match commits {
        Ok((commits, hosts)) => println!(
            "  the hosts' intents and attempts of one run: {hosts} hosts in {commits} commits"
        ),
        Err(e) => println!("  commits before dispatch: not counted ({e})"),
    }
    match peak {
        Some((kib, cpu)) => println!(
            "  the 20-host opmark run: peak memory {:.1} MiB, CPU {cpu:.2} s (user + system)",
            kib as f64 / 1024.0
        ),
        None => println!("  peak memory: skipped (/usr/bin/time -v unavailable)"),
    }
    println!(
        "  load average before {} after {}",
        load_before.trim(),
        load_after.trim()
    );
    lab.stop().ok();
}
