//! Where opmark's time goes, against OpenSSH, on a disposable loopback target:
//! cold `ssh host true` vs cold `opmark run host -- true` (a fresh op each time, ledger
//! and all), and the host shim's own cost (`dash -c SHIM run ... true` vs `dash -c true`).
//! Prints medians and ratios; a benchmark, never a test (`cargo bench --bench latency`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::lab::{Lab, LabSpec, Placement};
use opmark::op_id::OpId;
use opmark::shim::{self, RunRequest, Verb};

const ROUNDS: usize = 15;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(mut f: impl FnMut(usize)) -> Duration {
    f(usize::MAX); // warm the page cache and the target's sshd
    median(
        (0..ROUNDS)
            .map(|i| {
                let start = Instant::now();
                f(i);
                start.elapsed()
            })
            .collect(),
    )
}

fn ok(cmd: &mut Command) {
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(status.success(), "{cmd:?} failed");
}

/// The shim run locally as sshd would run it: the verb's input (the command) on stdin,
/// replies into pipes (it does nothing when they cannot reach a client). It must end
/// with the command's exit frame, or the figure would time a refusal.
fn shim_ok(cmd: &mut Command, input: &[u8]) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input)
        .expect("feed the shim");
    let out = child.wait_with_output().expect("wait");
    let frames = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && frames.contains(" X code=0 "),
        "{cmd:?} failed: {frames}"
    );
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-latency");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let lab = Lab::start(&LabSpec {
        count: 1,
        placement: Placement::Loopback,
        dir: base.join("lab"),
    })
    .expect("start a loopback sshd target (is openssh-server installed?)");
    let cfg = lab.ssh_config();
    let opmark = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/opmark");
    let opmark = if opmark.exists() {
        opmark
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/opmark")
    };

    let ssh = time(|_| {
        ok(Command::new("ssh")
            .arg("-F")
            .arg(cfg)
            .args(["-o", "BatchMode=yes", "target1", "true"]))
    });
    let run = time(|i| {
        ok(Command::new(&opmark)
            .arg("-F")
            .arg(cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            .env("XDG_CONFIG_HOME", base.join("config"))
            .args([
                "run",
                "target1",
                "--op",
                &format!("bench-{i}-{}", std::process::id()),
                "--",
                "true",
            ]))
    });
    let replay = time(|_| {
        ok(Command::new(&opmark)
            .arg("-F")
            .arg(cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            .env("XDG_CONFIG_HOME", base.join("config"))
            .args(["run", "target1", "--op", "bench-replayed", "--", "true"]))
    });

    let state = base.join("shim-state");
    let fp = "0".repeat(64);
    let bare = time(|_| ok(Command::new("dash").args(["-c", "true"])));
    let shimmed = time(|i| {
        let op = OpId::parse(&format!("shim-{i}")).unwrap();
        let verb = Verb::Run(RunRequest {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fp,
            family: Family::ReadOnly,
            timeout: None,
            output_cap: shim::DEFAULT_OUTPUT_CAP,
            stdin: None,
            supersede_interrupted: false,
            command: "true",
        });
        if i == usize::MAX {
            let _ = std::fs::remove_dir_all(state.join("opmark/ops/shim-18446744073709551615"));
        }
        // A disposable state dir, so the bench also runs from a clone under /tmp.
        shim_ok(
            shim::local_command(Path::new("/usr/bin/dash"), &verb)
                .env("XDG_STATE_HOME", &state)
                .env("OPMARK_ALLOW_VOLATILE_ROOT", "1"),
            &shim::local_data(&verb, b""),
        )
    });

    println!(
        "opmark {} ({}), {ROUNDS} rounds, medians, loopback sshd",
        env!("CARGO_PKG_VERSION"),
        opmark.display()
    );
    println!("  OpenSSH  ssh host true (cold)            {}", ms(ssh));
    println!(
        "  opmark   run host -- true (cold, new op) {}  ratio {:.2}x",
        ms(run),
        run.as_secs_f64() / ssh.as_secs_f64()
    );
    println!(
        "  opmark   run, same op again (replay)     {}  ratio {:.2}x",
        ms(replay),
        replay.as_secs_f64() / ssh.as_secs_f64()
    );
    println!("  host shim: dash -c true                  {}", ms(bare));
    println!(
        "  host shim: claim + detach + record true  {}  (+{} per command)",
        ms(shimmed),
        ms(shimmed.saturating_sub(bare))
    );
    lab.stop().ok();
}
