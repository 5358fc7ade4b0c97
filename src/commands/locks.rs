//! `opmark locks HOST`: the host locks held and waited for on a host (the work is
//! [`crate::ops::locks`]'s).

use super::common;
use super::render::printable;
use crate::cli::{GlobalArgs, LocksArgs};
use crate::error::{exit_code, Result};
use crate::ops::locks::{locks, LocksRequest};

/// Lists the host's locks: one line per held slot, then one per waiting operation.
pub fn run(global: &GlobalArgs, args: &LocksArgs) -> Result<u8> {
    let report = locks(
        &common::context(global),
        &LocksRequest {
            host: args.host.clone(),
            options: common::host_options(&args.host_args),
        },
    )?;
    if global.json {
        common::print_json(&report)?;
        return Ok(exit_code::OK);
    }
    if report.held.is_empty() && report.waiting.is_empty() {
        crate::outln!(
            "no host lock is held or waited for on {}",
            printable(&report.host)
        );
    }
    let unknown = "?".to_owned();
    for h in &report.held {
        let capacity = h.capacity.map_or_else(|| "?".to_owned(), |c| c.to_string());
        crate::outln!(
            "{} slot {}/{capacity}: held by {}{} since {}{}",
            printable(&h.lock),
            h.slot,
            printable(h.op_id.as_ref().unwrap_or(&unknown)),
            running(h.command.as_deref()),
            h.since.as_ref().unwrap_or(&unknown),
            if h.alive {
                ""
            } else {
                " (its holder is gone: the next claim takes the slot)"
            }
        );
    }
    for w in &report.waiting {
        crate::outln!(
            "{}{} waits for {} (claimed {})",
            printable(w.op_id.as_ref().unwrap_or(&unknown)),
            running(w.command.as_deref()),
            w.locks.join(", "),
            w.since.as_ref().unwrap_or(&unknown)
        );
    }
    Ok(exit_code::OK)
}

/// ` (`COMMAND`)`, the holder's redacted command, when the host said it.
fn running(command: Option<&str>) -> String {
    command.map_or_else(String::new, |c| format!(" (`{}`)", printable(c)))
}
