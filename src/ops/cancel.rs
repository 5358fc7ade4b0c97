//! Cancel: stop an operation on its host for good (see
//! docs/guarantees.md#interruptions-and-cancel) through the shim's `cancel` verb, record what happened as a `cancelled`
//! event, and say the final state.
//!
//! The shim does the work so that it holds on the host whatever happens to this client:
//! a running command's session gets TERM, then KILL after the grace, and its supervisor
//! (never signalled) writes the exit record marked `cancelled=1`, which every later `run`
//! of the op id replays; an absent, unstarted or interrupted marker is fenced, so no
//! delayed or repeated attempt can ever run it. An op id this ledger has no record of on
//! that host is cancelled only with `--force`: nothing is sent without it, so a typo
//! never fences an op id for good.
use std::time::Duration;

use serde::Serialize;

use super::host_changed::{self, Answered};
use super::{block_on, load_policy, open_existing_ledger, operator, Context, HostOptions};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::host::{
    CallError, CancelOutcome, Cancelled, Host, MarkerInfo, ReachError, RefusalReason,
};
use crate::ledger::{CancelResult, Durability, Event, Ledger, OpKey};
use crate::op_id::OpId;
use crate::text::printable;

/// Longest grace accepted: beyond it a "cancel" is a wait, and the caller's ssh session
/// would sit idle for that long.
const MAX_GRACE: Duration = Duration::from_secs(3600);

/// What to cancel.
#[derive(Debug, Clone)]
pub struct CancelRequest {
    /// The host as the user names it.
    pub host: String,
    /// The op id, unchecked.
    pub op: String,
    /// Between TERM and KILL (at most an hour).
    pub grace: Duration,
    /// Who cancels (default: the acting user).
    pub by: Option<String>,
    /// Cancel an op id this ledger has no record of on that host.
    pub force: bool,
    /// Connection options overriding the recorded route.
    pub options: HostOptions,
}

/// What the cancel did (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct CancelReport {
    pub schema: &'static str,
    pub op_id: String,
    pub host: String,
    /// `cancelled`, `already_completed`, `already_fenced`, `fenced`, `still_running`
    /// (JSON `cancel_outcome`: `outcome` is show's object).
    #[serde(rename = "cancel_outcome")]
    pub outcome: &'static str,
    /// For `fenced`: what the marker was (`absent`, `not_started`, `interrupted`).
    pub was: Option<String>,
    /// The host marker's state afterwards (`state` is the ledger's projection elsewhere).
    #[serde(rename = "marker_state")]
    pub state: &'static str,
    /// The exit code the host recorded, when there is one.
    pub exit_code: Option<i32>,
    /// The exit record says a cancel stopped the command.
    pub cancelled: bool,
    /// The plain SHA-256 of the intent recorded in the host's claim, when there is one.
    pub host_fingerprint: Option<String>,
    /// The attempt that holds the claim, when there is one.
    pub attempt_id: Option<String>,
    pub grace_ms: u64,
    pub by: String,
    /// What it means, in words (`reason`, as in every verdict).
    #[serde(rename = "reason")]
    pub message: String,
    /// The command is still running after TERM and KILL.
    #[serde(skip)]
    pub still_running: bool,
}

impl CancelReport {
    /// 0 once the operation can no longer run, 1 when it is still running.
    pub fn exit_status(&self) -> u8 {
        if self.still_running {
            exit_code::FINDINGS
        } else {
            exit_code::OK
        }
    }
}

/// Cancels on the host and records what happened; another machine, user or marker root
/// is answered as `run` answers it, `conflict`/`host_changed` (docs/guarantees.md#evidence-identity).
pub fn cancel(ctx: &Context, args: &CancelRequest) -> Result<Answered<CancelReport>> {
    let op =
        OpId::parse(&args.op).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    if args.grace > MAX_GRACE {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "--grace {}s is longer than the 1h limit; give the command at most --grace 1h between TERM and KILL. Nothing was sent",
                args.grace.as_secs()
            ),
        ));
    }
    let by = operator(args.by.as_deref());
    let policy = load_policy(ctx)?;
    // A host that cannot be a destination is bad input, whatever the ledger holds.
    crate::host::check_destination(&args.host)
        .map_err(|why| Error::new(ErrorKind::InvalidInput, format!("{why}; nothing was sent")))?;
    let mut ledger = open_existing_ledger(ctx, &policy)?;
    // The host the operation ran on, reached the way it was (docs/guarantees.md#host-identity).
    let (host, dest, recorded) =
        super::reach::reach_operation(ctx, &args.host, &args.options, op.as_str(), &ledger)?;
    let key = OpKey::new(op.as_str(), host.clone());
    // docs/guarantees.md#interruptions-and-cancel: on an op id this ledger does not know, the shim would fence an
    // absent marker for good; a typo must not close an op id.
    if !args.force && ledger.events(&key)?.is_empty() {
        return Err(unknown_op(&op, &host, &args.host, &ledger)?);
    }
    let grace_ms = u64::try_from(args.grace.as_millis()).unwrap_or(u64::MAX);

    let answer = block_on(async {
        // Another key is another machine: cancelling (or fencing) there would stop or
        // close the wrong thing.
        let reached = Host::connect_checked(&dest, recorded.root(), |key, route| {
            recorded.check(&host, op.as_str(), key, Some(route))
        })
        .await;
        let target = reached.map_err(|e| match e {
            ReachError::Connect(e) => Error::new(
                ErrorKind::Unreachable,
                format!(
                    "cannot cancel {op} on {}: {e}; nothing was sent",
                    printable(&host)
                ),
            ),
            changed => host_changed::reach_error(changed, "nothing was sent"),
        })?;
        Ok::<_, Error>(target.cancel(&op, args.grace).await)
    })?;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            return host_changed::answer(host_changed::Subcommand::Cancel, op.as_str(), &host, e)
        }
    };
    let Cancelled { outcome, marker } = match answer {
        Ok(done) => done,
        Err(CallError::Refused(r)) if r.reason == RefusalReason::RootChanged => {
            let e = host_changed::root_changed(&recorded, &host, op.as_str(), &r);
            return host_changed::answer(host_changed::Subcommand::Cancel, op.as_str(), &host, e);
        }
        Err(CallError::NotSent(why)) => {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "the cancel of {op} on {} was not sent ({why}); nothing changed",
                    printable(&host)
                ),
            ))
        }
        Err(CallError::Lost { reason, .. }) => {
            // The TERM may have gone out: what was asked is evidence worth keeping.
            ledger.append(
                &key,
                &Event::Cancelled {
                    by: by.clone(),
                    grace_ms,
                    result: CancelResult::Unknown,
                    exit_code: None,
                    detail: format!("the answer was lost: {reason}"),
                },
                Durability::Full,
            )?;
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "the cancel of {op} on {} lost its answer ({reason}); it may have been carried out. See `opmark probe {} {op}`, then cancel again (it is safe to repeat)",
                    printable(&host),
                    printable(&args.host)
                ),
            ));
        }
        Err(refused @ CallError::Refused(_)) => return Err(refusal_error(&op, &host, &refused)),
        Err(CallError::NoAnswer(_)) => {
            return Err(Error::new(
                ErrorKind::Internal,
                "the shim answered the cancel without a cancel frame",
            ))
        }
    };
    let message = message(&op, &host, &outcome, &marker, args.grace);
    let result = CancelResult::from(&outcome);
    ledger.append(
        &key,
        &Event::Cancelled {
            by: by.clone(),
            grace_ms,
            result,
            exit_code: marker.exit_code,
            detail: marker.summary(),
        },
        Durability::Full,
    )?;
    let was = match &outcome {
        CancelOutcome::Fenced { was } => Some(was.clone()),
        _ => None,
    };
    Ok(Answered::Report(CancelReport {
        schema: crate::ops::document::SCHEMA,
        op_id: op.as_str().to_owned(),
        host,
        outcome: outcome.as_str(),
        was,
        state: marker.state.as_str(),
        exit_code: marker.exit_code,
        cancelled: marker.cancelled(),
        host_fingerprint: marker.fingerprint.clone(),
        attempt_id: marker.attempt.clone(),
        grace_ms,
        by,
        message,
        still_running: matches!(outcome, CancelOutcome::Still { .. }),
    }))
}

/// The error for a cancel of an op id the ledger has no record of on that host.
fn unknown_op(op: &OpId, host: &str, typed: &str, ledger: &Ledger) -> Result<Error> {
    let hosts = ledger.hosts_of(op.as_str())?;
    let known = if hosts.is_empty() {
        format!(
            "no operation `{op}` is in the ledger {}",
            ledger.path().display()
        )
    } else {
        format!(
            "operation `{op}` is not recorded on `{}` in the ledger {} (it is on: {})",
            printable(host),
            ledger.path().display(),
            hosts
                .iter()
                .map(|h| printable(h))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Ok(Error::new(
        ErrorKind::InvalidInput,
        format!(
            "{known}; a cancel of an op id this ledger does not know fences it on the host for good if it is absent, and a typo must not close an op id. Nothing was sent. Check the op id with `opmark list`, or run `opmark cancel {} {op} --force` to cancel it anyway",
            printable(typed)
        ),
    ))
}

/// The error a refused cancel means: the shim did nothing.
fn refusal_error(op: &OpId, host: &str, refused: &CallError) -> Error {
    let kind = match refused {
        CallError::Refused(r)
            if matches!(
                r.reason,
                RefusalReason::InvalidOpId | RefusalReason::BadArgs
            ) =>
        {
            ErrorKind::InvalidInput
        }
        _ => ErrorKind::Unreachable,
    };
    Error::new(
        kind,
        format!(
            "the host shim refused to cancel {op} on {} ({}); nothing was signalled. Check the host with `opmark doctor`",
            printable(host),
            refused.seen()
        ),
    )
}

/// One sentence for people: what happened and what a later `run` of the op id does.
fn message(
    op: &OpId,
    host: &str,
    outcome: &CancelOutcome,
    marker: &MarkerInfo,
    grace: Duration,
) -> String {
    let host = printable(host);
    let exit = marker
        .exit_code
        .map_or_else(|| "unknown".to_owned(), describe_exit);
    match outcome {
        CancelOutcome::Cancelled => format!(
            "cancelled {op} on {host}: the command was stopped, exit {exit}; `opmark run` with this op id replays this result and never runs it again"
        ),
        // docs/guarantees.md#interruptions-and-cancel: its own status, not "stopped", when the signal did not end it.
        CancelOutcome::AlreadyCompleted if marker.cancel_pending() => format!(
            "{op} on {host} ended by itself, exit {exit}, while the cancel was pending: the cancel's signal did not stop it; `opmark run` with this op id replays this result"
        ),
        CancelOutcome::AlreadyCompleted => format!(
            "{op} on {host} had already completed (exit {exit}); nothing was signalled, nothing changed"
        ),
        CancelOutcome::AlreadyFenced => format!(
            "{op} on {host} was already fenced (closed as not applied); nothing changed"
        ),
        CancelOutcome::Fenced { was } => match was.as_str() {
            "absent" => format!(
                "{op} had not reached {host}: its op id is now fenced there, so no delayed or later attempt can run it; `opmark run` with this op id answers not_applied"
            ),
            "not_started" => format!(
                "{op} on {host} was claimed but its command had not started: fenced, it never will; `opmark run` with this op id answers not_applied"
            ),
            _ => format!(
                "{op} on {host} was interrupted (its process is gone without an exit record, so it may have had effects): fenced, it can never run again. Record what happened with `opmark resolve`"
            ),
        },
        CancelOutcome::Still { state } => format!(
            "{op} on {host} is still {state} after TERM, {}s of grace and KILL (a process that left the command's session, or one stuck in the kernel); check the host, then cancel again",
            grace.as_secs()
        ),
    }
}

/// `143 (SIGTERM)` for a shell's 128+N status of the common signals, else the number.
fn describe_exit(code: i32) -> String {
    let name = match code - 128 {
        1 => "SIGHUP",
        2 => "SIGINT",
        9 => "SIGKILL",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return code.to_string(),
    };
    format!("{code} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_of_signals_are_named() {
        assert_eq!(describe_exit(143), "143 (SIGTERM)");
        assert_eq!(describe_exit(137), "137 (SIGKILL)");
        assert_eq!(describe_exit(0), "0");
        assert_eq!(describe_exit(3), "3");
    }
}
