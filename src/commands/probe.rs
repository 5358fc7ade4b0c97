//! `opmark probe HOST OP`: the marker's state on the host, read-only; the observation is
//! recorded in the ledger. An operation the ledger knows is probed the way it ran (its
//! recorded route) and only on a host presenting the key it ran against (SPEC section 9);
//! another machine, user or marker root is answered as `run` answers it,
//! `conflict`/`host_changed` (SPEC 17).

use serde::Serialize;

use super::common;
use crate::cli::{GlobalArgs, ProbeArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{CallError, Destination, Host, MarkerInfo, RefusalReason};
use crate::ledger::{Durability, Event, OpKey};
use crate::op_id::OpId;
use crate::operation::identity::Recorded;

/// `probe --json`: the marker's fields under the contract's names (SPEC 6): the host's
/// plain digest is `host_fingerprint`; `fingerprint` is the ledger's HMAC, as in `run`
/// and `list`, and null when this ledger never ran the operation.
#[derive(Serialize)]
struct ProbeReport<'a> {
    op_id: &'a str,
    host: &'a str,
    state: &'a str,
    why: Option<&'a str>,
    attempt_id: Option<&'a str>,
    fingerprint: Option<&'a str>,
    host_fingerprint: Option<&'a str>,
    family: Option<&'a str>,
    exit_code: Option<i32>,
    timed_out: bool,
    out_bytes: Option<u64>,
    err_bytes: Option<u64>,
    /// gc collected the output: the marker is a tombstone (SPEC 3).
    output_collected: bool,
}

/// Probes and prints the state.
pub fn run(global: &GlobalArgs, args: &ProbeArgs) -> Result<u8> {
    let op =
        OpId::parse(&args.op).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    let policy = common::load_policy(global)?;
    let mut ledger = common::open_ledger(global, &policy)?;
    let (host, dest, recorded) =
        super::reach::reach_operation(global, &args.host, &args.host_args, op.as_str(), &ledger)?;
    let key = OpKey::new(op.as_str(), host.clone());
    let marker = match common::block_on(probe_checked(&dest, &op, &host, &recorded))? {
        Ok(marker) => marker,
        Err(e) => return super::host_changed::answer(global, op.as_str(), &host, e),
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
    if global.json {
        let record = ledger.operation(&key)?;
        common::print_json(&ProbeReport {
            op_id: op.as_str(),
            host: &host,
            state: marker.state.as_str(),
            why: marker.why.as_deref(),
            attempt_id: marker.attempt.as_deref(),
            fingerprint: record.as_ref().map(|r| r.fingerprint.as_str()),
            host_fingerprint: marker.fingerprint.as_deref(),
            family: marker.family.as_deref(),
            exit_code: marker.exit_code,
            timed_out: marker.timed_out,
            out_bytes: marker.out_bytes,
            err_bytes: marker.err_bytes,
            output_collected: marker.output_collected(),
        })?;
    } else {
        crate::outln!("{}", marker.summary());
    }
    Ok(0)
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
    let reached = reached.map_err(|e| super::host_changed::reach_error(e, "nothing was probed"))?;
    reached.probe(op).await.map_err(|e| match e {
        CallError::Refused(r) if r.reason == RefusalReason::RootChanged => {
            super::host_changed::root_changed(recorded, host, op.as_str(), &r)
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
