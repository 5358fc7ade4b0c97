//! Unit tests of the ledger: appends, projection, conflicts, the chain check.

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::family::Family;
use crate::vocab::{Boundary, RetryReason, Verdict};

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "opmark-ledger-{name}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        Scratch(dir)
    }
    fn db(&self) -> PathBuf {
        self.0.join("state").join("ledger.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn intended(fp: &str, display: &str) -> Event {
    Event::Intended {
        session: "s1".into(),
        family: Family::Destructive,
        display: display.into(),
        fingerprint: fp.into(),
        rule: "default".into(),
    }
}

fn dispatched(id: &str, n: u32) -> Event {
    Event::AttemptDispatched {
        attempt_id: id.into(),
        number: n,
        parent: None,
        reason: RetryReason::FirstAttempt,
    }
}

fn verdict(v: Verdict, code: Option<i32>) -> Event {
    Event::Verdict {
        attempt_id: Some("a1".into()),
        verdict: v,
        exit_code: code,
        reason: "r".into(),
    }
}

#[test]
fn creates_private_file_and_dir_and_migrates_once() {
    let s = Scratch::new("create");
    let l = Ledger::open(&s.db()).unwrap();
    drop(l);
    let meta = std::fs::metadata(s.db()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let dmeta = std::fs::metadata(s.db().parent().unwrap()).unwrap();
    assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
    // Reopening does not re-run migration 1 (it would fail on CREATE TABLE).
    let l = Ledger::open(&s.db()).unwrap();
    let v: i64 = l
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, schema::CURRENT_VERSION);
}

#[test]
fn projection_follows_the_events_and_the_unresolved_rule() {
    let s = Scratch::new("proj");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    let seqs = l
        .append_many(
            &k,
            &[intended("fp", "rm x"), dispatched("a1", 1)],
            Durability::Full,
        )
        .unwrap();
    assert_eq!(seqs, vec![1, 2]);
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!(
        (r.state.as_str(), r.attempts, r.unresolved),
        ("dispatched", 1, true)
    );
    l.append(
        &k,
        &Event::BoundaryReached {
            attempt_id: "a1".into(),
            boundary: Boundary::SentNoResponse,
            detail: "connection lost".into(),
        },
        Durability::Normal,
    )
    .unwrap();
    l.append(
        &k,
        &verdict(Verdict::Indeterminate, None),
        Durability::Normal,
    )
    .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!(r.verdict, Some(Verdict::Indeterminate));
    assert!(r.unresolved);
    assert_eq!(
        l.list(&ListFilter {
            unresolved: true,
            ..Default::default()
        })
        .unwrap()
        .len(),
        1
    );
    l.append(
        &k,
        &Event::OperatorDecision {
            by: "alice".into(),
            decision: "applied".into(),
            note: "checked by hand".into(),
            exit_code: None,
        },
        Durability::Normal,
    )
    .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert!(!r.unresolved);
    assert_eq!(r.state, "resolved:applied");
    assert!(l
        .list(&ListFilter {
            unresolved: true,
            ..Default::default()
        })
        .unwrap()
        .is_empty());
    assert_eq!(l.events(&k).unwrap().len(), 5);
    assert!(l.verify_chain().unwrap().intact());
}

#[test]
fn a_different_fingerprint_for_the_same_op_is_refused_and_stores_nothing() {
    let s = Scratch::new("conflict");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append(&k, &intended("fp-a", "echo a"), Durability::Full)
        .unwrap();
    let err = l
        .append_many(
            &k,
            &[intended("fp-b", "echo b"), dispatched("a2", 1)],
            Durability::Full,
        )
        .unwrap_err();
    assert!(matches!(err, LedgerError::FingerprintConflict { .. }));
    assert_eq!(l.events(&k).unwrap().len(), 1);
    // Same id on another host is another operation.
    l.append(
        &OpKey::new("op-1", "web2"),
        &intended("fp-b", "echo b"),
        Durability::Full,
    )
    .unwrap();
    assert_eq!(l.operations_by_id("op-1").unwrap().len(), 2);
    assert!(l.verify_chain().unwrap().intact());
}

#[test]
fn the_ledger_redacts_free_text_itself() {
    let s = Scratch::new("redact");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append(
        &k,
        &intended("fp", "mysql --password=Hunter2Canary"),
        Durability::Full,
    )
    .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!(r.display, "mysql --password=***");
    let ev = &l.events(&k).unwrap()[0];
    assert!(!serde_json::to_string(&ev.event)
        .unwrap()
        .contains("Hunter2Canary"));
}

#[test]
fn invalid_keys_are_refused_before_storing() {
    let s = Scratch::new("keys");
    let mut l = Ledger::open(&s.db()).unwrap();
    for k in [
        OpKey::new("../x", "h"),
        OpKey::new("ok", ""),
        OpKey::new("ok", "a b"),
    ] {
        assert!(l
            .append(&k, &intended("fp", "x"), Durability::Normal)
            .is_err());
    }
    assert_eq!(l.verify_chain().unwrap().events, 0);
}

#[test]
fn chain_check_names_edited_deleted_and_swapped_events() {
    let s = Scratch::new("chain");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    for i in 0..6 {
        l.append(
            &k,
            &Event::Probed {
                attempt_id: None,
                state: "absent".into(),
                exit_code: Some(i),
                detail: String::new(),
            },
            Durability::Normal,
        )
        .unwrap();
    }
    assert_eq!(l.verify_chain().unwrap().events, 6);
    let broken = |l: &Ledger| l.verify_chain().unwrap().first_break.unwrap().seq;

    l.conn
        .execute("UPDATE events SET payload = replace(payload, '\"exit_code\":2', '\"exit_code\":0') WHERE seq = 3", [])
        .unwrap();
    assert_eq!(broken(&l), 3);
}

#[test]
fn chain_check_names_a_deleted_middle_and_last_event() {
    let s = Scratch::new("chain-del");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    for _ in 0..5 {
        l.append(
            &k,
            &Event::Fenced { detail: "x".into() },
            Durability::Normal,
        )
        .unwrap();
    }
    l.conn
        .execute("DELETE FROM events WHERE seq = 5", [])
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 5, "{}", b.problem);
    l.conn
        .execute("DELETE FROM events WHERE seq = 2", [])
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 2, "{}", b.problem);
    assert!(b.problem.contains("missing"));
}

#[test]
fn stats_count_what_a_dashboard_needs() {
    let s = Scratch::new("stats");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append_many(
        &k,
        &[intended("fp", "x"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    l.append(&k, &dispatched("a2", 2), Durability::Full)
        .unwrap();
    l.append(
        &k,
        &verdict(Verdict::Indeterminate, None),
        Durability::Normal,
    )
    .unwrap();
    let k2 = OpKey::new("op-2", "web1");
    l.append(&k2, &intended("fp2", "y"), Durability::Full)
        .unwrap();
    l.append(&k2, &verdict(Verdict::Blocked, None), Durability::Normal)
        .unwrap();
    let st = l.stats().unwrap();
    assert_eq!(st.operations, 2);
    assert_eq!(st.unresolved, 1);
    assert_eq!(st.unknown_outcomes, 1);
    assert_eq!(st.approvals_asked, 1);
    assert_eq!(st.attempts, 2);
    assert_eq!(st.retries_by_family.get("destructive"), Some(&1));
    assert_eq!(st.by_family.get("destructive"), Some(&2));
}

#[test]
fn events_written_before_resolve_exit_and_host_identity_read_and_serialise_unchanged() {
    // As stored by earlier versions: the chain covers this exact text.
    let old = r#"{"kind":"operator_decision","by":"alice","decision":"applied","note":"n"}"#;
    let event: Event = serde_json::from_str(old).unwrap();
    assert!(matches!(
        event,
        Event::OperatorDecision {
            exit_code: None,
            ..
        }
    ));
    assert_eq!(serde_json::to_string(&event).unwrap(), old);
    let connected = Event::Connected {
        attempt_id: "at-1".into(),
        route: crate::ssh::Route {
            alias: "web1".into(),
            hostname: "10.0.0.1".into(),
            port: 22,
            user: "u".into(),
            identities: vec!["/k/id".into()],
            jump: None,
            jumps: Vec::new(),
            config: None,
        },
        host_key: "SHA256:abc".into(),
    };
    let text = serde_json::to_string(&connected).unwrap();
    assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), connected);
    assert_eq!(connected.kind(), "connected");
    assert_eq!(connected.attempt_id(), Some("at-1"));
}
