//! Reconcile: probe the hosts of unresolved operations and settle what the evidence
//! settles (docs/decisions.md#reconcile). Host work runs concurrently (one connection per host,
//! a bounded number of hosts at once), and each host's findings are recorded as soon as
//! that host answers, so a slow or dead host holds up no other host's records (see
//! docs/decisions.md#fleets); the decisions are made by [`settle`], a pure
//! function of the operation's events and what its host said, so they can be tested
//! without a host.
//!
//! What each piece of evidence decides:
//!
//! | evidence | decision | settles |
//! |---|---|---|
//! | no attempt was ever dispatched | `not_applied` (host not contacted) | yes |
//! | marker completed by one of our attempts | `completed` (exit code in the detail) | yes |
//! | marker completed by an attempt this ledger never made | `foreign_attempt_needs_decision` | no |
//! | marker running | `still_running` | no |
//! | marker interrupted | `interrupted_needs_decision` | no |
//! | marker fenced | `fenced` | yes |
//! | marker absent, nothing of ours ever reached it | fence it, then `not_applied` | yes |
//! | marker absent, but an attempt of ours had reached it | `marker_missing_needs_decision` | no |
//! | host unreachable | nothing but a `Probed{state: unreachable}` | no |
//! | host presents another key than the operation ran against | `host_changed`: no probe, no fence | no |
//! | same key, another user, or a marker root with another id (docs/guarantees.md#evidence-identity) | `host_changed`: no probe, no fence | no |
//!
//! Each operation's host is reached the way its attempts reached it (the recorded
//! route, docs/guarantees.md#host-identity) unless the caller overrides it, and every connection is held
//! to the host key the operation ran against before anything is probed or fenced.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::host::{
    CallError, Changed, ConnectError, Destination, Host, MarkerInfo, MarkerState, Refusal,
    RefusalReason,
};
use crate::ledger::{
    Decision, Durability, Event, History, Ledger, LedgerError, OpKey, OpState, OperationRecord,
    ProbeState, StoredEvent, UnlessSettledSince,
};
use crate::op_id::OpId;

use super::identity::{self, Recorded};

/// Hosts worked on at once: as `run --forks` by default. A dead host holds one slot for
/// its connect timeout; with few slots a handful of dead hosts would stall the rest.
pub const HOST_CONCURRENCY: usize = 32;
/// Shim calls in flight at once on one host's connection.
pub const CALLS_PER_HOST: usize = 4;

/// One operation to reconcile: its projection row and its events.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The projection row.
    pub record: OperationRecord,
    /// Its events, in order.
    pub events: Vec<StoredEvent>,
}

/// What the host said about one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// The host was not contacted: no attempt was ever dispatched.
    NotContacted,
    /// The host could not be reached, or the probe's reply was lost.
    Unreachable(String),
    /// The host presents another host key than the operation ran against: another
    /// machine. Nothing was probed or fenced there.
    KeyMismatch(String),
    /// The same machine, but another user or a marker root with another id than the
    /// operation's attempts reached (docs/guarantees.md#evidence-identity): another store of evidence. The shim refused
    /// before acting, or nothing was sent.
    HostChanged(String),
    /// The shim refused the probe (or the fence) before acting; read by the host job
    /// into one of the others, never settled on.
    Refused(Box<Refusal>),
    /// The probe's answer, and what fencing did when the marker was absent.
    Marker {
        /// The probe answer.
        probe: Box<MarkerInfo>,
        /// The fence, when one was tried.
        fence: Option<FenceResult>,
    },
}

/// The outcome of fencing an absent marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceResult {
    /// This call fenced it (or found it fenced already).
    Fenced(MarkerInfo),
    /// The marker was claimed between the probe and the fence: what the fence found.
    Claimed(MarkerInfo),
    /// The fence did not happen (lost reply, unusable marker root).
    Failed(String),
}

/// One row of the reconcile report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Operation id.
    pub op_id: String,
    /// Host as the ledger names it.
    pub host: String,
    /// The operation's state before reconcile (the projection's `state`).
    pub before: OpState,
    /// What the host said, in one line.
    pub evidence: String,
    /// The decision recorded (or, when nothing was decided, why: `host_unreachable`).
    pub decision: Decision,
    /// Whether the decision settles the operation.
    pub settled: bool,
    /// The recorded exit code, when the marker holds one.
    pub exit_code: Option<i32>,
    /// The marker root id the operation's attempts reached (docs/guarantees.md#evidence-identity), when recorded.
    pub root_id: Option<String>,
    /// Why, in words for people (also the `Reconciled` event's detail).
    pub detail: String,
}

/// What [`settle`] decided: the events to append and the report row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// Events to append, in order, in one transaction.
    pub events: Vec<Event>,
    /// The report row.
    pub outcome: Outcome,
}

/// Whether reconcile should fence this operation's marker if the probe finds it absent.
pub fn fence_if_absent(events: &[StoredEvent]) -> bool {
    let h = History::of(events);
    h.dispatched() && !h.claim_seen
}

/// Whether the host must be contacted at all (some attempt was dispatched).
pub fn needs_host(events: &[StoredEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e.event, Event::AttemptDispatched { .. }))
}

/// Decides what `evidence` settles for `candidate`. Pure: no I/O.
pub fn settle(candidate: &Candidate, evidence: &Evidence) -> Settlement {
    let rec = &candidate.record;
    let h = History::of(&candidate.events);
    let mut outcome = Outcome {
        op_id: rec.op_id.clone(),
        host: rec.host.clone(),
        before: rec.state.clone(),
        evidence: String::new(),
        decision: Decision::Other(String::new()),
        settled: false,
        exit_code: None,
        root_id: identity::recorded(&candidate.events)
            .root()
            .map(str::to_owned),
        detail: String::new(),
    };
    let mut events = Vec::new();
    let last_attempt = h.last_attempt().map(str::to_owned);
    let probed = |m: &MarkerInfo, what: &str| Event::Probed {
        attempt_id: last_attempt.clone(),
        state: m.state.into(),
        exit_code: m.exit_code,
        detail: format!("opmark reconcile {what}: {}", m.summary()),
        claim: super::record::claim_seen(m),
    };
    match evidence {
        Evidence::NotContacted => {
            outcome.evidence = "no attempt was ever dispatched".into();
            decide(
                &mut outcome,
                &mut events,
                Decision::NotApplied,
                "the intent was recorded but no attempt was ever dispatched: nothing left this machine, so nothing can have run".into(),
            );
        }
        Evidence::Unreachable(_) | Evidence::Refused(_) => {
            let why = match evidence {
                Evidence::Refused(r) => format!("the shim refused the probe ({})", r.reason),
                Evidence::Unreachable(why) => why.clone(),
                _ => String::new(),
            };
            outcome.evidence = format!("host unreachable: {why}");
            outcome.decision = Decision::HostUnreachable;
            outcome.detail = "left open; run `opmark reconcile` again when the host is back".into();
            events.push(Event::Probed {
                attempt_id: last_attempt.clone(),
                state: ProbeState::Unreachable,
                exit_code: None,
                detail: format!("opmark reconcile: {why}"),
                claim: None,
            });
        }
        Evidence::KeyMismatch(why) => {
            outcome.evidence = "host key mismatch: not probed".into();
            decide(
                &mut outcome,
                &mut events,
                Decision::HostChanged,
                why.clone(),
            );
        }
        Evidence::HostChanged(why) => {
            outcome.evidence = "host changed: not probed".into();
            decide(
                &mut outcome,
                &mut events,
                Decision::HostChanged,
                why.clone(),
            );
        }
        Evidence::Marker { probe, fence } => {
            events.push(probed(probe, "probe"));
            outcome.evidence = probe.summary();
            match (probe.state, fence) {
                (MarkerState::Absent, Some(FenceResult::Fenced(m))) => {
                    events.push(Event::Fenced {
                        detail: format!(
                            "opmark reconcile fenced the absent marker{}: a delayed attempt can never run",
                            m.fields
                                .get("fenced_at")
                                .map(|t| format!(" (at {})", unix_utc(t)))
                                .unwrap_or_default()
                        ),
                    });
                    outcome.evidence = "absent; fenced".into();
                    decide(
                        &mut outcome,
                        &mut events,
                        Decision::NotApplied,
                        "no marker on the host: the dispatched attempt never claimed it, and the op id is now fenced so it never can".into(),
                    );
                }
                (MarkerState::Absent, Some(FenceResult::Claimed(m))) => {
                    events.push(probed(m, "fence found the marker claimed"));
                    outcome.evidence = format!("absent, then claimed: {}", m.summary());
                    by_marker(&mut outcome, &mut events, &h, m);
                }
                (MarkerState::Absent, Some(FenceResult::Failed(why))) => {
                    outcome.evidence = format!("absent; fence failed: {why}");
                    decide(
                        &mut outcome,
                        &mut events,
                        Decision::AbsentFenceFailed,
                        format!("no marker yet, but fencing failed ({why}); a delayed attempt could still arrive, so this stays open"),
                    );
                }
                (MarkerState::Absent, None) => {
                    let detail = if !h.dispatched() {
                        "no marker and no attempt recorded".to_owned()
                    } else {
                        "no marker on the host, but an attempt of this operation had reached it (started, exit or a refusal about its marker): the evidence was removed (gc, or another marker root). Decide with `opmark resolve`".to_owned()
                    };
                    decide(
                        &mut outcome,
                        &mut events,
                        Decision::MarkerMissingNeedsDecision,
                        detail,
                    );
                }
                _ => by_marker(&mut outcome, &mut events, &h, probe),
            }
        }
    }
    Settlement { events, outcome }
}

/// Decision for a marker that exists (running, completed, interrupted, fenced).
fn by_marker(outcome: &mut Outcome, events: &mut Vec<Event>, h: &History, m: &MarkerInfo) {
    let holder = m.attempt.clone().unwrap_or_else(|| "?".into());
    let ours = m.attempt.as_ref().is_some_and(|a| h.is_ours(a));
    match m.state {
        MarkerState::Completed if ours => {
            outcome.exit_code = m.exit_code;
            let code = m
                .exit_code
                .map_or_else(|| "unknown".to_owned(), |c| c.to_string());
            decide(
                outcome,
                events,
                Decision::Completed,
                format!(
                    "the host recorded exit {code}{} for attempt {holder}{}",
                    if m.timed_out { " (timed out)" } else { "" },
                    m.fields
                        .get("ended_at")
                        .map(|t| format!(" (ended {})", unix_utc(t)))
                        .unwrap_or_default()
                ),
            );
        }
        MarkerState::Completed => {
            outcome.exit_code = m.exit_code;
            decide(
                outcome,
                events,
                Decision::ForeignAttemptNeedsDecision,
                format!("the marker was completed by attempt {holder}, which this ledger never made (another installation used this op id); compare with the other client, then `opmark resolve`"),
            );
        }
        MarkerState::Running => decide(
            outcome,
            events,
            Decision::StillRunning,
            format!(
                "attempt {holder}{} holds the claim and is running; reconcile again later",
                if ours { "" } else { " (not from this ledger)" }
            ),
        ),
        MarkerState::Interrupted => decide(
            outcome,
            events,
            Decision::InterruptedNeedsDecision,
            format!(
                "attempt {holder} claimed the marker but its process is gone without an exit record ({}); it may have had effects. Check the host, then `opmark resolve --as applied|not-applied|abandoned`",
                m.why.as_deref().unwrap_or("unknown")
            ),
        ),
        // A fence over a started command closed the op id but settled nothing about
        // its effects: a human says what happened.
        MarkerState::Fenced if m.started_before_fence() => decide(
            outcome,
            events,
            Decision::InterruptedNeedsDecision,
            format!(
                "the marker is fenced, but attempt {holder}'s command had started before the fence; it may have had effects and nothing more can run under this op id. Check the host, then `opmark resolve --as applied|abandoned`"
            ),
        ),
        MarkerState::Fenced => decide(
            outcome,
            events,
            Decision::Fenced,
            "the marker is fenced: nothing ran under this op id after the fence, and nothing can".into(),
        ),
        MarkerState::Absent => decide(
            outcome,
            events,
            Decision::MarkerMissingNeedsDecision,
            "no marker on the host".into(),
        ),
    }
}

fn decide(outcome: &mut Outcome, events: &mut Vec<Event>, decision: Decision, detail: String) {
    outcome.settled = decision.settles();
    outcome.decision = decision.clone();
    outcome.detail = detail.clone();
    events.push(Event::Reconciled { decision, detail });
}

/// A marker's unix-time field as `2024-05-01 10:00:00 UTC` (as sent when unreadable).
pub fn unix_utc(t: &str) -> String {
    t.parse::<i64>()
        .ok()
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .and_then(|d| {
            d.format(time::macros::format_description!(
                "[year]-[month]-[day] [hour]:[minute]:[second] UTC"
            ))
            .ok()
        })
        .unwrap_or_else(|| t.to_owned())
}

/// One operation's share of a host's work: its index, op id, whether to fence an
/// absent marker, and the host identity its events record.
type HostOp = (usize, OpId, bool, Recorded);

/// One way of reaching one host, and the operations to examine there.
type HostWork = (Result<Destination, ConnectError>, Vec<HostOp>);

/// Why a reconcile stopped before every candidate was recorded (what was recorded until
/// then stays recorded). Converted to the CLI's error at the edge (`ops`).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The ledger failed an append or a read.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A candidate's op id does not parse: a ledger edited outside opmark.
    #[error("the ledger holds an invalid op id: {0}")]
    InvalidOpId(String),
    /// A host's task panicked or was cancelled.
    #[error("a reconcile task failed: {0}")]
    Task(String),
}

/// Reconciles `candidates`: contacts their hosts (reached by `resolve`, given the
/// candidate and the route its events record), records what the evidence settles, and
/// returns one row each, in the order given. `progress` is told (operations recorded,
/// operations in all) each time a host's findings are recorded.
pub async fn reconcile(
    ledger: &mut Ledger,
    candidates: Vec<Candidate>,
    resolve: impl Fn(&Candidate, Option<&crate::ssh::Route>) -> Result<Destination, ConnectError>,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Outcome>, ReconcileError> {
    // Group by host and route: one connection per way of reaching a host, hosts in
    // parallel.
    let mut by_host: BTreeMap<(String, String), HostWork> = BTreeMap::new();
    let mut outcomes: Vec<Option<Outcome>> = (0..candidates.len()).map(|_| None).collect();
    // Settles one operation and records it at once.
    let record =
        |ledger: &mut Ledger, i: usize, ev: &Evidence| -> Result<Outcome, ReconcileError> {
            let c = &candidates[i];
            let s = settle(c, ev);
            let key = OpKey::new(c.record.op_id.clone(), c.record.host.clone());
            // Conditional: another reconcile or an operator (on any machine sharing this
            // ledger) may have settled it since the candidates were read.
            let since = Some(UnlessSettledSince(c.record.last_seq));
            match ledger.append_if(&key, &s.events, Durability::Normal, since) {
                Ok(_) => Ok(s.outcome),
                Err(e @ LedgerError::AlreadySettled(_)) => Ok(Outcome {
                    decision: Decision::AlreadySettled,
                    settled: true,
                    detail: e.to_string(),
                    ..s.outcome
                }),
                Err(e) => Err(e.into()),
            }
        };
    for (i, c) in candidates.iter().enumerate() {
        if !needs_host(&c.events) {
            outcomes[i] = Some(record(ledger, i, &Evidence::NotContacted)?);
            continue;
        }
        let op =
            OpId::parse(&c.record.op_id).map_err(|e| ReconcileError::InvalidOpId(e.to_string()))?;
        let recorded = identity::recorded(&c.events);
        let dest = resolve(c, recorded.route.as_ref());
        let via = dest
            .as_ref()
            .map_or_else(|e| e.to_string(), Destination::connection_key);
        by_host
            .entry((c.record.host.clone(), via))
            .or_insert_with(|| (dest, Vec::new()))
            .1
            .push((i, op, fence_if_absent(&c.events), recorded));
    }
    // The shim-call futures are not `Send` (their observer is a `dyn` borrow), so the
    // host work runs as local tasks: concurrent on this thread, which is all I/O needs.
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let hosts = Arc::new(tokio::sync::Semaphore::new(HOST_CONCURRENCY));
            let mut tasks = tokio::task::JoinSet::new();
            for ((host, _), (dest, ops)) in by_host {
                let hosts = Arc::clone(&hosts);
                tasks.spawn_local(async move {
                    let _permit = hosts.acquire_owned().await;
                    host_job(&host, dest, ops).await
                });
            }
            while let Some(done) = tasks.join_next().await {
                let found = done.map_err(|e| ReconcileError::Task(e.to_string()))?;
                for (i, ev) in found {
                    outcomes[i] = Some(record(ledger, i, &ev)?);
                }
                progress(
                    outcomes.iter().filter(|o| o.is_some()).count(),
                    candidates.len(),
                );
            }
            Ok::<(), ReconcileError>(())
        })
        .await?;
    let mut rows = Vec::with_capacity(candidates.len());
    for (i, outcome) in outcomes.into_iter().enumerate() {
        rows.push(match outcome {
            Some(o) => o,
            None => record(ledger, i, &Evidence::Unreachable("no answer".into()))?,
        });
    }
    Ok(rows)
}

/// Probes (and fences when due) every operation of one host over one connection, each
/// only after the host key matched the one that operation ran against.
async fn host_job(
    host: &str,
    dest: Result<Destination, ConnectError>,
    ops: Vec<HostOp>,
) -> Vec<(usize, Evidence)> {
    let route = dest.as_ref().ok().map(Destination::route);
    let session = match dest {
        Ok(d) => Host::connect(&d).await,
        Err(e) => Err(e),
    };
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            return ops
                .into_iter()
                .map(|(i, ..)| (i, Evidence::Unreachable(e.to_string())))
                .collect()
        }
    };
    let seen = session.host_key();
    let calls = Arc::new(tokio::sync::Semaphore::new(CALLS_PER_HOST));
    let mut tasks = tokio::task::JoinSet::new();
    let mut out = Vec::new();
    for (i, op, fence, recorded) in ops {
        match recorded.check(host, op.as_str(), seen.as_deref(), route.as_ref()) {
            Ok(()) => {}
            Err(Changed::Key(why)) => {
                out.push((i, Evidence::KeyMismatch(why)));
                continue;
            }
            Err(Changed::Other(why)) => {
                out.push((i, Evidence::HostChanged(why)));
                continue;
            }
        }
        // Every call for the operation names the marker root its attempts reached.
        let session = session.expecting_root(recorded.root());
        let calls = Arc::clone(&calls);
        let host = host.to_owned();
        tasks.spawn_local(async move {
            let _permit = calls.acquire_owned().await;
            let found = examine(&session, &op, fence).await;
            let found = read_refusal(found, |r| recorded.root_changed(&host, op.as_str(), r));
            (i, found)
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok(found) = done {
            out.push(found);
        }
    }
    out
}

/// What a refusal of the probe or the fence means for reconcile: a marker root with
/// another id than the attempts reached is another store of evidence (`root_changed`
/// says which, in words); any other refusal leaves the host unread. Other evidence
/// passes unchanged.
fn read_refusal(found: Evidence, root_changed: impl FnOnce(&Refusal) -> String) -> Evidence {
    match found {
        Evidence::Refused(r) if r.reason == RefusalReason::RootChanged => {
            Evidence::HostChanged(root_changed(&r))
        }
        Evidence::Refused(r) => {
            Evidence::Unreachable(format!("the shim refused the probe ({})", r.reason))
        }
        other => other,
    }
}

/// What a probe's answer leads to: evidence, or a fence of the absent marker.
#[derive(Debug, PartialEq)]
enum AfterProbe {
    Evidence(Evidence),
    /// The marker is absent and fencing it is safe: fence, then [`after_fence`].
    Fence(MarkerInfo),
}

/// Reads the probe's answer; `fence` says whether an absent marker is to be fenced
/// ([`fence_if_absent`]).
fn after_probe(answer: Result<MarkerInfo, CallError>, fence: bool) -> AfterProbe {
    let probe = match answer {
        Ok(m) => m,
        Err(CallError::Refused(r)) => return AfterProbe::Evidence(Evidence::Refused(r)),
        Err(CallError::NoAnswer(_)) => {
            return AfterProbe::Evidence(Evidence::Unreachable(
                "the shim answered without a probe frame".into(),
            ))
        }
        Err(e) => return AfterProbe::Evidence(Evidence::Unreachable(e.to_string())),
    };
    if probe.state != MarkerState::Absent || !fence {
        return AfterProbe::Evidence(Evidence::Marker {
            probe: Box::new(probe),
            fence: None,
        });
    }
    AfterProbe::Fence(probe)
}

/// Reads the fence's answer after `probe` found the marker absent. A refusal that shows
/// a marker claimed since is what the fence found; a root of another id is refused
/// evidence ([`read_refusal`]); anything else is a fence that did not happen.
fn after_fence(probe: MarkerInfo, answer: Result<MarkerInfo, CallError>) -> Evidence {
    let result = match answer {
        Ok(fenced) => FenceResult::Fenced(fenced),
        Err(CallError::Refused(r)) if r.reason == RefusalReason::RootChanged => {
            return Evidence::Refused(r)
        }
        Err(CallError::Refused(r)) => match r.marker {
            Some(m) if m.state != MarkerState::Absent => FenceResult::Claimed(m),
            _ => FenceResult::Failed(format!("the shim refused to fence ({})", r.reason)),
        },
        Err(CallError::NoAnswer(_)) => FenceResult::Failed("no fence answer".into()),
        Err(e) => FenceResult::Failed(e.to_string()),
    };
    Evidence::Marker {
        probe: Box::new(probe),
        fence: Some(result),
    }
}

/// Probe one marker; fence it when it is absent and `fence` says that is safe.
async fn examine(session: &Host, op: &OpId, fence: bool) -> Evidence {
    match after_probe(session.probe(op).await, fence) {
        AfterProbe::Evidence(found) => found,
        AfterProbe::Fence(probe) => {
            let answer = session.fence(op, false).await.map(|f| f.marker);
            after_fence(probe, answer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::Family;
    use crate::vocab::{Boundary, RetryReason};

    fn stored(seq: u64, event: Event) -> StoredEvent {
        StoredEvent {
            seq,
            op_id: "op1".into(),
            host: "h".into(),
            at: "2024-01-01T00:00:00.000000Z".into(),
            event,
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    fn candidate(boundary: Option<Boundary>) -> Candidate {
        let mut events = vec![stored(
            1,
            Event::Intended {
                session: "s".into(),
                family: Family::Destructive,
                display: "x".into(),
                fingerprint: "f".into(),
                rule: "r".into(),
                secrets: Vec::new(),
                become_user: None,
                locks: Vec::new(),
            },
        )];
        if let Some(b) = boundary {
            events.push(stored(
                2,
                Event::AttemptDispatched {
                    attempt_id: "at-1".into(),
                    number: 1,
                    parent: None,
                    reason: RetryReason::FirstAttempt,
                },
            ));
            events.push(stored(
                3,
                Event::BoundaryReached {
                    attempt_id: "at-1".into(),
                    boundary: b,
                    detail: "x".into(),
                    refusal: None,
                },
            ));
        }
        Candidate {
            record: OperationRecord {
                op_id: "op1".into(),
                host: "h".into(),
                family: Family::Destructive,
                display: "x".into(),
                fingerprint: "f".into(),
                rule: "r".into(),
                session: "s".into(),
                state: OpState::Boundary(Boundary::Started),
                verdict: None,
                exit_code: None,
                attempts: 1,
                last_attempt: Some("at-1".into()),
                unresolved: true,
                created_at: String::new(),
                updated_at: String::new(),
                first_seq: 1,
                last_seq: 3,
                contradictions: 0,
                settled_attempt: None,
                executed: false,
            },
            events,
        }
    }

    fn marker(state: MarkerState, attempt: Option<&str>, code: Option<i32>) -> MarkerInfo {
        MarkerInfo {
            state,
            why: None,
            attempt: attempt.map(str::to_owned),
            fingerprint: None,
            family: None,
            exit_code: code,
            timed_out: false,
            out_bytes: None,
            err_bytes: None,
            fields: BTreeMap::new(),
        }
    }

    fn refusal(reason: &str, marker: Option<MarkerInfo>) -> Box<Refusal> {
        Box::new(Refusal {
            reason: RefusalReason::parse(reason).expect("a shim word"),
            replay: false,
            marker,
            fields: BTreeMap::new(),
        })
    }

    #[test]
    fn a_refusal_for_another_marker_root_reads_as_host_changed_and_any_other_as_unreachable() {
        let other_root = Evidence::Refused(refusal("root_changed", None));
        assert_eq!(
            read_refusal(other_root, |r| format!("host changed ({})", r.reason)),
            Evidence::HostChanged("host changed (root_changed)".into())
        );
        let bad_args = Evidence::Refused(refusal("bad_args", None));
        assert_eq!(
            read_refusal(bad_args, |_| unreachable!("not a root of another id")),
            Evidence::Unreachable("the shim refused the probe (bad_args)".into())
        );
        let found = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Running, Some("a1"), None)),
            fence: None,
        };
        assert_eq!(
            read_refusal(found.clone(), |_| unreachable!("no refusal")),
            found
        );
    }

    #[test]
    fn a_probe_leads_to_a_fence_only_for_an_absent_marker_and_only_when_fencing_is_safe() {
        let absent = marker(MarkerState::Absent, None, None);
        let running = marker(MarkerState::Running, Some("a1"), None);
        assert_eq!(
            after_probe(Ok(absent.clone()), true),
            AfterProbe::Fence(absent.clone())
        );
        for (answer, fence) in [(absent, false), (running, true)] {
            assert_eq!(
                after_probe(Ok(answer.clone()), fence),
                AfterProbe::Evidence(Evidence::Marker {
                    probe: Box::new(answer),
                    fence: None
                })
            );
        }
        let r = refusal("bad_args", None);
        assert_eq!(
            after_probe(Err(CallError::Refused(r.clone())), true),
            AfterProbe::Evidence(Evidence::Refused(r))
        );
        assert_eq!(
            after_probe(Err(CallError::NoAnswer("probe")), true),
            AfterProbe::Evidence(Evidence::Unreachable(
                "the shim answered without a probe frame".into()
            ))
        );
        assert_eq!(
            after_probe(Err(CallError::NotSent("connection closed".into())), true),
            AfterProbe::Evidence(Evidence::Unreachable("connection closed".into()))
        );
    }

    #[test]
    fn a_fence_refused_over_a_marker_claimed_since_reports_that_marker_and_another_root_is_refused_evidence(
    ) {
        let absent = marker(MarkerState::Absent, None, None);
        let fenced = marker(MarkerState::Fenced, None, None);
        let claimed = marker(MarkerState::Running, Some("a2"), None);
        let with = |fence: FenceResult| Evidence::Marker {
            probe: Box::new(absent.clone()),
            fence: Some(fence),
        };
        assert_eq!(
            after_fence(absent.clone(), Ok(fenced.clone())),
            with(FenceResult::Fenced(fenced))
        );
        let busy = refusal("running", Some(claimed.clone()));
        assert_eq!(
            after_fence(absent.clone(), Err(CallError::Refused(busy))),
            with(FenceResult::Claimed(claimed))
        );
        for shown in [Some(absent.clone()), None] {
            let refused = refusal("bad_args", shown);
            assert_eq!(
                after_fence(absent.clone(), Err(CallError::Refused(refused))),
                with(FenceResult::Failed(
                    "the shim refused to fence (bad_args)".into()
                ))
            );
        }
        let other_root = refusal("root_changed", None);
        assert_eq!(
            after_fence(absent.clone(), Err(CallError::Refused(other_root.clone()))),
            Evidence::Refused(other_root)
        );
        assert_eq!(
            after_fence(absent.clone(), Err(CallError::NoAnswer("fence"))),
            with(FenceResult::Failed("no fence answer".into()))
        );
        assert_eq!(
            after_fence(absent.clone(), Err(CallError::NotSent("gone".into()))),
            with(FenceResult::Failed("gone".into()))
        );
    }

    fn decision(s: &Settlement) -> &str {
        s.outcome.decision.as_str()
    }

    #[test]
    fn intent_without_attempt_closes_not_applied_without_the_host() {
        let c = candidate(None);
        assert!(!needs_host(&c.events));
        let s = settle(&c, &Evidence::NotContacted);
        assert_eq!(decision(&s), "not_applied");
        assert!(s.outcome.settled);
    }

    #[test]
    fn completed_by_our_attempt_settles_with_its_exit_code() {
        let c = candidate(Some(Boundary::Started));
        let ev = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Completed, Some("at-1"), Some(5))),
            fence: None,
        };
        let s = settle(&c, &ev);
        assert_eq!(decision(&s), "completed");
        assert_eq!(s.outcome.exit_code, Some(5));
        assert!(s.outcome.detail.contains("exit 5"));
        assert!(matches!(
            s.events[0],
            Event::Probed {
                exit_code: Some(5),
                ..
            }
        ));
    }

    #[test]
    fn completed_by_a_foreign_attempt_is_not_claimed() {
        let c = candidate(Some(Boundary::SentNoResponse));
        let ev = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Completed, Some("at-other"), Some(0))),
            fence: None,
        };
        let s = settle(&c, &ev);
        assert_eq!(decision(&s), "foreign_attempt_needs_decision");
        assert!(!s.outcome.settled);
    }

    #[test]
    fn absent_after_sent_no_response_is_fenced_then_not_applied() {
        let c = candidate(Some(Boundary::SentNoResponse));
        assert!(fence_if_absent(&c.events));
        let ev = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Absent, None, None)),
            fence: Some(FenceResult::Fenced(marker(MarkerState::Fenced, None, None))),
        };
        let s = settle(&c, &ev);
        assert_eq!(decision(&s), "not_applied");
        assert!(s.events.iter().any(|e| matches!(e, Event::Fenced { .. })));
    }

    #[test]
    fn absent_after_started_is_missing_evidence_not_proof() {
        let c = candidate(Some(Boundary::Started));
        assert!(!fence_if_absent(&c.events));
        let ev = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Absent, None, None)),
            fence: None,
        };
        let s = settle(&c, &ev);
        assert_eq!(decision(&s), "marker_missing_needs_decision");
        assert!(!s.outcome.settled);
    }

    #[test]
    fn claimed_between_probe_and_fence_settles_by_what_the_fence_found() {
        let c = candidate(Some(Boundary::SentNoResponse));
        let ev = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Absent, None, None)),
            fence: Some(FenceResult::Claimed(marker(
                MarkerState::Running,
                Some("at-1"),
                None,
            ))),
        };
        let s = settle(&c, &ev);
        assert_eq!(decision(&s), "still_running");
        assert!(!s.events.iter().any(|e| matches!(e, Event::Fenced { .. })));
    }

    #[test]
    fn another_host_key_is_neither_probed_nor_fenced_and_stays_open() {
        let c = candidate(Some(Boundary::SentNoResponse));
        let s = settle(
            &c,
            &Evidence::KeyMismatch("host key for h is now SHA256:b".into()),
        );
        assert_eq!(decision(&s), "host_changed");
        assert!(!s.outcome.settled);
        assert!(!s
            .events
            .iter()
            .any(|e| matches!(e, Event::Fenced { .. } | Event::Probed { .. })));
    }

    #[test]
    fn running_interrupted_and_unreachable_stay_open() {
        let c = candidate(Some(Boundary::Started));
        for (state, want) in [
            (MarkerState::Running, "still_running"),
            (MarkerState::Interrupted, "interrupted_needs_decision"),
        ] {
            let s = settle(
                &c,
                &Evidence::Marker {
                    probe: Box::new(marker(state, Some("at-1"), None)),
                    fence: None,
                },
            );
            assert_eq!(decision(&s), want);
            assert!(!s.outcome.settled);
        }
        let s = settle(&c, &Evidence::Unreachable("connect failed".into()));
        assert!(!s.outcome.settled);
        assert_eq!(s.events.len(), 1);
        assert!(
            matches!(&s.events[0], Event::Probed { state, .. } if *state == ProbeState::Unreachable)
        );
        let s = settle(
            &c,
            &Evidence::Marker {
                probe: Box::new(marker(MarkerState::Fenced, None, None)),
                fence: None,
            },
        );
        assert_eq!(decision(&s), "fenced");
        assert!(s.outcome.settled);
        // Fenced after its command had started: closed, but its effects are unknown.
        let mut started = marker(MarkerState::Fenced, Some("at-1"), None);
        started.fields.insert("command_started".into(), "1".into());
        let s = settle(
            &c,
            &Evidence::Marker {
                probe: Box::new(started),
                fence: None,
            },
        );
        assert_eq!(decision(&s), "interrupted_needs_decision");
        assert!(!s.outcome.settled);
    }

    // --- mutation testing (docs/claims.md#mutation-testing): rows the tests above left open ---

    #[test]
    fn an_attempt_that_left_needs_its_host_and_an_intent_alone_does_not() {
        assert!(needs_host(
            &candidate(Some(Boundary::SentNoResponse)).events
        ));
        assert!(needs_host(&candidate(Some(Boundary::Started)).events));
        assert!(!needs_host(&candidate(None).events));
    }

    #[test]
    fn a_refused_or_unreachable_probe_says_why_and_leaves_the_operation_open() {
        let c = candidate(Some(Boundary::SentNoResponse));
        let refused = Refusal {
            reason: RefusalReason::parse("bad_args").expect("a shim word"),
            replay: false,
            marker: None,
            fields: BTreeMap::new(),
        };
        for (evidence, why) in [
            (
                Evidence::Refused(Box::new(refused)),
                "the shim refused the probe (bad_args)",
            ),
            (
                Evidence::Unreachable("connect failed".into()),
                "connect failed",
            ),
        ] {
            let s = settle(&c, &evidence);
            assert_eq!(decision(&s), "host_unreachable");
            assert!(!s.outcome.settled);
            assert_eq!(s.outcome.evidence, format!("host unreachable: {why}"));
            assert!(
                matches!(&s.events[..], [Event::Probed { state, detail, .. }]
                    if *state == ProbeState::Unreachable && *detail == format!("opmark reconcile: {why}")),
                "{:?}",
                s.events
            );
        }
    }

    #[test]
    fn absent_and_the_fence_failed_stays_open_since_a_delayed_attempt_could_still_arrive() {
        let c = candidate(Some(Boundary::SentNoResponse));
        let s = settle(
            &c,
            &Evidence::Marker {
                probe: Box::new(marker(MarkerState::Absent, None, None)),
                fence: Some(FenceResult::Failed("no fence answer".into())),
            },
        );
        assert_eq!(decision(&s), "absent_fence_failed");
        assert!(!s.outcome.settled);
        assert_eq!(s.outcome.evidence, "absent; fence failed: no fence answer");
        assert!(!s.events.iter().any(|e| matches!(e, Event::Fenced { .. })));
    }

    #[test]
    fn absent_without_a_fence_says_whether_an_attempt_of_ours_had_reached_the_host() {
        let absent = Evidence::Marker {
            probe: Box::new(marker(MarkerState::Absent, None, None)),
            fence: None,
        };
        let s = settle(&candidate(Some(Boundary::Started)), &absent);
        assert_eq!(decision(&s), "marker_missing_needs_decision");
        assert!(s.outcome.detail.contains("had reached it"), "{s:?}");
        assert!(s.outcome.detail.contains("opmark resolve"), "{s:?}");
        let s = settle(&candidate(None), &absent);
        assert_eq!(decision(&s), "marker_missing_needs_decision");
        assert_eq!(s.outcome.detail, "no marker and no attempt recorded");
    }

    #[test]
    fn the_markers_unix_times_read_as_utc_in_the_details() {
        assert_eq!(unix_utc("1714557600"), "2024-05-01 10:00:00 UTC");
        assert_eq!(
            unix_utc("not-a-time"),
            "not-a-time",
            "as sent when unreadable"
        );
        let mut done = marker(MarkerState::Completed, Some("at-1"), Some(0));
        done.fields.insert("ended_at".into(), "1714557600".into());
        let s = settle(
            &candidate(Some(Boundary::Started)),
            &Evidence::Marker {
                probe: Box::new(done),
                fence: None,
            },
        );
        assert_eq!(decision(&s), "completed");
        assert!(
            s.outcome
                .detail
                .ends_with("(ended 2024-05-01 10:00:00 UTC)"),
            "{s:?}"
        );
        let mut fenced = marker(MarkerState::Fenced, None, None);
        fenced
            .fields
            .insert("fenced_at".into(), "1714557600".into());
        let s = settle(
            &candidate(Some(Boundary::SentNoResponse)),
            &Evidence::Marker {
                probe: Box::new(marker(MarkerState::Absent, None, None)),
                fence: Some(FenceResult::Fenced(fenced)),
            },
        );
        assert!(
            s.events.iter().any(|e| matches!(e, Event::Fenced { detail }
                if detail.contains("(at 2024-05-01 10:00:00 UTC)"))),
            "{:?}",
            s.events
        );
    }

    #[test]
    fn reconcile_closes_an_intent_that_never_left_without_its_host_and_records_an_unreachable_host_as_open(
    ) {
        let dir = std::env::temp_dir().join(format!(
            "opmark-reconcile-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut ledger = Ledger::open(&dir.join("ledger.db")).unwrap();
        // op-quiet: an intent only. op-sent: an attempt that left, to a host whose name
        // no longer resolves.
        let (quiet, sent) = (OpKey::new("op-quiet", "h"), OpKey::new("op-sent", "h"));
        let intent = |fingerprint: &str| Event::Intended {
            session: "s".into(),
            family: Family::Destructive,
            display: "x".into(),
            fingerprint: fingerprint.into(),
            rule: "r".into(),
            secrets: Vec::new(),
            become_user: None,
            locks: Vec::new(),
        };
        ledger
            .append(&quiet, &intent("f1"), Durability::Normal)
            .unwrap();
        ledger
            .append_many(
                &sent,
                &[
                    intent("f2"),
                    Event::AttemptDispatched {
                        attempt_id: "at-1".into(),
                        number: 1,
                        parent: None,
                        reason: RetryReason::FirstAttempt,
                    },
                    Event::BoundaryReached {
                        attempt_id: "at-1".into(),
                        boundary: Boundary::SentNoResponse,
                        detail: "x".into(),
                        refusal: None,
                    },
                ],
                Durability::Normal,
            )
            .unwrap();
        let candidates = [&quiet, &sent]
            .map(|k| Candidate {
                record: ledger.operation(k).unwrap().unwrap(),
                events: ledger.events(k).unwrap(),
            })
            .to_vec();
        let resolved = std::cell::RefCell::new(Vec::new());
        let mut progress = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rows = rt
            .block_on(reconcile(
                &mut ledger,
                candidates,
                |c, _| {
                    resolved.borrow_mut().push(c.record.op_id.clone());
                    Err(ConnectError::new(
                        crate::ssh::ConnectStage::Resolve,
                        "no such host h",
                    ))
                },
                |done, all| progress.push((done, all)),
            ))
            .unwrap();
        assert_eq!(
            resolved.into_inner(),
            ["op-sent"],
            "only the operation whose attempt left is looked up"
        );
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            (
                rows[0].op_id.as_str(),
                rows[0].decision.as_str(),
                rows[0].settled
            ),
            ("op-quiet", "not_applied", true)
        );
        assert_eq!(
            (
                rows[1].op_id.as_str(),
                rows[1].decision.as_str(),
                rows[1].settled
            ),
            ("op-sent", "host_unreachable", false)
        );
        assert!(
            rows[1].evidence.contains("no such host h"),
            "the connect's own error, not a missing answer: {rows:?}"
        );
        assert_eq!(progress.last(), Some(&(2, 2)));
        // Both are recorded: the intent closed, the unreachable host a probe that failed.
        assert!(!ledger.operation(&quiet).unwrap().unwrap().unresolved);
        let events = ledger.events(&sent).unwrap();
        assert!(
            matches!(
                &events.last().unwrap().event,
                Event::Probed { state, detail, .. }
                    if *state == ProbeState::Unreachable && detail.contains("no such host h")
            ),
            "{events:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
