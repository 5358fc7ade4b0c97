//! `opmark gc HOST --older-than D [--tombstones-older-than D] [--dry-run]`: reclaim the
//! space of finished or fenced markers older than a retention period on a host (the
//! work, and what is never removed, is [`crate::ops::gc`]'s), and say what went.

use super::common;
use super::render::printable;
use crate::cli::{GcArgs, GlobalArgs};
use crate::error::{exit_code, Result};
use crate::host::GcAction;
use crate::operation::reconcile::unix_utc;
use crate::ops::gc::{gc, human, GcRequest};
use crate::ops::host_changed::Answered;

/// Runs the shim's gc and prints what it removed.
pub fn run(global: &GlobalArgs, args: &GcArgs) -> Result<u8> {
    let report = match gc(
        &common::context(global),
        &GcRequest {
            host: args.host.clone(),
            older_than: args.older_than,
            tombstones_older_than: args.tombstones_older_than,
            dry_run: args.dry_run,
            options: common::host_options(&args.host_args),
        },
    )? {
        Answered::Report(report) => report,
        Answered::HostChanged(changed) => return super::host_changed::render(global, &changed),
    };
    if global.json {
        common::print_json(&report)?;
    } else {
        let (settled, removed, kept, host) = (
            &report.settled_first,
            &report.removed,
            report.kept,
            &report.host,
        );
        for o in settled {
            crate::outln!(
                "settled first: {} ({}: {})",
                printable(&o.op_id),
                o.decision.as_str(),
                printable(&o.evidence)
            );
        }
        let would = if args.dry_run { "would be " } else { "" };
        for r in removed {
            let what = match r.action {
                GcAction::Collected => "output collected, tombstone kept",
                GcAction::TombstoneRemoved => "tombstone removed",
                GcAction::FailedStartReclaimed => "failed-start leftover reclaimed",
                GcAction::ShimReclaimed => "cached shim of another version reclaimed",
                GcAction::SpoolReclaimed => "unclaimed upload reclaimed",
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
