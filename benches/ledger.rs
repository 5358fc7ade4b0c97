//! Ledger append throughput: events/s for 1 and for 8 concurrent writers, each writer a
//! thread with its own connection (as separate opmark processes would have), for the
//! `Full` (intent + attempt before dispatch) and `Normal` durabilities.
//!
//! Run: `cargo bench --bench ledger` (set `OPMARK_BENCH_EVENTS` to change the total).

use std::path::PathBuf;
use std::time::Instant;

use opmark::ledger::{Durability, Event, Ledger, OpKey};

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
        state: "completed".into(),
        exit_code: Some(0),
        detail: "marker completed, exit recorded".into(),
        claim: None,
    }
}

/// Appends `total` events split over `writers` threads; returns events per second.
fn run(writers: usize, total: u64, durability: Durability) -> f64 {
    let dir = scratch(&format!("{writers}"));
    let db = dir.join("ledger.db");
    drop(Ledger::open(&db).expect("open ledger"));
    let per_writer = total / writers as u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut ledger = Ledger::open(&db).expect("open ledger");
                let key = OpKey::new(format!("bench-{w}"), "host");
                for n in 0..per_writer {
                    ledger.append(&key, &probe(n), durability).expect("append");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer thread");
    }
    let secs = start.elapsed().as_secs_f64();
    let ledger = Ledger::open(&db).expect("open ledger");
    let report = ledger.verify_chain().expect("verify");
    assert!(report.intact(), "chain broken: {:?}", report.first_break);
    assert_eq!(report.events, per_writer * writers as u64);
    drop(ledger);
    let _ = std::fs::remove_dir_all(&dir);
    (per_writer * writers as u64) as f64 / secs
}

fn main() {
    // `cargo test --benches` runs this binary too: keep that quick.
    let quick = std::env::args().any(|a| a == "--test" || a == "--list");
    let total: u64 = std::env::var("OPMARK_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 160 } else { 8000 });
    for (label, durability) in [("normal", Durability::Normal), ("full", Durability::Full)] {
        for writers in [1, 8] {
            let rate = run(writers, total, durability);
            println!(
                "ledger append, synchronous={label:<6} {writers} writer{}: {rate:>9.0} events/s ({total} events)",
                if writers == 1 { " " } else { "s" }
            );
        }
    }
}
