//! Probe: the marker's state on the host, read-only; the observation is recorded in the
//! ledger. An operation the ledger knows is probed the way it ran (its recorded route)
//! and only on a host presenting the key it ran against (docs/guarantees.md#host-identity).

use serde::Serialize;

use super::host_changed::{self, Answered};
use super::{block_on, load_policy, open_existing_ledger, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{CallError, Destination, Host, MarkerInfo, RefusalReason};
use crate::ledger::{Durability, Event, OpKey};
use crate::op_id::OpId;
use crate::operation::identity::Recorded;

/// What to probe.
#[derive(Debug, Clone)]
pub struct ProbeRequest {
    /// The host as the user names it.
    pub host: String,
    /// The op id, unchecked.
    pub op: String,
    /// Connection options overriding the recorded route.
    pub options: HostOptions,
}

/// The marker's fields under the contract's names (docs/guarantees.md#the-command-line-contract): the host's plain digest is
/// `host_fingerprint`; `fingerprint` is the ledger's HMAC, as in `run` and `list`, and
/// null when this ledger never ran the operation.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub op_id: String,
    pub host: String,
    /// The host marker's state (`absent`, `running`, `completed`, `interrupted`,
    /// `fenced`); `state` is the ledger's projection in `list` and `show`.
    #[serde(rename = "marker_state")]
    pub state: String,
    pub why: Option<String>,
    pub attempt_id: Option<String>,
    pub fingerprint: Option<String>,
    pub host_fingerprint: Option<String>,
    pub family: Option<String>,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// Stdout bytes the host kept (the same word as MCP's and the ledger's).
    pub stdout_bytes: Option<u64>,
    /// Stderr bytes the host kept.
    pub stderr_bytes: Option<u64>,
    /// gc collected the output: the marker is a tombstone (docs/host-protocol.md#tombstones).
    pub output_collected: bool,
    /// The marker in one line, for people.
    #[serde(skip)]
    pub summary: String,
}

/// Probes the marker and records the observation; another machine, user or marker root
/// is answered as `run` answers it, `conflict`/`host_changed` (docs/guarantees.md#evidence-identity).
pub fn probe(ctx: &Context, req: &ProbeRequest) -> Result<Answered<ProbeReport>> {
    let op =
        OpId::parse(&req.op).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    let policy = load_policy(ctx)?;
    // A host that cannot be a destination is bad input, whatever the ledger holds.
    crate::host::check_destination(&req.host)
        .map_err(|why| Error::new(ErrorKind::InvalidInput, format!("{why}; nothing was sent")))?;
    let mut ledger = open_existing_ledger(ctx, &policy)?;
    let (host, dest, recorded) =
        super::reach::reach_operation(ctx, &req.host, &req.options, op.as_str(), &ledger)?;
    let key = OpKey::new(op.as_str(), host.clone());
    let marker = match block_on(probe_checked(&dest, &op, &host, &recorded))? {
        Ok(marker) => marker,
        Err(e) => {
            return host_changed::answer(host_changed::Subcommand::Probe, op.as_str(), &host, e)
        }
    };
    ledger.append(
        &key,
        &Event::Probed {
            attempt_id: None,
            state: marker.state.as_str().into(),
            exit_code: marker.exit_code,
            detail: "opmark probe".into(),
            claim: crate::operation::record::claim_seen(&marker),
        },
        Durability::Normal,
    )?;
    let record = ledger.operation(&key)?;
    Ok(Answered::Report(ProbeReport {
        op_id: op.as_str().to_owned(),
        state: marker.state.as_str().to_owned(),
        why: marker.why.clone(),
        attempt_id: marker.attempt.clone(),
        fingerprint: record.map(|r| r.fingerprint),
        host_fingerprint: marker.fingerprint.clone(),
        family: marker.family.clone(),
        exit_code: marker.exit_code,
        timed_out: marker.timed_out,
        stdout_bytes: marker.out_bytes,
        stderr_bytes: marker.err_bytes,
        output_collected: marker.output_collected(),
        summary: marker.summary(),
        host,
    }))
}

/// One probe over a fresh connection, only on a host presenting a key the operation ran
/// against; transport failures are `Unreachable` errors.
async fn probe_checked(
    dest: &Destination,
    op: &OpId,
    host: &str,
    recorded: &Recorded,
) -> Result<MarkerInfo> {
    let reached = Host::connect_checked(dest, recorded.root(), |key, route| {
        recorded.check(host, op.as_str(), key, Some(route))
    })
    .await;
    let reached = reached.map_err(|e| host_changed::reach_error(e, "nothing was probed"))?;
    reached.probe(op).await.map_err(|e| match e {
        CallError::Refused(r) if r.reason == RefusalReason::RootChanged => {
            host_changed::root_changed(recorded, host, op.as_str(), &r)
        }
        CallError::Refused(r) => Error::new(
            ErrorKind::Unreachable,
            format!(
                "the host shim refused the probe: {} {:?}",
                r.reason, r.fields
            ),
        ),
        CallError::NoAnswer(_) => Error::new(
            ErrorKind::Internal,
            "the shim answered without a probe frame",
        ),
        e => Error::new(
            ErrorKind::Unreachable,
            format!("probe of {} failed: {e}", dest.display()),
        ),
    })
}
