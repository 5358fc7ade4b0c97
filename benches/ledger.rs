//! Ledger append throughput on both backends: events/s for 1 and for 8 concurrent
//! writers, each writer a thread with its own connection (as separate opmark processes
//! would have), for the `Full` (intent + attempt before dispatch) and `Normal`
//! durabilities, on SQLite and on a local PostgreSQL (a throwaway cluster on a unix
//! socket, started as the tests start theirs). Then the added latency of a cold
//! `opmark run` (one new process, one new op) with the PostgreSQL ledger instead of
//! SQLite: paired rounds against one loopback sshd target, medians.
//!
//! Run: `cargo bench --bench ledger` (set `OPMARK_BENCH_EVENTS` to change the total,
//! `OPMARK_BENCH_ROUNDS` the cold-run rounds). Without PostgreSQL or sshd those parts say
//! so and are left out.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::{Lab, LabSpec, Placement};
use opmark::ledger::fingerprint::InstallationKey;
use opmark::ledger::{Durability, Event, Ledger, OpKey};

// The tests' throwaway cluster, reused as is.
#[allow(dead_code)]
#[path = "../tests/it/support/postgres.rs"]
mod postgres;

/// What `postgres::require` calls when there is no PostgreSQL: say so, go on without it.
fn skip_or_fail(what: &str, why: &str) -> bool {
    eprintln!("SKIP: {what}: {why}");
    false
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "opmark-bench-ledger-{name}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

fn probe(n: u64) -> Event {
    Event::Probed {
        attempt_id: Some(format!("attempt-{n}")),
        state: opmark::ledger::ProbeState::Completed,
        exit_code: Some(0),
        detail: "marker completed, exit recorded".into(),
        claim: None,
    }
}

/// Where a run's ledger lives.
enum Target<'a> {
    Sqlite,
    Postgres(&'a postgres::Cluster),
}

/// Appends `total` events split over `writers` threads; returns events per second.
fn run(target: &Target<'_>, writers: usize, total: u64, durability: Durability) -> f64 {
    let dir = scratch(&format!("{writers}"));
    let (location, key) = match target {
        Target::Sqlite => (dir.join("ledger.db"), None),
        Target::Postgres(cluster) => {
            let key = dir.join("shared.key");
            InstallationKey::generate(&key).expect("keygen");
            (PathBuf::from(cluster.database("bench").url), Some(key))
        }
    };
    let open = |location: &Path, key: &Option<PathBuf>| {
        Ledger::open_with_key(location, key.as_deref()).expect("open ledger")
    };
    drop(open(&location, &key));
    let per_writer = total / writers as u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (location, key) = (location.clone(), key.clone());
            std::thread::spawn(move || {
                let mut ledger = open(&location, &key);
                let op = OpKey::new(format!("bench-{w}"), "host");
                for n in 0..per_writer {
                    ledger.append(&op, &probe(n), durability).expect("append");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer thread");
    }
    let secs = start.elapsed().as_secs_f64();
    let ledger = open(&location, &key);
    let report = ledger.verify_chain().expect("verify");
    assert!(report.intact(), "chain broken: {:?}", report.first_break);
    assert_eq!(report.events, per_writer * writers as u64);
    drop(ledger);
    let _ = std::fs::remove_dir_all(&dir);
    (per_writer * writers as u64) as f64 / secs
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Cold `opmark run` wall time, SQLite vs PostgreSQL ledger, `rounds` paired rounds.
fn cold_runs(cluster: &postgres::Cluster, rounds: usize) {
    let base = scratch("cold");
    let lab = match Lab::start(&LabSpec {
        count: 1,
        placement: Placement::Loopback,
        dir: base.join("lab"),
    }) {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("SKIP: cold opmark run: no loopback sshd target ({e})");
            return;
        }
    };
    let key = base.join("shared.key");
    InstallationKey::generate(&key).expect("keygen");
    let url = cluster.database("cold").url;
    let opmark = PathBuf::from(env!("CARGO_BIN_EXE_opmark"));
    let time_run = |ledger: &Path, key: Option<&Path>, op: &str| {
        let mut cmd = Command::new(&opmark);
        cmd.arg("-F")
            .arg(lab.ssh_config())
            .env("OPMARK_LEDGER", ledger)
            .env("XDG_CONFIG_HOME", base.join("config"))
            .env("XDG_STATE_HOME", base.join("state"))
            .args(["run", "target1", "--op", op, "--", "true"])
            .stdout(Stdio::null());
        if let Some(key) = key {
            cmd.env("OPMARK_LEDGER_KEY", key);
        }
        let start = Instant::now();
        let status = cmd.status().expect("spawn opmark");
        assert!(status.success(), "opmark run failed");
        start.elapsed()
    };
    let sqlite = base.join("ledger.db");
    // Warm both (shim shipped to the host, ledgers created and migrated).
    time_run(&sqlite, None, "warm-sqlite");
    time_run(Path::new(&url), Some(&key), "warm-pg");
    let (mut on_sqlite, mut on_pg) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        // Alternate which goes first, so drift in machine load hits both alike.
        let (a, b) = if i % 2 == 0 {
            let a = time_run(&sqlite, None, &format!("s-{i}"));
            (a, time_run(Path::new(&url), Some(&key), &format!("p-{i}")))
        } else {
            let b = time_run(Path::new(&url), Some(&key), &format!("p-{i}"));
            (time_run(&sqlite, None, &format!("s-{i}")), b)
        };
        on_sqlite.push(a);
        on_pg.push(b);
    }
    let (s, p) = (median(on_sqlite), median(on_pg));
    println!(
        "cold opmark run, median of {rounds}: sqlite ledger {:.1} ms, postgresql ledger {:.1} ms, added {:+.1} ms",
        s.as_secs_f64() * 1e3,
        p.as_secs_f64() * 1e3,
        (p.as_secs_f64() - s.as_secs_f64()) * 1e3
    );
    drop(lab);
    let _ = std::fs::remove_dir_all(&base);
}

fn main() {
    // `cargo test --benches` runs this binary too: keep that quick.
    let quick = std::env::args().any(|a| a == "--test" || a == "--list");
    let total: u64 = std::env::var("OPMARK_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 160 } else { 8000 });
    let rounds: usize = std::env::var("OPMARK_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 2 } else { 30 });
    let cluster = postgres::require("ledger bench on PostgreSQL");
    let mut targets = vec![("sqlite", Target::Sqlite)];
    if let Some(c) = cluster {
        targets.push(("postgresql", Target::Postgres(c)));
    }
    for (name, target) in &targets {
        // PostgreSQL commits are durable either way (the server's synchronous_commit=on):
        // one row for it.
        let durabilities: &[(&str, Durability)] = match target {
            Target::Sqlite => &[("normal", Durability::Normal), ("full", Durability::Full)],
            Target::Postgres(_) => &[("commit", Durability::Full)],
        };
        for (label, durability) in durabilities {
            for writers in [1, 8] {
                let rate = run(target, writers, total, *durability);
                println!(
                    "ledger append, {name:<10} synchronous={label:<6} {writers} writer{}: {rate:>9.0} events/s ({total} events)",
                    if writers == 1 { " " } else { "s" }
                );
            }
        }
    }
    if let Some(c) = cluster {
        cold_runs(c, rounds);
    }
}
