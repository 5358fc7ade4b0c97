//! `opmark approve OP [HOST] --note TEXT [--for D] [-i KEY] [-o FILE]`: signs an
//! approval of a held operation (the work is [`crate::ops::approve`]'s). The token goes to
//! standard output or the file; what is being approved goes to stderr for the human.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;

use super::common;
use super::render::printable;
use crate::cli::{ApproveArgs, GlobalArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ops::approve::{approve, ApproveRequest};

/// Signs, writes the token, and says what it approves.
pub fn run(global: &GlobalArgs, args: &ApproveArgs) -> Result<u8> {
    let report = approve(
        &common::context(global),
        &ApproveRequest {
            op: args.op.clone(),
            host: args.host.clone(),
            note: args.note.clone(),
            ttl: args.ttl,
            key: args.key.clone(),
            intent: args.intent.clone(),
        },
    )?;
    if let Some(path) = &args.output {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "-o {}: {e} (an approval is never written over a file)",
                        path.display()
                    ),
                )
            })?;
        file.write_all(report.token.as_bytes())
            .map_err(|e| Error::new(ErrorKind::LocalIo, format!("-o {}: {e}", path.display())))?;
    }
    if global.json {
        common::print_json(&report)?;
    } else if args.output.is_none() {
        crate::out!("{}", report.token);
    }
    let signer = match (&report.principal, &report.approvers) {
        (Some(p), Some(file)) => format!("{p} ({}, listed in {file})", report.key),
        _ => format!(
            "{} (no approvers file is configured here: no run checks this token)",
            report.key
        ),
    };
    crate::say!(
        "opmark: approved op {} on {}: `{}` (family {}, {}), until {}, signed by {signer}",
        report.op_id,
        printable(&report.host),
        printable(&report.intent),
        report.family,
        printable(&report.rule),
        report.expires,
    );
    let file = args
        .output
        .as_ref()
        .map_or("FILE".to_owned(), |p| p.display().to_string());
    crate::say!(
        "opmark: hand the token over; the held run is repeated with the same op id and `--approval {file}` (over MCP: `approval`). It lets one attempt run, once."
    );
    Ok(exit_code::OK)
}
