//! `opmark output OP [HOST]`: a part of an operation's recorded output (the work is
//! [`crate::ops::output`]): the raw bytes, as `cat` would print them, or one JSON document.

use super::common;
use crate::cli::{GlobalArgs, OutputArgs, StreamArg};
use crate::error::Result;
use crate::host::OutputStream;
use crate::ops::host_changed::Answered;
use crate::ops::output::{output, OutputRequest, Select};

/// Reads and prints the selected part.
pub fn run(global: &GlobalArgs, args: &OutputArgs) -> Result<u8> {
    let select = match (&args.range, args.tail, &args.grep) {
        (Some((from, to)), _, _) => Select::Range {
            from: *from,
            to: *to,
        },
        (_, Some(n), _) => Select::Tail(n),
        (_, _, Some(pattern)) => Select::Grep(pattern.clone()),
        _ => Select::All,
    };
    let report = match output(
        &common::context(global),
        &OutputRequest {
            op: args.op.clone(),
            host: args.host.clone(),
            stream: match args.stream {
                StreamArg::Stdout => OutputStream::Stdout,
                StreamArg::Stderr => OutputStream::Stderr,
            },
            select,
            max_bytes: crate::ops::output::MAX_READ,
            options: common::host_options(&args.host_args),
        },
    )? {
        Answered::Report(report) => report,
        Answered::HostChanged(changed) => return super::host_changed::render(global, &changed),
    };
    if global.json {
        common::print_json(&report)?;
        return Ok(0);
    }
    match &report.matches {
        Some(matches) => {
            for m in matches {
                crate::outln!("{}:{}", m.offset, m.line);
            }
        }
        None => super::render::Out.bytes(&report.bytes)?,
    }
    if report.dropped_bytes > 0 || report.output_collected {
        let why = if report.output_collected {
            "gc collected this operation's output; only its exit status is left".to_owned()
        } else {
            format!(
                "the host kept {} bytes of {}; the {} beyond the run's --output-cap were never kept",
                report.kept_bytes,
                report.stream,
                report.dropped_bytes
            )
        };
        crate::say!("opmark: {why}");
    }
    Ok(0)
}
