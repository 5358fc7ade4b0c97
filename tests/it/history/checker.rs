//! The fault-history checker's judgement: a pure function from what was asked and answered
//! (the history) and what the hosts did (their effect logs) to the list of broken promises.
//! It knows nothing of sshd, faults or timing, so a failure reads the same on replay, and
//! its own tests feed it small invented histories.
//!
//! Every command of a run writes `start LABEL` to its host's effect log before anything
//! else and `end LABEL CODE` just before it exits with CODE. LABEL names the intent (the
//! command), not the op id: the same intent may be sent under several op ids (a declared
//! `--repeats`, or an undeclared one the policy should hold), and the command cannot know
//! the op id it runs under. So effects are counted per intent and host, and bounded by
//! the op ids of that intent that could have run there.
//!
//! A convergent intent is the exception the policy makes: its contract reruns an
//! interrupted claim, so an op id of it may start more than once. The host sets every
//! interrupted claim it reruns aside under `superseded/` first, and that is the evidence
//! the bound uses: one more execution per claim set aside. (An interrupted command may
//! well have run to its end: a full disk that refused only its exit record leaves the
//! claim interrupted too.)

use std::collections::{BTreeMap, BTreeSet};

/// Exit statuses a command ended by `opmark cancel` reports (TERM, then KILL).
const CANCEL_STATUSES: [i64; 2] = [143, 137];

/// One host's answer about one operation, from a `run` document (or a fleet's member).
#[derive(Clone, Debug, PartialEq)]
pub struct HostAnswer {
    pub host: String,
    pub verdict: String,
    pub exit_code: Option<i64>,
    pub reason_code: Option<String>,
}

/// What an invocation got back.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Killed by the fault schedule before it answered: it may have run anything a run
    /// may run.
    Killed,
    /// Answered with a verdict per host.
    Verdicts(Vec<HostAnswer>),
    /// Answered with an error document or exit status and no verdict (a ledger or
    /// transport error before a verdict): counted as unknown, like `Killed`.
    NoVerdict { status: Option<i32>, reason: String },
    /// Another verb (cancel, gc, reconcile, resolve, audit): its exit status.
    Done { status: Option<i32> },
}

/// One invocation of opmark, as the history records it.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub seq: usize,
    pub agent: usize,
    pub ledger: usize,
    /// What the schedule meant it to be: `fresh`, `rerun`, `race`, `repeat-declared`,
    /// `repeat-undeclared`, `fleet`, `detach`, `cancel`, `gc`, `final-rerun`, ...
    pub kind: &'static str,
    /// The op id (empty for gc, reconcile, audit).
    pub op: String,
    pub hosts: Vec<String>,
    /// True for verbs that may start a command (run in its forms).
    pub runs: bool,
    pub outcome: Outcome,
    /// When its answer came (seconds since the epoch).
    pub answered_at: f64,
}

/// One line of a host's effect log.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// The command started, within this second (since the epoch, by the host's clock:
    /// namespace targets and containers share this machine's).
    Start {
        label: String,
        at: f64,
    },
    End {
        label: String,
        code: i64,
    },
}

/// How a ledger's operation stands after the operator's reconcile and resolve
/// (`list --all --json`).
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    pub ledger: usize,
    pub op: String,
    pub host: String,
    pub verdict: Option<String>,
    pub state: String,
    pub exit_code: Option<i64>,
}

/// Everything the checker judges.
#[derive(Default, Debug)]
pub struct History {
    pub invocations: Vec<Invocation>,
    /// The intent label each op id was sent with.
    pub op_label: BTreeMap<String, String>,
    /// The exit status each intent's command chooses.
    pub label_code: BTreeMap<String, i64>,
    /// The intents whose command is convergent (rerun after an interruption).
    pub convergent: BTreeSet<String>,
    /// Per (host, op id), the interrupted claims its host set aside to run it again.
    pub superseded: BTreeMap<(String, String), usize>,
    /// Per host, its effect log in order.
    pub effects: BTreeMap<String, Vec<Effect>>,
    /// The ledgers' final word per operation.
    pub settled: Vec<Settled>,
    /// `audit verify --full` per ledger: exit status and what it said when not clean.
    pub audits: BTreeMap<usize, (Option<i32>, String)>,
}

/// A broken promise: which one, and the evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

/// Verdicts that say the invocation ran nothing and the op id is not left to run (a
/// `not_applied` is retryable: see [`History::may_have_run`]).
fn ran_nothing(verdict: &str) -> bool {
    matches!(verdict, "conflict" | "blocked" | "refused")
}

/// Verdicts that say the command ran and name its true status.
fn ran(verdict: &str) -> bool {
    matches!(verdict, "completed" | "replayed")
}

impl History {
    fn starts(&self, label: &str, host: &str) -> usize {
        self.effects.get(host).map_or(0, |log| {
            log.iter()
                .filter(|e| matches!(e, Effect::Start { label: l, .. } if l == label))
                .count()
        })
    }

    /// The executions of a convergent `label` on `host` beyond one per op id that its
    /// host sanctioned: the claims of `ops` it set aside to rerun (see the module's
    /// comment). None for any other intent.
    fn reruns(&self, label: &str, host: &str, ops: Option<&BTreeSet<String>>) -> usize {
        if !self.convergent.contains(label) {
            return 0;
        }
        ops.into_iter()
            .flatten()
            .map(|op| {
                self.superseded
                    .get(&(host.to_owned(), op.clone()))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// The statuses an execution of `label` on `host` really ended with.
    fn true_statuses(&self, label: &str, host: &str) -> BTreeSet<i64> {
        let mut codes: BTreeSet<i64> = self.effects.get(host).map_or_else(BTreeSet::new, |log| {
            log.iter()
                .filter_map(|e| match e {
                    Effect::End { label: l, code } if l == label => Some(*code),
                    _ => None,
                })
                .collect()
        });
        let cancelled = self.invocations.iter().any(|i| {
            i.kind == "cancel"
                && i.hosts.iter().any(|h| h == host)
                && self.op_label.get(&i.op).is_some_and(|l| l == label)
        });
        // A command that never wrote its end line was stopped; only a cancel stops one.
        if cancelled && codes.len() < self.starts(label, host) {
            codes.extend(CANCEL_STATUSES);
        }
        codes
    }

    /// Every answer about (op, host): from invocations and from the settled ledgers.
    fn answers<'a>(&'a self, op: &'a str, host: &'a str) -> impl Iterator<Item = &'a HostAnswer> {
        self.invocations
            .iter()
            .filter(move |i| i.op == op && i.runs)
            .filter_map(|i| match &i.outcome {
                Outcome::Verdicts(v) => Some(v.iter()),
                _ => None,
            })
            .flatten()
            .filter(move |a| a.host == host)
    }

    /// Could `op` have run on `host`? Only if some invocation sent it there whose answer
    /// leaves room for a run: killed, no verdict, or a verdict other than `not_applied`
    /// and the refusals (each says that invocation ran nothing; `not_applied` is
    /// retryable, so a later invocation may still run the op id, once), and no ledger
    /// settled it as not applied (settled: nothing ran, and a fence keeps it so).
    fn may_have_run(&self, op: &str, host: &str) -> bool {
        if self
            .settled
            .iter()
            .any(|s| s.op == op && s.host == host && s.verdict.as_deref() == Some("not_applied"))
        {
            return false;
        }
        self.invocations
            .iter()
            .filter(|i| i.op == op && i.runs && i.hosts.iter().any(|h| h == host))
            .any(|i| match &i.outcome {
                Outcome::Verdicts(v) => v
                    .iter()
                    .filter(|a| a.host == host)
                    .any(|a| !ran_nothing(&a.verdict) && a.verdict != "not_applied"),
                _ => true,
            })
    }

    /// The op ids sent with `label`, and the hosts each went to.
    fn label_sends(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        let mut sends: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for i in self.invocations.iter().filter(|i| i.runs) {
            let Some(label) = self.op_label.get(&i.op) else {
                continue;
            };
            for h in &i.hosts {
                sends
                    .entry((label.clone(), h.clone()))
                    .or_default()
                    .insert(i.op.clone());
            }
        }
        sends
    }
}

/// Every broken promise in `h`, in a stable order.
pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let sends = h.label_sends();

    // At most one execution per op id and host; none for an op id answered not_applied
    // or only refused.
    let mut seen_hosts: BTreeSet<(String, String)> = BTreeSet::new();
    for (host, log) in &h.effects {
        for e in log {
            if let Effect::Start { label, .. } = e {
                seen_hosts.insert((label.clone(), host.clone()));
            }
        }
    }
    for (label, host) in &seen_hosts {
        let starts = h.starts(label, host);
        let ops = sends.get(&(label.clone(), host.clone()));
        let could: Vec<&String> = ops
            .map(|o| o.iter().filter(|op| h.may_have_run(op, host)).collect())
            .unwrap_or_default();
        let reruns = h.reruns(label, host, ops);
        if starts > could.len() + reruns {
            let mut said = Vec::new();
            for op in ops.into_iter().flatten() {
                let verdicts: Vec<&str> = h.answers(op, host).map(|a| a.verdict.as_str()).collect();
                said.push(format!("{op}: {verdicts:?}"));
            }
            // More executions than op ids sent: a double execution. Fewer, but more than
            // the op ids that could have run: one that answered "nothing ran" ran.
            let sent = ops.map_or(0, BTreeSet::len);
            out.push(Violation {
                rule: if starts > sent + reruns {
                    "at-most-once"
                } else {
                    "said-nothing-ran"
                },
                detail: format!(
                    "intent {label} ran {starts} times on {host}, but only {} of its op ids could have run there ({}){}; answers: {}",
                    could.len(),
                    could.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                    if h.convergent.contains(label) {
                        format!(", with {reruns} interrupted claim(s) set aside to rerun")
                    } else {
                        String::new()
                    },
                    said.join("; ")
                ),
            });
        }
    }

    // `not_applied` says nothing ran up to that answer. Where the op id is the only one
    // its intent was sent under on that host, and only through this ledger (another
    // ledger's attempts are not this one's to know), no execution started before it.
    for i in h.invocations.iter().filter(|i| i.runs) {
        let Outcome::Verdicts(answers) = &i.outcome else {
            continue;
        };
        let Some(label) = h.op_label.get(&i.op) else {
            continue;
        };
        let one_ledger = h
            .invocations
            .iter()
            .filter(|j| j.op == i.op && j.runs)
            .all(|j| j.ledger == i.ledger);
        for a in answers.iter().filter(|a| a.verdict == "not_applied") {
            let alone = sends
                .get(&(label.clone(), a.host.clone()))
                .is_some_and(|ops| ops.len() == 1);
            let before = h.effects.get(&a.host).map_or(0, |log| {
                log.iter()
                    // (The effect line has the second; the start was within it.)
                    .filter(|e| matches!(e, Effect::Start { label: l, at } if l == label && *at + 1.0 <= i.answered_at))
                    .count()
            });
            if one_ledger && alone && before > 0 {
                out.push(Violation {
                    rule: "said-nothing-ran",
                    detail: format!(
                        "invocation #{} ({}, agent {}) of {} on {} said not_applied, but the command had started there {before} time(s) before that answer",
                        i.seq, i.kind, i.agent, i.op, a.host
                    ),
                });
            }
        }
    }

    // A verdict that says the command ran names a real execution and its true status;
    // an unknown one claims no status.
    for i in h.invocations.iter().filter(|i| i.runs) {
        let Outcome::Verdicts(answers) = &i.outcome else {
            continue;
        };
        let Some(label) = h.op_label.get(&i.op) else {
            continue;
        };
        for a in answers {
            let where_ = format!(
                "invocation #{} ({}, agent {}) of {} on {}",
                i.seq, i.kind, i.agent, i.op, a.host
            );
            if ran(&a.verdict) {
                if h.starts(label, &a.host) == 0 {
                    out.push(Violation {
                        rule: "completed-means-ran",
                        detail: format!(
                            "{where_} said {} but the command never started there",
                            a.verdict
                        ),
                    });
                    continue;
                }
                let statuses = h.true_statuses(label, &a.host);
                let ok = a.exit_code.is_some_and(|c| statuses.contains(&c));
                if !ok {
                    out.push(Violation {
                        rule: "true-exit-status",
                        detail: format!(
                            "{where_} said {} with exit {:?}, but the command ended with {:?}",
                            a.verdict, a.exit_code, statuses
                        ),
                    });
                }
            } else if matches!(a.verdict.as_str(), "in_progress" | "indeterminate")
                && a.exit_code.is_some()
            {
                out.push(Violation {
                    rule: "unknown-claims-no-status",
                    detail: format!("{where_} said {} with exit {:?}", a.verdict, a.exit_code),
                });
            }
        }
    }

    // The ledgers' settled word agrees with the hosts.
    for s in &h.settled {
        let Some(label) = h.op_label.get(&s.op) else {
            continue;
        };
        if s.verdict.as_deref().is_some_and(ran) && s.exit_code.is_some() {
            let statuses = h.true_statuses(label, &s.host);
            if !s.exit_code.is_some_and(|c| statuses.contains(&c)) {
                out.push(Violation {
                    rule: "settled-matches-effects",
                    detail: format!(
                        "ledger {} settles {} on {} as {} ({}) exit {:?}, but the command ended with {:?}",
                        s.ledger, s.op, s.host, s.verdict.as_deref().unwrap_or("-"), s.state, s.exit_code, statuses
                    ),
                });
            }
        }
    }

    // Every answer the agents got is in their ledger.
    let recorded: BTreeSet<(usize, &str, &str)> = h
        .settled
        .iter()
        .map(|s| (s.ledger, s.op.as_str(), s.host.as_str()))
        .collect();
    for i in h.invocations.iter().filter(|i| i.runs) {
        let Outcome::Verdicts(answers) = &i.outcome else {
            continue;
        };
        for a in answers {
            // A refusal or a hold is answered before anything needs recording only when
            // the input was invalid; everything else leaves an intent at least.
            if a.reason_code.as_deref() == Some("invalid_input") {
                continue;
            }
            if !recorded.contains(&(i.ledger, i.op.as_str(), a.host.as_str())) {
                out.push(Violation {
                    rule: "no-missing-events",
                    detail: format!(
                        "invocation #{} ({}) of {} on {} answered {}, but ledger {} has no such operation",
                        i.seq, i.kind, i.op, a.host, a.verdict, i.ledger
                    ),
                });
            }
        }
    }

    for (ledger, (status, said)) in &h.audits {
        if *status != Some(0) {
            out.push(Violation {
                rule: "audit-verify-clean",
                detail: format!("audit verify --full of ledger {ledger} exited {status:?}: {said}"),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(host: &str, verdict: &str, exit: Option<i64>) -> Outcome {
        Outcome::Verdicts(vec![HostAnswer {
            host: host.into(),
            verdict: verdict.into(),
            exit_code: exit,
            reason_code: None,
        }])
    }

    fn run(seq: usize, op: &str, host: &str, outcome: Outcome) -> Invocation {
        Invocation {
            seq,
            agent: 0,
            ledger: 0,
            kind: "fresh",
            op: op.into(),
            hosts: vec![host.into()],
            runs: true,
            outcome,
            answered_at: seq as f64 * 10.0,
        }
    }

    /// One intent `I1` (exit 3) sent as op `o1` to `t1`, with the given effect lines and
    /// invocations, settled in ledger 0 as `completed` exit 3.
    fn history(effects: Vec<Effect>, invocations: Vec<Invocation>) -> History {
        let mut h = History::default();
        h.op_label.insert("o1".into(), "I1".into());
        h.label_code.insert("I1".into(), 3);
        h.effects.insert("t1".into(), effects);
        h.invocations = invocations;
        h.settled.push(Settled {
            ledger: 0,
            op: "o1".into(),
            host: "t1".into(),
            verdict: Some("completed".into()),
            state: "completed".into(),
            exit_code: Some(3),
        });
        h.audits.insert(0, (Some(0), String::new()));
        h
    }

    /// A start at time 5: after invocation 0 answered, before invocation 1 did.
    fn start() -> Effect {
        Effect::Start {
            label: "I1".into(),
            at: 5.0,
        }
    }

    fn end(code: i64) -> Effect {
        Effect::End {
            label: "I1".into(),
            code,
        }
    }

    fn rules(h: &History) -> Vec<&'static str> {
        check(h).into_iter().map(|v| v.rule).collect()
    }

    #[test]
    fn a_convergent_intent_rerun_after_its_host_set_the_interrupted_claim_aside_is_clean() {
        // The first execution ran to its end, but the full disk refused its exit record:
        // the claim read interrupted, the host set it aside, and the command ran again.
        let effects = vec![start(), end(3), start(), end(3)];
        let answers = || vec![run(0, "o1", "t1", verdict("t1", "completed", Some(3)))];
        let mut h = history(effects.clone(), answers());
        h.convergent.insert("I1".into());
        h.superseded.insert(("t1".into(), "o1".into()), 1);
        assert_eq!(rules(&h), Vec::<&str>::new());
        // The same for an append-only intent, whose claims are never rerun, is a double.
        let mut append_only = history(effects, answers());
        append_only.superseded.insert(("t1".into(), "o1".into()), 1);
        assert_eq!(rules(&append_only), vec!["at-most-once"]);
    }

    #[test]
    fn a_convergent_intent_run_twice_under_one_op_id_with_no_claim_set_aside_is_a_double_execution()
    {
        let mut h = history(
            vec![start(), start(), end(3)],
            vec![
                run(0, "o1", "t1", verdict("t1", "completed", Some(3))),
                run(1, "o1", "t1", verdict("t1", "completed", Some(3))),
            ],
        );
        h.convergent.insert("I1".into());
        let found = check(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, "at-most-once");
        assert!(
            found[0]
                .detail
                .contains("with 0 interrupted claim(s) set aside to rerun"),
            "{found:?}"
        );
    }

    #[test]
    fn a_killed_client_then_a_replay_of_one_execution_is_clean() {
        let h = history(
            vec![start(), end(3)],
            vec![
                run(0, "o1", "t1", Outcome::Killed),
                run(1, "o1", "t1", verdict("t1", "replayed", Some(3))),
            ],
        );
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn two_executions_of_one_op_id_are_a_double_execution() {
        let h = history(
            vec![start(), end(3), start(), end(3)],
            vec![
                run(0, "o1", "t1", verdict("t1", "completed", Some(3))),
                run(1, "o1", "t1", verdict("t1", "completed", Some(3))),
            ],
        );
        assert_eq!(rules(&h), vec!["at-most-once"]);
    }

    #[test]
    fn two_executions_under_two_declared_op_ids_are_allowed_but_not_three() {
        let mut h = history(
            vec![start(), end(3), start(), end(3)],
            vec![
                run(0, "o1", "t1", verdict("t1", "completed", Some(3))),
                run(1, "o2", "t1", verdict("t1", "completed", Some(3))),
            ],
        );
        h.op_label.insert("o2".into(), "I1".into());
        h.settled.push(Settled {
            op: "o2".into(),
            ..h.settled[0].clone()
        });
        assert_eq!(check(&h), vec![]);
        h.effects.get_mut("t1").unwrap().extend([start(), end(3)]);
        assert_eq!(rules(&h), vec!["at-most-once"]);
    }

    #[test]
    fn not_applied_then_a_rerun_that_runs_the_op_id_once_is_clean() {
        // not_applied is retryable: the same op id may run later, once.
        let h = history(
            vec![start(), end(3)],
            vec![
                run(0, "o1", "t1", verdict("t1", "not_applied", None)),
                run(1, "o1", "t1", verdict("t1", "completed", Some(3))),
            ],
        );
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn not_applied_after_the_command_had_started_is_caught() {
        let h = history(
            vec![start(), end(3)],
            vec![
                run(0, "o1", "t1", Outcome::Killed),
                run(1, "o1", "t1", verdict("t1", "not_applied", None)),
            ],
        );
        assert_eq!(rules(&h), vec!["said-nothing-ran"]);
    }

    #[test]
    fn a_ledger_that_settles_not_applied_for_a_command_that_ran_is_caught() {
        let mut h = history(
            vec![start(), end(3)],
            vec![run(0, "o1", "t1", Outcome::Killed)],
        );
        h.settled[0].verdict = Some("not_applied".into());
        h.settled[0].exit_code = None;
        assert_eq!(rules(&h), vec!["said-nothing-ran"]);
    }

    #[test]
    fn a_refused_or_blocked_invocation_that_ran_is_caught() {
        for said in ["blocked", "conflict", "refused"] {
            let h = history(
                vec![start(), end(3)],
                vec![run(0, "o1", "t1", verdict("t1", said, None))],
            );
            assert_eq!(rules(&h), vec!["said-nothing-ran"], "{said}");
        }
    }

    #[test]
    fn completed_with_another_status_or_without_an_execution_is_caught() {
        let wrong = history(
            vec![start(), end(3)],
            vec![run(0, "o1", "t1", verdict("t1", "completed", Some(0)))],
        );
        assert_eq!(rules(&wrong), vec!["true-exit-status"]);
        let never = history(
            vec![],
            vec![run(0, "o1", "t1", verdict("t1", "replayed", Some(3)))],
        );
        // The ledger settled it as completed too: that is the second finding.
        assert_eq!(
            rules(&never),
            vec!["completed-means-ran", "settled-matches-effects"]
        );
    }

    #[test]
    fn a_cancelled_command_reports_the_signal_status_only_after_a_cancel() {
        let mut cancel = run(1, "o1", "t1", Outcome::Done { status: Some(0) });
        cancel.kind = "cancel";
        cancel.runs = false;
        let mut h = history(
            vec![start()],
            vec![
                run(0, "o1", "t1", verdict("t1", "in_progress", None)),
                cancel,
                run(2, "o1", "t1", verdict("t1", "replayed", Some(143))),
            ],
        );
        h.settled[0].exit_code = Some(143);
        assert_eq!(check(&h), vec![]);
        h.invocations.remove(1);
        assert_eq!(
            rules(&h),
            vec!["true-exit-status", "settled-matches-effects"]
        );
    }

    #[test]
    fn an_unknown_outcome_that_names_a_status_is_caught() {
        let h = history(
            vec![start(), end(3)],
            vec![run(0, "o1", "t1", verdict("t1", "indeterminate", Some(3)))],
        );
        assert_eq!(rules(&h), vec!["unknown-claims-no-status"]);
    }

    #[test]
    fn an_answer_the_ledger_does_not_hold_and_a_dirty_audit_are_caught() {
        let mut h = history(
            vec![start(), end(3)],
            vec![run(0, "o1", "t1", verdict("t1", "completed", Some(3)))],
        );
        h.settled.clear();
        h.audits.insert(1, (Some(1), "event 7 edited".into()));
        assert_eq!(rules(&h), vec!["no-missing-events", "audit-verify-clean"]);
    }
}
