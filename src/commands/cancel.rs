//! `opmark cancel HOST OP [--grace D]`: stop an operation on its host for good (the
//! work, and why it is safe, is [`crate::ops::cancel`]'s), and say the final state.

use super::common;
use crate::cli::{CancelArgs, GlobalArgs};
use crate::error::Result;
use crate::ops::cancel::{cancel, CancelRequest};
use crate::ops::host_changed::Answered;

/// Cancels and prints the final state; exit 0 once the operation can no longer run,
/// 1 when it is still running after TERM and KILL.
pub fn run(global: &GlobalArgs, args: &CancelArgs) -> Result<u8> {
    let report = match cancel(
        &common::context(global),
        &CancelRequest {
            host: args.host.clone(),
            op: args.op.clone(),
            grace: args.grace,
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
    } else if report.still_running {
        crate::logging::say(format_args!("opmark: {}", report.message));
    } else {
        crate::outln!("{}", report.message);
    }
    Ok(report.exit_status())
}
