//! ledger integration tests: concurrent writer processes, `kill -9` in mid-write,
//! tampering found by `opmark audit verify`, and secrets that never reach disk or output.
//!
//! Writer processes are this test binary re-executed with `--exact ledger::writer_process
//! --ignored` and `OPMARK_TEST_LEDGER_ROLE` selecting what the child does.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use opmark::family::Family;
use opmark::ledger::chain::Link;
use opmark::ledger::{Durability, Event, Ledger, ListFilter, OpKey, Redactor};
use opmark::vocab::{Boundary, RetryReason, Verdict};

const ROLE: &str = "OPMARK_TEST_LEDGER_ROLE";
const PATH: &str = "OPMARK_TEST_LEDGER_PATH";
const WRITER: &str = "OPMARK_TEST_LEDGER_WRITER";
const OPS: &str = "OPMARK_TEST_LEDGER_OPS";
const GO: &str = "OPMARK_TEST_LEDGER_GO";

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
fn opmark(home: &Path, ledger: &Path, args: &[&str]) -> Output {
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

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
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
    if let Ok(go) = std::env::var(GO) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(&go).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut ledger = Ledger::open(&path).unwrap();
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

#[test]
fn sixteen_writer_processes_keep_every_event_and_the_chain() {
    const PROCS: usize = 16;
    const OPS_EACH: u64 = 50;
    let s = Scratch::new("concurrent");
    let db = s.path("ledger.db");
    let go = s.path("go");
    let children: Vec<_> = (0..PROCS)
        .map(|w| {
            writer_child("fixed", &db, w)
                .env(OPS, OPS_EACH.to_string())
                .env(GO, &go)
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // Release them together so they really contend (some also race to create the file).
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(&go, b"").unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a writer process failed");
    }

    let ledger = Ledger::open(&db).unwrap();
    let report = ledger.verify_chain().unwrap();
    assert_eq!(report.first_break, None);
    assert_eq!(report.events, PROCS as u64 * OPS_EACH * 5);
    let ops = ledger.list(&ListFilter::default()).unwrap();
    assert_eq!(ops.len(), PROCS * OPS_EACH as usize);
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
    let out = opmark(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "chain intact: 4000 events");
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
    let out = opmark(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

/// A closed ledger with 3 complete operations (15 events), copied per tamper scenario.
fn tamper_fixture(s: &Scratch) -> PathBuf {
    let db = s.path("pristine.db");
    let mut ledger = Ledger::open(&db).unwrap();
    for n in 0..3 {
        write_operation(&mut ledger, &OpKey::new(format!("op{n}"), "h"), n);
    }
    drop(ledger); // the last connection checkpoints the WAL into the file
    db
}

fn tampered(s: &Scratch, name: &str, sql: &str) -> PathBuf {
    let pristine = tamper_fixture(s);
    let db = s.path(&format!("{name}.db"));
    std::fs::copy(&pristine, &db).unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(sql).unwrap();
    drop(conn);
    db
}

fn assert_verify_names(s: &Scratch, db: &Path, seq: u64) -> String {
    let out = opmark(&s.0, db, &["audit", "verify"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with(&format!("chain broken at event #{seq}:")),
        "{stdout}"
    );
    stdout
}

#[test]
fn audit_verify_reports_an_intact_chain() {
    let s = Scratch::new("intact");
    let db = tamper_fixture(&s);
    let out = opmark(&s.0, &db, &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "chain intact: 15 events\n");
    let out = opmark(&s.0, &db, &["--json", "audit", "verify"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["intact"], true);
    assert_eq!(doc["events"], 15);
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
            "SELECT prev_hash, op_id, host, at, kind, payload FROM events WHERE seq = 7",
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
    let out = opmark(&s.0, &s.path("nope.db"), &["audit", "verify"]);
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
        },
        Event::Probed {
            attempt_id: Some("a1".into()),
            state: "absent".into(),
            exit_code: None,
            detail: String::new(),
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

    let out = opmark(&s.0, &db, &["show", "deploy-42"]);
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
        flat.contains(
            "attempt a2 (#2) dispatched: retry of a1 because response_lost_after_dispatch"
        ),
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

    let out = opmark(
        &s.0,
        &db,
        &["--json", "show", "deploy-42", "--host", "web1"],
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operation"]["unresolved"], true);
    assert_eq!(doc["events"].as_array().unwrap().len(), 7);

    let out = opmark(&s.0, &db, &["list", "--unresolved"]);
    let listed = text(&out.stdout);
    assert!(
        listed.contains("deploy-42") && !listed.contains("other-op"),
        "{listed}"
    );
    let out = opmark(&s.0, &db, &["--json", "list", "--host", "web2"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ops = doc["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["op_id"], "other-op");

    let out = opmark(&s.0, &db, &["--json", "stats"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operations"], 2);
    assert_eq!(doc["unresolved"], 1);
    assert_eq!(doc["unknown_outcomes"], 1);
    assert_eq!(doc["retries_by_family"]["destructive"], 1);

    let out = opmark(&s.0, &db, &["show", "no-such-op"]);
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

fn contains_canary(bytes: &[u8]) -> bool {
    bytes
        .windows(6)
        .any(|w| w.eq_ignore_ascii_case(b"canary"))
        // "Q2FuYXJ5" is base64 of "Canary": the Basic credential must not leak either.
        || bytes.windows(8).any(|w| w == b"Q2FuYXJ5")
}

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
            },
            Event::Probed {
                attempt_id: Some(a.clone()),
                state: "absent".into(),
                exit_code: None,
                detail: secret.to_string(),
            },
            Event::Reconciled {
                decision: "still_unknown".into(),
                detail: secret.to_string(),
            },
            Event::OperatorDecision {
                by: "alice".into(),
                decision: "approved".into(),
                note: secret.to_string(),
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
        outputs.push(opmark(
            &s.0,
            &db,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
        args.insert(0, "--json".into());
        outputs.push(opmark(
            &s.0,
            &db,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
    }
    for args in &runs {
        outputs.push(opmark(
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
    let shown = text(&opmark(&s.0, &db, &["show", "op6"]).stdout);
    assert!(shown.contains("https://bob:***@git.example.com"), "{shown}");
    drop(ledger);
    let bytes = std::fs::read(&db).unwrap();
    assert!(
        !contains_canary(&bytes),
        "secret found in the checkpointed database"
    );
}
