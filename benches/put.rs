//! `opmark put` of one 100 MB file, and of 1,000 small files in 10 directories (`-r`),
//! against `scp` and `rsync` (docs/commands.md#put-files-delivered-once), on loopback and
//! through a relay adding 25 ms each way: the same content, A B C per round (each tool
//! writes a destination that does not exist yet, so every round writes),
//! medians and ratios printed. opmark connects through its keeper after one warm-up, as
//! an agent calling it repeatedly would; scp and rsync connect per call, as they are used.
//! scp runs with `-O` (its own protocol: the lab's sshd has no sftp subsystem).
//! A benchmark, never a test (`cargo bench --bench put`; `OPMARK_BENCH_BIN` times another
//! build, `OPMARK_BENCH_ROUNDS` sets the rounds, `OPMARK_BENCH_MB` the size,
//! `OPMARK_BENCH_FILES` how many small files).

// Each bench uses part of the shared relay.
#[allow(dead_code)]
#[path = "common/relay.rs"]
mod relay;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::{Lab, LabSpec, Placement};

/// The relay's delay each way: a 50 ms round trip.
const ONE_WAY: Duration = Duration::from_millis(25);

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
        .max(1)
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

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One tool's way of copying its source to `dest` on the host named `alias` in `cfg`.
type Copy<'a> = Box<dyn Fn(&Path, &str, &str) + 'a>;

/// Times each tool `rounds` times, interleaved, and prints medians and ratios to scp.
/// `after_each` runs after every copy (the relay drops its log of the chunks).
#[allow(clippy::too_many_arguments)]
fn compare(
    title: &str,
    what: &str,
    cfg: &Path,
    alias: &str,
    remote_dir: &Path,
    tools: &[(&str, Copy)],
    rounds: usize,
    mb: f64,
    after_each: &dyn Fn(),
) {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); tools.len()];
    for round in 0..rounds {
        for (i, (name, copy)) in tools.iter().enumerate() {
            let dest = remote_dir.join(format!("{name}-{round}"));
            let start = Instant::now();
            copy(cfg, alias, dest.to_str().unwrap());
            times[i].push(start.elapsed());
            let _ = std::fs::remove_file(&dest);
            let _ = std::fs::remove_dir_all(&dest);
            after_each();
        }
    }
    println!("\n{title}: {what}, median of {rounds}");
    let scp = median(times[0].clone());
    for ((name, _), t) in tools.iter().zip(times) {
        let m = median(t);
        println!(
            "  {name:<8} {:>8.0} ms  {:>6.1} MB/s  {:>5.2}x scp",
            m.as_secs_f64() * 1e3,
            mb / m.as_secs_f64(),
            m.as_secs_f64() / scp.as_secs_f64()
        );
    }
}

/// scp, rsync (when installed) and opmark, each copying `source` (with `recursive`, a
/// directory's files into the destination directory, made by the copy).
fn tools<'a>(
    opmark: &'a Path,
    base: &'a Path,
    source: &'a Path,
    recursive: bool,
    counter: &'a std::cell::Cell<u32>,
) -> Vec<(&'static str, Copy<'a>)> {
    let pid = std::process::id();
    // The destination directory, made by the copy, holds the source's files directly:
    // scp names the directory (a destination that does not exist becomes its copy),
    // rsync `DIR/`, opmark `DIR/.`.
    let from = move |tail: &str| -> String {
        let mut text = source.display().to_string();
        if recursive {
            text.push_str(tail);
        }
        text
    };
    let mut tools: Vec<(&str, Copy)> = vec![(
        "scp",
        Box::new(move |cfg: &Path, alias: &str, dest: &str| {
            // -O: the classic scp protocol over a command channel, as the lab's sshd
            // runs no sftp subsystem (scp's default transfer since OpenSSH 9.0).
            ok(Command::new("scp")
                .args(["-q", "-O"])
                .args(recursive.then_some("-r"))
                .arg("-F")
                .arg(cfg)
                .args(["-o", "BatchMode=yes"])
                .arg(from(""))
                .arg(format!("{alias}:{dest}")))
        }),
    )];
    if have("rsync") {
        tools.push((
            "rsync",
            Box::new(move |cfg: &Path, alias: &str, dest: &str| {
                ok(Command::new("rsync")
                    .arg("-q")
                    .args(recursive.then_some("-r"))
                    .arg("-e")
                    .arg(format!("ssh -F {} -o BatchMode=yes", cfg.display()))
                    .arg(from("/"))
                    .arg(format!("{alias}:{dest}")))
            }),
        ));
    } else {
        println!("rsync: not installed (scripts/install-deps.sh --bench); left out");
    }
    tools.push((
        "opmark",
        Box::new(move |cfg: &Path, alias: &str, dest: &str| {
            counter.set(counter.get() + 1);
            ok(Command::new(opmark)
                .arg("-F")
                .arg(cfg)
                .env("OPMARK_LEDGER", base.join("ledger.db"))
                .env("XDG_CONFIG_HOME", base.join("config"))
                .env("XDG_STATE_HOME", base.join("state"))
                .env("XDG_RUNTIME_DIR", base.join("run"))
                .env("OPMARK_PERSIST", "5m")
                .arg("-q")
                .arg("put")
                .args(recursive.then_some("-r"))
                .arg(from("/."))
                .arg(format!("{alias}:{dest}"))
                .args(["--op", &format!("put-{pid}-{}", counter.get())]))
        }),
    ));
    tools
}

/// `count` files of 1-4 KB in directories of 100 under `dir`.
fn small_files(dir: &Path, count: usize) -> f64 {
    let mut bytes = 0;
    for i in 0..count {
        let sub = dir.join(format!("d{:02}", i / 100));
        std::fs::create_dir_all(&sub).unwrap();
        let len = 1024 + (i * 2654435761) % 3072;
        let content: Vec<u8> = (0..len).map(|j| ((i + j) % 251) as u8).collect();
        std::fs::write(sub.join(format!("f{i:04}.txt")), content).unwrap();
        bytes += len;
    }
    bytes as f64 / (1 << 20) as f64
}

fn main() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-put");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let lab = Lab::start(&LabSpec {
        count: 1,
        placement: Placement::Loopback,
        dir: base.join("lab"),
    })
    .expect("start a loopback sshd target (is openssh-server installed?)");
    let cfg = lab.ssh_config().to_path_buf();
    let opmark: PathBuf = std::env::var_os("OPMARK_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_opmark")));
    let rounds = setting("OPMARK_BENCH_ROUNDS", 3);
    let mb = setting("OPMARK_BENCH_MB", 100);
    let count = setting("OPMARK_BENCH_FILES", 1000);
    let local = base.join("content");
    let bytes: Vec<u8> = (0..mb << 20)
        .map(|i| (i as u64 * 2654435761 % 251) as u8)
        .collect();
    std::fs::write(&local, bytes).unwrap();
    let small = base.join("small");
    let small_mb = small_files(&small, count);
    let remote_dir = base.join("remote");
    std::fs::create_dir_all(&remote_dir).unwrap();
    let counter = std::cell::Cell::new(0u32);
    let (wan_cfg, relay) = relay::wan1(&lab, &base, ONE_WAY);
    let sets = [
        (format!("one {mb} MB file"), &local, false, mb as f64),
        (
            format!(
                "{count} files of 1-4 KB in {} directories",
                count.div_ceil(100)
            ),
            &small,
            true,
            small_mb,
        ),
    ];
    for (what, source, recursive, size) in &sets {
        let tools = tools(&opmark, &base, source, *recursive, &counter);
        // Warm-up: opmark's keeper holds its connection and the host caches its shim.
        for (name, copy) in &tools {
            let warm = remote_dir.join(format!("warm-{name}"));
            copy(&cfg, "target1", warm.to_str().unwrap());
            let _ = std::fs::remove_file(&warm);
            let _ = std::fs::remove_dir_all(&warm);
        }
        compare(
            "loopback",
            what,
            &cfg,
            "target1",
            &remote_dir,
            &tools,
            rounds,
            *size,
            &|| {},
        );
        for (name, copy) in &tools {
            let warm = remote_dir.join(format!("warm-wan-{name}"));
            copy(&wan_cfg, "wan1", warm.to_str().unwrap());
            let _ = std::fs::remove_file(&warm);
            let _ = std::fs::remove_dir_all(&warm);
            relay.clear();
        }
        compare(
            &format!("through a relay adding {} ms each way", ONE_WAY.as_millis()),
            what,
            &wan_cfg,
            "wan1",
            &remote_dir,
            &tools,
            rounds,
            *size,
            &|| relay.clear(),
        );
    }
    let _ = Command::new(&opmark)
        .env("XDG_RUNTIME_DIR", base.join("run"))
        .args(["keeper", "stop"])
        .output();
}
