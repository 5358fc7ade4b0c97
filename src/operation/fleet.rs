//! One operation on many hosts (docs/decisions.md#fleets): each host runs its own operation (same
//! op id, its own marker and ledger key) through [`super::run_interruptible`], up to
//! `--forks` at once in this process's runtime, with a failure budget (`--max-failures`)
//! and rolling batches (`--serial`). Hosts never dispatched get a `not_applied` verdict
//! that says why, with nothing recorded or sent for them.
//!
//! Each host task opens its own ledger handle, and SQLite serialises the writers (`BEGIN
//! IMMEDIATE`), so no host waits on another's network. The writes a host must have on
//! disk before its dispatch (its intent and attempt) are the exception: they wait in a
//! `CommitGroup` (`commit_group.rs`), and one transaction (`Full`) records those of every host that reached
//! its dispatch meanwhile; then those hosts go. Each host's are durable before its
//! dispatch exactly as a single `run`'s, in one fsync'd commit for many hosts instead of
//! one per host.
//! The host tasks are local to one thread (a `LocalSet`): a lifecycle holds its SQLite
//! connection, which is not `Sync`, across awaits. The SSH sessions' own tasks still run
//! on the runtime's workers, and the hosts' waiting is what overlaps.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use tokio::task::JoinSet;

use crate::error::Error;
use crate::ledger::fingerprint::{self, InstallationKey};
use crate::ledger::Ledger;
use crate::policy::Policy;
use crate::ssh::Pool;
use crate::vocab::{ReasonCode, Verdict};

use super::commit_group::CommitGroup;
use super::input::{family_and_rule, RunEnv, RunInput};
use super::interrupt::Interrupts;
use super::report::RunReport;
use super::run::run_interruptible;

/// How the hosts are scheduled.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Hosts running at once (at least 1).
    pub forks: usize,
    /// Stop dispatching after this many hosts ended badly.
    pub max_failures: Option<usize>,
    /// Rolling batches of this many hosts; the next starts only after a clean batch.
    pub serial: Option<usize>,
    /// Hosts of the run that failed before any dispatch (a name that cannot be a
    /// destination or resolves nowhere): they count against `max_failures` and in the
    /// progress, and are not among the inputs.
    pub failed_before: usize,
    /// Every input goes to one host (the files of a put): once one could not reach it,
    /// the rest are not dispatched (`connect_failed`, nothing sent), instead of each
    /// spending its own `--wait` on a host that is gone.
    pub one_host: bool,
}

/// An answer that says the host could not be reached (nothing sent, or sent and then
/// never heard from again).
fn unreachable(result: &HostResult) -> bool {
    matches!(&result.outcome, Ok(r) if matches!(
        (r.verdict, r.reason_code),
        (Verdict::NotApplied, ReasonCode::ConnectFailed | ReasonCode::WaitBudgetSpent)
            | (Verdict::Indeterminate, ReasonCode::UnreachableAfterDispatch)
    ))
}

/// What every host's operation shares: the policy, the fingerprint key, the session and
/// the connection pool; `open_ledger` gives each host task its own ledger handle.
pub struct FleetShared {
    /// The policy in effect for every host.
    pub policy: Arc<Policy>,
    /// The per-installation fingerprint key.
    pub key: InstallationKey,
    /// This session's id.
    pub session_id: String,
    /// SSH connections of this process.
    pub pool: Arc<Pool>,
    /// Opens a ledger handle (one per host task).
    pub open_ledger: Arc<dyn Fn() -> Result<Ledger, Error> + Send + Sync>,
}

impl std::fmt::Debug for FleetShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetShared")
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

/// One host's end: its run document, or opmark's own failure for that host (a ledger
/// that could not be opened or written, a malformed ssh config).
#[derive(Debug)]
pub struct HostResult {
    /// The host as given.
    pub host: String,
    /// The verdict, or the error that stopped this host's run.
    pub outcome: Result<RunReport, Error>,
}

impl HostResult {
    /// Completed or replayed with exit 0: the only outcome that does not count against
    /// `--max-failures` and lets the next `--serial` batch start.
    pub fn is_clean(&self) -> bool {
        matches!(&self.outcome, Ok(r) if matches!(r.verdict, Verdict::Completed | Verdict::Replayed)
            && r.exit_code.unwrap_or(0) == 0)
    }
}

/// Counts for a progress line: hosts finished, running now, finished badly.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    /// Hosts with an answer.
    pub done: usize,
    /// Hosts dispatched and not yet answered.
    pub running: usize,
    /// Hosts answered with anything but completed/replayed with exit 0.
    pub failed: usize,
    /// Every host of the run.
    pub total: usize,
}

/// Runs `inputs` (one per host, in the given order) under `plan`; answers one result per
/// host in the same order. `progress` is told after every change of the counts.
pub async fn run_fleet(
    shared: &FleetShared,
    inputs: Vec<RunInput>,
    plan: Schedule,
    interrupts: &Interrupts,
    progress: impl FnMut(Progress),
) -> Vec<HostResult> {
    // Without a handle for the shared commits, each host commits its own (as a `run`).
    let group = match (shared.open_ledger)() {
        Ok(ledger) => Some(std::rc::Rc::new(CommitGroup::new(ledger))),
        Err(e) => {
            tracing::debug!("no shared commit for the fleet: {e}");
            None
        }
    };
    tokio::task::LocalSet::new()
        .run_until(async {
            let server = group
                .clone()
                .map(|g| tokio::task::spawn_local(async move { g.serve().await }));
            let results = schedule(shared, inputs, plan, interrupts, group, progress).await;
            if let Some(server) = server {
                server.abort();
            }
            results
        })
        .await
}

async fn schedule(
    shared: &FleetShared,
    inputs: Vec<RunInput>,
    plan: Schedule,
    interrupts: &Interrupts,
    group: Option<std::rc::Rc<CommitGroup>>,
    mut progress: impl FnMut(Progress),
) -> Vec<HostResult> {
    let total = inputs.len();
    let mut results: Vec<Option<HostResult>> = (0..total).map(|_| None).collect();
    let batch_len = plan.serial.unwrap_or(total).max(1);
    let forks = plan.forks.max(1);
    let mut counts = Progress {
        total: total + plan.failed_before,
        done: plan.failed_before,
        failed: plan.failed_before,
        ..Progress::default()
    };
    // Why the rest is not dispatched, once something says stop.
    let mut stop: Option<ReasonCode> = None;
    if plan
        .max_failures
        .is_some_and(|max| plan.failed_before >= max)
    {
        stop = Some(ReasonCode::NotDispatchedMaxFailures);
    }
    let mut queue = inputs.into_iter().enumerate().peekable();
    while queue.peek().is_some() {
        let batch: Vec<(usize, RunInput)> = queue.by_ref().take(batch_len).collect();
        let mut batch_clean = true;
        let mut pending = batch.into_iter();
        let mut running: JoinSet<(usize, HostResult)> = JoinSet::new();
        loop {
            if interrupts.received().is_some() {
                stop.get_or_insert(ReasonCode::ClientInterrupted);
            }
            while stop.is_none() && running.len() < forks {
                let Some((index, input)) = pending.next() else {
                    break;
                };
                spawn_host(
                    &mut running,
                    shared,
                    index,
                    input,
                    interrupts.clone(),
                    group.clone(),
                );
                counts.running += 1;
                progress(counts);
            }
            if stop.is_some() {
                for (index, input) in pending.by_ref() {
                    results[index] = Some(not_dispatched(
                        shared,
                        &input,
                        stop.unwrap_or(ReasonCode::ClientInterrupted),
                        plan.one_host,
                    ));
                }
            }
            // A signal must stop new dispatches at once, not after the running hosts end.
            let joined = tokio::select! {
                joined = running.join_next() => joined,
                _ = interrupts.wait(), if stop.is_none() => continue,
            };
            let Some(joined) = joined else { break };
            let (index, result) = match joined {
                Ok(done) => done,
                // A host task panicked: an opmark bug, surfaced as such.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            counts.running -= 1;
            counts.done += 1;
            if plan.one_host && unreachable(&result) {
                stop.get_or_insert(ReasonCode::ConnectFailed);
            }
            if !result.is_clean() {
                counts.failed += 1;
                batch_clean = false;
                if plan.max_failures.is_some_and(|max| counts.failed >= max) {
                    stop.get_or_insert(ReasonCode::NotDispatchedMaxFailures);
                }
            }
            progress(counts);
            results[index] = Some(result);
        }
        if !batch_clean && plan.serial.is_some() {
            stop.get_or_insert(ReasonCode::NotDispatchedBatchFailed);
        }
        if let Some(code) = stop {
            for (index, input) in queue.by_ref() {
                results[index] = Some(not_dispatched(shared, &input, code, plan.one_host));
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every host gets an answer (fleet bug)"))
        .collect()
}

fn spawn_host(
    running: &mut JoinSet<(usize, HostResult)>,
    shared: &FleetShared,
    index: usize,
    input: RunInput,
    interrupts: Interrupts,
    group: Option<std::rc::Rc<CommitGroup>>,
) {
    let policy = shared.policy.clone();
    let pool = shared.pool.clone();
    let key = shared.key.clone();
    let session_id = shared.session_id.clone();
    let open_ledger = shared.open_ledger.clone();
    let host = input.host.host.clone();
    running.spawn_local(async move {
        let outcome = async {
            // Read now, not when the run was planned: only the runs in flight hold
            // their stdin (the files of a put).
            let input = input.load_stdin().await?;
            let mut ledger = open_ledger()?;
            run_interruptible(
                RunEnv {
                    ledger: &mut ledger,
                    policy: &policy,
                    key: &key,
                    session_id,
                    pool: &pool,
                    group: group.as_deref(),
                },
                input,
                &interrupts,
            )
            .await
            .map_err(Error::from)
        }
        .await;
        // An error names no host of its own; among many, the caller needs to know which.
        let outcome = outcome.map_err(|mut e| {
            e.message = format!("{host}: {}", e.message);
            e
        });
        (index, HostResult { host, outcome })
    });
}

/// The answer for a host never dispatched: `not_applied`, nothing recorded or sent, and
/// a rerun with the same op id runs it (at most once).
fn not_dispatched(
    shared: &FleetShared,
    input: &RunInput,
    code: ReasonCode,
    one_host: bool,
) -> HostResult {
    let why = match code {
        ReasonCode::NotDispatchedMaxFailures => "--max-failures hosts had already ended badly",
        ReasonCode::NotDispatchedBatchFailed => {
            "an earlier --serial batch did not complete cleanly"
        }
        ReasonCode::ConnectFailed => {
            "the host could not be reached for an earlier operation of this run"
        }
        _ => "the client was interrupted",
    };
    let host = input.host.host.clone();
    // A fleet's hosts share the op id the caller gave; the files of a put each have
    // their own, made from the put's: the same command again is the rerun either way.
    let rerun = if one_host {
        "the same command with the same --op delivers it (at most once)".to_owned()
    } else {
        format!(
            "`opmark run` with op id {} runs it (at most once)",
            input.op
        )
    };
    let reason = format!("not dispatched: {why}; nothing was recorded or sent for {host}. {rerun}");
    let (family, rule) = family_and_rule(&shared.policy.classify(&input.command), input.class);
    HostResult {
        host: host.clone(),
        outcome: Ok(RunReport {
            op_id: input.op.to_string(),
            host,
            attempt_id: None,
            family,
            verdict: Verdict::NotApplied,
            exit_code: None,
            stdout: Default::default(),
            stderr: Default::default(),
            attempts: Vec::new(),
            observations: Vec::new(),
            approval_needed: None,
            conflict_differs: None,
            fingerprint: fingerprint::ledger_fingerprint(&input.intent(), &shared.key),
            reason,
            reason_code: code,
            retryable: code.retryable(),
            rule,
            timed_out: false,
            dropped: (0, 0),
            ledger_error: None,
            truncated: false,
            kept: (0, 0),
            output_collected: false,
            output_available: true,
            cancelled: false,
            repeats: None,
        }),
    }
}

/// The `summary` of the fleet document: how many hosts, how many clean, and the count
/// of each verdict.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Hosts in the run (JSON `host_count`: `hosts` is the fleet document's list).
    #[serde(rename = "host_count")]
    pub hosts: usize,
    /// Completed or replayed with exit 0.
    pub ok: usize,
    /// Anything else (errors included).
    pub failed: usize,
    /// Hosts never dispatched (a subset of `failed`).
    pub not_dispatched: usize,
    /// Hosts per verdict (`error` for opmark's own failures).
    pub verdicts: BTreeMap<String, usize>,
    /// The process exit status.
    pub exit_status: u8,
}

impl Summary {
    /// The summary of `results`.
    pub fn of(results: &[HostResult]) -> Summary {
        let mut verdicts = BTreeMap::new();
        let mut ok = 0;
        let mut not_dispatched = 0;
        for r in results {
            ok += usize::from(r.is_clean());
            let name = match &r.outcome {
                Ok(report) => {
                    if matches!(
                        report.reason_code,
                        ReasonCode::NotDispatchedMaxFailures | ReasonCode::NotDispatchedBatchFailed
                    ) {
                        not_dispatched += 1;
                    }
                    report.verdict.to_string()
                }
                Err(_) => "error".to_owned(),
            };
            *verdicts.entry(name).or_insert(0) += 1;
        }
        Summary {
            hosts: results.len(),
            ok,
            failed: results.len() - ok,
            not_dispatched,
            verdicts,
            exit_status: exit_status(results),
        }
    }
}

/// docs/decisions.md#fleets: 0 when every host completed or replayed with exit 0; else the
/// reserved code of the most severe verdict; 1 when every verdict is completed or
/// replayed but some exit status was not 0. opmark's own failure on a host (ledger,
/// config) outranks every verdict: its exit code names what to fix here first.
pub fn exit_status(results: &[HostResult]) -> u8 {
    if let Some(e) = results.iter().find_map(|r| r.outcome.as_ref().err()) {
        return e.kind.exit_code();
    }
    let worst = results
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok())
        .map(|r| r.verdict)
        .max_by_key(|v| severity(*v));
    match worst {
        Some(v) if severity(v) > 0 => v.reserved_exit_code().unwrap_or(1),
        _ if results.iter().all(HostResult::is_clean) => 0,
        _ => 1,
    }
}

/// The order of docs/decisions.md#fleets: indeterminate > conflict > blocked > not_applied >
/// in_progress > refused; completed and replayed rank below every other verdict.
fn severity(v: Verdict) -> u8 {
    match v {
        Verdict::Completed | Verdict::Replayed => 0,
        Verdict::Refused => 1,
        Verdict::InProgress => 2,
        Verdict::NotApplied => 3,
        Verdict::Blocked => 4,
        Verdict::Conflict => 5,
        Verdict::Indeterminate => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::family::Family;

    fn host(verdict: Verdict, exit_code: Option<i32>) -> HostResult {
        HostResult {
            host: "h".into(),
            outcome: Ok(RunReport {
                op_id: "op".into(),
                host: "h".into(),
                attempt_id: None,
                family: Family::ReadOnly,
                verdict,
                exit_code,
                stdout: Default::default(),
                stderr: Default::default(),
                attempts: Vec::new(),
                observations: Vec::new(),
                approval_needed: None,
                conflict_differs: None,
                fingerprint: String::new(),
                reason: String::new(),
                reason_code: ReasonCode::CommandExited,
                retryable: false,
                rule: String::new(),
                timed_out: false,
                dropped: (0, 0),
                ledger_error: None,
                truncated: false,
                kept: (0, 0),
                output_collected: false,
                output_available: true,
                cancelled: false,
                repeats: None,
            }),
        }
    }

    #[test]
    fn every_host_clean_exits_zero() {
        let all = [
            host(Verdict::Completed, Some(0)),
            host(Verdict::Replayed, Some(0)),
        ];
        assert_eq!(exit_status(&all), 0);
    }

    #[test]
    fn a_nonzero_command_exit_among_clean_verdicts_exits_one() {
        let all = [
            host(Verdict::Completed, Some(0)),
            host(Verdict::Replayed, Some(3)),
        ];
        assert_eq!(exit_status(&all), 1);
    }

    #[test]
    fn the_most_severe_verdict_decides_the_exit_status() {
        let order = [
            Verdict::Refused,
            Verdict::InProgress,
            Verdict::NotApplied,
            Verdict::Blocked,
            Verdict::Conflict,
            Verdict::Indeterminate,
        ];
        for (i, worst) in order.iter().enumerate() {
            let mut all: Vec<HostResult> = order[..=i].iter().map(|v| host(*v, None)).collect();
            all.push(host(Verdict::Completed, Some(7)));
            all.reverse();
            assert_eq!(
                exit_status(&all),
                worst.reserved_exit_code().unwrap(),
                "worst {worst}"
            );
        }
    }

    #[test]
    fn an_error_on_one_host_outranks_every_verdict() {
        let all = [
            host(Verdict::Indeterminate, None),
            HostResult {
                host: "h".into(),
                outcome: Err(Error::new(ErrorKind::Config, "bad")),
            },
        ];
        assert_eq!(exit_status(&all), ErrorKind::Config.exit_code());
    }
}
