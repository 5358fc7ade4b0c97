//! Locks: the host locks held and waited for on a host (docs/host-protocol.md#host-locks),
//! read from its marker root; nothing is recorded or changed. A lock is the host's, shared
//! by every client of it, so the holders may be operations of other ledgers.

use serde::Serialize;

use super::{block_on, host_spec, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{CallError, Host, HostLocks};

/// Which host to ask.
#[derive(Debug, Clone)]
pub struct LocksRequest {
    /// The host as the user names it.
    pub host: String,
    /// Connection options.
    pub options: HostOptions,
}

/// The `--json` document.
#[derive(Debug, Clone, Serialize)]
pub struct LocksReport {
    /// The host as the user named it.
    pub host: String,
    /// Each held slot, lock by lock.
    pub held: Vec<HeldSlot>,
    /// The operations whose host supervisors wait for locks.
    pub waiting: Vec<WaitingOperation>,
}

/// One held slot of a lock.
#[derive(Debug, Clone, Serialize)]
pub struct HeldSlot {
    pub lock: String,
    /// The lock's capacity (`null`: unreadable on the host).
    pub capacity: Option<u32>,
    pub slot: u32,
    /// The holding operation (`null`: a holder opmark did not write).
    pub op_id: Option<String>,
    /// Since when (RFC 3339, UTC, the host's clock).
    pub since: Option<String>,
    /// False: its holder is gone (crashed, rebooted) and the next claim reaps the slot.
    pub alive: bool,
    /// The holder's command (its first line, at most 160 bytes, `…` where cut), redacted
    /// by the policy in effect (`null`: its marker no longer says).
    pub command: Option<String>,
}

/// An operation waiting on the host for its locks.
#[derive(Debug, Clone, Serialize)]
pub struct WaitingOperation {
    pub op_id: Option<String>,
    /// The locks it takes, `NAME` or `NAME:N`.
    pub locks: Vec<String>,
    /// When it was claimed (RFC 3339, UTC, the host's clock).
    pub since: Option<String>,
    /// Its command, as [`HeldSlot::command`].
    pub command: Option<String>,
}

/// Asks the host's shim which locks are held and waited for.
pub fn locks(ctx: &Context, req: &LocksRequest) -> Result<LocksReport> {
    crate::host::check_destination(&req.host)
        .map_err(|why| Error::new(ErrorKind::InvalidInput, format!("{why}; nothing was sent")))?;
    // The commands are the host's words about other operations: only their redacted
    // form leaves this function.
    let redactor = super::redactor_for_errors(ctx.policy.as_deref());
    let command = |fields: &std::collections::BTreeMap<String, String>| {
        crate::operation::reply::holder_command(fields, &redactor)
    };
    let spec = host_spec(ctx, &req.host, &req.options);
    let dest = crate::host::resolve(&spec)?;
    let found: HostLocks = block_on(async {
        let host = Host::connect(&dest).await?;
        host.locks().await.map_err(|e| match e {
            CallError::Refused(r) => Error::new(
                ErrorKind::Unreachable,
                format!(
                    "the host shim refused to list its locks: {} {:?}",
                    r.reason, r.fields
                ),
            ),
            e => Error::new(
                ErrorKind::Unreachable,
                format!("listing the locks of {} failed: {e}", dest.display()),
            ),
        })
    })??;
    let stamp = |s: Option<u64>| {
        s.and_then(|s| i64::try_from(s).ok())
            .and_then(crate::operation::repeat::epoch_stamp)
    };
    Ok(LocksReport {
        host: req.host.clone(),
        held: found
            .held
            .into_iter()
            .map(|h| HeldSlot {
                lock: h.lock,
                capacity: h.capacity,
                slot: h.slot,
                op_id: h.op,
                since: stamp(h.since),
                alive: h.alive,
                command: command(&h.command_fields),
            })
            .collect(),
        waiting: found
            .waiting
            .into_iter()
            .map(|w| WaitingOperation {
                op_id: w.op,
                locks: w.locks.iter().map(ToString::to_string).collect(),
                since: stamp(w.since),
                command: command(&w.command_fields),
            })
            .collect(),
    })
}
