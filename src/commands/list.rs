//! `opmark list`: the ledger's operations, most recently active first. Unresolved
//! operations are marked `!` (`H` once they need a human: unresolved longer than the
//! policy's `escalate_after`), contradicted ones (docs/ledger.md#contradictions) `C`. Op ids are never
//! shortened (people copy them into `show` and `run --op`); times are local unless
//! `--utc`.

use super::common;
use super::render::{fit, parse_at, printable, to_second};
use crate::cli::{GlobalArgs, ListArgs};
use crate::error::{exit_code, Result};
use crate::ops::list::{list, ListRequest, Listed};

/// Prints the operations as a table, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &ListArgs) -> Result<u8> {
    let report = list(
        &common::context(global),
        &ListRequest {
            unresolved: args.unresolved,
            host: args.host.clone(),
            since: args.since,
            limit: args.limit,
            all: args.all,
        },
    )?;
    if global.json {
        common::print_json(&report)?;
    } else {
        let zone = if args.utc { Zone::Utc } else { Zone::local() };
        crate::out!(
            "{}",
            table(
                &report.operations,
                args.unresolved,
                zone,
                report.escalate_after
            )
        );
    }
    match report.more {
        Some(Some(n)) => {
            crate::logging::say(format_args!("{n} more not shown; use --all or --limit N"))
        }
        Some(None) => crate::logging::say(format_args!("more not shown; use --all or --limit N")),
        None => {}
    }
    Ok(exit_code::OK)
}

/// The time zone the table's times are shown in.
#[derive(Debug, Clone, Copy)]
enum Zone {
    /// Asked for with `--utc`.
    Utc,
    /// The local offset, as the system reports it.
    Local(time::UtcOffset),
    /// Local time was wanted but the offset could not be determined safely (the `time`
    /// crate refuses when it cannot rule out a race with another thread's setenv).
    UtcFallback,
}

impl Zone {
    fn local() -> Zone {
        time::UtcOffset::current_local_offset().map_or(Zone::UtcFallback, Zone::Local)
    }

    fn offset(self) -> time::UtcOffset {
        match self {
            Zone::Local(offset) => offset,
            Zone::Utc | Zone::UtcFallback => time::UtcOffset::UTC,
        }
    }

    /// What the column header says about the times under it.
    fn label(self) -> String {
        match self {
            Zone::Utc => "UTC".to_owned(),
            Zone::UtcFallback => "UTC; local offset unknown".to_owned(),
            Zone::Local(offset) if offset.is_utc() => "local, UTC".to_owned(),
            Zone::Local(offset) => {
                let (h, m, _) = offset.as_hms();
                let sign = if offset.is_negative() { '-' } else { '+' };
                format!(
                    "local, UTC{sign}{:02}:{:02}",
                    h.unsigned_abs(),
                    m.unsigned_abs()
                )
            }
        }
    }

    /// `2024-05-01T10:00:00.123Z` as `05-01 12:00` in this zone; unparseable text is
    /// shown as stored, cut to the same shape.
    fn short(self, at: &str) -> String {
        let format = time::macros::format_description!("[month]-[day] [hour]:[minute]");
        parse_at(at)
            .and_then(|t| t.to_offset(self.offset()).format(&format).ok())
            .unwrap_or_else(|| to_second(at).get(5..16).unwrap_or("").to_owned())
    }
}

fn table(
    ops: &[Listed],
    only_unresolved: bool,
    zone: Zone,
    escalate_after: std::time::Duration,
) -> String {
    if ops.is_empty() {
        return if only_unresolved {
            "no unresolved operations\n".to_owned()
        } else {
            "no operations recorded\n".to_owned()
        };
    }
    let col = |f: &dyn Fn(&Listed) -> usize, min: usize, max: usize| {
        ops.iter().map(f).max().unwrap_or(0).clamp(min, max)
    };
    // Op ids and hosts are never cut: a shortened id cannot be copied into `show` or
    // `run --op` (minted ids are longer than any fixed column).
    let op_w = col(&|o| printable(&o.op_id).chars().count(), 5, usize::MAX);
    let host_w = col(&|o| printable(&o.host).chars().count(), 4, usize::MAX);
    let state_w = col(&|o| o.state.to_string().chars().count(), 5, 16);
    let mut out = format!(
        "   {:op_w$} {:host_w$} {:11} {:state_w$} {:>4} UPDATED ({})\n",
        "OP",
        "HOST",
        "FAMILY",
        "STATE",
        "EXIT",
        zone.label()
    );
    for o in ops {
        let exit = o.exit_code.map_or("-".to_owned(), |c| c.to_string());
        out.push_str(&format!(
            "{}{} {:op_w$} {:host_w$} {:11} {:state_w$} {:>4} {}\n",
            match (o.needs_human, o.unresolved) {
                (true, _) => "H",
                (false, true) => "!",
                (false, false) => " ",
            },
            if o.contradictions > 0 { "C" } else { " " },
            printable(&o.op_id),
            printable(&o.host),
            o.family.as_str(),
            fit(&printable(&o.state.to_string()), state_w),
            exit,
            zone.short(&o.updated_at),
        ));
    }
    let unresolved = ops.iter().filter(|o| o.unresolved).count();
    out.push_str(&format!(
        "{} operation{}, {unresolved} unresolved (marked !)",
        ops.len(),
        if ops.len() == 1 { "" } else { "s" }
    ));
    let needs_human = ops.iter().filter(|o| o.needs_human).count();
    if needs_human > 0 {
        // Only when present, so the common footer stays as it was.
        out.push_str(&format!(
            ", {needs_human} NEED{} A HUMAN (marked H: unresolved longer than escalate_after {}; `opmark reconcile`, then `opmark resolve`)",
            if needs_human == 1 { "S" } else { "" },
            crate::duration::format_duration(escalate_after)
        ));
    }
    let contradicted = ops.iter().filter(|o| o.contradictions > 0).count();
    if contradicted > 0 {
        // Only when present, so the common footer stays as it was.
        out.push_str(&format!(
            ", {contradicted} CONTRADICTED (marked C; `opmark show OP` says how)"
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_says_which_zone_the_times_are_in() {
        let east = time::UtcOffset::from_hms(5, 30, 0).unwrap();
        let west = time::UtcOffset::from_hms(-3, 0, 0).unwrap();
        assert_eq!(Zone::Utc.label(), "UTC");
        assert_eq!(Zone::Local(east).label(), "local, UTC+05:30");
        assert_eq!(Zone::Local(west).label(), "local, UTC-03:00");
        assert_eq!(Zone::Local(time::UtcOffset::UTC).label(), "local, UTC");
        assert_eq!(Zone::UtcFallback.label(), "UTC; local offset unknown");
    }

    #[test]
    fn times_are_shown_in_the_zone_and_odd_text_as_stored() {
        let at = "2026-03-04T22:30:59.123456Z";
        let east = time::UtcOffset::from_hms(5, 30, 0).unwrap();
        assert_eq!(Zone::Utc.short(at), "03-04 22:30");
        assert_eq!(Zone::UtcFallback.short(at), "03-04 22:30");
        assert_eq!(Zone::Local(east).short(at), "03-05 04:00");
        assert_eq!(Zone::Local(east).short("2026-03-04 garbage"), "03-04 garba");
    }
}
