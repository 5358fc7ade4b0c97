//! ledger integration tests: concurrent writer processes, `kill -9` in mid-write,
//! tampering found by `opmark audit verify`, and secrets that never reach disk or output.
//!
//! Writer processes are this test binary re-executed with `--exact ledger::writer_process
//! --ignored` and `OPMARK_TEST_LEDGER_ROLE` selecting what the child does.
//!
//! The CONFORMANCE SUITE (the functions named in `conformance!` below) runs every body once
//! per backend, `ledger::sqlite::NAME` and `ledger::postgres::NAME`, against a [`Fixture`]:
//! one set of tests, two backends. PostgreSQL runs on a throwaway cluster
//! (`support::postgres`); without PostgreSQL those tests skip locally and fail in CI.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::ledger::chain::Link;
use opmark::ledger::{key_path_beside, Durability, Event, Ledger, ListFilter, OpKey, Redactor};
use opmark::vocab::{Boundary, RetryReason, Verdict};

use crate::support::{self, contains_canary, lines, text, Lab, Sealed};

const ROLE: &str = "OPMARK_TEST_LEDGER_ROLE";
const PATH: &str = "OPMARK_TEST_LEDGER_PATH";
const WRITER: &str = "OPMARK_TEST_LEDGER_WRITER";
const OPS: &str = "OPMARK_TEST_LEDGER_OPS";
const KEY: &str = "OPMARK_TEST_LEDGER_KEY";

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "opmark-it-ledger-{name}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `opmark` with a sealed environment: own HOME/XDG dirs, no inherited OPMARK_*.
fn opmark_with_ledger(home: &Path, ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opmark"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .output()
        .unwrap()
}

/// The events of one complete operation as `run` writes them: intent + first attempt in
/// one FULL commit, then boundary, exit and verdict.
fn write_operation(ledger: &mut Ledger, key: &OpKey, n: u64) -> Vec<u64> {
    let attempt = format!("{}-a1", key.op_id);
    let mut seqs = ledger
        .append_many(
            key,
            &[
                Event::Intended {
                    session: "s".into(),
                    family: Family::ALL[(n % 4) as usize],
                    display: format!("echo {n}"),
                    fingerprint: format!("fp-{}", key.op_id),
                    rule: "test".into(),
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
        )
        .unwrap();
    seqs.push(
        ledger
            .append(
                key,
                &Event::BoundaryReached {
                    attempt_id: attempt.clone(),
                    boundary: Boundary::Started,
                    detail: String::new(),
                    refusal: None,
                },
                Durability::Normal,
            )
            .unwrap(),
    );
    seqs.push(
        ledger
            .append(
                key,
                &Event::ExitReceived {
                    attempt_id: attempt.clone(),
                    exit_code: Some(0),
                    signal: None,
                    timed_out: false,
                    stdout_bytes: 2,
                    stderr_bytes: 0,
                    stdout_sha256: "00".repeat(32),
                    stderr_sha256: "11".repeat(32),
                },
                Durability::Normal,
            )
            .unwrap(),
    );
    seqs.push(
        ledger
            .append(
                key,
                &Event::Verdict {
                    attempt_id: Some(attempt),
                    verdict: Verdict::Completed,
                    exit_code: Some(0),
                    reason: "exit status received".into(),
                },
                Durability::Normal,
            )
            .unwrap(),
    );
    seqs
}

/// Not a test on its own: the body of a writer child process (see the module doc).
#[test]
#[ignore = "child process of the ledger concurrency tests"]
fn writer_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let writer = std::env::var(WRITER).unwrap();
    let key = std::env::var_os(KEY).map(PathBuf::from);
    let mut ledger = Ledger::open_with_key(&path, key.as_deref()).unwrap();
    match role.as_str() {
        "fixed" => {
            let ops: u64 = std::env::var(OPS).unwrap().parse().unwrap();
            for n in 0..ops {
                let key = OpKey::new(format!("w{writer}-op{n}"), format!("host{}", n % 3));
                write_operation(&mut ledger, &key, n);
            }
        }
        "endless" => {
            // Report every commit on stdout so the parent knows what must survive.
            let mut n = 0u64;
            loop {
                let key = OpKey::new(format!("w{writer}-op{n}"), "h");
                let seqs = write_operation(&mut ledger, &key, n);
                println!(
                    "committed {}",
                    seqs.iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                );
                n += 1;
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn writer_child(role: &str, ledger: &Path, writer: usize) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "ledger::writer_process",
        "--ignored",
        "--nocapture",
        "-q",
    ])
    .env(ROLE, role)
    .env(PATH, ledger)
    .env(WRITER, writer.to_string())
    .stdin(Stdio::null());
    c
}

/// A ledger backend under test.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// One ledger on one backend, with what a test needs to reach it: the location for
/// `--ledger`, the key for `--ledger-key` (named for PostgreSQL, beside the file for
/// SQLite), and a scratch directory for HOMEs and files.
struct Fixture {
    scratch: Scratch,
    location: PathBuf,
    key: Option<PathBuf>,
    pg: Option<(
        &'static support::postgres::Cluster,
        support::postgres::Database,
    )>,
}

impl Fixture {
    /// `None`: skipped (PostgreSQL missing, locally).
    fn new(backend: Backend, name: &str) -> Option<Fixture> {
        let scratch = Scratch::new(name);
        match backend {
            Backend::Sqlite => Some(Fixture {
                location: scratch.path("ledger.db"),
                key: None,
                pg: None,
                scratch,
            }),
            Backend::Postgres => {
                let cluster = support::postgres::require(&format!("postgres::{name}"))?;
                let db = cluster.database(name);
                // A shared ledger's key is the operator's: made once, given to everyone.
                let key = scratch.path("shared.key");
                opmark::ledger::fingerprint::InstallationKey::generate(&key).unwrap();
                Some(Fixture {
                    location: PathBuf::from(&db.url),
                    key: Some(key),
                    pg: Some((cluster, db)),
                    scratch,
                })
            }
        }
    }

    fn open(&self) -> Ledger {
        Ledger::open_with_key(&self.location, self.key.as_deref()).unwrap()
    }

    /// `opmark audit verify ARGS` on this ledger: its exit code, stdout and stderr.
    fn audit_verify(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = self
            .opmark(&self.scratch.0)
            .args(["audit", "verify"])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }

    /// `opmark` with its own HOME (another "machine" when `home` differs) on this ledger.
    fn opmark(&self, home: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_opmark"));
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("XDG_STATE_HOME", home.join("state"))
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("OPMARK_LEDGER", &self.location)
            .stdin(Stdio::null());
        if let Some(key) = &self.key {
            c.env("OPMARK_LEDGER_KEY", key);
        }
        c
    }

    fn writer_child(&self, role: &str, writer: usize) -> Command {
        let mut c = writer_child(role, &self.location, writer);
        if let Some(key) = &self.key {
            c.env(KEY, key);
        }
        c
    }

    /// Runs `sql` on the ledger's database behind opmark's back (tampering).
    fn sql(&self, sql: &str) {
        match &self.pg {
            Some((cluster, db)) => {
                cluster.psql(db.name(), sql).unwrap();
            }
            None => {
                // The compact layout, made plain-SQL editable first (same rows).
                self.open().expand_rows_for_tests().unwrap();
                let conn = rusqlite::Connection::open(&self.location).unwrap();
                conn.execute_batch(sql).unwrap();
            }
        }
    }
}

/// Runs each named body once per backend: `ledger::sqlite::NAME`, `ledger::postgres::NAME`.
macro_rules! conformance {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    if let Some(f) = super::Fixture::new(super::Backend::Sqlite, stringify!($name)) {
                        super::$name(&f);
                    }
                }
            )+
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    if let Some(f) = super::Fixture::new(super::Backend::Postgres, stringify!($name)) {
                        super::$name(&f);
                    }
                }
            )+
        }
    };
}

conformance!(
    sixteen_writer_processes_keep_every_event_and_the_chain,
    two_concurrent_resolves_of_one_op_record_one_decision,
    a_settlement_conditional_on_what_was_read_loses_to_an_earlier_one,
    audit_verify_names_an_edited_and_a_deleted_event,
    list_show_and_stats_read_the_same_projection,
    a_ledger_of_the_previous_schema_counts_its_history_on_migrating_and_verifies,
    fleets_and_single_runs_in_many_processes_keep_every_event_of_every_operation,
    audit_verify_incremental_walks_from_the_checkpoint_and_full_from_the_start,
    audit_verify_finds_a_shared_intent_deleted_from_the_table_stats_reads,
    an_archived_ledger_and_its_archive_verify_and_an_edit_in_either_is_found,
    ledger_archive_refuses_what_it_cannot_archive_and_writes_nothing,
    the_full_walk_reads_past_a_page_and_names_an_edited_and_a_foreign_row,
);

fn sixteen_writer_processes_keep_every_event_and_the_chain(f: &Fixture) {
    const PROCS: usize = 16;
    const OPS_EACH: u64 = 50;
    // Every writer's first append waits until all sixteen have reached theirs, so they
    // are released together and really contend (no sleep hoping they line up).
    let barrier = f.scratch.path("barrier");
    let children: Vec<_> = (0..PROCS)
        .map(|w| {
            f.writer_child("fixed", w)
                .env(OPS, OPS_EACH.to_string())
                .env("OPMARK_TEST_APPEND_BARRIER", &barrier)
                .env("OPMARK_TEST_APPEND_BARRIER_N", PROCS.to_string())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a writer process failed");
    }

    let ledger = f.open();
    let report = ledger.verify_chain().unwrap();
    assert_eq!(report.first_break, None);
    assert_eq!(report.first_mismatch, None);
    assert_eq!(report.events, PROCS as u64 * OPS_EACH * 5);
    let ops = ledger.list(&ListFilter::default()).unwrap();
    assert_eq!(ops.len(), PROCS * OPS_EACH as usize);
    // They contended: each writer's events span a range of the chain, and had the writers
    // run one after another those ranges would be disjoint.
    let span = |w: usize| {
        let seqs: Vec<u64> = (0..OPS_EACH)
            .flat_map(|n| {
                let key = OpKey::new(format!("w{w}-op{n}"), format!("host{}", n % 3));
                ledger.events(&key).unwrap().into_iter().map(|e| e.seq)
            })
            .collect();
        (*seqs.iter().min().unwrap(), *seqs.iter().max().unwrap())
    };
    let spans: Vec<(u64, u64)> = (0..PROCS).map(span).collect();
    let interleaved = spans
        .iter()
        .enumerate()
        .any(|(i, a)| spans.iter().skip(i + 1).any(|b| a.0 < b.1 && b.0 < a.1));
    assert!(interleaved, "the writers never overlapped: {spans:?}");
    for w in 0..PROCS {
        for n in 0..OPS_EACH {
            let key = OpKey::new(format!("w{w}-op{n}"), format!("host{}", n % 3));
            let kinds: Vec<_> = ledger
                .events(&key)
                .unwrap()
                .iter()
                .map(|e| e.event.kind())
                .collect();
            assert_eq!(
                kinds,
                [
                    "intended",
                    "attempt_dispatched",
                    "boundary_reached",
                    "exit_received",
                    "verdict"
                ],
                "{key:?}"
            );
        }
    }
    let out = f
        .opmark(&f.scratch.0)
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "chain intact: 4000 events, projection equals their replay"
    );
}

/// Issue 24 row 10: four processes each running a 4-host fleet and four single-host runs,
/// all at once on one ledger, round after round, against real sshd targets. Every run
/// must answer `completed` with exit status 0 and no `ledger_error`, every operation must
/// hold its whole story (intent, attempt, exit, verdict) under its own key, the rows'
/// `last_seq` must be their own last event, and `audit verify` must find the projection
/// equal to the replay. (Before the fix, a fleet's per-host ledger opens closed a file
/// descriptor on the SQLite database, which drops every POSIX lock this process held on
/// it: another process then checkpointed and removed the WAL under the fleet's feet.)
fn fleets_and_single_runs_in_many_processes_keep_every_event_of_every_operation(f: &Fixture) {
    const ROUNDS: usize = 20;
    const PROCS: usize = 4;
    let Some(lab) = support::loopback_lab_named(
        "fleets_and_single_runs_in_many_processes_keep_every_event",
        4,
    ) else {
        return;
    };
    let hosts: Vec<String> = lab.targets().iter().map(|t| t.alias.clone()).collect();
    let started = Instant::now();
    let mut expected: Vec<OpKey> = Vec::new();
    for round in 0..ROUNDS {
        let mut children = Vec::new();
        for p in 0..PROCS {
            let home = f.scratch.path(&format!("home-{p}"));
            std::fs::create_dir_all(&home).unwrap();
            let fleet_op = format!("fleet-r{round}-p{p}");
            let mut fleet = f.opmark(&home);
            fleet
                .env("OPMARK_PERSIST", "0")
                .arg("-F")
                .arg(lab.ssh_config())
                .args(["--json", "run"])
                .args(&hosts)
                .args(["--op", &fleet_op, "--", "true"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            children.push((fleet_op.clone(), true, fleet.spawn().unwrap()));
            expected.extend(
                hosts
                    .iter()
                    .map(|h| OpKey::new(fleet_op.clone(), h.clone())),
            );
            let single_op = format!("single-r{round}-p{p}");
            let host = &hosts[p % hosts.len()];
            let mut single = f.opmark(&home);
            single
                .env("OPMARK_PERSIST", "0")
                .arg("-F")
                .arg(lab.ssh_config())
                .args(["--json", "run", host, "--op", &single_op, "--", "true"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            children.push((single_op.clone(), false, single.spawn().unwrap()));
            expected.push(OpKey::new(single_op, host.clone()));
        }
        for (op, is_fleet, child) in children {
            let out = child.wait_with_output().unwrap();
            let doc: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            assert_eq!(
                out.status.code(),
                Some(0),
                "round {round} {op}: {doc} {}",
                text(&out.stderr)
            );
            let docs: Vec<serde_json::Value> = if is_fleet {
                doc["hosts"].as_array().cloned().unwrap_or_default()
            } else {
                vec![doc.clone()]
            };
            assert_eq!(docs.len(), if is_fleet { hosts.len() } else { 1 }, "{doc}");
            for d in docs {
                assert_eq!(d["verdict"], "completed", "round {round} {op}: {d}");
                assert_eq!(d["exit_code"], 0, "round {round} {op}: {d}");
                assert!(d.get("ledger_error").is_none(), "round {round} {op}: {d}");
            }
        }
    }
    let elapsed = started.elapsed();

    let ledger = f.open();
    let mut counted = 0u64;
    for key in &expected {
        let events = ledger.events(key).unwrap();
        counted += events.len() as u64;
        let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
        for want in ["intended", "attempt_dispatched", "exit_received", "verdict"] {
            assert!(kinds.contains(&want), "{key:?} lacks {want}: {kinds:?}");
        }
        assert!(
            matches!(
                events.last().map(|e| &e.event),
                Some(Event::Verdict {
                    verdict: Verdict::Completed,
                    exit_code: Some(0),
                    ..
                })
            ),
            "{key:?}: {kinds:?}"
        );
        let row = ledger.operation(key).unwrap().expect("a projection row");
        assert_eq!(row.state.to_string(), "completed", "{key:?}");
        assert_eq!(row.last_seq, events.last().unwrap().seq, "{key:?}");
    }
    let stats = ledger.stats().unwrap();
    assert_eq!(stats.operations, expected.len() as u64);
    assert_eq!(stats.events, counted, "no event under any other key");
    let report = ledger.verify_chain().unwrap();
    assert!(report.intact(), "{report:?}");
    let out = f
        .opmark(&f.scratch.0)
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("projection equals their replay"),
        "{}",
        text(&out.stdout)
    );
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "{ROUNDS} rounds of {PROCS} fleets x {} hosts + {PROCS} single runs: {} operations, {counted} events, {:.1} s",
        hosts.len(),
        expected.len(),
        elapsed.as_secs_f64()
    );
}

/// An operation whose outcome is unknown: intent, attempt, `indeterminate`.
fn unresolved_operation(ledger: &mut Ledger, key: &OpKey) {
    ledger
        .append_many(
            key,
            &[
                Event::Intended {
                    session: "s".into(),
                    family: Family::Destructive,
                    display: "systemctl restart app".into(),
                    fingerprint: format!("fp-{}", key.op_id),
                    rule: "test".into(),
                    secrets: Vec::new(),
                    become_user: None,
                    locks: Vec::new(),
                },
                Event::AttemptDispatched {
                    attempt_id: "at-1".into(),
                    number: 1,
                    parent: None,
                    reason: RetryReason::FirstAttempt,
                },
                Event::Verdict {
                    attempt_id: Some("at-1".into()),
                    verdict: Verdict::Indeterminate,
                    exit_code: None,
                    reason: "connection lost".into(),
                },
            ],
            Durability::Full,
        )
        .unwrap();
}

fn decisions(ledger: &Ledger, key: &OpKey) -> Vec<String> {
    ledger
        .events(key)
        .unwrap()
        .iter()
        .filter_map(|e| match &e.event {
            Event::OperatorDecision { by, .. } => Some(by.clone()),
            _ => None,
        })
        .collect()
}

fn two_concurrent_resolves_of_one_op_record_one_decision(f: &Fixture) {
    let key = OpKey::new("restart-1", "web1");
    unresolved_operation(&mut f.open(), &key);
    // Two operators, each on their own "machine" (HOME), decide at the same moment: each
    // one's append waits until both have read the operation and reached theirs.
    let barrier = f.scratch.path("barrier");
    let children: Vec<_> = ["alice", "bob"]
        .iter()
        .map(|who| {
            let home = f.scratch.path(who);
            std::fs::create_dir_all(&home).unwrap();
            let mut c = f.opmark(&home);
            c.env("OPMARK_TEST_APPEND_BARRIER", &barrier)
                .env("OPMARK_TEST_APPEND_BARRIER_N", "2")
                .args([
                    "resolve",
                    "restart-1",
                    "--host",
                    "web1",
                    "--as",
                    "applied",
                    "--note",
                    "checked the unit by hand",
                    "--by",
                    who,
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let won: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
    let lost: Vec<&Output> = outs.iter().filter(|o| !o.status.success()).collect();
    assert_eq!(won.len(), 1, "exactly one decision wins: {outs:?}");
    assert_eq!(lost.len(), 1);
    let ledger = f.open();
    let recorded = decisions(&ledger, &key);
    assert_eq!(recorded.len(), 1, "one decision recorded: {recorded:?}");
    let winner = &recorded[0];
    let err = text(&lost[0].stderr);
    assert!(
        err.contains(&format!("already settled by operator {winner} at 20")),
        "the loser is told who settled it and when: {err}"
    );
    assert!(err.contains("nothing was recorded"), "{err}");
    // Lost under the chain-head lock, having read the operation unsettled: the
    // conditional append's refusal names the winning event (the read-time one does not).
    assert!(
        err.contains(", event #"),
        "the two decisions overlapped: {err}"
    );
    let report = ledger.verify_chain().unwrap();
    assert!(report.intact(), "{report:?}");
}

fn a_settlement_conditional_on_what_was_read_loses_to_an_earlier_one(f: &Fixture) {
    let key = OpKey::new("deploy-7", "db1");
    let mut first = f.open();
    let mut second = f.open();
    unresolved_operation(&mut first, &key);
    // Both read the operation before either decides (two machines, one ledger).
    let seen_first = first.operation(&key).unwrap().unwrap().last_seq;
    let seen_second = second.operation(&key).unwrap().unwrap().last_seq;
    let decide = |by: &str| Event::OperatorDecision {
        by: by.into(),
        decision: opmark::ledger::Decision::NotApplied,
        note: "never ran".into(),
        exit_code: None,
    };
    first
        .append_if(
            &key,
            &[decide("alice")],
            Durability::Full,
            Some(opmark::ledger::UnlessSettledSince(seen_first)),
        )
        .unwrap();
    let err = second
        .append_if(
            &key,
            &[decide("bob")],
            Durability::Full,
            Some(opmark::ledger::UnlessSettledSince(seen_second)),
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, opmark::ledger::LedgerError::AlreadySettled(ref s) if s.by == "operator alice"),
        "{msg}"
    );
    assert!(
        msg.contains("already settled by operator alice at 20"),
        "{msg}"
    );
    assert_eq!(decisions(&second, &key), ["alice"]);
    // A reconcile settlement is held to the same rule.
    let err = second
        .append_if(
            &key,
            &[Event::Reconciled {
                decision: opmark::ledger::Decision::Completed,
                detail: "exit 0".into(),
            }],
            Durability::Normal,
            Some(opmark::ledger::UnlessSettledSince(seen_second)),
        )
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("already settled by operator alice"));
    // Unconditional writes (observations) still go in.
    second
        .append(&key, &decide("carol"), Durability::Normal)
        .unwrap();
    assert!(second.verify_chain().unwrap().intact());
}

fn audit_verify_names_an_edited_and_a_deleted_event(f: &Fixture) {
    let mut ledger = f.open();
    for n in 0..3 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    drop(ledger);
    let verify = || f.audit_verify(&[]);
    let (code, out, err) = verify();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out.trim(),
        "chain intact: 15 events, projection equals their replay"
    );
    f.sql("UPDATE events SET payload = replace(payload, 'echo 1', 'echo 9') WHERE seq = 6");
    let (code, out, _) = verify();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("chain broken at event #6:"), "{out}");
    f.sql("UPDATE events SET payload = replace(payload, 'echo 9', 'echo 1') WHERE seq = 6");
    assert_eq!(verify().0, Some(0));
    f.sql("DELETE FROM events WHERE seq = 8");
    let (code, out, _) = verify();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("chain broken at event #8:"), "{out}");
    assert!(out.contains("missing (deleted)"), "{out}");
}

/// The full walk streams the chain and the rows (PostgreSQL a page of 4,096 rows at a
/// time): more events than a page, and rows edited or added behind opmark's back.
fn the_full_walk_reads_past_a_page_and_names_an_edited_and_a_foreign_row(f: &Fixture) {
    let mut ledger = f.open();
    for n in 0..900 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    drop(ledger);
    let verify = || f.audit_verify(&["--full"]);
    let (code, out, err) = verify();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out.trim(),
        "chain intact: 4500 events, projection equals their replay"
    );
    f.sql("UPDATE operations SET display = display || ' x' WHERE op_id = 'op850'");
    let (code, out, _) = verify();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("projection differs from the events at operation `op850` on `h`"),
        "{out}"
    );
    assert!(out.contains("display"), "{out}");
    f.sql("UPDATE operations SET display = substr(display, 1, length(display) - 2) WHERE op_id = 'op850'");
    assert_eq!(verify().0, Some(0), "the edit undone");
    f.sql(
        "INSERT INTO operations (op_id, host, family, display, fingerprint, rule, session, state, verdict, exit_code, attempts, last_attempt, unresolved, created_at, updated_at, first_seq, last_seq, contradictions, settled_attempt)
         SELECT 'ghost', host, family, display, 'fp-ghost', rule, session, state, verdict, exit_code, attempts, last_attempt, unresolved, created_at, updated_at, first_seq, last_seq, contradictions, settled_attempt
         FROM operations WHERE op_id = 'op20'",
    );
    let (code, out, _) = verify();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("projection differs from the events at operation `ghost` on `h`"),
        "{out}"
    );
    assert!(out.contains("added outside opmark"), "{out}");
}

fn list_show_and_stats_read_the_same_projection(f: &Fixture) {
    let mut ledger = f.open();
    for n in 0..4 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    unresolved_operation(&mut ledger, &OpKey::new("lost-1", "h"));
    drop(ledger);
    let json = |args: &[&str]| -> serde_json::Value {
        let out = f
            .opmark(&f.scratch.0)
            .arg("--json")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let list = json(&["list"]);
    assert_eq!(list["operations"].as_array().unwrap().len(), 5, "{list}");
    let open = json(&["list", "--unresolved"]);
    let open = open["operations"].as_array().unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0]["op_id"], "lost-1");
    assert_eq!(open[0]["state"], "indeterminate");
    let show = json(&["show", "op2"]);
    assert_eq!(show["hosts"].as_array().map_or(1, Vec::len), 1, "{show}");
    let stats = json(&["stats"]);
    assert_eq!(stats["event_count"], 23, "{stats}");
    assert_eq!(stats["operation_count"], 5, "{stats}");
    assert_eq!(stats["unresolved_count"], 1, "{stats}");
    assert_eq!(stats["verdicts"]["completed"], 4, "{stats}");
    assert_eq!(stats["attempt_count"], 5, "{stats}");
    // The health counts read the same on both backends, over the whole ledger and over a
    // window that holds all of it: the indeterminate one is an unknown outcome.
    let unknown = serde_json::json!({"total": 1, "by_family": {"destructive": 1}});
    assert_eq!(stats["health"]["unknown_outcome_tally"], unknown, "{stats}");
    let window = json(&["stats", "--since", "1h"]);
    assert_eq!(window["health"], stats["health"], "{window}");
}

#[test]
fn writer_killed_with_sigkill_in_a_loop_loses_no_commit_and_leaves_no_half_operation() {
    let s = Scratch::new("sigkill");
    let db = s.path("ledger.db");
    let mut reported: Vec<u64> = Vec::new();
    for round in 0..10usize {
        let mut child = writer_child("endless", &db, round)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (first_commit, committed) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut seqs = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("committed ") {
                    seqs.extend(rest.split(' ').map(|s| s.parse::<u64>().unwrap()));
                    let _ = first_commit.send(());
                }
            }
            seqs
        });
        // Kill only once the writer is writing (a slow start on a busy machine must not
        // make every kill land before the first commit), at a varied moment after that so
        // it lands in different phases of a write.
        committed
            .recv_timeout(Duration::from_secs(60))
            .expect("the writer committed nothing within 60 s");
        std::thread::sleep(Duration::from_millis(1 + 23 * round as u64));
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        reported.extend(reader.join().unwrap());
    }
    assert!(!reported.is_empty(), "the writer never committed anything");

    let ledger = Ledger::open(&db).unwrap();
    let report = ledger.verify_chain().unwrap();
    assert_eq!(report.first_break, None);
    let max = *reported.iter().max().unwrap();
    eprintln!(
        "{} events stored, {} reported committed before the kills",
        report.events,
        reported.len()
    );
    assert!(report.events >= max, "committed events were lost");
    for op in ledger.list(&ListFilter::default()).unwrap() {
        let key = OpKey::new(&op.op_id, &op.host);
        let events = ledger.events(&key).unwrap();
        assert_eq!(events[0].event.kind(), "intended", "{key:?}");
        assert_eq!(
            events.get(1).map(|e| e.event.kind()),
            Some("attempt_dispatched"),
            "half operation {key:?}: intent without its attempt"
        );
    }
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

/// A closed ledger with 3 complete operations (15 events), copied per tamper scenario.
fn tamper_fixture(s: &Scratch) -> PathBuf {
    let db = s.path("pristine.db");
    let mut ledger = Ledger::open(&db).unwrap();
    for n in 0..3 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    // The write-ahead log outlives the connection (the newest commits live there until
    // SQLite folds it in), so fold it in before the file alone is copied.
    ledger.checkpoint().unwrap();
    drop(ledger);
    db
}

fn tampered(s: &Scratch, name: &str, sql: &str) -> PathBuf {
    let pristine = tamper_fixture(s);
    let db = s.path(&format!("{name}.db"));
    std::fs::copy(&pristine, &db).unwrap();
    // The copy keeps its key beside it, as a ledger moved with its key does.
    std::fs::copy(key_path_beside(&pristine), key_path_beside(&db)).unwrap();
    // The compact layout, made plain-SQL editable first (the same rows).
    Ledger::open(&db).unwrap().expand_rows_for_tests().unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(sql).unwrap();
    drop(conn);
    db
}

fn assert_verify_names(s: &Scratch, db: &Path, seq: u64) -> String {
    let out = opmark_with_ledger(&s.0, db, &["audit", "verify"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with(&format!("chain broken at event #{seq}:")),
        "{stdout}"
    );
    stdout
}

#[test]
fn a_backup_is_the_whole_ledger_while_cp_of_the_file_alone_may_miss_the_newest_commits() {
    let s = Scratch::new("backup");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    for n in 0..3 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    drop(ledger);
    // A closed ledger keeps its newest commits in its write-ahead log: that is what
    // spares each run a checkpoint's fsyncs, and why a copy is made by `ledger backup`.
    let wal = s.path("ledger.db-wal");
    assert!(
        std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0),
        "the log is kept after the last connection closes"
    );

    let copy = s.path("copy.db");
    let out = opmark_with_ledger(&s.0, &db, &["ledger", "backup", copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("--ledger-key"),
        "names the key it opens with: {said}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "a copy of the ledger is as private as the ledger"
    );

    // The copy alone, with this ledger's key, is the whole ledger.
    let key = key_path_beside(&db);
    let key = key.to_str().unwrap();
    let verify = opmark_with_ledger(&s.0, &copy, &["--ledger-key", key, "audit", "verify"]);
    assert_eq!(
        text(&verify.stdout),
        "chain intact: 15 events, projection equals their replay\n",
        "{}",
        text(&verify.stderr)
    );

    // An existing file is never overwritten; a missing ledger writes nothing.
    let before = std::fs::read(&copy).unwrap();
    let again = opmark_with_ledger(&s.0, &db, &["ledger", "backup", copy.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(245), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("already exists; a backup never overwrites a file"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    let nowhere = s.path("nowhere.db");
    let other = s.path("other.db");
    let none = opmark_with_ledger(
        &s.0,
        &nowhere,
        &["ledger", "backup", other.to_str().unwrap()],
    );
    assert_eq!(none.status.code(), Some(245), "{}", text(&none.stderr));
    assert!(
        text(&none.stderr).contains("no ledger at"),
        "{}",
        text(&none.stderr)
    );
    assert!(!other.exists() && !nowhere.exists(), "nothing was created");
}

#[test]
fn a_ledger_deleted_without_its_log_starts_empty_never_with_the_old_tail() {
    let s = Scratch::new("deleted");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    for n in 0..3 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    drop(ledger);
    // Someone starts afresh by deleting the file they know of; its log stays behind
    // (it outlives the process). The new ledger is an empty file, and SQLite removes a
    // log it finds beside an empty file instead of replaying the old ledger's pages.
    std::fs::remove_file(&db).unwrap();
    assert!(s.path("ledger.db-wal").exists());

    let ledger = Ledger::open(&db).unwrap();
    let ops = ledger.list(&ListFilter::default()).unwrap();
    assert!(ops.is_empty(), "the old log's commits came back: {ops:?}");
    drop(ledger);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    assert_eq!(
        text(&out.stdout),
        "chain intact: 0 events, projection equals their replay\n",
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn audit_verify_reports_an_intact_chain() {
    let s = Scratch::new("intact");
    let db = tamper_fixture(&s);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        "chain intact: 15 events, projection equals their replay\n"
    );
    let out = opmark_with_ledger(&s.0, &db, &["--json", "audit", "verify"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["intact"], true);
    assert_eq!(doc["event_count"], 15);
}

#[test]
fn audit_verify_names_an_edited_event() {
    let s = Scratch::new("edit");
    let db = tampered(
        &s,
        "edit",
        "UPDATE events SET payload = replace(payload, 'completed', 'not_applied') WHERE seq = 10",
    );
    let msg = assert_verify_names(&s, &db, 10);
    assert!(msg.contains("edited"), "{msg}");
}

#[test]
fn audit_verify_names_an_edited_event_whose_hash_was_recomputed() {
    let s = Scratch::new("rehash");
    let db = tampered(
        &s,
        "rehash",
        "UPDATE events SET at = '2000-01-01T00:00:00.000000Z' WHERE seq = 7",
    );
    // Recompute event 7's own hash, as a careful forger would.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let (prev, op, host, at, kind, payload): (String, String, String, String, String, String) =
        conn.query_row(
            "SELECT e.prev_hash, k.op_id, k.host, e.at, e.kind, e.payload FROM events e JOIN op_keys k ON k.id = e.op WHERE e.seq = 7",
            [],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .unwrap();
    let hash = Link {
        seq: 7,
        prev_hash: &prev,
        op_id: &op,
        host: &host,
        at: &at,
        kind: &kind,
        payload: &payload,
    }
    .hash();
    conn.execute("UPDATE events SET hash = ?1 WHERE seq = 7", [hash])
        .unwrap();
    drop(conn);
    assert_verify_names(&s, &db, 7);
}

#[test]
fn audit_verify_names_a_deleted_event() {
    let s = Scratch::new("delete");
    let db = tampered(&s, "delete", "DELETE FROM events WHERE seq = 6");
    let msg = assert_verify_names(&s, &db, 6);
    assert!(msg.contains("missing"), "{msg}");
    let db = tampered(&s, "delete-first", "DELETE FROM events WHERE seq = 1");
    assert_verify_names(&s, &db, 1);
    let db = tampered(&s, "delete-last", "DELETE FROM events WHERE seq = 15");
    assert_verify_names(&s, &db, 15);
}

#[test]
fn audit_verify_names_swapped_events() {
    let s = Scratch::new("swap");
    let db = tampered(
        &s,
        "swap",
        "UPDATE events SET seq = -1 WHERE seq = 4;
         UPDATE events SET seq = 4 WHERE seq = 5;
         UPDATE events SET seq = 5 WHERE seq = -1;",
    );
    assert_verify_names(&s, &db, 4);
}

#[test]
fn audit_verify_without_a_ledger_is_a_clear_error() {
    let s = Scratch::new("missing");
    let out = opmark_with_ledger(&s.0, &s.path("nope.db"), &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(248));
    assert!(
        text(&out.stderr).contains("no ledger at"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !s.path("nope.db").exists(),
        "a read command created a ledger"
    );
}

#[test]
fn list_and_show_render_the_timeline_with_retries() {
    let s = Scratch::new("show");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    let key = OpKey::new("deploy-42", "web1");
    write_operation(&mut ledger, &OpKey::new("other-op", "web2"), 1);
    ledger
        .append_many(
            &key,
            &[
                Event::Intended {
                    session: "s1".into(),
                    family: Family::Destructive,
                    display: "rm -rf /srv/old".into(),
                    fingerprint: "ab".repeat(32),
                    rule: "default_family".into(),
                    secrets: Vec::new(),
                    become_user: None,
                    locks: Vec::new(),
                },
                Event::AttemptDispatched {
                    attempt_id: "a1".into(),
                    number: 1,
                    parent: None,
                    reason: RetryReason::FirstAttempt,
                },
            ],
            Durability::Full,
        )
        .unwrap();
    for e in [
        Event::BoundaryReached {
            attempt_id: "a1".into(),
            boundary: Boundary::SentNoResponse,
            detail: "keepalive timeout after 3s".into(),
            refusal: None,
        },
        Event::Probed {
            attempt_id: Some("a1".into()),
            state: "absent".into(),
            exit_code: None,
            detail: String::new(),
            claim: None,
        },
        Event::AttemptDispatched {
            attempt_id: "a2".into(),
            number: 2,
            parent: Some("a1".into()),
            reason: RetryReason::ResponseLostAfterDispatch,
        },
        Event::BoundaryReached {
            attempt_id: "a2".into(),
            boundary: Boundary::SentNoResponse,
            detail: "keepalive timeout after 3s".into(),
            refusal: None,
        },
        Event::Verdict {
            attempt_id: Some("a2".into()),
            verdict: Verdict::Indeterminate,
            exit_code: None,
            reason: "probe unreachable within the budget".into(),
        },
    ] {
        ledger.append(&key, &e, Durability::Normal).unwrap();
    }

    let out = opmark_with_ledger(&s.0, &db, &["show", "deploy-42"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        shown.starts_with("operation deploy-42 on web1\n"),
        "{shown}"
    );
    assert!(shown.contains("UNRESOLVED"), "{shown}");
    // Long lines wrap; compare the words.
    let flat = shown.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("attempt a2 (#2) begun: retry of a1 because response_lost_after_dispatch"),
        "{shown}"
    );
    assert!(
        flat.contains("verdict indeterminate (attempt a2)"),
        "{shown}"
    );
    for line in shown.lines() {
        assert!(line.chars().count() <= 80, "line over 80 columns: {line:?}");
    }
    // Attempt sub-events are indented deeper than the attempt line.
    let indent = |needle: &str| {
        let l = shown.lines().find(|l| l.contains(needle)).unwrap();
        let after_seq = l.split_once('#').unwrap().1;
        after_seq.len() - after_seq.split_once(' ').unwrap().1.trim_start().len()
    };
    assert!(indent("boundary sent_no_response") > indent("attempt a1"));
    assert!(indent("attempt a1") > indent("intended"));

    let out = opmark_with_ledger(
        &s.0,
        &db,
        &["--json", "show", "deploy-42", "--host", "web1"],
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operation"]["unresolved"], true);
    assert_eq!(doc["events"].as_array().unwrap().len(), 7);

    let out = opmark_with_ledger(&s.0, &db, &["list", "--unresolved"]);
    let listed = text(&out.stdout);
    assert!(
        listed.contains("deploy-42") && !listed.contains("other-op"),
        "{listed}"
    );
    let out = opmark_with_ledger(&s.0, &db, &["--json", "list", "--host", "web2"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ops = doc["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["op_id"], "other-op");

    let out = opmark_with_ledger(&s.0, &db, &["--json", "stats"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operation_count"], 2);
    assert_eq!(doc["unresolved_count"], 1);
    assert_eq!(doc["unknown_outcomes"], 1);
    assert_eq!(doc["retries_by_family"]["destructive"], 1);

    let out = opmark_with_ledger(&s.0, &db, &["show", "no-such-op"]);
    assert_eq!(out.status.code(), Some(245));
    assert!(text(&out.stderr).contains("no operation `no-such-op`"));
}

/// One canary per redaction shape. Every secret contains "canary" (any case) and nothing
/// else written in the test does, so one byte search covers all shapes.
const CANARY_TEXTS: &[&str] = &[
    "mysql --password=CanaryPwEq1 -e 'select 1'",
    "tool --password CanaryPwSp2 run",
    "mysqldump -u root -pCanaryGlued3 db",
    "DB_TOKEN=CanaryEnv4 SECRET_KEY='Canary quoted 5' ./deploy",
    "curl -H 'Authorization: Bearer CanaryBearer6' https://api",
    "curl -H 'Authorization: Basic Q2FuYXJ5QmFzaWM3' https://api",
    "git clone https://bob:CanaryUrl8@git.example.com/r.git",
    "aws s3 ls # AKIACANARY9XXXXXXXXX",
    "gh auth ghp_Canary10aaaaaaaaaaaaaaaaaaaa",
    "gho_Canary11bbbbbbbbbbbbbbbbbbbb",
    "github_pat_Canary12cccccccccccccccccccc",
    "glpat-Canary13dddddddddddddddd",
    "xoxb-Canary14-eeeeeeeeee",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nCanaryPem15\nAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "policy says corp-canary-16 is secret",
];

#[test]
fn canary_secrets_appear_nowhere_in_the_database_wal_or_output() {
    let s = Scratch::new("redaction");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    ledger.set_redactor(Redactor::new(&[
        regex::Regex::new(r"corp-canary-[0-9]+").unwrap()
    ]));
    for (n, secret) in CANARY_TEXTS.iter().enumerate() {
        let key = OpKey::new(format!("op{n}"), "web1");
        let a = format!("a{n}");
        let events = [
            Event::Intended {
                session: "s".into(),
                family: Family::Destructive,
                display: secret.to_string(),
                fingerprint: format!("fp{n}"),
                rule: secret.to_string(),
                secrets: Vec::new(),
                become_user: None,
                locks: Vec::new(),
            },
            Event::AttemptDispatched {
                attempt_id: a.clone(),
                number: 1,
                parent: None,
                reason: RetryReason::FirstAttempt,
            },
        ];
        ledger.append_many(&key, &events, Durability::Full).unwrap();
        for e in [
            Event::BoundaryReached {
                attempt_id: a.clone(),
                boundary: Boundary::Refused,
                detail: secret.to_string(),
                refusal: None,
            },
            Event::Probed {
                attempt_id: Some(a.clone()),
                state: "absent".into(),
                exit_code: None,
                detail: secret.to_string(),
                claim: None,
            },
            Event::Reconciled {
                decision: "still_unknown".into(),
                detail: secret.to_string(),
            },
            Event::OperatorDecision {
                by: "alice".into(),
                decision: "approved".into(),
                note: secret.to_string(),
                exit_code: None,
            },
            Event::Fenced {
                detail: secret.to_string(),
            },
            Event::Superseded {
                attempt_id: a.clone(),
                note: secret.to_string(),
            },
            Event::Verdict {
                attempt_id: Some(a.clone()),
                verdict: Verdict::Indeterminate,
                exit_code: None,
                reason: secret.to_string(),
            },
        ] {
            ledger.append(&key, &e, Durability::Normal).unwrap();
        }
    }
    // While the ledger is open its newest pages live in the WAL: search it, and -shm.
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", db.display()));
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !contains_canary(&bytes),
            "secret found in {}",
            file.display()
        );
    }
    let mut outputs = Vec::new();
    let runs: Vec<Vec<String>> = vec![
        vec!["list".into()],
        vec!["--json".into(), "list".into()],
        vec!["stats".into()],
        vec!["--json".into(), "stats".into()],
        vec!["audit".into(), "verify".into()],
        vec!["-vvv".into(), "show".into(), "op3".into()],
        // Errors that echo the user's input must mask it too.
        vec!["show".into(), "x --password=CanaryErr17".into()],
        vec!["show".into(), "ghp_Canary18ffffffffffffffffffff".into()],
        vec![
            "show".into(),
            "op1".into(),
            "--host".into(),
            "DB_TOKEN=CanaryErr19".into(),
        ],
    ];
    for n in 0..CANARY_TEXTS.len() {
        let mut args = vec!["show".to_owned(), format!("op{n}")];
        outputs.push(opmark_with_ledger(
            &s.0,
            &db,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
        args.insert(0, "--json".into());
        outputs.push(opmark_with_ledger(
            &s.0,
            &db,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
    }
    for args in &runs {
        outputs.push(opmark_with_ledger(
            &s.0,
            &db,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
    }
    for out in &outputs {
        assert!(
            !contains_canary(&out.stdout) && !contains_canary(&out.stderr),
            "secret printed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    // The shapes survive: what was masked is still recognisable.
    let shown = text(&opmark_with_ledger(&s.0, &db, &["show", "op6"]).stdout);
    assert!(shown.contains("https://bob:***@git.example.com"), "{shown}");
    drop(ledger);
    let bytes = std::fs::read(&db).unwrap();
    assert!(
        !contains_canary(&bytes),
        "secret found in the checkpointed database"
    );
}

/// Issue 24 row 8 (names only; docs/guarantees.md#evidence-identity): two labs never name a target
/// alike, so one ledger keeps their operations apart. The same op id run on each lab's
/// first target is two operations, and the second runs on its own machine instead of
/// replaying the first lab's exit. Inside one lab's ssh_config `target1` still reaches
/// that lab's first target (OpenSSH and opmark alike), and known_hosts holds every key.
#[test]
fn two_labs_name_their_targets_uniquely_so_one_ledger_keeps_their_operations_apart() {
    let Some(a) = support::loopback_lab_named("two-labs-a", 1) else {
        return;
    };
    let Some(b) = support::loopback_lab_named("two-labs-b", 1) else {
        return;
    };
    let (ta, tb) = (&a.targets()[0], &b.targets()[0]);
    assert_ne!(ta.alias, tb.alias, "two labs, two names");
    for (lab, t) in [(&a, ta), (&b, tb)] {
        assert_eq!(t.short_name(), "target1");
        assert!(
            t.alias.ends_with("-target1") && t.alias.starts_with(lab.id()),
            "{}",
            t.alias
        );
        assert!(std::ptr::eq(lab.target("target1").unwrap(), t));
        for name in [t.alias.as_str(), "target1"] {
            let out = support::ssh(lab)
                .args([name, "echo", "hi"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        }
    }
    let env = Sealed::new("two-labs");
    let mut outcomes = Vec::new();
    for (lab, t) in [(&a, ta), (&b, tb)] {
        let out = env
            .opmark_with_lab(lab)
            .args(["--json", "run", &t.alias, "--op", "same-op", "--", "echo"])
            .arg("ran on $XDG_STATE_HOME")
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{doc} {}", text(&out.stderr));
        outcomes.push((doc["verdict"].clone(), doc["stdout"].clone()));
    }
    for (i, t) in [ta, tb].iter().enumerate() {
        assert_eq!(outcomes[i].0, "completed", "{outcomes:?}");
        assert_eq!(
            outcomes[i].1.as_str().unwrap(),
            format!("ran on {}\n", t.state_home.display()),
            "each ran on its own target"
        );
    }
    let ledger = Ledger::open(&env.ledger).unwrap();
    assert_eq!(ledger.hosts_of("same-op").unwrap().len(), 2);
}

// --- The installation key belongs to the ledger (docs/ledger.md#the-installation-key) -------------------

/// `opmark --json run target1 --op OP -- CMD` in `env` (any extra env applied first).
fn run_op_with(
    cmd: &mut Command,
    lab: &Lab,
    op: &str,
    command: &str,
) -> (serde_json::Value, i32, String) {
    let out = cmd
        .arg("-F")
        .arg(lab.ssh_config())
        .args(["--json", "run", "target1", "--op", op, "--", command])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (doc, out.status.code().unwrap_or(-1), text(&out.stderr))
}

#[test]
fn the_same_ledger_under_another_config_dir_replays_instead_of_conflicting() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("key-same-ledger");
    let other = Sealed::new("key-other-home");
    let fx = env.root.join("effects");
    let cmd = format!("echo ran >> {}; exit 5", fx.display());
    let (first, status, err) = run_op_with(&mut env.opmark(), &lab, "key-1", &cmd);
    assert_eq!(first["verdict"], "completed", "{first} {err}");
    assert_eq!(status, 5);
    let key = key_path_beside(&env.ledger);
    assert!(key.is_file(), "the key is made with the ledger, beside it");

    // Same ledger, another HOME and XDG_CONFIG_HOME (sudo, a container keeping only the
    // state dir): the same intent is recognised, nothing runs again.
    let mut elsewhere = other.opmark();
    elsewhere
        .env_remove("OPMARK_LEDGER")
        .arg("--ledger")
        .arg(&env.ledger);
    let (again, status, err) = run_op_with(&mut elsewhere, &lab, "key-1", &cmd);
    assert_eq!(again["verdict"], "replayed", "{again} {err}");
    assert_eq!((again["exit_code"].as_i64(), status), (Some(5), 5));
    assert_eq!(lines(&fx), 1, "one execution on the host");
    assert!(
        std::fs::read_dir(&other.config).unwrap().next().is_none(),
        "no key was made under the other config dir"
    );

    // Key deleted: a clear error naming both paths, nothing sent (a new op would run).
    let saved = env.root.join("saved.key");
    std::fs::rename(&key, &saved).unwrap();
    let marker_root = lab.target("target1").unwrap().marker_root();
    let (doc, status, err) = run_op_with(&mut env.opmark(), &lab, "key-2", &cmd);
    assert_eq!(status, 248, "{doc} {err}");
    let said = format!("{doc} {err}");
    assert!(said.contains(&env.ledger.display().to_string()), "{said}");
    assert!(said.contains(&key.display().to_string()), "{said}");
    assert!(!said.contains("conflict"), "{said}");
    assert!(!key.exists(), "no key silently made for an existing ledger");
    assert!(!marker_root.join("ops/key-2").exists(), "nothing was sent");

    // A different key: the same kind of error, never `conflict`.
    let wrong = other.root.join("wrong.key");
    let out = other
        .opmark()
        .args(["ledger", "keygen"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut wrong_key = env.opmark();
    wrong_key.env("OPMARK_LEDGER_KEY", &wrong);
    let (doc, status, err) = run_op_with(&mut wrong_key, &lab, "key-1", &cmd);
    assert_eq!(status, 248, "{doc} {err}");
    let said = format!("{doc} {err}");
    assert!(said.contains(&wrong.display().to_string()), "{said}");
    assert!(said.contains(&env.ledger.display().to_string()), "{said}");
    assert!(said.contains("not the key of the ledger"), "{said}");
    let (doc, status, err) = run_op_with(&mut wrong_key, &lab, "key-3", &cmd);
    assert_eq!(status, 248, "{doc} {err}");
    assert!(!marker_root.join("ops/key-3").exists(), "nothing was sent");
    assert_eq!(lines(&fx), 1);

    // The restored key opens the ledger again, and the operation still replays.
    std::fs::rename(&saved, &key).unwrap();
    let (again, _, err) = run_op_with(&mut env.opmark(), &lab, "key-1", &cmd);
    assert_eq!(again["verdict"], "replayed", "{again} {err}");
    assert_eq!(lines(&fx), 1);
}

#[test]
fn ledger_keygen_writes_a_0600_key_and_never_overwrites() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("keygen");
    let key = s.path("keys/shared.key");
    let out = opmark_with_ledger(
        &s.0,
        &s.path("l.db"),
        &["ledger", "keygen", key.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (32, 0o600));
    let before = std::fs::read(&key).unwrap();
    let out = opmark_with_ledger(
        &s.0,
        &s.path("l.db"),
        &["ledger", "keygen", key.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(245));
    assert!(
        text(&out.stderr).contains("refusing to overwrite"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&key).unwrap(), before);
}

/// The schema of version 1, as the old layout shipped it (migrations are never edited,
/// so this is what such a ledger holds).
const SCHEMA_V1: &str = "
    CREATE TABLE events (seq INTEGER PRIMARY KEY, op_id TEXT NOT NULL, host TEXT NOT NULL,
        at TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL, prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL);
    CREATE INDEX events_by_operation ON events (op_id, host, seq);
    CREATE INDEX events_by_kind ON events (kind);
    CREATE TABLE chain_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL,
        hash TEXT NOT NULL);
    CREATE TABLE operations (op_id TEXT NOT NULL, host TEXT NOT NULL, family TEXT NOT NULL,
        display TEXT NOT NULL, fingerprint TEXT NOT NULL, rule TEXT NOT NULL,
        session TEXT NOT NULL, state TEXT NOT NULL, verdict TEXT, exit_code INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0, last_attempt TEXT, unresolved INTEGER NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL, PRIMARY KEY (op_id, host)) WITHOUT ROWID;
    CREATE INDEX operations_by_recency ON operations (last_seq);
    CREATE INDEX operations_unresolved ON operations (unresolved, last_seq);
    PRAGMA user_version = 1;
";

/// A ledger as the old layout left it: schema 1, a plain SHA-256 chain holding one
/// operation that completed with exit 9, and an `operations` row edited to say exit 0
/// (the old layout never checked its rows).
fn old_layout_ledger(db: &Path) {
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(SCHEMA_V1).unwrap();
    let events = [
        (
            "intended",
            r#"{"kind":"intended","session":"s","family":"destructive","display":"rm -rf /srv/old","fingerprint":"fp","rule":"r"}"#,
        ),
        (
            "attempt_dispatched",
            r#"{"kind":"attempt_dispatched","attempt_id":"at-1","number":1,"parent":null,"reason":"first_attempt"}"#,
        ),
        (
            "verdict",
            r#"{"kind":"verdict","attempt_id":"at-1","verdict":"completed","exit_code":9,"reason":"r"}"#,
        ),
    ];
    let at = "2026-01-01T00:00:00.000000Z";
    let mut prev = opmark::ledger::chain::GENESIS.to_owned();
    for (i, (kind, payload)) in events.iter().enumerate() {
        let seq = i as u64 + 1;
        let hash = Link {
            seq,
            prev_hash: &prev,
            op_id: "old-op",
            host: "h",
            at,
            kind,
            payload,
        }
        .hash();
        conn.execute(
            "INSERT INTO events VALUES (?1, 'old-op', 'h', ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![seq, at, kind, payload, prev, hash],
        )
        .unwrap();
        prev = hash;
    }
    conn.execute(
        "INSERT INTO chain_head VALUES (1, ?1, ?2)",
        rusqlite::params![events.len() as u64, prev],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO operations VALUES ('old-op', 'h', 'destructive', 'echo harmless', 'fp', 'r', 's', 'completed', 'completed', 0, 1, 'at-1', 0, ?1, ?1, 1, 3)",
        [at],
    )
    .unwrap();
}

#[test]
fn an_old_layout_ledger_adopts_the_config_dir_key_once_and_keeps_verifying() {
    let s = Scratch::new("adopt");
    let db = s.path("state/opmark/ledger.db");
    old_layout_ledger(&db);
    // Without any key, it refuses and names where it looked.
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(248));
    let err = text(&out.stderr);
    assert!(
        err.contains(&key_path_beside(&db).display().to_string()),
        "{err}"
    );
    assert!(err.contains("config/opmark/installation.key"), "{err}");

    let legacy = s.path("config/opmark/installation.key");
    std::fs::create_dir_all(legacy.parent().unwrap()).unwrap();
    std::fs::write(&legacy, [7u8; 32]).unwrap();
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{}{err}", text(&out.stdout));
    assert!(
        err.contains("copied")
            && err.contains(&legacy.display().to_string())
            && err.contains("rebuilt from its events"),
        "{err}"
    );
    assert_eq!(std::fs::read(key_path_beside(&db)).unwrap(), [7u8; 32]);
    // Once: the next open is silent, and new events are keyed after the old plain ones.
    let mut ledger = Ledger::open(&db).unwrap();
    ledger
        .append(
            &OpKey::new("new-op", "h"),
            &Event::Fenced {
                detail: "new".into(),
            },
            Durability::Normal,
        )
        .unwrap();
    drop(ledger);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(text(&out.stderr), "");
    assert!(text(&out.stdout).starts_with("chain intact: 4 events"));
    // The rows now say what the events say.
    let doc: serde_json::Value =
        serde_json::from_slice(&opmark_with_ledger(&s.0, &db, &["--json", "list"]).stdout).unwrap();
    let op = &doc["operations"][0];
    assert_eq!(op["display"], "rm -rf /srv/old");
    assert_eq!(op["exit_code"], 9);
}

// --- audit verify does not trust the projection (docs/ledger.md#the-chain) -------------------

#[test]
fn audit_verify_names_an_edited_projection_row() {
    let s = Scratch::new("projection");
    let db = tampered(
        &s,
        "projection",
        "UPDATE operations SET verdict = 'completed', exit_code = 0, display = 'echo harmless' WHERE op_id = 'op1'",
    );
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.starts_with("projection differs from the events at operation `op1` on `h`"),
        "{stdout}"
    );
    assert!(stdout.contains("display"), "{stdout}");
    let out = opmark_with_ledger(&s.0, &db, &["--json", "audit", "verify"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["intact"], false);
    assert_eq!(doc["first_mismatch"]["op_id"], "op1");
}

#[test]
fn audit_verify_finds_a_deleted_tail_whose_head_was_fixed() {
    let s = Scratch::new("tail");
    let db = tampered(
        &s,
        "tail",
        "DELETE FROM events WHERE seq = 15;
         UPDATE chain_head SET seq = 14, hash = (SELECT hash FROM events WHERE seq = 14);",
    );
    let msg = assert_verify_names(&s, &db, 15);
    assert!(msg.contains("deleted"), "{msg}");
}

#[test]
fn audit_verify_finds_a_full_recomputation_of_the_plain_chain() {
    let s = Scratch::new("recompute");
    let db = tampered(
        &s,
        "recompute",
        "UPDATE events SET payload = replace(payload, '\"exit_code\":0', '\"exit_code\":7')",
    );
    // Recompute every hash and the head in order, as someone without the key would.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let rows: Vec<(u64, String, String, String, String, String)> = {
        let mut st = conn
            .prepare("SELECT e.seq, k.op_id, k.host, e.at, e.kind, e.payload FROM events e JOIN op_keys k ON k.id = e.op ORDER BY e.seq")
            .unwrap();
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    };
    let mut prev = opmark::ledger::chain::GENESIS.to_owned();
    for (seq, op_id, host, at, kind, payload) in &rows {
        let hash = Link {
            seq: *seq,
            prev_hash: &prev,
            op_id,
            host,
            at,
            kind,
            payload,
        }
        .hash();
        conn.execute(
            "UPDATE events SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
    conn.execute(
        "UPDATE chain_head SET seq = ?1, hash = ?2",
        rusqlite::params![rows.len() as u64, prev],
    )
    .unwrap();
    drop(conn);
    let msg = assert_verify_names(&s, &db, 1);
    assert!(msg.contains("keyed hash"), "{msg}");
}

// --- contradictions between evidence (docs/ledger.md#contradictions) ------------------------------

#[test]
fn an_edited_exit_record_is_a_contradiction_shown_everywhere_and_the_ledger_keeps_exit_0() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("contradiction");
    let (first, status, err) = run_op_with(&mut env.opmark(), &lab, "edited-1", "true");
    assert_eq!(
        (first["verdict"].as_str(), status),
        (Some("completed"), 0),
        "{first} {err}"
    );

    // A deliberate edit of the host's exit record, as a command of the same user could.
    let exit = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/edited-1/exit");
    let record = std::fs::read_to_string(&exit).unwrap();
    assert!(record.starts_with("code=0\n"), "{record}");
    std::fs::write(&exit, record.replacen("code=0", "code=9", 1)).unwrap();

    let out = env
        .opmark_with_lab(&lab)
        .args(["probe", "target1", "edited-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("exit=9"),
        "{}",
        text(&out.stdout)
    );

    let show = env.opmark().args(["show", "edited-1"]).output().unwrap();
    let page = text(&show.stdout);
    // Lines wrap at 80 columns; compare the words.
    let words = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("CONTRADICTED expected completed exit 0 (attempt at-"),
        "{page}"
    );
    assert!(words.contains("but probed (event #"), "{page}");
    assert!(
        words.contains("saw completed exit 9 (attempt at-"),
        "{page}"
    );
    let doc: serde_json::Value = serde_json::from_slice(
        &env.opmark()
            .args(["--json", "show", "edited-1"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(doc["contradictions"][0]["seen"]["exit_code"], 9);
    assert_eq!(doc["operation"]["exit_code"], 0);
    assert_eq!(doc["outcome"]["exit_code"], 0);

    let list = text(&env.opmark().arg("list").output().unwrap().stdout);
    let row = list.lines().find(|l| l.contains("edited-1")).unwrap();
    assert!(row.starts_with(" C "), "{list}");
    assert!(list.contains("1 CONTRADICTED"), "{list}");
    let doc: serde_json::Value = serde_json::from_slice(
        &env.opmark()
            .args(["--json", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let op = &doc["operations"][0];
    assert_eq!(
        (op["contradiction_count"].as_u64(), op["exit_code"].as_i64()),
        (Some(1), Some(0))
    );

    let stats: serde_json::Value = serde_json::from_slice(
        &env.opmark()
            .args(["--json", "stats"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(stats["contradiction_count"], 1);
    assert_eq!(stats["contradicted_operations"], 1);

    // reconcile reports it and does not settle it away.
    let out = env
        .opmark_with_lab(&lab)
        .args(["reconcile", "edited-1"])
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("edited-1") && said.contains("CONTRADICTED"),
        "{said}"
    );
    let out = env
        .opmark_with_lab(&lab)
        .args(["--json", "reconcile", "edited-1"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["contradicted"][0]["exit_code"], 0);

    // A rerun replays what the host now says, and says on stderr that it contradicts
    // the ledger, which keeps exit 0.
    let (doc, _, err) = run_op_with(&mut env.opmark(), &lab, "edited-1", "true");
    assert_eq!(doc["verdict"], "replayed", "{doc} {err}");
    assert!(err.contains("CONTRADICTION"), "{err}");
    assert!(err.contains("keeps exit 0"), "{err}");

    // The chain and the projection still agree with each other.
    let out = env.opmark().args(["audit", "verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

// --- the verdict survives a ledger that cannot be written after dispatch -----------

/// A size-limited tmpfs mounted for one test, unmounted on drop.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(dir: PathBuf, size: &str) -> SmallFs {
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", text(&out.stderr));
        SmallFs(dir)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_ledger_disk_filled_by_the_command_still_gets_the_verdict_and_a_rerun_replays() {
    if !support::require_root("a_ledger_disk_filled_by_the_command_still_gets_the_verdict")
        || !support::require_tools("ledger disk full", &["mount", "umount", "dd"])
    {
        return;
    }
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("ledger-full");
    let fs = SmallFs::mount(env.root.join("ledgerfs"), "2m");
    let ledger = fs.0.join("ledger.db");
    let fx = env.root.join("effects");
    // The target is local: the command itself fills the ledger's filesystem after the
    // intent and the attempt were written, then exits 3.
    let cmd = format!(
        "echo ran >> {}; dd if=/dev/zero of={} bs=64k 2>/dev/null; exit 3",
        fx.display(),
        fs.0.join("fill").display()
    );
    let mut first = env.opmark();
    first.env("OPMARK_LEDGER", &ledger);
    let (doc, status, err) = run_op_with(&mut first, &lab, "full-1", &cmd);
    assert_eq!(doc["verdict"], "completed", "{doc} {err}");
    assert_eq!((doc["exit_code"].as_i64(), status), (Some(3), 3), "{err}");
    assert_eq!(doc["ledger_error"]["reason_code"], "ledger_full", "{doc}");
    assert!(
        doc["ledger_error"]["message"]
            .as_str()
            .unwrap()
            .contains("full"),
        "{doc}"
    );
    assert!(err.contains("could not record this verdict"), "{err}");
    assert!(err.contains("same op id"), "{err}");
    assert_eq!(lines(&fx), 1);

    std::fs::remove_file(fs.0.join("fill")).unwrap();
    let mut again = env.opmark();
    again.env("OPMARK_LEDGER", &ledger);
    let (doc, status, err) = run_op_with(&mut again, &lab, "full-1", &cmd);
    assert_eq!(doc["verdict"], "replayed", "{doc} {err}");
    assert_eq!((doc["exit_code"].as_i64(), status), (Some(3), 3));
    assert!(doc.get("ledger_error").is_none(), "{doc}");
    assert_eq!(lines(&fx), 1, "one execution");
    let out = env
        .opmark()
        .env("OPMARK_LEDGER", &ledger)
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn a_completed_marker_whose_claim_record_was_removed_is_a_contradiction() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("claimless");
    let (first, status, err) = run_op_with(&mut env.opmark(), &lab, "claimless-1", "exit 4");
    assert_eq!(
        (first["verdict"].as_str(), status),
        (Some("completed"), 4),
        "{first} {err}"
    );
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/claimless-1");
    std::fs::remove_file(marker.join("claim")).unwrap();
    let out = env
        .opmark_with_lab(&lab)
        .args(["probe", "target1", "claimless-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(
        &env.opmark()
            .args(["--json", "show", "claimless-1"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(
        doc["contradictions"][0]["seen"]["state"], "completed without a claim record",
        "{doc}"
    );
    assert_eq!(doc["operation"]["exit_code"], 4);
}

/// `opmark ledger migrate --to URL`: a SQLite ledger written by real commands is copied
/// event for event into PostgreSQL; the chain verifies there under the same key, `show`
/// reads the same history, new events extend the copied chain, and a second copy into the
/// now non-empty database is refused.
#[test]
fn postgres_migrate_from_sqlite_keeps_the_chain() {
    let Some(pg) = Fixture::new(Backend::Postgres, "migrate") else {
        return;
    };
    let s = Scratch::new("migrate-src");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    for n in 0..5 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    unresolved_operation(&mut ledger, &OpKey::new("lost-1", "h"));
    ledger
        .append(
            &OpKey::new("lost-1", "h"),
            &Event::OperatorDecision {
                by: "alice".into(),
                decision: opmark::ledger::Decision::Abandoned,
                note: "host is gone".into(),
                exit_code: None,
            },
            Durability::Full,
        )
        .unwrap();
    drop(ledger);
    let url = pg.location.to_str().unwrap();
    let out = opmark_with_ledger(&s.0, &db, &["ledger", "migrate", "--to", url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.starts_with("copied 29 events from"), "{said}");
    assert!(said.contains("chain intact there"), "{said}");
    assert!(
        said.contains(&key_path_beside(&db).display().to_string()),
        "names the key to use: {said}"
    );

    // The copy, opened with the SQLite ledger's key as every machine will.
    let key = key_path_beside(&db);
    let on_pg = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_opmark"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &s.0)
            .args(["--ledger", url, "--ledger-key"])
            .arg(&key)
            .args(args)
            .output()
            .unwrap()
    };
    let out = on_pg(&["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "chain intact: 29 events, projection equals their replay"
    );
    let from_sqlite = opmark_with_ledger(&s.0, &db, &["--json", "show", "lost-1"]);
    let from_pg = on_pg(&["--json", "show", "lost-1"]);
    let events = |o: &Output| {
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        doc["events"].clone()
    };
    assert_eq!(events(&from_sqlite), events(&from_pg), "the same history");
    let mut copied = Ledger::open_with_key(&pg.location, Some(&key)).unwrap();
    write_operation(&mut copied, &OpKey::new("after-move", "h"), 9);
    assert!(copied.verify_chain().unwrap().intact());
    assert_eq!(copied.verify_chain().unwrap().events, 34);

    // Another key cannot open it; a second copy into it is refused.
    let out = Command::new(env!("CARGO_BIN_EXE_opmark"))
        .env_clear()
        .env("HOME", &s.0)
        .args(["--ledger", url, "--ledger-key"])
        .arg(pg.key.as_ref().unwrap())
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("is not the key of the ledger"),
        "{}",
        text(&out.stderr)
    );
    let out = opmark_with_ledger(&s.0, &db, &["ledger", "migrate", "--to", url]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("already holds"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 30: `ledger migrate` of an archived SQLite ledger keeps the cut and the archived
/// counts on PostgreSQL: the copy verifies from the cut, its archive verifies with it as
/// one chain, and `stats` counts the whole history as before.
#[test]
fn postgres_migrate_of_an_archived_sqlite_ledger_keeps_its_cut_and_archive() {
    let Some(pg) = Fixture::new(Backend::Postgres, "migratearchived") else {
        return;
    };
    let s = Scratch::new("migrate-archived-src");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    archivable_history(&mut ledger);
    drop(ledger);
    let file = s.path("archive.db");
    let file_arg = file.to_str().unwrap();
    let out = opmark_with_ledger(
        &s.0,
        &db,
        &["ledger", "archive", "--before", "0s", file_arg],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stats = Ledger::open(&db).unwrap().stats().unwrap();
    let url = pg.location.to_str().unwrap();
    // Archived counts edited in the source: refused, nothing copied.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mac: String = conn
        .query_row(
            "SELECT value FROM meta WHERE name = 'archive_counts_mac'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    conn.execute(
        "UPDATE meta SET value = 'edited' WHERE name = 'archive_counts_mac'",
        [],
    )
    .unwrap();
    let out = opmark_with_ledger(&s.0, &db, &["ledger", "migrate", "--to", url]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("archived counts was edited outside opmark"),
        "{}",
        text(&out.stderr)
    );
    conn.execute(
        "UPDATE meta SET value = ?1 WHERE name = 'archive_counts_mac'",
        [&mac],
    )
    .unwrap();
    drop(conn);
    let out = opmark_with_ledger(&s.0, &db, &["ledger", "migrate", "--to", url]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let key = key_path_beside(&db);
    let copied = Ledger::open_with_key(&pg.location, Some(&key)).unwrap();
    assert_eq!(copied.stats().unwrap(), stats, "the whole history, counted");
    drop(copied);
    let on_pg = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_opmark"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &s.0)
            .args(["--ledger", url, "--ledger-key"])
            .arg(&key)
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout))
    };
    let (code, out) = on_pg(&["audit", "verify"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("8 events after the archive cut at event #20"),
        "{out}"
    );
    let (code, out) = on_pg(&["audit", "verify", "--archive", file_arg]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with("chain intact: 28 events, projection equals their replay"),
        "{out}"
    );
}

#[test]
fn postgres_ledger_needs_a_named_key_and_refuses_tls_it_cannot_do() {
    let Some(pg) = Fixture::new(Backend::Postgres, "needkey") else {
        return;
    };
    let s = Scratch::new("needkey");
    let url = pg.location.to_str().unwrap();
    let out = opmark_with_ledger(&s.0, Path::new(url), &["list"]);
    // 248: the ledger cannot be used as given (as for a missing or wrong key file).
    assert_eq!(out.status.code(), Some(248), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("needs its installation key named: give --ledger-key"),
        "{}",
        text(&out.stderr)
    );
    let tls = "postgresql://opmark:hunter2@db.invalid/ledger?sslmode=require";
    let out = Command::new(env!("CARGO_BIN_EXE_opmark"))
        .env_clear()
        .env("HOME", &s.0)
        .args(["--ledger", tls, "--ledger-key"])
        .arg(pg.key.as_ref().unwrap())
        .arg("list")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        err.contains("this opmark has no TLS for PostgreSQL"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "no password in messages: {err}");
}

/// Machine A's `run` is killed after the command started, leaving the operation
/// unresolved in the shared ledger; machine B (its own HOME, its own copy of the ssh
/// config) reconciles it from the host's marker, and A then sees it settled.
#[test]
fn postgres_reconcile_from_a_second_machine_settles_what_the_first_left() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let Some(pg) = Fixture::new(Backend::Postgres, "twomachines") else {
        return;
    };
    let machine = |name: &str| {
        let env = Sealed::new(&format!("twomachines-{name}"));
        let config = env.root.join("ssh_config");
        std::fs::copy(lab.ssh_config(), &config).unwrap();
        (env, config)
    };
    let on = |m: &(Sealed, PathBuf)| {
        let mut c = m.0.opmark();
        c.env("OPMARK_LEDGER", &pg.location)
            .env("OPMARK_LEDGER_KEY", pg.key.as_ref().unwrap())
            .arg("-F")
            .arg(&m.1);
        c
    };
    let a = machine("a");
    let b = machine("b");
    let crashed = on(&a)
        .env("OPMARK_FAULT", "after_started")
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            "left-by-a",
            "--",
            "echo hi; exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), None, "killed by its fault point");
    let open = on(&a)
        .args(["--json", "list", "--unresolved"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&open.stdout).unwrap();
    assert_eq!(doc["operations"][0]["op_id"], "left-by-a", "{doc}");

    // B reconciles until the host's exit record is there (the command runs detached).
    let deadline = Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let out = on(&b).args(["--json", "reconcile"]).output().unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}{}", text(&out.stdout), text(&out.stderr)));
        if doc["operations"][0]["decision"] == "completed" {
            break doc;
        }
        assert!(Instant::now() < deadline, "never settled: {doc}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(settled["operations"][0]["exit_code"], 3, "{settled}");
    let open = on(&a)
        .args(["--json", "list", "--unresolved"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&open.stdout).unwrap();
    assert_eq!(doc["operations"].as_array().unwrap().len(), 0, "{doc}");
    let show = on(&a).args(["show", "left-by-a"]).output().unwrap();
    assert!(
        text(&show.stdout).contains("reconciled: completed"),
        "{}",
        text(&show.stdout)
    );
    assert!(pg.open().verify_chain().unwrap().intact());
}

#[test]
fn ledger_migrate_refuses_what_it_cannot_copy() {
    let s = Scratch::new("migrate-bad");
    let db = s.path("ledger.db");
    // No ledger yet: nothing to copy.
    let out = opmark_with_ledger(
        &s.0,
        &db,
        &["ledger", "migrate", "--to", "postgresql://u@h/db"],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("no ledger at"),
        "{}",
        text(&out.stderr)
    );
    let mut ledger = Ledger::open(&db).unwrap();
    write_operation(&mut ledger, &OpKey::new("op1", "h"), 1);
    drop(ledger);
    // The target must be PostgreSQL.
    let out = opmark_with_ledger(&s.0, &db, &["ledger", "migrate", "--to", "/tmp/other.db"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("--to must be a PostgreSQL URL"),
        "{}",
        text(&out.stderr)
    );
    // The source must be SQLite.
    let out = opmark_with_ledger(
        &s.0,
        Path::new("postgresql://u:hunter2@h/db"),
        &["ledger", "migrate", "--to", "postgresql://u@h/db2"],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(err.contains("copies a SQLite ledger"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// Issue 30: a routine `audit verify --incremental` reads only the events after the
/// checkpoint the last verify recorded, and says so; without a checkpoint it walks all.
#[test]
fn audit_verify_incremental_reads_only_what_is_new_and_says_so() {
    let s = Scratch::new("incremental");
    let db = tamper_fixture(&s);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify", "--incremental"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        "chain intact: 15 events, projection equals their replay\n",
        "no checkpoint yet: the whole chain"
    );
    let mut ledger = Ledger::open(&db).unwrap();
    ledger
        .append(
            &OpKey::new("later-op", "h"),
            &Event::Fenced {
                detail: "later".into(),
            },
            Durability::Normal,
        )
        .unwrap();
    drop(ledger);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify", "--incremental"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).starts_with(
            "chain intact: 1 new events after the checkpoint at event #15 (verified earlier), and the 1 operations they touch"
        ),
        "{}",
        text(&out.stdout)
    );
    let doc: serde_json::Value = serde_json::from_slice(
        &opmark_with_ledger(&s.0, &db, &["--json", "audit", "verify", "--incremental"]).stdout,
    )
    .unwrap();
    assert_eq!(doc["walked"]["scope"], "since_checkpoint", "{doc}");
    assert_eq!(doc["walked"]["checkpoint"], 16, "{doc}");
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify", "--full"]);
    assert_eq!(
        text(&out.stdout),
        "chain intact: 16 events, projection equals their replay\n"
    );
}

/// Issue 30, on both backends: a verify records a keyed checkpoint at the head;
/// `--incremental` then reads only the events after it and says so, finds an edit among
/// them, and trusts what was verified before it: an edit there is found by `--full`.
fn audit_verify_incremental_walks_from_the_checkpoint_and_full_from_the_start(f: &Fixture) {
    let mut ledger = f.open();
    for n in 0..3 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    drop(ledger);
    let verify = |args: &[&str]| f.audit_verify(args);
    let (code, out, err) = verify(&["--incremental"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out, "chain intact: 15 events, projection equals their replay\n",
        "no checkpoint yet: the whole chain"
    );
    let mut ledger = f.open();
    write_operation(&mut ledger, &OpKey::new("op3", "h"), 3);
    drop(ledger);
    let (code, out, err) = verify(&["--incremental"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with(
            "chain intact: 5 new events after the checkpoint at event #15 (verified earlier), and the 1 operations they touch"
        ),
        "{out}"
    );
    let out = f
        .opmark(&f.scratch.0)
        .args(["--json", "audit", "verify", "--incremental"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["walked"]["scope"], "since_checkpoint", "{doc}");
    assert_eq!(doc["walked"]["checkpoint"], 20, "{doc}");
    assert_eq!(doc["event_count"], 0, "{doc}");
    // An edit after the checkpoint: found by the routine verify.
    let mut ledger = f.open();
    write_operation(&mut ledger, &OpKey::new("op4", "h"), 4);
    drop(ledger);
    f.sql("UPDATE events SET payload = replace(payload, 'echo 4', 'echo 8') WHERE seq = 21");
    let (code, out, _) = verify(&["--incremental"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("chain broken at event #21:"), "{out}");
    f.sql("UPDATE events SET payload = replace(payload, 'echo 8', 'echo 4') WHERE seq = 21");
    let (code, out, _) = verify(&["--incremental"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with("chain intact: 5 new events after the checkpoint at event #20"),
        "{out}"
    );
    // An edit before the checkpoint: the routine verify trusts what it verified earlier;
    // the full walk finds it.
    f.sql("UPDATE events SET payload = replace(payload, 'echo 1', 'echo 9') WHERE seq = 6");
    let (code, out, _) = verify(&["--incremental"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("after the checkpoint at event #25"), "{out}");
    let (code, out, _) = verify(&["--full"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("chain broken at event #6:"), "{out}");
}

/// Issue 30, on both backends: `stats` finds suspected duplicate effects through the
/// `shared_intents` table, so deleting a row of it hides one; the full verify recounts
/// the table from `operations` and names it. A row beyond the recount is fine (the table
/// only grows).
fn audit_verify_finds_a_shared_intent_deleted_from_the_table_stats_reads(f: &Fixture) {
    let mut ledger = f.open();
    write_operation(&mut ledger, &OpKey::new("alone", "h"), 0);
    for op in ["first", "again"] {
        ledger
            .append(
                &OpKey::new(op, "h"),
                &Event::Intended {
                    session: "s".into(),
                    family: Family::ALL[0],
                    display: "echo same".into(),
                    fingerprint: "fp-same".into(),
                    rule: "test".into(),
                    secrets: Vec::new(),
                    become_user: None,
                    locks: Vec::new(),
                },
                Durability::Normal,
            )
            .unwrap();
    }
    drop(ledger);
    let verify = || f.audit_verify(&[]);
    let (code, out, err) = verify();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out,
        "chain intact: 7 events, projection equals their replay\n"
    );
    f.sql("DELETE FROM shared_intents");
    let (code, out, err) = verify();
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("shared_intents: 1 (fingerprint, host) pair"),
        "{out}"
    );
    f.sql(
        "INSERT INTO shared_intents (fingerprint, host) SELECT fingerprint, host FROM operations
             GROUP BY fingerprint, host HAVING COUNT(*) > 1;
         INSERT INTO shared_intents (fingerprint, host) VALUES ('fp-stale', 'h');",
    );
    let (code, out, err) = verify();
    assert_eq!(code, Some(0), "{out}{err}");
    // A tally `stats` reads, of a duplicate no intent holds: a false alarm, named.
    f.sql("INSERT INTO duplicate_tallies (host, family, intents) VALUES ('h', 'destructive', 1)");
    let (code, out, err) = verify();
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("duplicate_tallies: 1 (host, family) tally(ies) differ"),
        "{out}"
    );
    f.sql("UPDATE duplicate_tallies SET intents = 0");
    let (code, out, err) = verify();
    assert_eq!(code, Some(0), "{out}{err}");
}

/// Issue 30: a ledger written before the counters (SQLite schema 2, PostgreSQL schema 1)
/// is migrated on open: its history is counted once, `stats` says what it said before,
/// and the chain, the rows and the counters verify.
fn a_ledger_of_the_previous_schema_counts_its_history_on_migrating_and_verifies(f: &Fixture) {
    let mut ledger = f.open();
    for n in 0..6 {
        write_operation(
            &mut ledger,
            &OpKey::new(format!("old-{n}"), format!("host{}", n % 2)),
            n,
        );
    }
    unresolved_operation(&mut ledger, &OpKey::new("old-unresolved", "host1"));
    let before = ledger.stats().unwrap();
    assert_eq!(before.operations, 7);
    assert_eq!(before.unresolved, 1);
    drop(ledger);
    let rollback = if f.pg.is_some() {
        "DROP TABLE counters;
         DROP INDEX operations_unresolved;
         DROP INDEX operations_contradicted;
         DROP INDEX operations_by_host;
         DROP INDEX operations_by_fingerprint;
         CREATE INDEX events_by_kind ON events (kind);
         CREATE INDEX operations_unresolved ON operations (unresolved, last_seq);
         DROP TABLE shared_intents;
         DROP TABLE duplicate_tallies;
         DROP FUNCTION opmark_tally_duplicate;
         DROP FUNCTION opmark_is_duplicate;
         DROP FUNCTION opmark_note_shared_intent CASCADE;
         DROP FUNCTION opmark_count_shared_intent;
         DROP FUNCTION opmark_recount_shared_intent;
         DROP FUNCTION opmark_family_rank;
         ALTER TABLE operations DROP COLUMN executed;
         UPDATE opmark_schema SET version = 1;"
    } else {
        // Schema 2 stored each event as one text row (`f.sql` expanded the rows first, so
        // each column holds its text).
        "CREATE TABLE events_text (seq INTEGER PRIMARY KEY, op_id TEXT NOT NULL,
             host TEXT NOT NULL, at TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
             prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
         INSERT INTO events_text SELECT e.seq, k.op_id, k.host, e.at, e.kind, e.payload,
             e.prev_hash, e.hash FROM events e JOIN op_keys k ON k.id = e.op;
         DROP TABLE events; DROP TABLE atoms; DROP TABLE op_keys;
         ALTER TABLE events_text RENAME TO events;
         CREATE INDEX events_by_operation ON events (op_id, host, seq);
         DROP TABLE counters;
         DROP INDEX operations_unresolved;
         DROP INDEX operations_contradicted;
         DROP INDEX operations_by_host;
         DROP INDEX operations_by_intent;
         CREATE INDEX events_by_kind ON events (kind);
         CREATE INDEX operations_unresolved ON operations (unresolved, last_seq);
         DROP TRIGGER shared_intents_on_insert;
         DROP TRIGGER shared_intents_on_execution;
         DROP TRIGGER shared_intents_on_change;
         DROP TRIGGER shared_intents_on_delete;
         DROP TABLE shared_intents;
         DROP TABLE duplicate_tallies;
         ALTER TABLE operations DROP COLUMN executed;
         PRAGMA user_version = 2;"
    };
    f.sql(rollback);
    let ledger = f.open();
    assert_eq!(ledger.stats().unwrap(), before);
    let report = ledger.verify_chain().unwrap();
    assert!(report.intact(), "{report:?}");
    let out = f
        .opmark(&f.scratch.0)
        .args(["--json", "stats"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operation_count"], 7, "{doc}");
    assert_eq!(doc["unresolved_count"], 1, "{doc}");
}

/// Issue 30: `ledger archive --before D FILE` moves settled operations out (never an
/// unresolved one), `audit verify` checks the ledger from the cut and says so, and
/// `audit verify --archive FILE` checks both as one chain; an edit in the archive is found.
#[test]
fn ledger_archive_moves_settled_operations_and_verify_spans_both() {
    let s = Scratch::new("archive-cli");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    archivable_history(&mut ledger);
    drop(ledger);
    let file = s.path("archive.db");
    let file_arg = file.to_str().unwrap();
    let out = opmark_with_ledger(
        &s.0,
        &db,
        &["ledger", "archive", "--before", "0s", file_arg],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout)
            .starts_with("moved 20 events of 4 settled operations (through event #20)"),
        "{}",
        text(&out.stdout)
    );
    let ledger = Ledger::open(&db).unwrap();
    assert!(ledger
        .operation(&OpKey::new("done-0", "h1"))
        .unwrap()
        .is_none());
    assert!(
        ledger
            .operation(&OpKey::new("open-1", "h1"))
            .unwrap()
            .unwrap()
            .unresolved
    );
    assert!(ledger
        .operation(&OpKey::new("done-late", "h1"))
        .unwrap()
        .is_some());
    drop(ledger);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("after the archive cut at event #20"),
        "{}",
        text(&out.stdout)
    );
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify", "--archive", file_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).starts_with("chain intact: "),
        "{}",
        text(&out.stdout)
    );
    let archive = rusqlite::Connection::open(&file).unwrap();
    archive
        .execute(
            "UPDATE events SET at = '2020-01-01T00:00:00.000000Z' WHERE seq = 7",
            [],
        )
        .unwrap();
    drop(archive);
    let out = opmark_with_ledger(&s.0, &db, &["audit", "verify", "--archive", file_arg]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).starts_with("chain broken at event #7"),
        "{}",
        text(&out.stdout)
    );
}

/// Four settled operations, then an unresolved one, then a settled one: what `ledger
/// archive --before 0s` can move is the first four (the unresolved one holds the rest).
fn archivable_history(ledger: &mut Ledger) {
    for n in 0..4 {
        write_operation(ledger, &OpKey::new(format!("done-{n}"), "h1"), n);
    }
    unresolved_operation(ledger, &OpKey::new("open-1", "h1"));
    write_operation(ledger, &OpKey::new("done-late", "h1"), 9);
}

/// Issue 30, on both backends: `ledger archive` moves the settled operations out (never
/// an unresolved one, never half an operation), `stats` still counts the whole history,
/// and the ledger and its archive verify as one chain; an edit in the ledger after the cut
/// and an edit in the archive are each found.
fn an_archived_ledger_and_its_archive_verify_and_an_edit_in_either_is_found(f: &Fixture) {
    let mut ledger = f.open();
    archivable_history(&mut ledger);
    let before = ledger.stats().unwrap();
    let late = ledger
        .operation(&OpKey::new("done-late", "h1"))
        .unwrap()
        .unwrap()
        .first_seq;
    drop(ledger);
    let run = |args: &[&str]| {
        let out = f.opmark(&f.scratch.0).args(args).output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let file = f.scratch.path("archive.db");
    let file_arg = file.to_str().unwrap();
    let (code, out, err) = run(&["ledger", "archive", "--before", "0s", file_arg]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with("moved 20 events of 4 settled operations (through event #20)"),
        "{out}"
    );
    let ledger = f.open();
    assert!(ledger
        .operation(&OpKey::new("done-3", "h1"))
        .unwrap()
        .is_none());
    assert!(
        ledger
            .operation(&OpKey::new("open-1", "h1"))
            .unwrap()
            .unwrap()
            .unresolved
    );
    assert_eq!(
        ledger.events(&OpKey::new("done-late", "h1")).unwrap().len(),
        5
    );
    assert_eq!(
        ledger.stats().unwrap(),
        before,
        "stats counts the whole history"
    );
    drop(ledger);
    let (code, out, err) = run(&[
        "ledger",
        "archive",
        "--before",
        "0s",
        &format!("{file_arg}.2"),
    ]);
    assert_eq!(code, Some(245), "{out}{err}");
    assert!(
        err.contains("was archived before (through event #20)"),
        "{err}"
    );
    let (code, out, _) = run(&["audit", "verify"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("after the archive cut at event #20"), "{out}");
    let (code, out, _) = run(&["audit", "verify", "--archive", file_arg]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with("chain intact: 28 events, projection equals their replay"),
        "{out}"
    );
    // An edit in the ledger, after the cut.
    f.sql("UPDATE events SET payload = replace(payload, 'echo 9', 'echo 7')");
    let (code, out, _) = run(&["audit", "verify", "--archive", file_arg]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with(&format!("chain broken at event #{late}:")),
        "{out}"
    );
    f.sql("UPDATE events SET payload = replace(payload, 'echo 7', 'echo 9')");
    assert_eq!(run(&["audit", "verify", "--archive", file_arg]).0, Some(0));
    // An edit in the archive (a SQLite file on either backend).
    let archive = rusqlite::Connection::open(&file).unwrap();
    archive
        .execute(
            "UPDATE events SET at = '2020-01-01T00:00:00.000000Z' WHERE seq = 7",
            [],
        )
        .unwrap();
    drop(archive);
    let (code, out, _) = run(&["audit", "verify", "--archive", file_arg]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("chain broken at event #7"), "{out}");
    // The ledger's records of the archive are MACed: edits of them are found too.
    f.sql("UPDATE meta SET value = replace(value, ':', ': ') WHERE name = 'archive_counts'");
    let (code, out, _) = run(&["audit", "verify"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("archive_counts (its MAC does not match)"),
        "{out}"
    );
    f.sql("UPDATE meta SET value = '19' || substr(value, 3) WHERE name = 'archive_cut'");
    let (code, out, _) = run(&["audit", "verify"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the record of where `ledger archive` cut the chain was edited"),
        "{out}"
    );
}

/// Issue 30, on both backends: `ledger archive` refuses, naming why and writing no file,
/// when everything before the time is unresolved or the file exists; `audit verify
/// --archive` refuses a ledger that was never archived.
fn ledger_archive_refuses_what_it_cannot_archive_and_writes_nothing(f: &Fixture) {
    let mut ledger = f.open();
    unresolved_operation(&mut ledger, &OpKey::new("open-1", "h1"));
    drop(ledger);
    let run = |args: &[&str]| {
        let out = f.opmark(&f.scratch.0).args(args).output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let file = f.scratch.path("archive.db");
    let file_arg = file.to_str().unwrap();
    let (code, _, err) = run(&["ledger", "archive", "--before", "0s", file_arg]);
    assert_eq!(code, Some(245), "{err}");
    assert!(
        err.contains("unresolved operations and those still active are never archived"),
        "{err}"
    );
    assert!(!file.exists());
    let (code, _, err) = run(&["audit", "verify", "--archive", file_arg]);
    assert_eq!(code, Some(245), "{err}");
    assert!(
        err.contains("was never archived: verify it without --archive"),
        "{err}"
    );
    std::fs::write(&file, b"mine").unwrap();
    let (code, _, err) = run(&["ledger", "archive", "--before", "0s", file_arg]);
    assert_eq!(code, Some(245), "{err}");
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    assert_eq!(f.open().stats().unwrap().operations, 1);
}

/// Issue 30's new options refuse bad input naming the problem and the way on.
#[test]
fn stats_since_and_ledger_archive_refuse_bad_input_with_the_fix() {
    let s = Scratch::new("scale-bad-input");
    let db = s.path("ledger.db");
    let mut ledger = Ledger::open(&db).unwrap();
    unresolved_operation(&mut ledger, &OpKey::new("open-1", "h1"));
    drop(ledger);
    let out = opmark_with_ledger(&s.0, &db, &["stats", "--since", "100000000d"]);
    assert_eq!(out.status.code(), Some(245));
    assert!(
        text(&out.stderr).contains("use a shorter duration"),
        "{}",
        text(&out.stderr)
    );
    // Only an unresolved operation: nothing may be archived, and no file is written.
    let file = s.path("archive.db");
    let out = opmark_with_ledger(
        &s.0,
        &db,
        &[
            "ledger",
            "archive",
            "--before",
            "0s",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(245), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("unresolved operations and those still active are never archived"),
        "{}",
        text(&out.stderr)
    );
    assert!(!file.exists());
    let out = opmark_with_ledger(
        &s.0,
        &db,
        &["audit", "verify", "--archive", file.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(245), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was never archived: verify it without --archive"),
        "{}",
        text(&out.stderr)
    );
}
