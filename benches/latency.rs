//! Where opmark's time goes, against OpenSSH, on a disposable loopback target, measured
//! A B A B (each round runs OpenSSH, then opmark, so load on the machine hits both):
//! cold `ssh host true` vs cold `opmark run host -- true` (a fresh op each time, ledger
//! and all; the host's cached shim warm, and once more with it removed before each run,
//! as on the first call to a host), the replay of an op that already ran, and the host
//! shim's own cost (`dash SHIM run ... true` as the stub runs it vs `dash -c true`). Then
//! peak memory of a cold run, and the same cold comparison through a relay that delays
//! every chunk 25 ms each way (a 50 ms round trip: loopback has no netem), which also
//! counts the round trips each client waits for, and peak memory of a `--json` run whose
//! command writes 100 MB (spooled, not held: docs/ledger.md#redaction). Prints medians and ratios; a benchmark,
//! never a test (`cargo bench --bench latency`; `OPMARK_BENCH_BIN` times another build).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::lab::{Lab, LabSpec, Placement};
use opmark::op_id::OpId;
use opmark::shim::{self, RunRequest, Verb};

const ROUNDS: usize = 15;
const WAN_ROUNDS: usize = 5;
const ONE_WAY: Duration = Duration::from_millis(25);

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Medians of `a` and `b` run alternately, `rounds` times each, after one warm-up each.
fn paired(
    rounds: usize,
    mut a: impl FnMut(usize),
    mut b: impl FnMut(usize),
) -> (Duration, Duration) {
    a(usize::MAX);
    b(usize::MAX);
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let start = Instant::now();
        a(i);
        ta.push(start.elapsed());
        let start = Instant::now();
        b(i);
        tb.push(start.elapsed());
    }
    (median(ta), median(tb))
}

fn ok(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shim run locally as the stub runs it from the host's cache, the verb's input (the
/// command) on stdin, replies into pipes (it does nothing when they cannot reach a
/// client). It must end with the command's exit frame, or the figure would time a refusal.
fn shim_ok(cmd: &mut Command, input: &[u8]) {
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

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
}

/// A TCP relay in front of `upstream` that holds every chunk `delay` before passing it
/// on (throughput is untouched: chunks queue, they do not wait for each other) and logs
/// when each chunk arrived and from which side.
struct Relay {
    port: u16,
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
}

impl Relay {
    fn start(upstream: SocketAddr, delay: Duration) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().unwrap().port();
        let log: Arc<Mutex<Vec<(Instant, bool)>>> = Arc::default();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for s in [&client, &server] {
                    s.set_nodelay(true).ok();
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                pump(client, s2, true, delay, log2.clone());
                pump(server, c2, false, delay, log2.clone());
            }
        });
        Relay { port, log }
    }

    fn clear(&self) {
        self.log.lock().unwrap().clear();
    }

    /// Round trips the client waited for in what the log holds: the TCP handshake, plus
    /// each flight of client chunks that a flight of server chunks answered. A final
    /// client flight nobody answers (a close, a disconnect) is not waited for.
    fn round_trips(&self) -> usize {
        let mut log = self.log.lock().unwrap().clone();
        log.sort_by_key(|(t, _)| *t);
        let mut flights: Vec<bool> = Vec::new();
        for (_, from_client) in log {
            if flights.last() != Some(&from_client) {
                flights.push(from_client);
            }
        }
        1 + flights.windows(2).filter(|w| w[0] && !w[1]).count()
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    from_client: bool,
    delay: Duration,
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        for (at, bytes) in rx {
            let due = at + delay;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                return;
            }
        }
        to.shutdown(std::net::Shutdown::Write).ok();
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            let now = Instant::now();
            log.lock().unwrap().push((now, from_client));
            if tx.send((now, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
}

/// Peak resident memory of one run of `cmd`, through GNU time.
fn peak_kib(cmd: &Command) -> Option<u64> {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        return None;
    }
    let mut timed = Command::new(time);
    timed.arg("-f").arg("peak-kib=%M").arg(cmd.get_program());
    timed.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            timed.env(k, v);
        }
    }
    // The output goes nowhere: the figure is opmark's, not a reader's buffer.
    let out = timed
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("peak-kib="))
        .next_back()?
        .trim()
        .parse()
        .ok()
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
    let cfg = lab.ssh_config().to_path_buf();
    let target = lab.target("target1").unwrap().clone();
    let opmark: PathBuf = std::env::var_os("OPMARK_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_opmark")));
    let cache = target
        .marker_root()
        .join("shim")
        .join(format!("{}.sh", shim::script_sha256()));

    let ssh_true = |cfg: &Path, alias: &str| {
        ok(Command::new("ssh")
            .arg("-F")
            .arg(cfg)
            .args(["-o", "BatchMode=yes", alias, "true"])
            .stdout(Stdio::null()))
    };
    let opmark_cmd = |cfg: &Path, alias: &str, op: &str| {
        let mut cmd = Command::new(&opmark);
        cmd.arg("-F")
            .arg(cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            // Cold figures: every run makes its own connection (reuse is benches/reuse.rs).
            .env("OPMARK_PERSIST", "0")
            .env("XDG_CONFIG_HOME", base.join("config"))
            .args(["run", alias, "--op", op, "--", "true"]);
        cmd
    };
    let pid = std::process::id();

    let (ssh, run) = paired(
        ROUNDS,
        |_| ssh_true(&cfg, "target1"),
        |i| {
            ok(&mut opmark_cmd(
                &cfg,
                "target1",
                &format!("bench-{i}-{pid}"),
            ))
        },
    );
    let (ssh_first, first) = paired(
        ROUNDS,
        |_| ssh_true(&cfg, "target1"),
        |i| {
            let _ = std::fs::remove_file(&cache);
            ok(&mut opmark_cmd(
                &cfg,
                "target1",
                &format!("first-{i}-{pid}"),
            ))
        },
    );
    let (ssh_replay, replay) = paired(
        ROUNDS,
        |_| ssh_true(&cfg, "target1"),
        |_| ok(&mut opmark_cmd(&cfg, "target1", "bench-replayed")),
    );

    // The shim as the stub runs it: from its cached file, under dash.
    let state = base.join("shim-state");
    let file = base.join("shim.sh");
    std::fs::write(&file, shim::SCRIPT).unwrap();
    let fp = "0".repeat(64);
    let (bare, shimmed) = paired(
        ROUNDS,
        |_| ok(Command::new("dash").args(["-c", "true"])),
        |i| {
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
                repeat: opmark::shim::RepeatCheck::OFF,
                command: "true",
            });
            if i == usize::MAX {
                let _ = std::fs::remove_dir_all(state.join("opmark/ops/shim-18446744073709551615"));
            }
            // A disposable state dir, so the bench also runs from a clone under /tmp.
            shim_ok(
                Command::new("/usr/bin/dash")
                    .arg(&file)
                    .arg(&file)
                    .args(verb.args())
                    .env("OPMARK_SH", "/usr/bin/dash")
                    .env("XDG_STATE_HOME", &state)
                    .env("OPMARK_ALLOW_VOLATILE_ROOT", "1"),
                &shim::local_data(&verb, b""),
            )
        },
    );

    let peaks: Vec<u64> = (0..5)
        .filter_map(|i| peak_kib(&opmark_cmd(&cfg, "target1", &format!("mem-{i}-{pid}"))))
        .collect();
    // `--json` with 100 MB of output (a megabyte kept in memory per stream, the rest in
    // the spool): before spooling, the document held it twice (400 MB -> 796 MB RSS).
    let big = |i: usize, json: bool| {
        let mut cmd = Command::new(&opmark);
        cmd.arg("-F")
            .arg(&cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            .env("OPMARK_PERSIST", "0")
            .env("XDG_CONFIG_HOME", base.join("config"));
        if json {
            cmd.arg("--json");
        }
        cmd.args([
            "run",
            "target1",
            "--op",
            &format!("big-{json}-{i}-{pid}"),
            "--",
        ])
        .arg("head -c 100000000 /dev/zero | tr '\\0' a");
        cmd
    };
    let json_peaks: Vec<u64> = (0..3).filter_map(|i| peak_kib(&big(i, true))).collect();
    let plain_peaks: Vec<u64> = (0..3).filter_map(|i| peak_kib(&big(i, false))).collect();

    // Through the delaying relay: an alias for it that keeps the target's host key.
    let relay = Relay::start(SocketAddr::new(target.addr, target.port), ONE_WAY);
    let wan_cfg = base.join("ssh_config.wan");
    let lab_cfg = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &wan_cfg,
        format!(
            "Host wan1\n  HostName 127.0.0.1\n  Port {}\n  HostKeyAlias {}\n  User {}\n  \
             IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  \
             StrictHostKeyChecking yes\n\n{lab_cfg}",
            relay.port,
            target.known_hosts_host(),
            target.user,
            lab.client_key().display(),
            lab.known_hosts().display(),
        ),
    )
    .unwrap();
    let (wan_ssh, wan_run) = paired(
        WAN_ROUNDS,
        |_| ssh_true(&wan_cfg, "wan1"),
        |i| ok(&mut opmark_cmd(&wan_cfg, "wan1", &format!("wan-{i}-{pid}"))),
    );
    relay.clear();
    ssh_true(&wan_cfg, "wan1");
    let trips_ssh = relay.round_trips();
    relay.clear();
    ok(&mut opmark_cmd(&wan_cfg, "wan1", &format!("trips-{pid}")));
    let trips_run = relay.round_trips();
    relay.clear();
    let _ = std::fs::remove_file(&cache);
    ok(&mut opmark_cmd(
        &wan_cfg,
        "wan1",
        &format!("trips-first-{pid}"),
    ));
    let trips_first = relay.round_trips();

    println!(
        "opmark {} ({}), A B A B, {ROUNDS} pairs, medians, loopback sshd, {} cores",
        env!("CARGO_PKG_VERSION"),
        opmark.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("  cold ssh host true                        {}", ms(ssh));
    println!(
        "  cold opmark run -- true (new op)          {}  ratio {}",
        ms(run),
        ratio(run, ssh)
    );
    println!(
        "  same, first call to the host (no cache)   {}  ratio {}  (ssh {})",
        ms(first),
        ratio(first, ssh_first),
        ms(ssh_first)
    );
    println!(
        "  opmark run, same op again (replay)        {}  ratio {}  (ssh {})",
        ms(replay),
        ratio(replay, ssh_replay),
        ms(ssh_replay)
    );
    println!("  host shim: dash -c true                   {}", ms(bare));
    println!(
        "  host shim: claim + detach + record true   {}  (+{} per command)",
        ms(shimmed),
        ms(shimmed.saturating_sub(bare))
    );
    match peaks.iter().max() {
        Some(kib) => println!(
            "  peak memory of a cold run (max of {})      {:.1} MiB",
            peaks.len(),
            *kib as f64 / 1024.0
        ),
        None => println!("  peak memory: /usr/bin/time not found"),
    }
    if let (Some(json), Some(plain)) = (json_peaks.iter().max(), plain_peaks.iter().max()) {
        println!(
            "  peak memory, 100 MB of output (max of {}): --json {:.1} MiB, streamed {:.1} MiB",
            json_peaks.len(),
            *json as f64 / 1024.0,
            *plain as f64 / 1024.0
        );
    }
    println!(
        "through a relay adding {} each way, {WAN_ROUNDS} pairs:",
        ms(ONE_WAY)
    );
    println!(
        "  cold ssh host true                        {}  {trips_ssh} round trips",
        ms(wan_ssh)
    );
    println!(
        "  cold opmark run -- true                   {}  ratio {}  {trips_run} round trips ({trips_first} on the first call to a host)",
        ms(wan_run),
        ratio(wan_run, wan_ssh)
    );
    lab.stop().ok();
}
