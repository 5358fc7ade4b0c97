//! `opmark audit verify`: walk the ledger's keyed hash chain and name the first broken
//! event, then replay the projection and name the first operation row that differs. The
//! same checks and the same output on every ledger backend (the work is
//! [`crate::ops::audit`]'s).

use super::render::printable;
use crate::cli::{AuditAction, AuditArgs, GlobalArgs, VerifyArgs};
use crate::error::Result;
use crate::ledger::VerifyScope;
use crate::ops::audit::VerifyRequest;

/// Exit 0 "chain intact: N events"; exit 1 naming the first broken event or row.
pub fn run(global: &GlobalArgs, args: &AuditArgs) -> Result<u8> {
    match &args.action {
        AuditAction::Verify(v) => verify(global, v),
    }
}

fn verify(global: &GlobalArgs, args: &VerifyArgs) -> Result<u8> {
    let report = crate::ops::audit::verify(
        &super::common::context(global),
        &VerifyRequest {
            incremental: args.incremental && !args.full,
            archive: args.archive.clone(),
        },
    )?;
    if global.json {
        super::common::print_json(&report)?;
    } else {
        match (&report.first_break, &report.first_mismatch) {
            (None, None) if report.counters_mismatch.is_some() => crate::outln!(
                "the `stats` counters differ from a recount of the events ({}); they were changed outside opmark: `opmark stats` is wrong, the events and `list` are not",
                report.counters_mismatch.as_deref().unwrap_or_default()
            ),
            (Some(b), _) => crate::outln!("chain broken at event #{}: {}", b.seq, b.problem),
            (None, Some(m)) => crate::outln!(
                "projection differs from the events at operation `{}` on `{}`: {}; that row was changed outside opmark: trust the timeline of `opmark show` (the events), not its header or `list`",
                printable(&m.op_id),
                printable(&m.host),
                m.problem
            ),
            (None, None) => match report.walked {
                VerifyScope::Full => match report.archived_through {
                    None => crate::outln!(
                        "chain intact: {} events, projection equals their replay",
                        report.events
                    ),
                    Some(cut) => crate::outln!(
                        "chain intact: {} events after the archive cut at event #{cut}, projection equals their replay; events up to the cut are in the archive (`opmark audit verify --archive FILE` checks it too)",
                        report.events
                    ),
                },
                VerifyScope::SinceCheckpoint {
                    checkpoint,
                    operations,
                } => crate::outln!(
                    "chain intact: {} new events after the checkpoint at event #{checkpoint} (verified earlier), and the {operations} operations they touch equal their replay; only what is new was read: `opmark audit verify` walks the whole chain",
                    report.events
                ),
            },
        }
    }
    Ok(report.exit_status())
}
