//! `opmark resolve OP --host H --as applied|not-applied|abandoned --note TEXT`: an
//! operator's decision, recorded as an observation. `not-applied` first fences the marker
//! on the host, and is refused when the host's evidence contradicts it.

use serde::Serialize;

use super::common;
use super::list::printable;
use super::reconcile::resolve_ledger_host;
use crate::cli::{GlobalArgs, Resolution, ResolveArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ledger::{Durability, Event, OpKey};
use crate::op_id::OpId;
use crate::operation::call::{call_shim, CallEnd, FramesOnly};
use crate::shim::{Frame, MarkerState, Verb};
use crate::ssh::Session;

#[derive(Serialize)]
struct Report<'a> {
    op_id: &'a str,
    host: &'a str,
    decision: &'a str,
    by: &'a str,
    note: &'a str,
    /// What the fence did on the host (not-applied only).
    fence: Option<String>,
    /// Sequence numbers of the recorded events.
    seqs: Vec<u64>,
}

/// The ledger's word for a resolution.
pub fn decision_name(r: Resolution) -> &'static str {
    match r {
        Resolution::Applied => "applied",
        Resolution::NotApplied => "not_applied",
        Resolution::Abandoned => "abandoned",
    }
}

/// Records the decision (after fencing, for not-applied).
pub fn run(global: &GlobalArgs, args: &ResolveArgs) -> Result<u8> {
    let op =
        OpId::parse(&args.op).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    if args.note.trim().is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--note is empty; say why (it is recorded with the decision)",
        ));
    }
    // The decision is recorded under a name: never a made-up one.
    let by = common::operator_name(args.by.as_deref()).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "cannot tell who is deciding: $USER and $LOGNAME are unset and the uid has no \
             passwd entry; give --operator NAME. Nothing was recorded",
        )
    })?;
    let policy = common::load_policy(global)?;
    let mut ledger = common::open_ledger(global, &policy)?;
    let key = OpKey::new(op.as_str(), args.host.clone());
    if ledger.operation(&key)?.is_none() {
        let hosts = ledger.hosts_of(op.as_str())?;
        let hint = if hosts.is_empty() {
            "`opmark list` shows what is recorded".to_owned()
        } else {
            format!(
                "it is recorded on: {}",
                hosts
                    .iter()
                    .map(|h| printable(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no operation `{op}` on host `{}` in the ledger {}; {hint}. Nothing was recorded",
                printable(&args.host),
                ledger.path().display()
            ),
        ));
    }
    let decision = decision_name(args.decision);
    let mut events = Vec::new();
    let mut fence_text = None;
    if args.decision == Resolution::NotApplied {
        let text = fence(global, args, &op)?;
        events.push(Event::Fenced {
            detail: format!("opmark resolve --as not-applied by {by}: {text}"),
        });
        fence_text = Some(text);
    }
    events.push(Event::OperatorDecision {
        by: by.clone(),
        decision: decision.to_owned(),
        note: args.note.clone(),
    });
    let seqs = ledger.append_many(&key, &events, Durability::Full)?;
    if global.json {
        common::print_json(&Report {
            op_id: op.as_str(),
            host: &args.host,
            decision,
            by: &by,
            note: &args.note,
            fence: fence_text,
            seqs,
        })?;
    } else {
        if let Some(t) = &fence_text {
            println!("fenced on {}: {t}", printable(&args.host));
        }
        println!(
            "recorded: {} decided {decision} for {op} on {}",
            printable(&by),
            printable(&args.host)
        );
    }
    Ok(exit_code::OK)
}

/// Fences the marker (force: an interrupted claim too). Refuses when the host says the
/// command completed or is running: the evidence contradicts "not applied".
fn fence(global: &GlobalArgs, args: &ResolveArgs, op: &OpId) -> Result<String> {
    let dest = resolve_ledger_host(global, &args.host, &args.host_args).map_err(|e| {
        Error::new(
            ErrorKind::Unreachable,
            format!(
                "cannot fence {op} on {}: {e}; nothing was recorded",
                printable(&args.host)
            ),
        )
    })?;
    let runtime = common::runtime()?;
    let frames = runtime.block_on(async {
        let session = Session::connect(&dest).await.map_err(|e| {
            Error::new(
                ErrorKind::Unreachable,
                format!(
                    "cannot fence {op} on {}: {e}; nothing was recorded. A not-applied decision needs the fence so a delayed attempt can never run",
                    printable(&args.host)
                ),
            )
        })?;
        match call_shim(&session, &Verb::Fence { op, force: true }, None, &mut FramesOnly).await {
            CallEnd::Finished(frames) => Ok(frames),
            CallEnd::NotSent(why) | CallEnd::Lost { reason: why, .. } => Err(Error::new(
                ErrorKind::Unreachable,
                format!("the fence of {op} on {} got no answer ({why}); nothing was recorded. Probe it, then retry", printable(&args.host)),
            )),
        }
    })?;
    for f in frames {
        match f {
            Frame::Fence { outcome, marker } => {
                return Ok(format!("{outcome} ({})", marker.summary()))
            }
            Frame::Refused(r) => {
                let state = r.marker.as_ref().map(|m| m.state);
                let seen = r
                    .marker
                    .as_ref()
                    .map(|m| m.summary())
                    .unwrap_or_else(|| r.reason.clone());
                let message = match state {
                    Some(MarkerState::Completed) => format!(
                        "the host says {op} completed ({seen}): that contradicts not-applied; nothing was recorded. Use --as applied, or investigate with `opmark show {op}`"
                    ),
                    Some(MarkerState::Running) => format!(
                        "the host says {op} is running ({seen}): it cannot be declared not applied; nothing was recorded. Wait for it, then `opmark reconcile`"
                    ),
                    _ => format!(
                        "the host refused to fence {op} ({seen}); nothing was recorded. Check the host with `opmark doctor`"
                    ),
                };
                return Err(Error::new(ErrorKind::InvalidInput, message));
            }
            _ => {}
        }
    }
    Err(Error::new(
        ErrorKind::Internal,
        "the shim answered the fence without a fence frame; nothing was recorded",
    ))
}
