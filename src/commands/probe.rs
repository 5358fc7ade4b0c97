//! `opmark probe HOST OP`: the marker's state on the host (the work is
//! [`crate::ops::probe`]), as one line or one JSON document.

use super::common;
use crate::cli::{GlobalArgs, ProbeArgs};
use crate::error::Result;
use crate::ops::host_changed::Answered;
use crate::ops::probe::{probe, ProbeRequest};

/// Probes and prints the state.
pub fn run(global: &GlobalArgs, args: &ProbeArgs) -> Result<u8> {
    let report = match probe(
        &common::context(global),
        &ProbeRequest {
            host: args.host.clone(),
            op: args.op.clone(),
            options: common::host_options(&args.host_args),
        },
    )? {
        Answered::Report(report) => report,
        Answered::HostChanged(changed) => return super::host_changed::render(global, &changed),
    };
    if global.json {
        common::print_json(&report)?;
    } else {
        crate::outln!("{}", report.summary);
    }
    Ok(0)
}
