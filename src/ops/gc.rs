//! Gc: reclaim the
//! space of finished or fenced markers older than a retention period on a host (see
//! docs/host-protocol.md#tombstones). What stays of each is a tombstone (state, exit status, fingerprint,
//! attempt, family, times; no output) that probe and a later claim read as before, so a
//! rerun replays instead of running again; tombstones go only with
//! `--tombstones-older-than`. Failed-start leftovers and cached shims of other versions
//! go too. Before anything is collected, this ledger's unsettled operations on the host
//! are settled as `reconcile` would. Never a running or interrupted marker (the shim
//! decides per marker), never with a retention shorter than policy allows, and never on
//! a machine other than the one the ledger's latest operation on that host ran on: the
//! host is reached by that operation's recorded route and must present its host key,
//! user and marker root (docs/guarantees.md#evidence-identity; otherwise `conflict`/`host_changed`, as
//! `run` answers).

use std::time::Duration;

use serde::Serialize;

use super::host_changed::{self, Answered};
use super::reach::{ledger_name, reach};
use super::{block_on, load_policy, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::host::{CallError, GcRemoved, Host, RefusalReason};
use crate::ledger::{ListFilter, OpKey};
use crate::operation::identity::{self, Recorded};
use crate::operation::reconcile::{self, Candidate, Outcome};
use crate::policy::Policy;

/// What to reclaim, where.
#[derive(Debug, Clone)]
pub struct GcRequest {
    /// The host as the user names it.
    pub host: String,
    /// Finished or fenced markers older than this lose their output.
    pub older_than: Duration,
    /// Tombstones older than this go too (None: kept).
    pub tombstones_older_than: Option<Duration>,
    /// Say what would go, change nothing (in the ledger either).
    pub dry_run: bool,
    /// Connection options overriding the recorded route.
    pub options: HostOptions,
}

/// What gc did (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    /// The host as the ledger names it.
    pub host: String,
    pub older_than_secs: u64,
    /// `null`: tombstones are kept.
    pub tombstones_older_than_secs: Option<u64>,
    pub dry_run: bool,
    /// This ledger's unsettled operations on the host, settled before anything went.
    pub settled_first: Vec<Outcome>,
    /// Everything collected or reclaimed, each with its `action`.
    pub removed: Vec<GcRemoved>,
    pub kept: u64,
}

/// The largest `min_retention` of the policy's families, and that family (the most
/// dangerous one on ties): gc removes markers of every family, so the strictest applies.
pub fn strictest_retention(policy: &Policy) -> (Family, Duration) {
    let mut best = (Family::ReadOnly, Duration::ZERO);
    for f in Family::ALL {
        let min = policy.family(f).min_retention;
        if min >= best.1 {
            best = (f, min);
        }
    }
    best
}

/// Runs the shim's gc (after settling this ledger's unsettled operations on the host).
pub fn gc(ctx: &Context, args: &GcRequest) -> Result<Answered<GcReport>> {
    let policy = load_policy(ctx)?;
    let (family, min) = strictest_retention(&policy);
    if args.older_than < min {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "--older-than {} is shorter than the policy's min_retention for {family} markers ({}); markers must outlive any late retry. Use --older-than {} or more (policy: {}). Nothing was removed",
                human(args.older_than),
                human(min),
                human(min),
                policy.origin()
            ),
        ));
    }
    if let Some(tombs) = args.tombstones_older_than.filter(|t| *t < min) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "--tombstones-older-than {} is shorter than the policy's min_retention for {family} markers ({}); a tombstone is what keeps a late rerun from running again. Use --tombstones-older-than {} or more (policy: {}). Nothing was removed",
                human(tombs),
                human(min),
                human(min),
                policy.origin()
            ),
        ));
    }
    let (host, fresh) = ledger_name(ctx, &args.host, &args.options)?;
    let settled = settle_first(ctx, &host, args)?;
    let (op, recorded) = latest_identity(ctx, &host)?;
    let dest = match recorded.route.as_ref() {
        Some(route) => reach(ctx, &host, &args.options, Some(route)),
        None => fresh,
    }?;
    let report = block_on(async {
        let reached = Host::connect_checked(&dest, recorded.root(), |key, route| {
            recorded.check(&host, &op, key, Some(route))
        })
        .await;
        let target = reached.map_err(|e| host_changed::reach_error(e, "nothing was removed"))?;
        target.gc(args.older_than, args.dry_run, args.tombstones_older_than).await.map_err(|e| match e {
            CallError::NotSent(why) => Error::new(
                ErrorKind::Unreachable,
                format!("gc on {host} was not sent ({why}); nothing was removed"),
            ),
            CallError::Refused(r) if r.reason == RefusalReason::RootChanged => {
                host_changed::root_changed(&recorded, &host, &op, &r)
            }
            CallError::Refused(r) => Error::new(
                ErrorKind::Unreachable,
                format!(
                    "the host shim refused gc on {host} ({}); check the host with `opmark doctor`",
                    r.reason
                ),
            ),
            lost => Error::new(
                ErrorKind::Unreachable,
                format!("gc on {host} lost its answer ({lost}); some markers may have been removed. Run it again with --dry-run to see what is left"),
            ),
        })
    })?;
    let report = match report {
        Ok(report) => report,
        Err(e) => return host_changed::answer(host_changed::Subcommand::Gc, &op, &host, e),
    };
    Ok(Answered::Report(GcReport {
        host,
        older_than_secs: args.older_than.as_secs(),
        tombstones_older_than_secs: args.tombstones_older_than.map(|t| t.as_secs()),
        dry_run: args.dry_run,
        settled_first: settled,
        removed: report.removed,
        kept: report.kept,
    }))
}

/// docs/host-protocol.md#tombstones: before anything is collected on `host`, this ledger's unsettled operations
/// there are settled as `reconcile` would settle them (probe, then record what the
/// evidence says), so that a completion the ledger never heard of is recorded while the
/// host still holds its output.
fn settle_first(ctx: &Context, host: &str, args: &GcRequest) -> Result<Vec<Outcome>> {
    let (existing, _) = crate::ledger::Ledger::open_existing_default_or(
        ctx.ledger.as_deref(),
        ctx.ledger_key.as_deref(),
    )?;
    let Some(mut ledger) = existing else {
        return Ok(Vec::new());
    };
    let records = ledger.list(&ListFilter {
        unresolved: true,
        host: Some(host.to_owned()),
        limit: None,
        ..Default::default()
    })?;
    if records.is_empty() || args.dry_run {
        // A dry run changes nothing, in the ledger either.
        return Ok(Vec::new());
    }
    let mut candidates = Vec::with_capacity(records.len());
    for record in records {
        let events = ledger.events(&OpKey::new(record.op_id.clone(), record.host.clone()))?;
        candidates.push(Candidate { record, events });
    }
    Ok(block_on(reconcile::reconcile(
        &mut ledger,
        candidates,
        |c, route| reach(ctx, &c.record.host, &args.options, route),
        |_, _| {},
    ))??)
}

/// The newest operation on `host` whose events record how it reached the host, and that
/// identity (empty when the ledger has none: nothing to hold the host to).
fn latest_identity(ctx: &Context, host: &str) -> Result<(String, Recorded)> {
    let (existing, _) = crate::ledger::Ledger::open_existing_default_or(
        ctx.ledger.as_deref(),
        ctx.ledger_key.as_deref(),
    )?;
    let Some(ledger) = existing else {
        return Ok((String::new(), Recorded::default()));
    };
    // Newest first, a page at a time: the answer is almost always on the first page, and
    // a host's whole history is read only when none of it recorded a route.
    let mut before_seq = None;
    loop {
        let ops = ledger.list(&ListFilter {
            host: Some(host.to_owned()),
            before_seq,
            limit: Some(64),
            ..Default::default()
        })?;
        let Some(last) = ops.last() else { break };
        before_seq = Some(last.last_seq);
        for r in ops {
            let recorded = identity::recorded(&ledger.events(&OpKey::new(r.op_id.clone(), host))?);
            if recorded.route.is_some() {
                return Ok((r.op_id, recorded));
            }
        }
    }
    Ok((String::new(), Recorded::default()))
}

/// `30d`, `12h`, `90s`: the largest whole unit.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if s >= len && s.is_multiple_of(len) {
            return format!("{}{unit}", s / len);
        }
    }
    if d.subsec_millis() != 0 {
        return format!("{}ms", d.as_millis());
    }
    format!("{s}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_use_the_largest_whole_unit() {
        assert_eq!(human(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(human(Duration::from_secs(7200)), "2h");
        assert_eq!(human(Duration::from_secs(90)), "90s");
        assert_eq!(human(Duration::from_millis(500)), "500ms");
    }

    #[test]
    fn strictest_retention_is_the_largest_family_minimum() {
        let policy = Policy::builtin();
        let (family, min) = strictest_retention(&policy);
        for f in Family::ALL {
            assert!(policy.family(f).min_retention <= min, "{f}");
        }
        assert_eq!(policy.family(family).min_retention, min);
    }
}
