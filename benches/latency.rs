//! Where opmark's time goes, against OpenSSH, on a disposable loopback target, measured
//! A B A B (each round runs OpenSSH, then opmark, so load on the machine hits both):
//! cold `ssh host true` vs cold `opmark run host -- true` (a fresh op each time, ledger
//! and all; the host's cached shim warm, and once more with it and the client's memory
//! of it removed before each run, as on the first call to a host), the replay of an op
//! that already ran, and the host shim's own cost (`dash SHIM run ... true` as the stub
//! runs it vs `dash -c true`). Then peak memory of a cold run, and the same cold
//! comparison through a relay that delays every chunk 25 ms each way (a 50 ms round
//! trip: loopback has no netem), and peak memory of a `--json` run whose command writes
//! 100 MB (spooled, not held: docs/ledger.md#redaction). Last, the round trips each
//! client waits for through the relay, phase by phase (TCP, version, kex, service
//! request, auth, channel open, exec, reply, close; how they are named: [`named_trips`]).
//! Prints medians and ratios; a benchmark, never a test (`cargo bench --bench latency`;
//! `OPMARK_BENCH_BIN` times another build, `OPMARK_BENCH_TRIPS=1` counts the round trips
//! only).
//!
//! A trip named `?` is one whose answer the client logs nothing for at `-vvv`: russh's
//! PK_OK to an unsigned public-key query (opmark before issue 31).

// Each bench uses part of the shared relay (latency names trips, reuse counts them).
#[allow(dead_code)]
#[path = "common/relay.rs"]
mod relay;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::lab::{Lab, LabSpec, Placement};
use opmark::op_id::OpId;
use opmark::shim::{self, RunCall, Verb};
use relay::Relay;

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

/// What a client waits for, in the order an SSH exchange meets it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Phase {
    Tcp,
    Version,
    Kex,
    Service,
    Auth,
    ChannelOpen,
    Exec,
    Reply,
    Close,
}

const PHASES: [(Phase, &str); 9] = [
    (Phase::Tcp, "TCP"),
    (Phase::Version, "version"),
    (Phase::Kex, "kex"),
    (Phase::Service, "service request"),
    (Phase::Auth, "auth"),
    (Phase::ChannelOpen, "channel open"),
    (Phase::Exec, "exec"),
    (Phase::Reply, "reply"),
    (Phase::Close, "close"),
];

fn phase_name(p: Phase) -> &'static str {
    PHASES.iter().find(|(q, _)| *q == p).map_or("?", |(_, n)| n)
}

/// The phase an SSH message answers, by its type number (RFC 4250 §4.1). `None` for
/// messages nobody waits for (EXT_INFO, global requests, window adjustments).
fn phase_of_type(msg: u8) -> Option<Phase> {
    match msg {
        20..=49 => Some(Phase::Kex),
        6 => Some(Phase::Service),
        50..=79 => Some(Phase::Auth),
        91 | 92 => Some(Phase::ChannelOpen),
        99 | 100 => Some(Phase::Exec),
        94 | 95 | 98 => Some(Phase::Reply),
        96 | 97 => Some(Phase::Close),
        _ => None,
    }
}

/// One side's stream read as SSH's clear text: the identification line, then binary
/// packets (RFC 4253 §6) up to that side's NEWKEYS; after it the relay sees only
/// ciphertext, and [`ClearText::feed`] says so with `None`.
#[derive(Default)]
struct ClearText {
    buf: Vec<u8>,
    ident: bool,
    encrypted: bool,
}

/// What the relay could read in a chunk.
#[derive(Default)]
struct Seen {
    ident: bool,
    types: Vec<u8>,
    ciphertext: bool,
}

impl ClearText {
    fn feed(&mut self, bytes: &[u8]) -> Seen {
        let mut seen = Seen::default();
        if self.encrypted {
            seen.ciphertext = true;
            return seen;
        }
        self.buf.extend_from_slice(bytes);
        while !self.ident {
            let Some(nl) = self.buf.iter().position(|&b| b == b'\n') else {
                return seen;
            };
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            if line.starts_with(b"SSH-") {
                self.ident = true;
                seen.ident = true;
            }
        }
        while self.buf.len() >= 6 {
            let len = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
            if self.buf.len() < 4 + len {
                break;
            }
            let msg = self.buf[5];
            self.buf.drain(..4 + len);
            seen.types.push(msg);
            if msg == 21 {
                // NEWKEYS: what follows is encrypted.
                self.encrypted = true;
                seen.ciphertext |= !self.buf.is_empty();
                self.buf.clear();
                break;
            }
        }
        seen
    }
}

/// A line the client printed (`-vvv`), and when the bench read it.
struct Said {
    at: Instant,
    phases: Vec<Phase>,
}

/// A client's round trips, one entry per trip: the phases whose answer it carried.
type Trips = Vec<Vec<Phase>>;

/// Round trips the client waited for in what `relay` logged: the TCP handshake (the
/// relay answers it at once on loopback; on a real link it costs one), plus each
/// flight of client chunks that a flight of server chunks answered. A final client
/// flight nobody answers (a close, a disconnect) is not waited for.
///
/// Each trip is named by what its answering server flight carried: while that side is
/// still in clear text, by the relay itself (its identification line: version; key
/// exchange messages: kex); once it is encrypted, by what the client said it received
/// (`said`, its `-vvv` lines timed as the bench read them) between that flight's
/// delivery and the next one's. A trip that carried several answers (a pipelined
/// request) names them all; one the client said nothing about is `?`.
fn named_trips(relay: &Relay, said: &[Said]) -> Trips {
    let log = relay.chunks();
    let (mut client, mut server) = (ClearText::default(), ClearText::default());
    // Flights: (from_client, first chunk's arrival, what the relay read in them).
    let mut flights: Vec<(bool, Instant, Seen)> = Vec::new();
    for c in &log {
        let seen = if c.from_client {
            client.feed(&c.bytes)
        } else {
            server.feed(&c.bytes)
        };
        match flights.last_mut() {
            Some((dir, _, s)) if *dir == c.from_client => {
                s.ident |= seen.ident;
                s.types.extend(seen.types);
                s.ciphertext |= seen.ciphertext;
            }
            _ => flights.push((c.from_client, c.at, seen)),
        }
    }
    let mut trips: Trips = vec![vec![Phase::Tcp]];
    for (i, w) in flights.windows(2).enumerate() {
        let ((true, _, _), (false, at, seen)) = (&w[0], &w[1]) else {
            continue;
        };
        let mut phases: Vec<Phase> = seen
            .types
            .iter()
            .filter_map(|&t| phase_of_type(t))
            .collect();
        if seen.ident {
            phases.push(Phase::Version);
        }
        if seen.ciphertext {
            let from = *at + relay.delay;
            let until = flights[i + 2..]
                .iter()
                .find(|f| !f.0)
                .map(|f| f.1 + relay.delay);
            for s in said {
                if s.at >= from && until.is_none_or(|u| s.at < u) {
                    phases.extend(&s.phases);
                }
            }
        }
        phases.sort();
        phases.dedup();
        trips.push(phases);
    }
    trips
}

/// Runs `cmd` (stdin closed, stdout dropped), reading its stderr line by line as it comes
/// and naming the phases each line tells of with `classify`. Panics if it fails.
fn run_saying(cmd: &mut Command, classify: fn(&str) -> Vec<Phase>) -> Vec<Said> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut said = Vec::new();
    let mut text = String::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap())) {
        let Ok(line) = line else { break };
        said.push(Said {
            at: Instant::now(),
            phases: classify(&line),
        });
        text.push_str(&line);
        text.push('\n');
    }
    let status = child.wait().expect("wait");
    assert!(status.success(), "{cmd:?} failed: {text}");
    said
}

/// OpenSSH `-vvv`: `debug3: receive packet: type N`.
fn ssh_says(line: &str) -> Vec<Phase> {
    line.split_once("receive packet: type ")
        .and_then(|(_, n)| n.trim().parse::<u8>().ok())
        .and_then(phase_of_type)
        .into_iter()
        .collect()
}

/// opmark `-vvv`: russh's debug lines for what it received, and opmark's own for the
/// exec's answer, its output and its end.
fn opmark_says(line: &str) -> Vec<Phase> {
    const SAYS: &[(&str, Phase)] = &[
        ("waiting service request, Some(6)", Phase::Service),
        ("service accepted", Phase::Service),
        ("userauth_", Phase::Auth),
        ("channel_open_confirmation", Phase::ChannelOpen),
        ("the host accepted the exec request", Phase::Exec),
        ("bytes of stdout", Phase::Reply),
        ("bytes of stderr", Phase::Reply),
        ("exit status", Phase::Reply),
        ("channel_eof", Phase::Close),
        ("channel_close", Phase::Close),
    ];
    SAYS.iter()
        .filter(|(s, _)| line.contains(s))
        .map(|(_, p)| *p)
        .collect()
}

/// `7 round trips: TCP 1, version 1, ...` and the trips in order, a trip that carried
/// several answers counted once, under the last.
fn describe(trips: &Trips) -> String {
    let mut counts = String::new();
    for (phase, name) in PHASES {
        let n = trips.iter().filter(|t| t.last() == Some(&phase)).count();
        counts.push_str(&format!(", {name} {n}"));
    }
    let unknown = trips.iter().filter(|t| t.is_empty()).count();
    if unknown > 0 {
        counts.push_str(&format!(", ? {unknown}"));
    }
    let order: Vec<String> = trips
        .iter()
        .map(|t| {
            if t.is_empty() {
                "?".to_owned()
            } else {
                t.iter()
                    .map(|p| phase_name(*p))
                    .collect::<Vec<_>>()
                    .join("+")
            }
        })
        .collect();
    format!(
        "{} round trips{counts}\n      in order: {}",
        trips.len(),
        order.join(" | ")
    )
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

    let ssh_cmd = |cfg: &Path, alias: &str, verbose: bool| {
        let mut cmd = Command::new("ssh");
        cmd.arg("-F").arg(cfg).args(["-o", "BatchMode=yes"]);
        if verbose {
            cmd.arg("-vvv");
        }
        cmd.args([alias, "true"]).stdout(Stdio::null());
        cmd
    };
    let ssh_true = |cfg: &Path, alias: &str| ok(&mut ssh_cmd(cfg, alias, false));
    // What this client remembers of the hosts it called (which have its shim cached):
    // removed with the host's copy for the figures of a first call to a host.
    let client_state = base.join("state");
    let opmark_cmd_v = |cfg: &Path, alias: &str, op: &str, verbose: bool| {
        let mut cmd = Command::new(&opmark);
        if verbose {
            cmd.arg("-vvv");
        }
        cmd.arg("-F")
            .arg(cfg)
            .env("OPMARK_LEDGER", base.join("ledger.db"))
            // Cold figures: every run makes its own connection (reuse is benches/reuse.rs).
            .env("OPMARK_PERSIST", "0")
            .env("XDG_CONFIG_HOME", base.join("config"))
            .env("XDG_STATE_HOME", &client_state)
            .args(["run", alias, "--op", op, "--", "true"]);
        cmd
    };
    let opmark_cmd = |cfg: &Path, alias: &str, op: &str| opmark_cmd_v(cfg, alias, op, false);
    let forget_the_host = || {
        let _ = std::fs::remove_file(&cache);
        let _ = std::fs::remove_dir_all(&client_state);
    };
    let pid = std::process::id();
    // `OPMARK_BENCH_TRIPS=1`: only the round trips through the relay (no timings), for
    // iterating on them.
    let trips_only = std::env::var_os("OPMARK_BENCH_TRIPS").is_some();
    if trips_only {
        trips(
            &relay_cfg_for(&lab, &base),
            &ssh_cmd,
            &opmark_cmd_v,
            &forget_the_host,
            pid,
        );
        lab.stop().ok();
        return;
    }

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
            forget_the_host();
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
            let verb = Verb::Run(RunCall {
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
                secrets: opmark::secret::Secrets::none(),
                become_user: None,
                locks: &[],
                lock_wait: std::time::Duration::ZERO,
                kind: opmark::shim::RunKind::Command,
                put_from: 0,
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

    let wan_cfg = relay_cfg_for(&lab, &base);
    let (wan_ssh, wan_run) = paired(
        WAN_ROUNDS,
        |_| ssh_true(&wan_cfg.0, "wan1"),
        |i| {
            ok(&mut opmark_cmd(
                &wan_cfg.0,
                "wan1",
                &format!("wan-{i}-{pid}"),
            ))
        },
    );
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
        "  cold ssh host true                        {}",
        ms(wan_ssh)
    );
    println!(
        "  cold opmark run -- true                   {}  ratio {}",
        ms(wan_run),
        ratio(wan_run, wan_ssh)
    );
    trips(&wan_cfg, &ssh_cmd, &opmark_cmd_v, &forget_the_host, pid);
    lab.stop().ok();
}

/// An ssh_config with an alias `wan1` for the target through a new delaying relay, and
/// the relay.
fn relay_cfg_for(lab: &Lab, base: &Path) -> (PathBuf, Relay) {
    relay::wan1(lab, base, ONE_WAY)
}

/// The round trips of one cold `ssh true`, one cold `opmark run -- true` to a host that
/// has the shim and one to a host (and a client) that never met, through the relay,
/// each run with `-vvv` so that the encrypted phases can be named (see [`named_trips`]).
fn trips(
    (cfg, relay): &(PathBuf, Relay),
    ssh_cmd: &dyn Fn(&Path, &str, bool) -> Command,
    opmark_cmd_v: &dyn Fn(&Path, &str, &str, bool) -> Command,
    forget_the_host: &dyn Fn(),
    pid: u32,
) {
    // Warm: the host has the shim, the client knows it.
    ok(&mut opmark_cmd_v(
        cfg,
        "wan1",
        &format!("trips-warm-{pid}"),
        false,
    ));
    relay.clear();
    let said = run_saying(&mut ssh_cmd(cfg, "wan1", true), ssh_says);
    let ssh = named_trips(relay, &said);
    relay.clear();
    let said = run_saying(
        &mut opmark_cmd_v(cfg, "wan1", &format!("trips-{pid}"), true),
        opmark_says,
    );
    let run = named_trips(relay, &said);
    forget_the_host();
    relay.clear();
    let said = run_saying(
        &mut opmark_cmd_v(cfg, "wan1", &format!("trips-first-{pid}"), true),
        opmark_says,
    );
    let first = named_trips(relay, &said);
    println!(
        "round trips through the relay ({} each way; one run each, -vvv):",
        ms(ONE_WAY)
    );
    println!("  cold ssh host true: {}", describe(&ssh));
    println!("  cold opmark run -- true: {}", describe(&run));
    println!("  first call to a host: {}", describe(&first));
}
