//! Repetitions (docs/guarantees.md#repetitions): the same intent on the same host under
//! another op id within the family's `repeat_window`, the failure an op id alone cannot
//! stop (an agent that lost its op id and minted a new one). Looked for in the ledger
//! here, before anything is sent, and on the host by the shim's fingerprint index at the
//! claim (docs/host-protocol.md#the-fingerprint-index). What a found one does is the
//! policy's `on_repeat`: `block` answers `blocked` (`repeats_recent_operation`) naming the
//! earlier operation and the two ways forward, `warn` runs and says so, `allow` is silent.
//! A repetition declared with `--repeats OP` (or an amendment of an operation of the same
//! intent, `--amends OP`) is no surprise: it runs, and both operations show the link.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

use crate::ledger::{Event, LedgerError, LinkRelation, OpKey, OperationRecord};
use crate::policy::OnRepeat;
use crate::vocab::Verdict;

/// An earlier operation this run repeats: the run document's `repeats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repetition {
    /// The earlier operation's id.
    pub op_id: String,
    /// Its state when seen: the ledger's state, or the host marker's (`running`,
    /// `completed`, `interrupted`, `claiming`).
    pub state: String,
    /// When it was intended (ledger) or claimed (host), UTC RFC 3339.
    pub at: String,
    /// How its host was reached, in words.
    pub route: String,
    /// What the policy did about it: `block` or `warn`.
    pub action: &'static str,
    /// Where it was seen: `ledger`, or `host` (the shim's fingerprint index: another
    /// ledger, another machine).
    pub seen_in: &'static str,
    /// Which setting holds it back and where to change it (the family, the rule that
    /// gave it, the policy file), for the `blocked` reason; not part of the document.
    #[serde(skip)]
    pub because: Option<String>,
}

impl Repetition {
    /// The ledger event recording it.
    pub fn event(&self) -> Event {
        Event::RepetitionHeld {
            earlier_op: self.op_id.clone(),
            earlier_state: self.state.clone(),
            earlier_at: self.at.clone(),
            route: self.route.clone(),
            seen_in: self.seen_in.into(),
            action: self.action.into(),
        }
    }

    /// The line said on stderr when the policy warns.
    pub fn warning(&self, op: &str, host: &str) -> String {
        format!(
            "warning: op {op} repeats op {earlier} on {host} ({state}, at {at}; seen in the {seen}): the same command under a new op id runs again. Rerun with --op {earlier} to replay it instead, or --repeats {earlier} to say the repetition is meant",
            earlier = self.op_id,
            state = self.state,
            at = self.at,
            seen = self.seen_in,
        )
    }

    /// A repetition the shim's fingerprint index found (its `R repeats` refusal or `W`
    /// warning fields): `earlier`, `earlier_state`, `earlier_at` (epoch seconds).
    pub fn from_host(
        fields: &std::collections::BTreeMap<String, String>,
        route: String,
        action: &'static str,
    ) -> Repetition {
        let field = |k: &str| fields.get(k).cloned().unwrap_or_else(|| "unknown".into());
        let at = fields
            .get("earlier_at")
            .and_then(|t| t.parse::<i64>().ok())
            .and_then(epoch_stamp)
            .unwrap_or_else(|| field("earlier_at"));
        Repetition {
            op_id: field("earlier"),
            state: field("earlier_state"),
            at,
            route,
            action,
            seen_in: "host",
            because: None,
        }
    }
}

/// Epoch seconds as a UTC RFC 3339 stamp.
pub(crate) fn epoch_stamp(secs: i64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp(secs).ok()?;
    t.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// What a run declared about repetitions: `--repeats OP`, `--amends OP`.
#[derive(Debug, Clone, Default)]
pub struct Declared {
    /// `--repeats`.
    pub repeats: Option<String>,
    /// `--amends`.
    pub amends: Option<String>,
}

impl Declared {
    /// The op ids declared, for the shim (`-` when none).
    pub fn ops(&self) -> Vec<String> {
        self.repeats.iter().chain(&self.amends).cloned().collect()
    }

    /// The links to record: (relation of this operation, the other op id).
    pub fn links(&self) -> Vec<(LinkRelation, String)> {
        let mut links = Vec::new();
        if let Some(op) = &self.repeats {
            links.push((LinkRelation::Repeats, op.clone()));
        }
        if let Some(op) = &self.amends {
            links.push((LinkRelation::Amends, op.clone()));
        }
        links
    }
}

/// What the ledger holds that bears on this run's declarations and repetitions.
pub trait LedgerView {
    /// See [`crate::ledger::Ledger::same_intent_since`].
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError>;
    /// One operation's events.
    fn events_of(&self, key: &OpKey) -> Result<Vec<Event>, LedgerError>;
}

impl LedgerView for crate::ledger::Ledger {
    fn same_intent_since(
        &self,
        fingerprint: &str,
        host: &str,
        op_id: &str,
        since: &str,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        crate::ledger::Ledger::same_intent_since(self, fingerprint, host, op_id, since)
    }
    fn events_of(&self, key: &OpKey) -> Result<Vec<Event>, LedgerError> {
        Ok(self.events(key)?.into_iter().map(|e| e.event).collect())
    }
}

/// An earlier operation that may have had the effect: it has attempts, and its verdict
/// is not one that says nothing ran (held back, refused, closed as not applied).
fn may_have_run(record: &OperationRecord) -> bool {
    record.attempts > 0
        && !matches!(
            record.verdict,
            Some(Verdict::Blocked | Verdict::Refused | Verdict::NotApplied)
        )
}

/// The declared op ids and, through their own recorded `repeats`/`amends` links, the ops
/// they declared (a repetition of a declared repetition is declared too).
fn declared_closure(
    ledger: &dyn LedgerView,
    host: &str,
    declared: &Declared,
) -> Result<BTreeSet<String>, LedgerError> {
    let mut known: BTreeSet<String> = declared.ops().into_iter().collect();
    let mut todo: Vec<String> = known.iter().cloned().collect();
    // Bounded: a chain longer than this is not worth reading before every run.
    for _ in 0..16 {
        let Some(op) = todo.pop() else { break };
        for event in ledger.events_of(&OpKey::new(op, host))? {
            if let Event::Linked {
                relation: LinkRelation::Repeats | LinkRelation::Amends,
                other_op,
                ..
            } = event
            {
                if known.insert(other_op.clone()) {
                    todo.push(other_op);
                }
            }
        }
    }
    Ok(known)
}

/// The ledger half of the check: the earliest operation of the same intent on the same
/// host under another op id, intended within `window`, that may have run and was not
/// declared; `None` when the policy allows repetitions or there is none.
pub fn in_ledger(
    ledger: &dyn LedgerView,
    key: &OpKey,
    ledger_fp: &str,
    window: Duration,
    action: OnRepeat,
    declared: &Declared,
) -> Result<Option<Repetition>, LedgerError> {
    let action = match action {
        OnRepeat::Allow => return Ok(None),
        OnRepeat::Warn => "warn",
        OnRepeat::Block => "block",
    };
    if window.is_zero() {
        return Ok(None);
    }
    let since = crate::ledger::stamp_before(window).unwrap_or_default();
    let found = ledger.same_intent_since(ledger_fp, &key.host, &key.op_id, &since)?;
    let candidates: Vec<&OperationRecord> = found.iter().filter(|r| may_have_run(r)).collect();
    if candidates.is_empty() {
        return Ok(None);
    }
    let declared = declared_closure(ledger, &key.host, declared)?;
    let Some(earlier) = candidates
        .into_iter()
        .find(|r| !declared.contains(&r.op_id))
    else {
        return Ok(None);
    };
    let route = ledger
        .events_of(&OpKey::new(earlier.op_id.clone(), earlier.host.clone()))?
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::Connected { route, .. } => Some(route.describe()),
            _ => None,
        })
        .unwrap_or_else(|| format!("{} (no connection recorded)", earlier.host));
    Ok(Some(Repetition {
        op_id: earlier.op_id.clone(),
        state: earlier.state.to_string(),
        at: earlier.created_at.clone(),
        route,
        action,
        seen_in: "ledger",
        because: None,
    }))
}

/// Why a declaration cannot be taken, checked before anything is sent: `--repeats` of an
/// operation the ledger holds on this host with another intent (it would repeat nothing),
/// or of the run's own op id.
pub fn check_declared(
    key: &OpKey,
    ledger_fp: &str,
    declared: &Declared,
    other: impl Fn(&OpKey) -> Result<Option<OperationRecord>, LedgerError>,
) -> Result<Option<String>, LedgerError> {
    for (relation, op) in declared.links() {
        let flag = match relation {
            LinkRelation::Repeats => "--repeats",
            _ => "--amends",
        };
        if *op == key.op_id {
            return Ok(Some(format!(
                "{flag} {op} names this run's own op id; name the EARLIER operation it {}; nothing was sent",
                if relation == LinkRelation::Repeats { "repeats" } else { "replaces" }
            )));
        }
        if relation == LinkRelation::Repeats {
            if let Some(record) = other(&OpKey::new(op.clone(), key.host.clone()))? {
                if record.fingerprint != ledger_fp {
                    return Ok(Some(format!(
                        "--repeats {op}: op {op} on {} is a different command or stdin (`opmark show {op}`), so this run repeats nothing of it; use --amends {op} if this command replaces that one, or drop --repeats; nothing was sent",
                        key.host
                    )));
                }
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::family::Family;
    use crate::ledger::OpState;
    use crate::ssh::Route;

    fn record(
        op_id: &str,
        fingerprint: &str,
        attempts: u32,
        verdict: Option<Verdict>,
    ) -> OperationRecord {
        OperationRecord {
            op_id: op_id.into(),
            host: "web1".into(),
            family: Family::Destructive,
            display: "systemctl restart app".into(),
            fingerprint: fingerprint.into(),
            rule: String::new(),
            session: String::new(),
            state: OpState::ExitReceived,
            verdict,
            exit_code: None,
            attempts,
            last_attempt: None,
            unresolved: false,
            created_at: "2026-12-05T10:00:00.000000Z".into(),
            updated_at: String::new(),
            first_seq: 1,
            last_seq: 2,
            contradictions: 0,
            settled_attempt: None,
            executed: false,
        }
    }

    fn route(user: &str) -> Route {
        Route {
            alias: "web1".into(),
            hostname: "10.0.0.1".into(),
            port: 22,
            user: user.into(),
            identities: Vec::new(),
            jump: None,
            jumps: Vec::new(),
            config: None,
        }
    }

    /// A ledger of operations of the run's intent, with each one's events by op id.
    #[derive(Default)]
    struct Fake {
        same_intent: Vec<OperationRecord>,
        events: BTreeMap<String, Vec<Event>>,
    }

    impl LedgerView for Fake {
        fn same_intent_since(
            &self,
            _fingerprint: &str,
            _host: &str,
            _op_id: &str,
            _since: &str,
        ) -> Result<Vec<OperationRecord>, LedgerError> {
            Ok(self.same_intent.clone())
        }
        fn events_of(&self, key: &OpKey) -> Result<Vec<Event>, LedgerError> {
            Ok(self.events.get(&key.op_id).cloned().unwrap_or_default())
        }
    }

    fn linked(relation: LinkRelation, other_op: &str) -> Event {
        Event::Linked {
            relation,
            other_op: other_op.into(),
            other_host: "web1".into(),
        }
    }

    fn look(ledger: &Fake, action: OnRepeat, declared: &Declared) -> Option<Repetition> {
        in_ledger(
            ledger,
            &OpKey::new("op-new", "web1"),
            "fp-a",
            Duration::from_secs(3600),
            action,
            declared,
        )
        .unwrap()
    }

    #[test]
    fn an_earlier_operation_may_have_run_once_dispatched_unless_its_verdict_says_nothing_ran() {
        assert!(
            !may_have_run(&record("op-0", "fp-a", 0, None)),
            "never dispatched"
        );
        assert!(
            may_have_run(&record("op-0", "fp-a", 1, None)),
            "one attempt, no verdict yet"
        );
        assert!(may_have_run(&record(
            "op-0",
            "fp-a",
            2,
            Some(Verdict::Completed)
        )));
        assert!(may_have_run(&record(
            "op-0",
            "fp-a",
            1,
            Some(Verdict::Indeterminate)
        )));
        for nothing_ran in [Verdict::Blocked, Verdict::Refused, Verdict::NotApplied] {
            assert!(
                !may_have_run(&record("op-0", "fp-a", 1, Some(nothing_ran))),
                "{nothing_ran:?}"
            );
        }
    }

    #[test]
    fn the_same_intent_under_another_op_id_is_a_repetition_named_with_the_route_it_ran_through() {
        let mut ledger = Fake {
            same_intent: vec![
                record("op-never-sent", "fp-a", 0, None),
                record("op-0", "fp-a", 1, Some(Verdict::Completed)),
            ],
            ..Fake::default()
        };
        ledger.events.insert(
            "op-0".into(),
            vec![Event::Connected {
                attempt_id: "at-1".into(),
                route: route("deploy"),
                host_key: "SHA256:a".into(),
            }],
        );
        let found = look(&ledger, OnRepeat::Block, &Declared::default()).expect("a repetition");
        assert_eq!(
            found,
            Repetition {
                op_id: "op-0".into(),
                state: "exit_received".into(),
                at: "2026-12-05T10:00:00.000000Z".into(),
                route: route("deploy").describe(),
                action: "block",
                seen_in: "ledger",
                because: None,
            }
        );
        assert_eq!(
            look(&ledger, OnRepeat::Warn, &Declared::default()).map(|r| r.action),
            Some("warn")
        );
        assert_eq!(look(&ledger, OnRepeat::Allow, &Declared::default()), None);
        ledger.events.clear();
        assert_eq!(
            look(&ledger, OnRepeat::Block, &Declared::default()).map(|r| r.route),
            Some("web1 (no connection recorded)".to_owned())
        );
    }

    #[test]
    fn a_declared_repetition_and_what_it_declared_in_turn_are_no_surprise() {
        let mut ledger = Fake {
            same_intent: vec![
                record("op-0", "fp-a", 1, Some(Verdict::Completed)),
                record("op-1", "fp-a", 1, Some(Verdict::Completed)),
            ],
            ..Fake::default()
        };
        // op-1 was itself run with --repeats op-0.
        ledger
            .events
            .insert("op-1".into(), vec![linked(LinkRelation::Repeats, "op-0")]);
        let repeats = |op: &str| Declared {
            repeats: Some(op.into()),
            amends: None,
        };
        assert_eq!(look(&ledger, OnRepeat::Block, &repeats("op-1")), None);
        // Declaring only the older one leaves the newer one a surprise.
        assert_eq!(
            look(&ledger, OnRepeat::Block, &repeats("op-0")).map(|r| r.op_id),
            Some("op-1".to_owned())
        );
        let amends = Declared {
            repeats: None,
            amends: Some("op-1".into()),
        };
        assert_eq!(look(&ledger, OnRepeat::Block, &amends), None);
    }

    #[test]
    fn both_declarations_are_sent_to_the_shim_and_linked_in_order() {
        let declared = Declared {
            repeats: Some("op-0".into()),
            amends: Some("op-1".into()),
        };
        assert_eq!(declared.ops(), vec!["op-0".to_owned(), "op-1".to_owned()]);
        assert_eq!(
            declared.links(),
            vec![
                (LinkRelation::Repeats, "op-0".to_owned()),
                (LinkRelation::Amends, "op-1".to_owned())
            ]
        );
        assert!(Declared::default().ops().is_empty());
        assert!(Declared::default().links().is_empty());
    }

    #[test]
    fn a_declaration_naming_the_run_s_own_op_id_or_another_intent_is_refused_before_sending() {
        let key = OpKey::new("op-new", "web1");
        let ledger = |fingerprint: &'static str| {
            move |k: &OpKey| -> Result<Option<OperationRecord>, LedgerError> {
                Ok(Some(record(&k.op_id, fingerprint, 1, None)))
            }
        };
        let check = |declared: Declared, fingerprint: &'static str| {
            check_declared(&key, "fp-a", &declared, ledger(fingerprint)).unwrap()
        };
        let repeats = |op: &str| Declared {
            repeats: Some(op.into()),
            amends: None,
        };
        let amends = |op: &str| Declared {
            repeats: None,
            amends: Some(op.into()),
        };
        assert_eq!(
            check(repeats("op-new"), "fp-a").as_deref(),
            Some("--repeats op-new names this run's own op id; name the EARLIER operation it repeats; nothing was sent")
        );
        assert_eq!(
            check(amends("op-new"), "fp-a").as_deref(),
            Some("--amends op-new names this run's own op id; name the EARLIER operation it replaces; nothing was sent")
        );
        assert_eq!(check(repeats("op-0"), "fp-a"), None, "the same intent");
        let other = check(repeats("op-0"), "fp-b").expect("another intent");
        assert!(
            other.starts_with("--repeats op-0: op op-0 on web1 is a different command or stdin"),
            "{other}"
        );
        assert_eq!(
            check(amends("op-0"), "fp-b"),
            None,
            "an amendment replaces another command"
        );
    }

    #[test]
    fn a_repetition_the_host_found_says_when_in_utc_and_what_it_does_not_know() {
        let fields: BTreeMap<String, String> = [
            ("earlier", "op-0"),
            ("earlier_state", "completed"),
            ("earlier_at", "1764892800"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let r = Repetition::from_host(&fields, "deploy@10.0.0.1:22".into(), "warn");
        assert_eq!(
            (r.op_id.as_str(), r.state.as_str(), r.at.as_str(), r.seen_in),
            ("op-0", "completed", "2025-12-05T00:00:00Z", "host")
        );
        assert_eq!(
            r.warning("op-new", "web1"),
            "warning: op op-new repeats op op-0 on web1 (completed, at 2025-12-05T00:00:00Z; seen in the host): the same command under a new op id runs again. Rerun with --op op-0 to replay it instead, or --repeats op-0 to say the repetition is meant"
        );
        let odd: BTreeMap<String, String> =
            [("earlier_at".to_owned(), "yesterday".to_owned())].into();
        let r = Repetition::from_host(&odd, String::new(), "block");
        assert_eq!(
            (r.op_id.as_str(), r.state.as_str(), r.at.as_str()),
            ("unknown", "unknown", "yesterday")
        );
    }

    #[test]
    fn the_real_ledger_answers_the_same_intent_and_an_operation_s_events() {
        let dir = std::env::temp_dir().join(format!(
            "opmark-repeat-view-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut ledger = crate::ledger::Ledger::open(&dir.join("ledger.db")).unwrap();
        let intent = Event::Intended {
            session: "s".into(),
            family: Family::Destructive,
            display: "systemctl restart app".into(),
            fingerprint: "fp-a".into(),
            rule: "r".into(),
            secrets: Vec::new(),
            become_user: None,
            locks: Vec::new(),
        };
        let earlier = OpKey::new("op-0", "web1");
        ledger
            .append(&earlier, &intent, crate::ledger::Durability::Normal)
            .unwrap();
        let since = crate::ledger::stamp_before(Duration::from_secs(3600)).unwrap();
        let view: &dyn LedgerView = &ledger;
        let found = view
            .same_intent_since("fp-a", "web1", "op-new", &since)
            .unwrap();
        assert_eq!(
            found.iter().map(|r| r.op_id.as_str()).collect::<Vec<_>>(),
            ["op-0"]
        );
        assert_eq!(view.events_of(&earlier).unwrap(), vec![intent]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
