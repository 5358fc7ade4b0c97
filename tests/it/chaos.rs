//! A randomized fault test, bounded and seeded: many operations against three namespace
//! targets while links are cut and restored, clients are killed, sshd is restarted, one
//! target's marker root fills up and is freed, and the ledger's installation key goes
//! missing or is replaced by a wrong one for a while, at random moments; clients also
//! alternate between two config directories (the key belongs to the ledger, not to
//! them). At the end every fault is undone, `reconcile` runs, and every effect file is
//! checked against every verdict: no operation executed twice, no verdict claimed more
//! than the evidence, no key problem ever reported as a `conflict`.
//!
//! Seeds: one random seed per run; in CI also [`KNOWN_SEEDS`] first, so a regression
//! they cover fails every build, not one in N. A failure names its seed and how to replay
//! it (`OPMARK_CHAOS_SEED=<seed>`, or several separated by commas).

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::support::disk::{needs_loop_mounts, SmallDisk};
use crate::support::{self, fast_loss_config, fresh_dir, text, Lab, Sealed};

const OPERATIONS: usize = 30;
const CONCURRENT: usize = 5;
const TARGETS: [&str; 3] = ["target1", "target2", "target3"];
/// The target whose marker root is a small disk that the test fills and frees.
const SMALL_DISK_TARGET: &str = "target2";
/// Seeds CI runs on every build, before a random one. Each was seen to cut links, kill
/// clients and restart sshd, and to end in a mix of verdicts.
const KNOWN_SEEDS: [u64; 3] = [3, 5, 8];

struct Op {
    id: String,
    target: &'static str,
    command: String,
    effect: PathBuf,
    code: i32,
    /// Verdicts of every client that answered (killed clients answer nothing).
    answers: Vec<Value>,
    launches: u32,
}

fn executions(effect: &Path) -> usize {
    std::fs::read_to_string(effect).map_or(0, |t| t.lines().count())
}

/// A marker whose command started and has not recorded its exit yet, if any (read from
/// the targets' marker roots, which are local directories).
fn still_running(lab: &Lab) -> Option<PathBuf> {
    lab.targets().iter().find_map(|t| {
        std::fs::read_dir(t.marker_root().join("ops"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|m| {
                m.join("started").exists()
                    && !m.join("exit").exists()
                    && !m.join("fenced").exists()
                    // The exit record could not be written (a full disk): it never will be.
                    && !m.join("exit_write_failed").exists()
            })
    })
}

/// The seeds to run: `OPMARK_CHAOS_SEED` when set (a replay), else the known seeds in CI,
/// then one random seed.
fn seeds() -> Vec<u64> {
    if let Ok(text) = std::env::var("OPMARK_CHAOS_SEED") {
        return text
            .split(',')
            .map(|s| {
                s.trim().parse().unwrap_or_else(|_| {
                    panic!("OPMARK_CHAOS_SEED={text:?}: expected seeds as decimal u64 numbers separated by commas, e.g. OPMARK_CHAOS_SEED=42,7")
                })
            })
            .collect();
    }
    let mut seeds = if support::in_ci() {
        KNOWN_SEEDS.to_vec()
    } else {
        Vec::new()
    };
    seeds.push(rand::random());
    seeds
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(a panic without a message)")
}

#[test]
fn random_cuts_kills_and_restarts_never_execute_an_operation_twice() {
    let seeds = seeds(); // a bad OPMARK_CHAOS_SEED is refused before a lab starts
    if !needs_loop_mounts(crate::test_name!()) {
        return;
    }
    let Some(lab) = support::netns_lab(3) else {
        return;
    };
    for seed in seeds {
        let started = Instant::now();
        // Any failure, from an assertion or from the lab, is reported with its seed.
        if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(|| round(&lab, seed))) {
            panic!(
                "chaos seed {seed} failed: {}\nreplay it: OPMARK_CHAOS_SEED={seed} cargo test --test it chaos::",
                panic_text(payload.as_ref())
            );
        }
        eprintln!("seed {seed}: passed in {:?}", started.elapsed());
    }
}

/// One seeded round against the lab's three targets; leaves every link restored and
/// every sshd running.
fn round(lab: &Lab, seed: u64) {
    eprintln!("chaos seed: {seed} (replay with OPMARK_CHAOS_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let env = Sealed::new("chaos");
    let dir = fresh_dir("chaos");
    let cfg = fast_loss_config(lab, &dir);
    // A second config directory: the same ledger must answer the same way from it.
    let other_config = dir.join("other-config");
    std::fs::create_dir_all(&other_config).unwrap();
    let key_file = env.ledger.with_extension("key");
    let key_aside = dir.join("ledger.key.aside");
    // A 16 MiB marker root on one target; its sshd restarts so that its sessions (in
    // their own mount namespace) see the mount.
    let disk =
        SmallDisk::mount_as_marker_root(lab.target(SMALL_DISK_TARGET).unwrap(), 16 * 1024, 4096);
    lab.stop_sshd(SMALL_DISK_TARGET).unwrap();
    lab.start_sshd(SMALL_DISK_TARGET).unwrap();

    // Append-only commands: never re-run automatically, so each line is one execution.
    let mut ops: Vec<Op> = (0..OPERATIONS)
        .map(|i| {
            let effect = dir.join(format!("effect-{i}"));
            let code = rng.random_range(0..4);
            let sleep_ms = rng.random_range(0..2500);
            Op {
                id: format!("chaos-{seed:x}-{i}"),
                target: TARGETS[rng.random_range(0..TARGETS.len())],
                command: format!(
                    "echo ran >> {}; sleep {}.{:03}; echo done; exit {code}",
                    effect.display(),
                    sleep_ms / 1000,
                    sleep_ms % 1000
                ),
                effect,
                code,
                answers: Vec::new(),
                launches: 0,
            }
        })
        .collect();

    let launch = |op: &mut Op, config_dir: &Path| -> Child {
        op.launches += 1;
        env.opmark()
            .env("XDG_CONFIG_HOME", config_dir)
            .arg("-F")
            .arg(&cfg)
            .args([
                "--json",
                "run",
                op.target,
                "--op",
                &op.id,
                "--wait",
                "3s",
                "--",
                &op.command,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut queue: Vec<usize> = (0..OPERATIONS).collect();
    let mut running: Vec<(usize, Child)> = Vec::new();
    let mut cut_until: BTreeMap<&str, Instant> = BTreeMap::new();
    let mut faults = BTreeMap::<&str, u32>::new();
    let mut disk_full_until: Option<Instant> = None;
    // When the key comes back, and whether it was taken away (else replaced).
    let mut key_fault_until: Option<Instant> = None;
    // Clients that answered with an error instead of a verdict while the key was gone.
    let mut key_refusals = 0u32;
    while (!queue.is_empty() || !running.is_empty()) && Instant::now() < deadline {
        while running.len() < CONCURRENT {
            let Some(i) = queue.pop() else { break };
            let config_dir = if rng.random_bool(0.5) {
                env.config.clone()
            } else {
                other_config.clone()
            };
            running.push((i, launch(&mut ops[i], &config_dir)));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(50..250)));
        match rng.random_range(0..9) {
            0 | 1 => {
                let t = TARGETS[rng.random_range(0..TARGETS.len())];
                if !cut_until.contains_key(t) {
                    lab.cut(t).unwrap();
                    cut_until.insert(
                        t,
                        Instant::now() + Duration::from_millis(rng.random_range(500..3000)),
                    );
                    *faults.entry("link cut").or_default() += 1;
                }
            }
            2 | 3 if !running.is_empty() => {
                let k = rng.random_range(0..running.len());
                let (i, mut child) = running.swap_remove(k);
                let _ = child.kill();
                let _ = child.wait();
                *faults.entry("client killed").or_default() += 1;
                // The caller retries the same op id later, as an agent would.
                if rng.random_bool(0.7) {
                    queue.insert(0, i);
                }
            }
            // (A cut target cannot show that its restarted sshd is ready.)
            4 if !cut_until.contains_key(TARGETS[0]) => {
                let t = TARGETS[0];
                lab.stop_sshd(t).unwrap();
                std::thread::sleep(Duration::from_millis(rng.random_range(0..500)));
                // No retry: restarts that "never became ready" were the lab reading
                // killed clients' `ssh_dispatch_run_fatal` lines as a dead server (fixed;
                // tests/it/targets.rs proves it), and a failure now carries the sshd log.
                lab.start_sshd(t).unwrap();
                *faults.entry("sshd restarted").or_default() += 1;
            }
            5 if disk_full_until.is_none() => {
                disk.fill_blocks();
                disk_full_until =
                    Some(Instant::now() + Duration::from_millis(rng.random_range(500..3000)));
                *faults.entry("marker root full").or_default() += 1;
            }
            6 if key_fault_until.is_none() && key_file.exists() => {
                // Missing, or another key in its place: both must be errors naming the
                // paths, never a conflict, and never a second execution.
                std::fs::rename(&key_file, &key_aside).unwrap();
                if rng.random_bool(0.5) {
                    std::fs::write(&key_file, [7u8; 32]).unwrap();
                    std::fs::set_permissions(
                        &key_file,
                        std::os::unix::fs::PermissionsExt::from_mode(0o600),
                    )
                    .unwrap();
                    *faults.entry("ledger key replaced").or_default() += 1;
                } else {
                    *faults.entry("ledger key missing").or_default() += 1;
                }
                key_fault_until =
                    Some(Instant::now() + Duration::from_millis(rng.random_range(300..1500)));
            }
            _ => {}
        }
        let now = Instant::now();
        if disk_full_until.is_some_and(|until| until <= now) {
            disk.free_blocks();
            disk_full_until = None;
        }
        if key_fault_until.is_some_and(|until| until <= now) {
            std::fs::rename(&key_aside, &key_file).unwrap();
            key_fault_until = None;
        }
        cut_until.retain(|t, until| {
            if *until <= now {
                lab.restore(t).unwrap();
                false
            } else {
                true
            }
        });
        let mut still = Vec::new();
        for (i, mut child) in running.drain(..) {
            match child.try_wait().unwrap() {
                Some(_) => {
                    let out = child.wait_with_output().unwrap();
                    let stderr = text(&out.stderr);
                    // A ledger without its key refuses before anything is sent (exit 248,
                    // naming the key file): no verdict, and the caller tries again later.
                    if out.status.code() == Some(248) && stderr.contains("installation key") {
                        key_refusals += 1;
                        queue.insert(0, i);
                        continue;
                    }
                    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                        panic!(
                            "seed {seed}: {} answered no JSON ({e}): {}",
                            ops[i].id,
                            text(&out.stderr)
                        )
                    });
                    // Anything short of a settled answer is retried later with the same id.
                    if !matches!(
                        json["verdict"].as_str(),
                        Some("completed" | "replayed" | "not_applied")
                    ) {
                        queue.insert(0, i);
                    }
                    ops[i].answers.push(json);
                }
                None => still.push((i, child)),
            }
        }
        running = still;
    }
    for (_, mut child) in running {
        let _ = child.kill();
        let _ = child.wait();
    }
    for t in TARGETS {
        lab.restore(t).unwrap();
        lab.start_sshd(t).unwrap();
    }
    if disk_full_until.is_some() {
        disk.free_blocks();
    }
    if key_fault_until.is_some() {
        std::fs::rename(&key_aside, &key_file).unwrap();
    }
    eprintln!("seed {seed}: faults {faults:?}; clients refused for the ledger key: {key_refusals}");

    // Let detached commands finish, then let reconcile settle what the evidence settles.
    let settle_by = Instant::now() + Duration::from_secs(60);
    while let Some(busy) = still_running(lab) {
        assert!(
            Instant::now() < settle_by,
            "seed {seed}: {} started but has no exit record after 60 s",
            busy.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let reconcile = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args(["--json", "reconcile"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&reconcile.stdout).unwrap_or_else(|e| {
        panic!(
            "seed {seed}: reconcile JSON ({e}): {}",
            text(&reconcile.stderr)
        )
    });
    let decisions: BTreeMap<String, (String, Option<i64>)> = report["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["op_id"].as_str().unwrap().to_owned(),
                (
                    o["decision"].as_str().unwrap().to_owned(),
                    o["exit_code"].as_i64(),
                ),
            )
        })
        .collect();

    let mut tally = BTreeMap::<String, usize>::new();
    for op in &ops {
        let runs = executions(&op.effect);
        assert!(runs <= 1, "seed {seed}: {} executed {runs} times", op.id);
        for a in &op.answers {
            let verdict = a["verdict"].as_str().unwrap();
            *tally.entry(verdict.to_owned()).or_default() += 1;
            match verdict {
                "completed" | "replayed" => {
                    assert_eq!(
                        runs, 1,
                        "seed {seed}: {} said {verdict} but ran {runs} times",
                        op.id
                    );
                    assert_eq!(
                        a["exit_code"].as_i64(),
                        Some(op.code.into()),
                        "seed {seed}: {}",
                        op.id
                    );
                }
                // Closed as not applied: nothing ran, and the fence keeps it so.
                "not_applied" => assert_eq!(runs, 0, "seed {seed}: {} not_applied but ran", op.id),
                // Unknown outcomes claim nothing; exit codes stay null.
                "indeterminate" | "in_progress" => {
                    assert!(a["exit_code"].is_null(), "seed {seed}: {}: {a}", op.id)
                }
                other => panic!(
                    "seed {seed}: {} got an unexpected verdict {other}: {a}",
                    op.id
                ),
            }
        }
        if let Some((decision, code)) = decisions.get(&op.id) {
            match decision.as_str() {
                "completed" => {
                    assert_eq!(
                        runs, 1,
                        "seed {seed}: reconcile said completed for {}",
                        op.id
                    );
                    assert_eq!(*code, Some(op.code.into()), "seed {seed}: {}", op.id);
                }
                "not_applied" | "fenced" => {
                    assert_eq!(
                        runs, 0,
                        "seed {seed}: reconcile said {decision} for {}",
                        op.id
                    )
                }
                _ => {}
            }
        }
    }
    // A late run of every op id must never add an execution.
    for op in &ops {
        let before = executions(&op.effect);
        let out = env
            .opmark()
            .arg("-F")
            .arg(&cfg)
            .args([
                "--json",
                "run",
                op.target,
                "--op",
                &op.id,
                "--wait",
                "5s",
                "--",
                &op.command,
            ])
            .output()
            .unwrap();
        let a: Value = serde_json::from_slice(&out.stdout).unwrap();
        let after = executions(&op.effect);
        assert!(
            after <= 1,
            "seed {seed}: {} ran twice after a late run",
            op.id
        );
        if before == 1 {
            assert_eq!(after, 1, "seed {seed}: {}", op.id);
        }
        if a["verdict"] == "completed" || a["verdict"] == "replayed" {
            assert_eq!(
                a["exit_code"].as_i64(),
                Some(op.code.into()),
                "seed {seed}: {}",
                op.id
            );
        }
    }
    let audit = env.opmark().args(["audit", "verify"]).output().unwrap();
    assert!(
        audit.status.success(),
        "seed {seed}: {}",
        text(&audit.stdout)
    );
    eprintln!(
        "seed {seed}: verdicts {tally:?}; reconcile decisions {:?}",
        decisions
            .values()
            .map(|(d, _)| d.as_str())
            .collect::<Vec<_>>()
    );
}
