//! `opmark audit verify`: walk the ledger's keyed hash chain and name the first broken
//! event, then replay the projection and name the first operation row that differs. The
//! same checks and the same output on every ledger backend (the work is
//! [`crate::ops::audit`]'s).

use super::render::printable;
use crate::cli::{AuditAction, AuditArgs, GlobalArgs};
use crate::error::Result;

/// Exit 0 "chain intact: N events"; exit 1 naming the first broken event or row.
pub fn run(global: &GlobalArgs, args: &AuditArgs) -> Result<u8> {
    match args.action {
        AuditAction::Verify => verify(global),
    }
}

fn verify(global: &GlobalArgs) -> Result<u8> {
    let report = crate::ops::audit::verify(&super::common::context(global))?;
    if global.json {
        super::common::print_json(&report)?;
    } else {
        match (&report.first_break, &report.first_mismatch) {
            (Some(b), _) => crate::outln!("chain broken at event #{}: {}", b.seq, b.problem),
            (None, Some(m)) => crate::outln!(
                "projection differs from the events at operation `{}` on `{}`: {}; that row was changed outside opmark: trust the timeline of `opmark show` (the events), not its header or `list`",
                printable(&m.op_id),
                printable(&m.host),
                m.problem
            ),
            (None, None) => crate::outln!(
                "chain intact: {} events, projection equals their replay",
                report.events
            ),
        }
    }
    Ok(report.exit_status())
}
