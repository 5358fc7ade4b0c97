//! The ledger at scale (issues 30, 46): ledgers of 1k, 100k and 1M operations of a simple run
//! (one in 50 repeating the intent before it under a new op id, the families taking turns),
//! built through the ledger's own append algorithm (real events, real keyed chain; the
//! big ones in batched transactions of that same algorithm), then for each size: bytes
//! per operation and the wall time of the everyday commands, run as the real `opmark`
//! binary against that ledger (`list --limit 20`, `show`, `reconcile` with nothing
//! unresolved and with 10 unresolved, `stats`, `stats --format prometheus`, `stats --since 1h`, `audit verify
//! --incremental` (after the cold runs' few new operations) and `--full`), and the ledger time of a cold `run` (opening the ledger
//! and the appends a simple run makes, with their durabilities).
//!
//! Run: `cargo bench --bench ledger_scale`. `OPMARK_BENCH_SIZES=1000,100000` picks the
//! sizes (default 1000,100000,1000000); `OPMARK_BENCH_ROUNDS` the rounds per command
//! (median, default 5); `OPMARK_BENCH_KEEP=1` keeps the ledgers and says where. The 10 unresolved operations point at a closed loopback port, so
//! `reconcile` times the ledger and a refused connection, not a network.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::ledger::{Durability, Event, Ledger, OpKey, ProbeState};
use opmark::ssh::Route;
use opmark::vocab::{Boundary, RetryReason, Verdict};

const HOSTS: usize = 20;
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "opmark-bench-scale-{name}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

fn route(host: usize, port: u16) -> Route {
    Route {
        alias: format!("target{host}"),
        hostname: "127.0.0.1".into(),
        port,
        user: "opmark".into(),
        identities: vec![PathBuf::from("/var/lib/opmark-lab/lab-1f3a/client_ed25519")],
        jump: None,
        jumps: Vec::new(),
        config: Some(PathBuf::from("/var/lib/opmark-lab/lab-1f3a/ssh_config")),
    }
}

/// An intent fingerprint as the ledger stores them: an HMAC in hex, so uniform (an index
/// on its first digits spreads), and one per intent `n` (the same `n`, the same intent).
fn fingerprint(n: u64) -> String {
    // splitmix64: uniform digits, the same for the same n.
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b, c) = (mix(n), mix(n ^ 0x5555), mix(n ^ 0xaaaa));
    format!("{a:016x}{b:016x}{c:016x}{n:016x}")
}

/// Every `REPEAT_EVERY`th operation repeats the intent of the one before it (on its
/// host, under its own op id), as agents retrying with fresh ids do; the families take
/// turns, so the ledger holds suspected duplicates of every family and `stats` must
/// count them (read-only repeats apart: they are no duplicate effect).
const REPEAT_EVERY: u64 = 50;

/// The intent operation `n` runs: (its intent's number, its host, its family).
fn intent_of(n: u64) -> (u64, usize, Family) {
    let family = [
        Family::ReadOnly,
        Family::Convergent,
        Family::AppendOnly,
        Family::Destructive,
    ][((n / REPEAT_EVERY) % 4) as usize];
    let intent = if n % REPEAT_EVERY == 1 { n - 1 } else { n };
    (intent, (intent as usize) % HOSTS, family)
}

/// The events `opmark run target --op ID -- true` records, in its transactions (the first
/// one `Full`, before dispatch), as src/operation/driver.rs writes them.
/// Its intent is number `intent` (the same number, the same intent) in `family`.
fn simple_run(
    n: u64,
    intent: u64,
    host: usize,
    family: Family,
    session: &str,
) -> Vec<(Vec<Event>, Durability)> {
    // The id formats opmark writes (`new_attempt_id`, `session_id`).
    let attempt = format!("at-{:016x}", rand::random::<u64>() ^ n);
    vec![
        (
            vec![
                Event::SessionStarted {
                    session: session.to_owned(),
                    pid: 4242,
                    version: env!("CARGO_PKG_VERSION").into(),
                },
                Event::Intended {
                    session: session.to_owned(),
                    family,
                    display: "true".into(),
                    fingerprint: fingerprint(intent),
                    rule: "builtin read_only: true".into(),
                    secrets: Vec::new(),
                    become_user: None,
                    locks: Vec::new(),
                },
                Event::AttemptDispatched {
                    attempt_id: attempt.clone(),
                    number: 1,
                    parent: None,
                    reason: RetryReason::FirstAttempt,
                },
            ],
            Durability::Full,
        ),
        (
            vec![Event::Connected {
                attempt_id: attempt.clone(),
                route: route(host, 2200 + host as u16),
                host_key: format!("SHA256:hostkeyfingerprint{host:02}xxxxxxxxxxxxxxxxxxxxxxx"),
            }],
            Durability::Normal,
        ),
        (
            vec![Event::BoundaryReached {
                attempt_id: attempt.clone(),
                boundary: Boundary::SentNoResponse,
                detail: "exec request sent".into(),
                refusal: None,
            }],
            Durability::Normal,
        ),
        (
            vec![Event::MarkerRoot {
                attempt_id: attempt.clone(),
                root_id: format!("{:032x}", host as u128 * 7919),
            }],
            Durability::Normal,
        ),
        (
            vec![Event::BoundaryReached {
                attempt_id: attempt.clone(),
                boundary: Boundary::Started,
                detail: "the shim claimed the operation and started the command".into(),
                refusal: None,
            }],
            Durability::Normal,
        ),
        (
            vec![Event::ExitReceived {
                attempt_id: attempt.clone(),
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                stdout_bytes: 0,
                stderr_bytes: 0,
                stdout_sha256: EMPTY_SHA256.into(),
                stderr_sha256: EMPTY_SHA256.into(),
            }],
            Durability::Normal,
        ),
        (
            vec![Event::Verdict {
                attempt_id: Some(attempt),
                verdict: Verdict::Completed,
                exit_code: Some(0),
                reason: "the command ran in this invocation and exited 0".into(),
            }],
            Durability::Normal,
        ),
    ]
}

/// An operation whose outcome is unknown (sent, no answer), pointing at a closed port.
fn unresolved_run(n: u64, session: &str) -> Vec<Event> {
    let attempt = format!("at-{:016x}", u64::MAX - n);
    vec![
        Event::SessionStarted {
            session: session.to_owned(),
            pid: 4243,
            version: env!("CARGO_PKG_VERSION").into(),
        },
        Event::Intended {
            session: session.to_owned(),
            family: Family::ReadOnly,
            display: "true".into(),
            fingerprint: fingerprint(u64::MAX - n),
            rule: "builtin read_only: true".into(),
            secrets: Vec::new(),
            become_user: None,
            locks: Vec::new(),
        },
        Event::AttemptDispatched {
            attempt_id: attempt.clone(),
            number: 1,
            parent: None,
            reason: RetryReason::FirstAttempt,
        },
        Event::Connected {
            attempt_id: attempt.clone(),
            route: route(99, 1),
            host_key: "SHA256:deadhostkey".into(),
        },
        Event::BoundaryReached {
            attempt_id: attempt.clone(),
            boundary: Boundary::SentNoResponse,
            detail: "exec request sent".into(),
            refusal: None,
        },
        Event::Probed {
            attempt_id: Some(attempt.clone()),
            state: ProbeState::Unreachable,
            exit_code: None,
            detail: "connection lost".into(),
            claim: None,
        },
        Event::Verdict {
            attempt_id: Some(attempt),
            verdict: Verdict::Indeterminate,
            exit_code: None,
            reason: "the connection was lost after the request was sent".into(),
        },
    ]
}

/// The record time of operation `n` of `ops`: a year of history, evenly spread and
/// ending now, as a fleet's ledger holds (so `stats --since 1h` has an hour's window, not
/// the whole history built a minute ago).
fn stamp(n: u64, ops: u64, now: time::OffsetDateTime) -> String {
    const YEAR_MICROS: i64 = 365 * 24 * 3600 * 1_000_000;
    let back = YEAR_MICROS - (YEAR_MICROS as i128 * i128::from(n + 1) / i128::from(ops)) as i64;
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    (now - time::Duration::microseconds(back))
        .format(&fmt)
        .expect("UTC time formats")
}

/// Builds a ledger of `ops` simple runs spread over a year, in batched transactions of
/// the ledger's own append algorithm.
fn build(path: &Path, ops: u64) {
    let mut ledger = Ledger::open(path).expect("open ledger");
    let now = time::OffsetDateTime::now_utc();
    let mut session = String::new();
    let mut batch: Vec<(OpKey, Vec<Event>, String)> = Vec::new();
    for n in 0..ops {
        // An agent session runs a few hundred operations.
        if n % 200 == 0 {
            session = format!("s-{:016x}", rand::random::<u64>());
        }
        let (intent, host, family) = intent_of(n);
        let key = OpKey::new(format!("op-{n:08}"), format!("target{host}"));
        let events = simple_run(n, intent, host, family, &session)
            .into_iter()
            .flat_map(|(e, _)| e)
            .collect();
        batch.push((key, events, stamp(n, ops, now)));
        if batch.len() == 2000 {
            ledger.append_batch_stamped(&batch).expect("append batch");
            batch.clear();
        }
    }
    ledger.append_batch_stamped(&batch).expect("append batch");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{:8.1} ms", d.as_secs_f64() * 1e3),
        None => format!("{:>11}", "n/a"),
    }
}

struct Env {
    opmark: PathBuf,
    base: PathBuf,
    ssh_config: PathBuf,
}

impl Env {
    /// Median wall time of `opmark ARGS` on `ledger`; `ok` lists the accepted exit codes.
    /// `None` (printed `n/a`) when this opmark does not have the command.
    fn time(&self, ledger: &Path, args: &[&str], ok: &[i32], rounds: usize) -> Option<Duration> {
        let mut times = Vec::new();
        for _ in 0..rounds {
            let start = Instant::now();
            let out = Command::new(&self.opmark)
                .arg("-F")
                .arg(&self.ssh_config)
                .env("OPMARK_LEDGER", ledger)
                .env_remove("OPMARK_LEDGER_KEY")
                .env("XDG_CONFIG_HOME", self.base.join("config"))
                .env("XDG_STATE_HOME", self.base.join("state"))
                .env("OPMARK_PERSIST", "0")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .expect("spawn opmark");
            times.push(start.elapsed());
            let code = out.status.code().unwrap_or(-1);
            if code == 2 && String::from_utf8_lossy(&out.stderr).contains("unexpected argument") {
                return None;
            }
            assert!(
                ok.contains(&code),
                "opmark {args:?} exited {code}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Some(median(times))
    }
}

/// A cold `run`'s ledger work: open the ledger, then the appends a simple run makes.
fn cold_run_ledger_time(path: &Path, rounds: usize) -> Duration {
    let mut times = Vec::new();
    for r in 0..rounds {
        let start = Instant::now();
        let mut ledger = Ledger::open(path).expect("open ledger");
        let key = OpKey::new(format!("cold-{r}-{:08x}", rand::random::<u32>()), "target1");
        // An intent of its own: a cold run is no repetition.
        let intent = (1 << 40) | r as u64;
        for (events, durability) in simple_run(r as u64, intent, 1, Family::ReadOnly, "sess-cold") {
            ledger
                .append_many(&key, &events, durability)
                .expect("append");
        }
        drop(ledger);
        times.push(start.elapsed());
    }
    median(times)
}

fn file_bytes(path: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .map(|s| {
            std::fs::metadata(format!("{}{s}", path.display()))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .sum()
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (`cargo test --benches`, which passes
    // no such flag) is a quick smoke run.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sizes: Vec<u64> = std::env::var("OPMARK_BENCH_SIZES")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|s| {
                    s.trim().parse().unwrap_or_else(|_| {
                        panic!("OPMARK_BENCH_SIZES: `{s}` is not a number of operations; give e.g. 1000,100000")
                    })
                })
                .collect()
        })
        .unwrap_or_else(|| {
            if quick {
                vec![200]
            } else {
                vec![1_000, 100_000, 1_000_000]
            }
        });
    let rounds: usize = std::env::var("OPMARK_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 5 });
    let base = scratch("env");
    let ssh_config = base.join("ssh_config");
    // The unresolved operations' host: a closed loopback port, refused at once.
    std::fs::write(
        &ssh_config,
        "Host dead\n  HostName 127.0.0.1\n  Port 1\n  User opmark\n",
    )
    .expect("write ssh config");
    let env = Env {
        opmark: PathBuf::from(env!("CARGO_BIN_EXE_opmark")),
        base: base.clone(),
        ssh_config,
    };
    println!(
        "{:>9} {:>9} {:>10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "ops",
        "B/op",
        "build s",
        "list -l 20",
        "show",
        "reconcile 0",
        "reconcile10",
        "stats",
        "stats prom",
        "stats 1h",
        "verify inc",
        "verify full",
        "full ev/s",
        "cold run"
    );
    for &ops in &sizes {
        let dir = scratch(&format!("{ops}"));
        let settled = dir.join("settled.db");
        let start = Instant::now();
        build(&settled, ops);
        let build_secs = start.elapsed().as_secs_f64();
        // Bytes after a checkpoint, so the WAL is folded into the file.
        Ledger::open(&settled)
            .expect("open")
            .checkpoint()
            .expect("checkpoint");
        let bytes = file_bytes(&settled);
        let show_op = format!("op-{:08}", ops / 2);
        let list = env.time(&settled, &["list", "--limit", "20"], &[0], rounds);
        let show = env.time(&settled, &["show", &show_op], &[0], rounds);
        let rec0 = env.time(&settled, &["reconcile"], &[0], rounds);
        let stats = env.time(&settled, &["stats"], &[0], rounds);
        let stats_1h = env.time(&settled, &["stats", "--since", "1h"], &[0], rounds);
        let prom = env.time(&settled, &["stats", "--format", "prometheus"], &[0], rounds);
        // The full walk records a checkpoint; the cold runs then add a few operations,
        // and the incremental verify reads only those.
        let full = env.time(
            &settled,
            &["audit", "verify", "--full"],
            &[0],
            rounds.min(3),
        );
        let events = ops * 9;
        let full_rate = full.map_or(0.0, |f| events as f64 / f.as_secs_f64());
        let cold = cold_run_ledger_time(&settled, rounds);
        let inc = env.time(&settled, &["audit", "verify", "--incremental"], &[0], 1);
        // The same ledger with 10 unresolved operations added.
        let mut ledger = Ledger::open(&settled).expect("open ledger");
        let batch: Vec<(OpKey, Vec<Event>)> = (0..10)
            .map(|n| {
                (
                    OpKey::new(format!("unres-{n}"), "dead"),
                    unresolved_run(n, "sess-dead"),
                )
            })
            .collect();
        ledger.append_batch(&batch).expect("append batch");
        drop(ledger);
        let rec10 = env.time(&settled, &["reconcile"], &[0, 1], rounds);
        println!(
            "{ops:>9} {:>9.0} {build_secs:>10.1} {} {} {} {} {} {} {} {} {} {:>11.0} {}",
            bytes as f64 / ops as f64,
            ms(list),
            ms(show),
            ms(rec0),
            ms(rec10),
            ms(stats),
            ms(prom),
            ms(stats_1h),
            ms(inc),
            ms(full),
            full_rate,
            ms(Some(cold)),
        );
        // What the timed `stats` answered about the repetitions built in.
        let out = Command::new(&env.opmark)
            .args(["--json", "stats"])
            .env("OPMARK_LEDGER", &settled)
            .env("XDG_CONFIG_HOME", env.base.join("config"))
            .env("XDG_STATE_HOME", env.base.join("state"))
            .output()
            .expect("spawn opmark");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        println!(
            "{:>9}   suspected duplicates {} (by family {}; read-only repeats are none)",
            "",
            doc["health"]["suspected_duplicate_tally"]["total"],
            doc["health"]["suspected_duplicate_tally"]["by_family"],
        );
        if std::env::var_os("OPMARK_BENCH_KEEP").is_some() {
            eprintln!("kept {}", settled.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
