//! `opmark resolve OP --host H --as applied|not-applied|abandoned --note TEXT [--exit N]`:
//! an operator's decision, recorded as an observation, and final (the work, and when it
//! is refused, is [`crate::ops::resolve`]'s).

use super::common;
use super::render::printable;
use crate::cli::{GlobalArgs, ResolveArgs};
use crate::error::{exit_code, Result};
use crate::ops::host_changed::Answered;
use crate::ops::resolve::{resolve, ResolveRequest};

/// Records the decision (after fencing, for not-applied) and says what was recorded.
pub fn run(global: &GlobalArgs, args: &ResolveArgs) -> Result<u8> {
    let report = match resolve(
        &common::context(global),
        &ResolveRequest {
            op: args.op.clone(),
            host: args.host.clone(),
            decision: args.decision,
            note: args.note.clone(),
            exit: args.exit,
            by: args.by.clone(),
            force: args.force,
            options: common::host_options(&args.host_args),
        },
    )? {
        Answered::Report(report) => report,
        Answered::HostChanged(changed) => return super::host_changed::render(global, &changed),
    };
    if global.json {
        common::print_json(&report)?;
    } else {
        if let Some(t) = &report.fence {
            crate::outln!("fence on {}: {t}", printable(&report.host));
        }
        crate::outln!(
            "recorded: {} decided {} for {} on {}",
            printable(&report.by),
            report.decision,
            report.op_id,
            printable(&report.host)
        );
    }
    Ok(exit_code::OK)
}
