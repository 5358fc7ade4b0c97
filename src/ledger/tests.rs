//! Unit tests of the ledger: appends, projection, conflicts, the chain check. On SQLite,
//! whose file they edit behind opmark's back as an attacker (or an old opmark) would: the
//! one place outside `store/` that names rusqlite (the architecture test allows it). Not
//! in `store/sqlite/`: they drive the [`Ledger`], which is above the stores.

use std::os::unix::fs::PermissionsExt;

use super::store::sqlite::schema;
use super::*;
use crate::family::Family;
use crate::vocab::{Boundary, RetryReason, Verdict};
use rusqlite::params;

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
        secrets: Vec::new(),
        become_user: None,
        locks: Vec::new(),
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
        .conn()
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
        (r.state.to_string().as_str(), r.attempts, r.unresolved),
        ("dispatched", 1, true)
    );
    l.append(
        &k,
        &Event::BoundaryReached {
            attempt_id: "a1".into(),
            boundary: Boundary::SentNoResponse,
            detail: "connection lost".into(),
            refusal: None,
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
    assert_eq!(r.state.to_string(), "resolved:applied");
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
                claim: None,
            },
            Durability::Normal,
        )
        .unwrap();
    }
    assert_eq!(l.verify_chain().unwrap().events, 6);
    let broken = |l: &Ledger| l.verify_chain().unwrap().first_break.unwrap().seq;

    l.expand_rows_for_tests().unwrap();
    l.conn()
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
    l.conn()
        .execute("DELETE FROM events WHERE seq = 5", [])
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 5, "{}", b.problem);
    l.conn()
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

/// A probe as `opmark probe` records it; a claimed marker names attempt `a1`.
fn probed(state: &str, code: Option<i32>) -> Event {
    probed_by(state, code, Some("a1"))
}

/// A probe of a marker whose claim names `holder` (`None`: no claim record).
fn probed_by(state: &str, code: Option<i32>, holder: Option<&str>) -> Event {
    Event::Probed {
        attempt_id: None,
        state: state.into(),
        exit_code: code,
        detail: "opmark probe".into(),
        claim: (state != "absent").then(|| event::ClaimSeen {
            attempt: holder.map(str::to_owned),
        }),
    }
}

/// An operation that ran and completed with `code`, as `run` records it.
fn completed_op(l: &mut Ledger, k: &OpKey, code: i32) {
    l.append_many(
        k,
        &[intended("fp", "x"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    l.append(
        k,
        &verdict(Verdict::Completed, Some(code)),
        Durability::Normal,
    )
    .unwrap();
}

fn kinds(l: &Ledger, k: &OpKey) -> Vec<&'static str> {
    l.events(k)
        .unwrap()
        .iter()
        .map(|e| e.event.kind())
        .collect()
}

#[test]
fn a_fresh_ledger_makes_its_key_beside_it_0600_and_reopens_with_it() {
    let s = Scratch::new("key-beside");
    let fp = {
        let l = Ledger::open(&s.db()).unwrap();
        assert_eq!(l.key().path(), key_path_beside(&s.db()));
        assert_eq!(
            key_path_beside(&s.db()),
            s.0.join("state").join("ledger.key")
        );
        l.key().check_value()
    };
    let meta = std::fs::metadata(key_path_beside(&s.db())).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let again = Ledger::open(&s.db()).unwrap();
    assert_eq!(again.key().check_value(), fp, "the same key, not a new one");
}

#[test]
fn a_missing_key_is_an_error_naming_both_paths_and_no_key_is_made() {
    let s = Scratch::new("key-missing");
    {
        let mut l = Ledger::open(&s.db()).unwrap();
        completed_op(&mut l, &OpKey::new("op-1", "web1"), 0);
    }
    let key = key_path_beside(&s.db());
    std::fs::remove_file(&key).unwrap();
    let err = Ledger::open(&s.db()).unwrap_err().to_string();
    assert!(err.contains(&s.db().display().to_string()), "{err}");
    assert!(err.contains(&key.display().to_string()), "{err}");
    assert!(err.contains("--ledger-key"), "{err}");
    assert!(
        !key.exists(),
        "a key was silently made for an existing ledger"
    );
    // Also for a ledger that has its schema but no event yet: the binding is what counts.
    let s2 = Scratch::new("key-missing-empty");
    drop(Ledger::open(&s2.db()).unwrap());
    std::fs::remove_file(key_path_beside(&s2.db())).unwrap();
    assert!(Ledger::open(&s2.db()).is_err());
}

#[test]
fn a_different_key_is_an_error_naming_both_paths_never_a_conflict() {
    let s = Scratch::new("key-other");
    {
        let mut l = Ledger::open(&s.db()).unwrap();
        completed_op(&mut l, &OpKey::new("op-1", "web1"), 0);
    }
    let other = s.0.join("other.key");
    fingerprint::InstallationKey::generate(&other).unwrap();
    let err = Ledger::open_with_key(&s.db(), Some(&other)).unwrap_err();
    assert!(matches!(err, LedgerError::Invalid { .. }), "{err:?}");
    let err = err.to_string();
    assert!(err.contains(&s.db().display().to_string()), "{err}");
    assert!(err.contains(&other.display().to_string()), "{err}");
    assert!(err.contains("not the key of the ledger"), "{err}");
    // The right key named explicitly opens it.
    let copy = s.0.join("copy.key");
    std::fs::copy(key_path_beside(&s.db()), &copy).unwrap();
    Ledger::open_with_key(&s.db(), Some(&copy)).unwrap();
}

#[test]
fn a_named_key_for_a_fresh_ledger_must_exist() {
    let s = Scratch::new("key-named");
    let named = s.0.join("shared.key");
    let err = Ledger::open_with_key(&s.db(), Some(&named))
        .unwrap_err()
        .to_string();
    assert!(err.contains("opmark ledger keygen"), "{err}");
    assert!(!named.exists());
    fingerprint::InstallationKey::generate(&named).unwrap();
    let l = Ledger::open_with_key(&s.db(), Some(&named)).unwrap();
    assert_eq!(l.key().path(), named);
    assert!(!key_path_beside(&s.db()).exists(), "no second key was made");
}

#[test]
fn a_probe_that_disagrees_with_a_settled_exit_is_a_contradiction_not_a_rewrite() {
    let s = Scratch::new("contradiction");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    completed_op(&mut l, &k, 0);
    // Agreeing evidence and a gc'd marker are not contradictions.
    l.append(&k, &probed("completed", Some(0)), Durability::Normal)
        .unwrap();
    l.append(&k, &probed("absent", None), Durability::Normal)
        .unwrap();
    assert_eq!(l.operation(&k).unwrap().unwrap().contradictions, 0);

    let seq = l
        .append(&k, &probed("completed", Some(9)), Durability::Normal)
        .unwrap();
    let events = l.events(&k).unwrap();
    let last = events.last().unwrap();
    assert_eq!(last.seq, seq + 1, "recorded right after the evidence");
    assert_eq!(
        last.event,
        Event::Contradiction {
            source: "probed".into(),
            evidence_seq: seq,
            expected: Observed {
                state: "completed".into(),
                exit_code: Some(0),
                attempt: Some("a1".into()),
            },
            seen: Observed {
                state: "completed".into(),
                exit_code: Some(9),
                attempt: Some("a1".into()),
            },
        }
    );
    // A replay verdict carrying the edited exit does not rewrite the settled one.
    l.append(&k, &verdict(Verdict::Replayed, Some(9)), Durability::Normal)
        .unwrap();
    // A marker running again after completion is one too.
    l.append(&k, &probed("running", None), Durability::Normal)
        .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!(r.exit_code, Some(0), "the first settled truth is kept");
    assert_eq!(r.verdict, Some(Verdict::Completed));
    assert_eq!(r.contradictions, 2);
    assert_eq!(
        kinds(&l, &k)
            .iter()
            .filter(|k| **k == "contradiction")
            .count(),
        2
    );
    let st = l.stats().unwrap();
    assert_eq!((st.contradictions, st.contradicted_operations), (2, 1));
    let report = l.verify_chain().unwrap();
    assert!(report.intact(), "{report:?}");
}

#[test]
fn an_unsettled_operation_takes_its_exit_from_later_evidence_without_contradiction() {
    let s = Scratch::new("no-contradiction");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append_many(
        &k,
        &[intended("fp", "x"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    l.append(
        &k,
        &verdict(Verdict::Indeterminate, None),
        Durability::Normal,
    )
    .unwrap();
    l.append(&k, &probed("completed", Some(9)), Durability::Normal)
        .unwrap();
    l.append(&k, &verdict(Verdict::Replayed, Some(9)), Durability::Normal)
        .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!((r.exit_code, r.contradictions), (Some(9), 0));
}

#[test]
fn verify_names_a_projection_row_that_differs_from_its_events() {
    let s = Scratch::new("projection");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append_many(
        &k,
        &[intended("fp", "rm -rf /srv/x"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    l.append(
        &k,
        &verdict(Verdict::Completed, Some(9)),
        Durability::Normal,
    )
    .unwrap();
    assert!(l.verify_chain().unwrap().intact());
    l.conn()
        .execute(
            "UPDATE operations SET verdict = 'completed', exit_code = 0, display = 'echo harmless'",
            [],
        )
        .unwrap();
    let report = l.verify_chain().unwrap();
    assert!(
        report.first_break.is_none(),
        "the events themselves are whole"
    );
    let m = report.first_mismatch.unwrap();
    assert_eq!((m.op_id.as_str(), m.host.as_str()), ("op-1", "web1"));
    assert!(m.problem.contains("display, exit_code"), "{}", m.problem);
    assert!(
        !m.problem.contains("harmless"),
        "no stored values in the message"
    );

    l.conn().execute("DELETE FROM operations", []).unwrap();
    let m = l.verify_chain().unwrap().first_mismatch.unwrap();
    assert!(m.problem.contains("missing"), "{}", m.problem);
}

#[test]
fn verify_finds_a_deleted_tail_whose_head_was_fixed_and_a_plain_recomputation() {
    let s = Scratch::new("tail");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    for i in 0..4 {
        l.append(&k, &probed("absent", Some(i)), Durability::Normal)
            .unwrap();
    }
    l.expand_rows_for_tests().unwrap();
    l.conn()
        .execute_batch(
            "DELETE FROM events WHERE seq = 4;
             UPDATE chain_head SET seq = 3, hash = (SELECT hash FROM events WHERE seq = 3);",
        )
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 4, "{}", b.problem);
    assert!(b.problem.contains("deleted"), "{}", b.problem);

    // Recompute every hash and the head with the plain (unkeyed) scheme.
    let rows: Vec<(u64, String, String, String, String, String)> = {
        let mut st = l
            .conn()
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
    let mut prev = chain::GENESIS.to_owned();
    for (seq, op_id, host, at, kind, payload) in &rows {
        let hash = chain::Link {
            seq: *seq,
            prev_hash: &prev,
            op_id,
            host,
            at,
            kind,
            payload,
        }
        .hash();
        l.conn()
            .execute(
                "UPDATE events SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
                params![prev, hash, seq],
            )
            .unwrap();
        prev = hash;
    }
    l.conn()
        .execute("UPDATE chain_head SET hash = ?1", params![prev])
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 1, "{}", b.problem);
    assert!(b.problem.contains("keyed hash"), "{}", b.problem);
}

#[test]
fn moving_the_keyed_switch_point_is_found() {
    let s = Scratch::new("switch");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append(&k, &probed("absent", None), Durability::Normal)
        .unwrap();
    l.conn()
        .execute(
            "UPDATE meta SET value = '99' WHERE name = 'chain_keyed_from'",
            [],
        )
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.unwrap();
    assert!(b.problem.contains("keyed chain starts"), "{}", b.problem);
}

#[test]
fn a_completed_marker_without_a_claim_record_is_a_contradiction() {
    let s = Scratch::new("claimless");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append_many(
        &k,
        &[intended("fp", "x"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    l.append(
        &k,
        &probed_by("completed", Some(0), None),
        Durability::Normal,
    )
    .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!(r.contradictions, 1);
    let last = l.events(&k).unwrap().pop().unwrap().event;
    assert!(
        matches!(&last, Event::Contradiction { seen, .. } if seen.state == "completed without a claim record"),
        "{last:?}"
    );
    // Interrupted or running markers without a claim are crash leftovers or a claim in
    // progress (the shim says `never_started`/`claiming`), not contradictions.
    l.append(
        &k,
        &probed_by("interrupted", None, None),
        Durability::Normal,
    )
    .unwrap();
    assert_eq!(l.operation(&k).unwrap().unwrap().contradictions, 1);
}

#[test]
fn a_marker_completed_by_another_attempt_than_the_settled_one_is_a_contradiction() {
    let s = Scratch::new("other-attempt");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    completed_op(&mut l, &k, 0);
    assert_eq!(
        l.operation(&k).unwrap().unwrap().settled_attempt.as_deref(),
        Some("a1")
    );
    l.append(
        &k,
        &probed_by("completed", Some(0), Some("a1")),
        Durability::Normal,
    )
    .unwrap();
    assert_eq!(l.operation(&k).unwrap().unwrap().contradictions, 0);
    l.append(
        &k,
        &probed_by("completed", Some(0), Some("a9")),
        Durability::Normal,
    )
    .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!((r.contradictions, r.exit_code), (1, Some(0)));
    assert!(l.verify_chain().unwrap().intact());
}

#[test]
fn a_ledger_whose_key_check_was_deleted_is_refused_not_rebound() {
    let s = Scratch::new("check-gone");
    {
        let mut l = Ledger::open(&s.db()).unwrap();
        completed_op(&mut l, &OpKey::new("op-1", "web1"), 0);
        l.conn()
            .execute("DELETE FROM meta WHERE name = 'key_check'", [])
            .unwrap();
    }
    let err = Ledger::open(&s.db()).unwrap_err().to_string();
    assert!(err.contains("edited outside opmark"), "{err}");
}

#[test]
fn a_reconcile_that_settles_a_completed_marker_keeps_its_exit_code() {
    let s = Scratch::new("reconciled-exit");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append_many(
        &k,
        &[intended("fp", "x"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    l.append(
        &k,
        &verdict(Verdict::Indeterminate, None),
        Durability::Normal,
    )
    .unwrap();
    // What `reconcile` appends when the marker holds exit 0: the probe, then its decision.
    l.append(&k, &probed("completed", Some(0)), Durability::Normal)
        .unwrap();
    l.append(
        &k,
        &Event::Reconciled {
            decision: "completed".into(),
            detail: "the marker holds the exit".into(),
        },
        Durability::Normal,
    )
    .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!((r.exit_code, r.unresolved), (Some(0), false));
    let listed = l.list(&ListFilter::default()).unwrap();
    assert_eq!(listed[0].exit_code, Some(0));
    assert!(l.verify_chain().unwrap().intact());
}

/// A ledger an older opmark wrote: an operator decision spelled `not-applied`, stored
/// under that spelling in the event and in the row (which it settled). It reads as the
/// typed `not_applied`, settles, and `audit verify` finds chain and projection whole.
#[test]
fn a_ledger_with_the_old_spelling_still_reads_and_verifies() {
    let s = Scratch::new("oldspelling");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-old", "h1");
    l.append_many(
        &k,
        &[intended("fp", "rm x"), dispatched("a1", 1)],
        Durability::Normal,
    )
    .unwrap();
    // Written as older opmark wrote it: the word itself, not this version's spelling.
    l.append(
        &k,
        &Event::OperatorDecision {
            by: "alice".into(),
            decision: Decision::Other("not-applied".into()),
            note: "checked".into(),
            exit_code: None,
        },
        Durability::Normal,
    )
    .unwrap();
    l.expand_rows_for_tests().unwrap();
    let payload: String = l
        .conn()
        .query_row(
            "SELECT payload FROM events WHERE kind = 'operator_decision'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        payload.contains("\"decision\":\"not-applied\""),
        "{payload}"
    );
    // Older opmark counted `not-applied` as settling when it folded the row.
    l.conn()
        .execute("UPDATE operations SET unresolved = 0", [])
        .unwrap();
    let r = l.operation(&k).unwrap().unwrap();
    assert_eq!(r.state, OpState::Resolved(Decision::NotApplied));
    assert!(!r.unresolved);
    let events = l.events(&k).unwrap();
    let d = History::of(&events).final_decision.unwrap();
    assert_eq!(d.decision, Decision::NotApplied);
    let report = l.verify_chain().unwrap();
    assert!(report.first_break.is_none(), "{:?}", report.first_break);
    assert!(
        report.first_mismatch.is_none(),
        "{:?}",
        report.first_mismatch
    );
}

/// Several operations in every shape `stats` counts: settled, retried, blocked,
/// contradicted.
fn varied_history(l: &mut Ledger) {
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
    let k3 = OpKey::new("op-3", "web2");
    completed_op(l, &k3, 0);
    l.append(&k3, &probed("completed", Some(3)), Durability::Normal)
        .unwrap();
}

#[test]
fn stats_come_from_counters_that_verify_recounts_and_an_edited_counter_is_found() {
    let s = Scratch::new("counters");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let st = l.stats().unwrap();
    assert_eq!(st.operations, 3);
    assert_eq!(st.unresolved, 1);
    assert_eq!(st.retries_by_family.get("destructive"), Some(&1));
    assert_eq!(st.contradictions, 1);
    assert_eq!(st.contradicted_operations, 1);
    assert_eq!(st.by_state.values().sum::<u64>(), 3);
    let events: u64 = l
        .conn()
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(st.events, events);
    let report = l.verify_chain().unwrap();
    assert!(report.intact(), "{report:?}");
    // A dashboard number changed behind opmark's back is named, not trusted.
    l.conn()
        .execute(
            "UPDATE counters SET n = n + 5 WHERE name = 'unresolved'",
            [],
        )
        .unwrap();
    let report = l.verify_chain().unwrap();
    assert_eq!(report.counters_mismatch.as_deref(), Some("unresolved"));
    assert!(!report.intact());
}

#[test]
fn stats_since_counts_only_the_window() {
    let s = Scratch::new("window");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let all = l.stats().unwrap();
    let past = l.stats_since("2000-01-01T00:00:00.000000Z").unwrap();
    assert_eq!(past, all);
    let cutoff = now();
    let k = OpKey::new("op-4", "web3");
    l.append(&k, &intended("fp4", "z"), Durability::Full)
        .unwrap();
    l.append(&k, &verdict(Verdict::Blocked, None), Durability::Normal)
        .unwrap();
    let window = l.stats_since(&cutoff).unwrap();
    assert_eq!(window.events, 2);
    assert_eq!(window.operations, 1);
    assert_eq!(window.approvals_asked, 1);
    assert_eq!(window.by_family.get("destructive"), Some(&1));
    let future = l.stats_since("2999-01-01T00:00:00.000000Z").unwrap();
    assert_eq!(future.events, 0);
    assert_eq!(future.operations, 0);
}

#[test]
fn a_ledger_of_schema_version_2_migrates_counts_its_history_and_verifies() {
    let s = Scratch::new("migrate3");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let before = l.stats().unwrap();
    // Back to what opmark of schema version 2 left on disk.
    drop(l);
    as_schema_3(
        &s.db(),
        "DROP TABLE counters;
         DROP INDEX operations_unresolved;
         DROP INDEX operations_contradicted;
         DROP INDEX operations_by_host;
         CREATE INDEX events_by_kind ON events (kind);
         CREATE INDEX operations_unresolved ON operations (unresolved, last_seq);
         PRAGMA user_version = 2;",
    );
    let l = Ledger::open(&s.db()).unwrap();
    let version: i64 = l
        .conn()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::CURRENT_VERSION);
    assert_eq!(l.stats().unwrap(), before);
    let report = l.verify_chain().unwrap();
    assert!(report.intact(), "{report:?}");
}

const INC: bool = true;
const FULL: bool = false;

#[test]
fn a_routine_verify_reads_only_what_is_new_since_its_checkpoint_and_full_reads_all() {
    let s = Scratch::new("checkpoint");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let total: u64 = l
        .conn()
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    // No checkpoint yet: the whole chain.
    let (report, scope) = l.verify(INC).unwrap();
    assert!(report.intact(), "{report:?}");
    assert_eq!(scope, VerifyScope::Full);
    assert_eq!(report.events, total);
    // Two new events of one operation: only they are walked, that operation replayed.
    let k = OpKey::new("op-9", "web9");
    l.append_many(
        &k,
        &[intended("fp9", "x"), dispatched("a9", 1)],
        Durability::Normal,
    )
    .unwrap();
    let (report, scope) = l.verify(INC).unwrap();
    assert!(report.intact(), "{report:?}");
    assert_eq!(
        scope,
        VerifyScope::SinceCheckpoint {
            checkpoint: total,
            operations: 1
        }
    );
    assert_eq!(report.events, 2);
    // Nothing new: nothing walked.
    let (report, _) = l.verify(INC).unwrap();
    assert!(report.intact());
    assert_eq!(report.events, 0);
    // The row of an operation with new events is compared with their replay too.
    let k8 = OpKey::new("op-8", "web8");
    l.append_many(
        &k8,
        &[intended("fp8", "x"), dispatched("a8", 1)],
        Durability::Normal,
    )
    .unwrap();
    l.conn()
        .execute(
            "UPDATE operations SET exit_code = 0 WHERE op_id = 'op-8'",
            [],
        )
        .unwrap();
    let (report, scope) = l.verify(INC).unwrap();
    assert!(
        matches!(scope, VerifyScope::SinceCheckpoint { .. }),
        "{scope:?}"
    );
    assert!(report.first_break.is_none(), "{report:?}");
    let m = report.first_mismatch.expect("the edited row is named");
    assert_eq!((m.op_id.as_str(), m.host.as_str()), ("op-8", "web8"));
    l.conn()
        .execute(
            "UPDATE operations SET exit_code = NULL WHERE op_id = 'op-8'",
            [],
        )
        .unwrap();
    assert!(l.verify(INC).unwrap().0.intact());
    // An edit of a new event is found by the routine verify.
    l.append(
        &k,
        &verdict(Verdict::Completed, Some(0)),
        Durability::Normal,
    )
    .unwrap();
    l.expand_rows_for_tests().unwrap();
    l.conn()
        .execute(
            "UPDATE events SET payload = replace(payload, 'completed', 'not_applied') WHERE seq = ?1",
            params![total + 5],
        )
        .unwrap();
    let (report, _) = l.verify(INC).unwrap();
    assert_eq!(report.first_break.as_ref().map(|b| b.seq), Some(total + 5));
    // An edit before the checkpoint is what `--full` is for.
    l.conn()
        .execute(
            "UPDATE events SET payload = payload || ' ' WHERE seq = 1",
            [],
        )
        .unwrap();
    let (report, scope) = l.verify(FULL).unwrap();
    assert_eq!(scope, VerifyScope::Full);
    assert_eq!(report.first_break.as_ref().map(|b| b.seq), Some(1));
}

#[test]
fn a_checkpoint_edited_outside_opmark_is_not_trusted() {
    let s = Scratch::new("badcheckpoint");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    assert!(l.verify(INC).unwrap().0.intact());
    // Someone edits an old event and moves the checkpoint past... without the key.
    l.expand_rows_for_tests().unwrap();
    l.conn()
        .execute(
            "UPDATE events SET payload = payload || ' ' WHERE seq = 2",
            [],
        )
        .unwrap();
    l.conn()
        .execute(
            "UPDATE meta SET value = '1 ' || (SELECT hash FROM events WHERE seq = 1) WHERE name = 'verified_through'",
            [],
        )
        .unwrap();
    let (report, scope) = l.verify(INC).unwrap();
    assert_eq!(
        scope,
        VerifyScope::Full,
        "a checkpoint whose MAC fails is ignored"
    );
    assert_eq!(report.first_break.as_ref().map(|b| b.seq), Some(2));
}

/// An archive of `l` cut before now: every settled operation, so everything but the
/// unresolved `op-1` (and what came after its first event).
fn archived(s: &Scratch, l: &mut Ledger) -> (PathBuf, archive::ArchiveReport) {
    let file = s.0.join("archive.db");
    let cutoff = now();
    let report = l.archive_before(&cutoff, &file).unwrap();
    (file, report)
}

#[test]
fn an_archived_ledger_and_its_archive_verify_together_and_unresolved_operations_stay() {
    let s = Scratch::new("archive");
    let mut l = Ledger::open(&s.db()).unwrap();
    // Settled operations first, then the unresolved one, then more settled ones.
    let k3 = OpKey::new("arch-3", "old1");
    completed_op(&mut l, &k3, 0);
    let k4 = OpKey::new("arch-4", "old1");
    completed_op(&mut l, &k4, 0);
    let cut_expected = l.operation(&k4).unwrap().unwrap().last_seq;
    varied_history(&mut l);
    let before = l.stats().unwrap();
    let total: u64 = l
        .conn()
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    let (file, report) = archived(&s, &mut l);
    // The cut stops before the unresolved op-1 (and everything after its first event).
    assert_eq!(report.cut, cut_expected);
    assert_eq!(report.operations, 2);
    assert!(
        l.operation(&k3).unwrap().is_none(),
        "moved out of the ledger"
    );
    assert!(
        l.operation(&OpKey::new("op-1", "web1"))
            .unwrap()
            .unwrap()
            .unresolved
    );
    // `stats` still counts the whole history.
    assert_eq!(l.stats().unwrap(), before);
    let alone = l.verify_chain().unwrap();
    assert!(alone.intact(), "{alone:?}");
    assert_eq!(alone.events, total - report.events);
    let both = l.verify_with_archive(&file).unwrap();
    assert!(both.intact(), "{both:?}");
    assert_eq!(both.events, total);
    // Archiving again is refused, as is a file that exists.
    let again = l
        .archive_before(&now(), &s.0.join("second.db"))
        .unwrap_err();
    assert!(again.to_string().contains("archived before"), "{again}");
}

#[test]
fn an_edit_in_the_archive_or_in_the_ledger_after_the_cut_is_found() {
    let s = Scratch::new("archive-edit");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k3 = OpKey::new("arch-3", "old1");
    completed_op(&mut l, &k3, 0);
    varied_history(&mut l);
    let (file, report) = archived(&s, &mut l);
    let archive = rusqlite::Connection::open(&file).unwrap();
    archive
        .execute(
            "UPDATE events SET payload = replace(payload, '\"exit_code\":0', '\"exit_code\":1') WHERE seq = ?1",
            params![report.cut],
        )
        .unwrap();
    let found = l.verify_with_archive(&file).unwrap();
    let b = found.first_break.expect("the archive's edit is found");
    assert_eq!(b.seq, report.cut, "{}", b.problem);
    // Undo it; now edit the ledger right after the cut.
    drop(archive);
    std::fs::remove_file(&file).unwrap();
    let s2 = Scratch::new("archive-edit2");
    let mut l2 = Ledger::open(&s2.db()).unwrap();
    completed_op(&mut l2, &k3, 0);
    varied_history(&mut l2);
    let (file2, report2) = archived(&s2, &mut l2);
    l2.expand_rows_for_tests().unwrap();
    l2.conn()
        .execute(
            "UPDATE events SET payload = payload || ' ' WHERE seq = ?1",
            params![report2.cut + 1],
        )
        .unwrap();
    let found = l2.verify_with_archive(&file2).unwrap();
    assert_eq!(found.first_break.map(|b| b.seq), Some(report2.cut + 1));
    // And a cut moved without the key is not trusted.
    l2.conn()
        .execute(
            "UPDATE meta SET value = '1 ' || substr(value, instr(value, ' ') + 1) WHERE name = 'archive_cut'",
            [],
        )
        .unwrap();
    let found = l2.verify_chain().unwrap();
    assert!(
        found
            .first_break
            .as_ref()
            .is_some_and(|b| b.problem.contains("cut the chain was edited")),
        "{found:?}"
    );
}

/// Turns a ledger of this version back into schema 3's text layout (one text row per
/// event, as opmark wrote until the compact layout): schema 4 (health counters, intent index) is rebuilt by its migration, schema 5 changed nothing else, schema 6's
/// `shared_intents` is rebuilt by its migration, schema 7 changed only the events and
/// schema 8 only how `operations` stores its two stamps (text again here, in a TEXT
/// column), schema 9 added `operations.executed` and the counts of `shared_intents`, both
/// filled by its migration, and schema 10's `duplicate_tallies` is filled by its, so this is exactly the file an older opmark leaves. `edit` then runs on the
/// old rows.
pub(crate) fn as_schema_3(db: &Path, edit: &str) -> u64 {
    let l = Ledger::open(db).unwrap();
    let snapshot = l.snapshot().unwrap();
    let mut rows = snapshot.rows;
    // The text layout stored every hash in full.
    chain::complete(&mut rows, &l.key, snapshot.keyed_from, chain::GENESIS);
    drop(l);
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(
        "DROP TABLE events; DROP TABLE atoms; DROP TABLE op_keys;
         DROP INDEX IF EXISTS operations_by_fingerprint;
         DROP INDEX IF EXISTS operations_by_intent;
         DROP TRIGGER IF EXISTS shared_intents_on_insert;
         DROP TRIGGER IF EXISTS shared_intents_on_update;
         DROP TRIGGER IF EXISTS shared_intents_on_execution;
         DROP TRIGGER IF EXISTS shared_intents_on_change;
         DROP TRIGGER IF EXISTS shared_intents_on_delete;
         DROP TABLE IF EXISTS shared_intents;
         DROP TABLE IF EXISTS duplicate_tallies;
         DELETE FROM counters WHERE name LIKE 'h/%';
         ALTER TABLE operations RENAME TO operations_v8;
         CREATE TABLE operations (
             op_id TEXT NOT NULL, host TEXT NOT NULL, family TEXT NOT NULL,
             display TEXT NOT NULL, fingerprint TEXT NOT NULL, rule TEXT NOT NULL,
             session TEXT NOT NULL, state TEXT NOT NULL, verdict TEXT, exit_code INTEGER,
             attempts INTEGER NOT NULL DEFAULT 0, last_attempt TEXT, unresolved INTEGER NOT NULL,
             created_at TEXT NOT NULL, updated_at TEXT NOT NULL, first_seq INTEGER NOT NULL,
             last_seq INTEGER NOT NULL, contradictions INTEGER NOT NULL DEFAULT 0,
             settled_attempt TEXT, PRIMARY KEY (op_id, host)) WITHOUT ROWID;
         INSERT INTO operations SELECT op_id, host, family, display, fingerprint, rule, session,
             state, verdict, exit_code, attempts, last_attempt, unresolved,
             strftime('%Y-%m-%dT%H:%M:%S', created_at / 1000000, 'unixepoch') || printf('.%06dZ', created_at % 1000000),
             strftime('%Y-%m-%dT%H:%M:%S', updated_at / 1000000, 'unixepoch') || printf('.%06dZ', updated_at % 1000000),
             first_seq, last_seq, contradictions, settled_attempt FROM operations_v8;
         DROP TABLE operations_v8;
         CREATE INDEX operations_by_recency ON operations (last_seq);
         CREATE INDEX operations_unresolved ON operations (last_seq) WHERE unresolved = 1;
         CREATE INDEX operations_contradicted ON operations (last_seq) WHERE contradictions > 0;
         CREATE INDEX operations_by_host ON operations (host, last_seq);
         CREATE TABLE events (
             seq INTEGER PRIMARY KEY, op_id TEXT NOT NULL, host TEXT NOT NULL,
             at TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
             prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
         CREATE INDEX events_by_operation ON events (op_id, host, seq);
         PRAGMA user_version = 3;",
    )
    .unwrap();
    for r in &rows {
        conn.execute(
            "INSERT INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                r.seq,
                r.op_id,
                r.host,
                r.at,
                r.kind,
                r.payload,
                r.prev_hash,
                r.hash
            ],
        )
        .unwrap();
    }
    conn.execute_batch(edit).unwrap();
    rows.len() as u64
}

#[test]
fn a_text_layout_ledger_migrates_to_the_compact_one_and_still_verifies_and_finds_edits() {
    let s = Scratch::new("migrate-compact");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let before = l.verify_chain().unwrap();
    assert!(before.intact(), "{before:?}");
    let ops_before = l.list(&ListFilter::default()).unwrap();
    drop(l);
    let events = as_schema_3(&s.db(), "");
    {
        // The old file holds the stamps as text, as schema 7 wrote them.
        let conn = rusqlite::Connection::open(s.db()).unwrap();
        let text: (String, String) = conn
            .query_row(
                "SELECT typeof(created_at), typeof(updated_at) FROM operations LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(text, ("text".to_owned(), "text".to_owned()));
    }
    let text_bytes = std::fs::metadata(s.db()).unwrap().len();
    assert!(text_bytes > 0);
    // Opening migrates (schemas 4 and 5); the chain and the projection verify as before.
    let l = Ledger::open(&s.db()).unwrap();
    let after = l.verify_chain().unwrap();
    assert!(after.intact(), "{after:?}");
    assert_eq!(after.events, events);
    let version: i64 = l
        .conn()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::CURRENT_VERSION);
    // Every payload became compact, none kept as text.
    let texts: u64 = l
        .conn()
        .query_row(
            "SELECT COUNT(*) FROM events WHERE typeof(payload) != 'blob' OR prev_hash IS NOT NULL OR kind IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(texts, 0);
    // Schema 8: every operation's stamps became micros, and read back as they were.
    let stamps_as_text: u64 = l
        .conn()
        .query_row(
            "SELECT COUNT(*) FROM operations WHERE typeof(created_at) != 'integer' OR typeof(updated_at) != 'integer'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stamps_as_text, 0);
    assert_eq!(l.list(&ListFilter::default()).unwrap(), ops_before);
    // An edit of the migrated ledger is found.
    l.expand_rows_for_tests().unwrap();
    l.conn()
        .execute(
            "UPDATE events SET payload = replace(payload, '\"verdict\":\"blocked\"', '\"verdict\":\"completed\"') WHERE seq = 6",
            [],
        )
        .unwrap();
    let b = l.verify_chain().unwrap().first_break.expect("edit found");
    assert_eq!(b.seq, 6, "{}", b.problem);
}

#[test]
fn a_stamp_that_would_not_come_back_as_micros_stays_text_through_the_migration() {
    let s = Scratch::new("migrate-odd-stamp");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let op = l.list(&ListFilter::default()).unwrap()[0].op_id.clone();
    drop(l);
    // No 31 February: SQLite's date functions would move it to March, so it stays text.
    as_schema_3(
        &s.db(),
        &format!(
            "UPDATE operations SET updated_at = '2026-02-31T00:00:00.000000Z' WHERE op_id = '{op}'"
        ),
    );
    let l = Ledger::open(&s.db()).unwrap();
    let (kind, at): (String, String) = l
        .conn()
        .query_row(
            "SELECT typeof(updated_at), updated_at FROM operations WHERE op_id = ?1",
            [&op],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (kind.as_str(), at.as_str()),
        ("text", "2026-02-31T00:00:00.000000Z")
    );
    let rec = l.list(&ListFilter::default()).unwrap();
    let rec = rec.iter().find(|r| r.op_id == op).unwrap();
    assert_eq!(rec.updated_at, "2026-02-31T00:00:00.000000Z");
    // It was an edit of the projection, and the full walk still says so.
    let report = l.verify_chain().unwrap();
    assert!(!report.intact(), "{report:?}");
}

#[test]
fn an_edit_made_before_the_migration_is_still_found_after_it() {
    let s = Scratch::new("migrate-edited");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    drop(l);
    // A fixed predecessor hash: rewriting only its first byte to `ff` changed nothing
    // when the real one began so (one run in 256, the key being random).
    as_schema_3(
        &s.db(),
        &format!(
            "UPDATE events SET payload = replace(payload, '\"number\":2', '\"number\":7') WHERE seq = 3;
         UPDATE events SET prev_hash = '{}' WHERE seq = 5;",
            "f".repeat(64)
        ),
    );
    let l = Ledger::open(&s.db()).unwrap();
    let b = l.verify_chain().unwrap().first_break.expect("edit found");
    assert_eq!(b.seq, 3, "{}", b.problem);
    // The other edit (a predecessor hash) was kept too, not smoothed over.
    let kept: Option<Vec<u8>> = l
        .conn()
        .query_row("SELECT prev_hash FROM events WHERE seq = 5", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kept.map(|h| h[0]), Some(0xff));
}

/// The full walk compares each operation's row when the event its `last_seq` names goes
/// by and then forgets it (src/ledger/verify.rs): every way a row can be wrong is still
/// found, without holding every operation.
#[test]
fn the_one_pass_walk_names_rows_moved_added_or_deleted() {
    let cases: [(&str, &str, &str); 4] = [
        (
            "UPDATE operations SET last_seq = first_seq WHERE op_id = 'op-1'",
            "op-1",
            "",
        ),
        (
            "UPDATE operations SET last_seq = 999 WHERE op_id = 'op-2'",
            "op-2",
            "last_seq",
        ),
        (
            "INSERT INTO operations SELECT 'ghost', host, family, display, fingerprint, rule, session, state, verdict, exit_code, attempts, last_attempt, unresolved, created_at, updated_at, first_seq, last_seq + 100, contradictions, settled_attempt, executed FROM operations WHERE op_id = 'op-2'",
            "ghost",
            "no events behind it",
        ),
        (
            "DELETE FROM operations WHERE op_id = 'op-3'",
            "op-3",
            "missing",
        ),
    ];
    for (n, (sql, op, problem)) in cases.iter().enumerate() {
        let s = Scratch::new(&format!("one-pass-{n}"));
        let mut l = Ledger::open(&s.db()).unwrap();
        varied_history(&mut l);
        assert!(l.verify_chain().unwrap().intact());
        l.conn().execute_batch(sql).unwrap();
        let report = l.verify_chain().unwrap();
        assert!(report.first_break.is_none(), "{sql}: {report:?}");
        let m = report
            .first_mismatch
            .clone()
            .unwrap_or_else(|| panic!("{sql}: not found: {report:?}"));
        assert_eq!(m.op_id, *op, "{sql}: {}", m.problem);
        assert!(m.problem.contains(problem), "{sql}: {}", m.problem);
    }
    // A row rolled back to exactly its replay after the operation's first event: only
    // the events that follow it give it away.
    let s = Scratch::new("one-pass-rolled-back");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let k = OpKey::new("op-2", "web1");
    let first = l.events(&k).unwrap().remove(0);
    let mut early = None;
    projection::fold(
        &mut early,
        (&k.op_id, &k.host),
        &first.event,
        first.seq,
        &first.at,
    )
    .expect("an intent is not refused");
    let early = early.expect("an intent makes a row");
    let tx = l.conn().unchecked_transaction().unwrap();
    super::store::sqlite::operations::store(&tx, &early).unwrap();
    tx.commit().unwrap();
    let m = l.verify_chain().unwrap().first_mismatch.expect("found");
    assert_eq!(m.op_id, "op-2", "{}", m.problem);
    assert!(
        m.problem.contains("ends before its events do"),
        "{}",
        m.problem
    );
}

/// The intent index is what finds one intent's operations (every run's repetition check,
/// every new operation's shared-intent trigger, `stats`' duplicates): SQLite must plan
/// it, not a walk of all the host's operations, on a ledger never ANALYZEd.
#[test]
fn one_intents_operations_are_found_through_the_intent_index() {
    let s = Scratch::new("intent-index");
    let mut l = Ledger::open(&s.db()).unwrap();
    varied_history(&mut l);
    let same = (sqlite::DIALECT.same_fingerprint)("d.fingerprint", "?1");
    for sql in [
        format!("SELECT 1 FROM operations d WHERE {same} AND d.host = ?2 AND d.op_id <> ?3"),
        // The trigger's condition, with NEW's columns as parameters.
        "SELECT 1 FROM operations d WHERE substr(d.fingerprint, 1, 16) = substr(?1, 1, 16) AND +d.fingerprint = ?1 AND d.host = ?2 AND d.op_id <> ?3".to_owned(),
    ] {
        let plan: Vec<String> = l
            .conn()
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(params!["fp", "web1", "op-9"], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter().any(|p| p.contains("operations_by_intent")),
            "{sql}: {plan:?}"
        );
    }
    let trigger: String = l
        .conn()
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'shared_intents_on_insert'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        trigger.contains("+d.fingerprint = NEW.fingerprint"),
        "{trigger}"
    );
}

#[test]
fn the_full_walk_reads_atoms_in_order_and_finds_one_edited_or_deleted() {
    let s = Scratch::new("walk-atoms");
    let mut l = Ledger::open(&s.db()).unwrap();
    for (op, attempt) in [("op-1", "attempt-one"), ("op-2", "attempt-two")] {
        let k = OpKey::new(op, "web1");
        l.append(&k, &intended(&format!("fp-{op}"), "x"), Durability::Full)
            .unwrap();
        l.append(&k, &dispatched(attempt, 1), Durability::Full)
            .unwrap();
    }
    let report = l.verify_chain().unwrap();
    assert_eq!((report.events, report.first_break), (4, None));
    let atom = |l: &Ledger| -> i64 {
        l.conn()
            .query_row(
                "SELECT COUNT(*) FROM atoms WHERE text = 'attempt-two'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(atom(&l), 1, "the attempt id is stored once, as an atom");

    // Op-2's dispatch (event #4) is the first event that names the atom.
    l.conn()
        .execute(
            "UPDATE atoms SET text = 'attempt-2wo' WHERE text = 'attempt-two'",
            [],
        )
        .unwrap();
    let edited = Ledger::open(&s.db()).unwrap();
    let b = edited.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 4, "{}", b.problem);

    // A missing atom makes its event undecodable: a break, not an error.
    l.conn()
        .execute("DELETE FROM atoms WHERE text = 'attempt-2wo'", [])
        .unwrap();
    let deleted = Ledger::open(&s.db()).unwrap();
    let b = deleted.verify_chain().unwrap().first_break.unwrap();
    assert_eq!(b.seq, 4, "{}", b.problem);
}

#[test]
fn a_settlement_made_after_another_writer_settled_is_refused_naming_the_first() {
    let s = Scratch::new("settled-since");
    let mut l = Ledger::open(&s.db()).unwrap();
    let k = OpKey::new("op-1", "web1");
    l.append_many(
        &k,
        &[
            intended("fp", "x"),
            dispatched("a1", 1),
            verdict(Verdict::Indeterminate, None),
        ],
        Durability::Full,
    )
    .unwrap();
    let seen = l.operation(&k).unwrap().unwrap().last_seq;
    let decide = |by: &str, decision: &str| Event::OperatorDecision {
        by: by.into(),
        decision: decision.into(),
        note: String::new(),
        exit_code: None,
    };
    // Words that leave the outcome open do not settle it: a later settlement still goes.
    l.append(&k, &decide("carol", "approved"), Durability::Normal)
        .unwrap();
    l.append(
        &k,
        &Event::Reconciled {
            decision: "interrupted_needs_decision".into(),
            detail: "d".into(),
        },
        Durability::Normal,
    )
    .unwrap();
    // Two settlements that both read the operation at `seen`: the first wins.
    let since = Some(UnlessSettledSince(seen));
    l.append_if(&k, &[decide("alice", "applied")], Durability::Normal, since)
        .unwrap();
    let events_before = l.events(&k).unwrap().len();
    let refused = l
        .append_if(
            &k,
            &[decide("bob", "not_applied")],
            Durability::Normal,
            since,
        )
        .unwrap_err();
    let LedgerError::AlreadySettled(first) = refused else {
        panic!("not AlreadySettled: {refused:?}");
    };
    assert_eq!(
        (first.by.as_str(), first.decision.as_str(), first.seq),
        ("operator alice", "applied", seen + 3)
    );
    assert_eq!(
        l.events(&k).unwrap().len(),
        events_before,
        "bob stored nothing"
    );
    // A reconcile's settlement counts the same, and one read after it goes.
    let k2 = OpKey::new("op-2", "web1");
    l.append_many(
        &k2,
        &[intended("fp2", "y"), dispatched("a1", 1)],
        Durability::Full,
    )
    .unwrap();
    let seen2 = l.operation(&k2).unwrap().unwrap().last_seq;
    l.append(
        &k2,
        &Event::Reconciled {
            decision: "completed".into(),
            detail: "d".into(),
        },
        Durability::Normal,
    )
    .unwrap();
    let refused = l
        .append_if(
            &k2,
            &[decide("bob", "applied")],
            Durability::Normal,
            Some(UnlessSettledSince(seen2)),
        )
        .unwrap_err();
    assert!(
        matches!(&refused, LedgerError::AlreadySettled(f) if f.by == "reconcile"),
        "{refused:?}"
    );
    let now_seen = l.operation(&k2).unwrap().unwrap().last_seq;
    l.append_if(
        &k2,
        &[decide("bob", "applied")],
        Durability::Normal,
        Some(UnlessSettledSince(now_seen)),
    )
    .unwrap();
    assert!(l.verify_chain().unwrap().intact());
}

impl Ledger {
    /// The SQLite connection, for tests that edit the file behind opmark's back.
    pub(crate) fn conn(&self) -> &rusqlite::Connection {
        self.store.sqlite_conn().expect("a SQLite ledger")
    }
}

/// The database at `db` opened as a plain SQLite file: no migration, no key check.
pub(crate) fn open_raw(db: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(db).unwrap()
}
