//! `opmark gc HOST --older-than D [--tombstones-older-than D] [--dry-run]`: reclaim the
//! space of finished or fenced markers older than a retention period on a host (SPEC
//! section 3). What stays of each is a tombstone (state, exit status, fingerprint,
//! attempt, family, times; no output) that probe and a later claim read as before, so a
//! rerun replays instead of running again; tombstones go only with
//! `--tombstones-older-than`. Failed-start leftovers and cached shims of other versions
//! go too. Before anything is collected, this ledger's unsettled operations on the host
//! are settled as `reconcile` would. Never a running or interrupted marker (the shim
//! decides per marker), never with a retention shorter than policy allows, and never on
//! a machine other than the one the ledger's latest operation on that host ran on: the
//! host is reached by that operation's recorded route and must present its host key
//! (SPEC section 9).

use std::time::Duration;

use serde::Serialize;

use super::common;
use super::reach::{ledger_name, reach};
use super::render::printable;
use crate::cli::{GcArgs, GlobalArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::family::Family;
use crate::host::{CallError, GcAction, GcRemoved, Host};
use crate::ledger::{ListFilter, OpKey};
use crate::operation::identity::{self, Recorded};
use crate::operation::reconcile::{self, unix_utc, Candidate, Outcome};
use crate::policy::Policy;

#[derive(Serialize)]
struct Report<'a> {
    host: &'a str,
    older_than_secs: u64,
    /// `null`: tombstones are kept.
    tombstones_older_than_secs: Option<u64>,
    dry_run: bool,
    /// This ledger's unsettled operations on the host, settled before anything went.
    settled_first: &'a [Outcome],
    /// Everything collected or reclaimed, each with its `action`.
    removed: &'a [GcRemoved],
    kept: u64,
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

/// Runs the shim's gc and prints what it removed.
pub fn run(global: &GlobalArgs, args: &GcArgs) -> Result<u8> {
    let policy = common::load_policy(global)?;
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
    let (host, fresh) = ledger_name(global, &args.host, &args.host_args)?;
    let settled = settle_first(global, &host, args)?;
    let (op, recorded) = latest_identity(global, &host)?;
    let dest = match recorded.route.as_ref() {
        Some(route) => reach(global, &host, &args.host_args, Some(route)),
        None => fresh,
    }?;
    let report = common::block_on(async {
        let reached = Host::connect_checked(&dest, recorded.root(), |key, route| {
            recorded.check(&host, &op, key, Some(route))
        })
        .await;
        let target = reached.map_err(|e| common::reach_error(e, "nothing was removed"))?;
        target.gc(args.older_than, args.dry_run, args.tombstones_older_than).await.map_err(|e| match e {
            CallError::NotSent(why) => Error::new(
                ErrorKind::Unreachable,
                format!("gc on {host} was not sent ({why}); nothing was removed"),
            ),
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
    })??;
    let (removed, kept) = (report.removed, report.kept);
    if global.json {
        common::print_json(&Report {
            host: &host,
            older_than_secs: args.older_than.as_secs(),
            tombstones_older_than_secs: args.tombstones_older_than.map(|t| t.as_secs()),
            dry_run: args.dry_run,
            settled_first: &settled,
            removed: &removed,
            kept,
        })?;
    } else {
        for o in &settled {
            crate::outln!(
                "settled first: {} ({}: {})",
                printable(&o.op_id),
                o.decision.as_str(),
                printable(&o.evidence)
            );
        }
        let would = if args.dry_run { "would be " } else { "" };
        for r in &removed {
            let what = match r.action {
                GcAction::Collected => "output collected, tombstone kept",
                GcAction::TombstoneRemoved => "tombstone removed",
                GcAction::FailedStartReclaimed => "failed-start leftover reclaimed",
                GcAction::ShimReclaimed => "cached shim of another version reclaimed",
            };
            if r.at == 0 {
                crate::outln!("{would}{what}: {}", printable(&r.op));
            } else {
                crate::outln!(
                    "{would}{what}: {} ({}, recorded {})",
                    printable(&r.op),
                    r.state,
                    unix_utc(&r.at.to_string())
                );
            }
        }
        let count = |a: GcAction| removed.iter().filter(|r| r.action == a).count();
        crate::outln!(
            "{host}: {would}collected {}, tombstones removed {}, leftovers reclaimed {}; kept {kept} (running, interrupted, newer than {}, or tombstones{})",
            count(GcAction::Collected),
            count(GcAction::TombstoneRemoved),
            count(GcAction::FailedStartReclaimed) + count(GcAction::ShimReclaimed),
            human(args.older_than),
            if args.tombstones_older_than.is_none() {
                ": those go only with --tombstones-older-than"
            } else {
                ""
            }
        );
    }
    Ok(exit_code::OK)
}

/// SPEC 3: before anything is collected on `host`, this ledger's unsettled operations
/// there are settled as `reconcile` would settle them (probe, then record what the
/// evidence says), so that a completion the ledger never heard of is recorded while the
/// host still holds its output.
fn settle_first(global: &GlobalArgs, host: &str, args: &GcArgs) -> Result<Vec<Outcome>> {
    let (existing, _) = crate::ledger::Ledger::open_existing_default_or(
        global.ledger.as_deref(),
        global.ledger_key.as_deref(),
    )?;
    let Some(mut ledger) = existing else {
        return Ok(Vec::new());
    };
    let records = ledger.list(&ListFilter {
        unresolved: true,
        host: Some(host.to_owned()),
        limit: None,
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
    common::block_on(reconcile::reconcile(
        &mut ledger,
        candidates,
        |c, route| reach(global, &c.record.host, &args.host_args, route),
        |_, _| {},
    ))?
}

/// The newest operation on `host` whose events record how it reached the host, and that
/// identity (empty when the ledger has none: nothing to hold the host to).
fn latest_identity(global: &GlobalArgs, host: &str) -> Result<(String, Recorded)> {
    let (existing, _) = crate::ledger::Ledger::open_existing_default_or(
        global.ledger.as_deref(),
        global.ledger_key.as_deref(),
    )?;
    let Some(ledger) = existing else {
        return Ok((String::new(), Recorded::default()));
    };
    let ops = ledger.list(&ListFilter {
        unresolved: false,
        host: Some(host.to_owned()),
        limit: None,
    })?;
    for r in ops {
        let recorded = identity::recorded(&ledger.events(&OpKey::new(r.op_id.clone(), host))?);
        if recorded.route.is_some() {
            return Ok((r.op_id, recorded));
        }
    }
    Ok((String::new(), Recorded::default()))
}

/// `30d`, `12h`, `90s`: the largest whole unit.
fn human(d: Duration) -> String {
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
