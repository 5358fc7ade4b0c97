//! `opmark list`: the ledger's operations, most recently active first. Unresolved
//! operations are marked `!` (`H` once they need a human: unresolved longer than the
//! policy's `escalate_after`), contradicted ones (docs/ledger.md#contradictions) `C`. Op ids
//! and hosts are never shortened (people copy them into `show` and `run --op`); the
//! command (its redacted display form) is cut to the screen unless `--wide`; times are
//! local (year to second) unless `--utc`.

use super::common;
use super::render::{fit, pad, parse_at, printable, to_second, width, Fit};
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
        let fit_to = if args.wide() {
            Fit::Wide
        } else {
            Fit::Screen(crate::logging::terminal_width())
        };
        crate::out!(
            "{}",
            table(
                &report.operations,
                args.unresolved,
                zone,
                fit_to,
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

    /// `2024-05-01T10:00:00.123Z` as `2024-05-01 12:00:00` in this zone (year and
    /// seconds: an operation from last year or two in one minute must be told apart);
    /// unparseable text is shown as stored, cut to the same shape.
    fn at(self, at: &str) -> String {
        let format =
            time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
        parse_at(at)
            .and_then(|t| t.to_offset(self.offset()).format(&format).ok())
            .unwrap_or_else(|| to_second(at))
    }
}

/// The narrowest room a command gets beside the other columns; below it, the command
/// goes on a line of its own under the row.
const MIN_COMMAND: usize = 12;

/// Where the lines under an op id start.
const INDENT: &str = "     ";

/// How one operation's lines are laid out on a screen.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The op id on a line of its own, the columns under it.
    op_own_line: bool,
    /// Columns left for the command on its row.
    room: usize,
}

fn table(
    ops: &[Listed],
    only_unresolved: bool,
    zone: Zone,
    fit_to: Fit,
    escalate_after: std::time::Duration,
) -> String {
    if ops.is_empty() {
        return if only_unresolved {
            "no unresolved operations\n".to_owned()
        } else {
            "no operations recorded\n".to_owned()
        };
    }
    let col =
        |f: &dyn Fn(&Listed) -> usize, min: usize| ops.iter().map(f).max().unwrap_or(0).max(min);
    // Op ids and hosts are never cut: a shortened id cannot be copied into `show` or
    // `run --op` (minted ids are longer than any fixed column).
    let op_w = col(&|o| width(&printable(&o.op_id)), 2);
    let host_w = col(&|o| width(&printable(&o.host)), 4);
    let state_w = col(&|o| width(&o.state.to_string()), 5);
    let exit_w = col(&|o| o.exit_code.map_or(1, |c| c.to_string().len()), 4);
    let wide = fit_to == Fit::Wide;
    let family_w = if wide {
        col(&|o| o.family.as_str().len(), 6)
    } else {
        0
    };
    let time_w = 19;
    // HOST [FAMILY] STATE EXIT UPDATED, then the command: the columns after the op id.
    let columns = |host: &str, family: &str, state: &str, exit: &str, at: &str| {
        let mut c = format!("{} ", pad(host, host_w));
        if wide {
            c.push_str(&pad(family, family_w));
            c.push(' ');
        }
        c.push_str(&format!(
            "{} {exit:>exit_w$} {} ",
            pad(state, state_w),
            pad(at, time_w)
        ));
        c
    };
    let head_columns = columns("HOST", "FAMILY", "STATE", "EXIT", "UPDATED");
    let inline_w = 3 + op_w + 1 + width(&head_columns);
    // When the op id and the columns leave too little room for the command, the op id
    // gets a line of its own (whole), and the columns go under it.
    let layout = match fit_to {
        Fit::Wide => Layout {
            op_own_line: false,
            room: usize::MAX,
        },
        Fit::Screen(w) if inline_w + MIN_COMMAND <= w => Layout {
            op_own_line: false,
            room: w - inline_w,
        },
        Fit::Screen(w) => Layout {
            op_own_line: true,
            room: w.saturating_sub(INDENT.len() + width(&head_columns)),
        },
    };
    let command_own_line = layout.room < MIN_COMMAND;
    let command_head = if command_own_line { "" } else { "COMMAND" };
    let mut out = if layout.op_own_line {
        format!("   OP\n{INDENT}{head_columns}{command_head}")
    } else {
        format!("   {} {head_columns}{command_head}", pad("OP", op_w))
    };
    out = out.lines().map(|l| format!("{}\n", l.trim_end())).collect();
    for o in ops {
        let exit = o.exit_code.map_or("-".to_owned(), |c| c.to_string());
        let marks = format!(
            "{}{} ",
            match (o.needs_human, o.unresolved) {
                (true, _) => "H",
                (false, true) => "!",
                (false, false) => " ",
            },
            if o.contradictions > 0 { "C" } else { " " },
        );
        let cols = columns(
            &printable(&o.host),
            o.family.as_str(),
            &printable(&o.state.to_string()),
            &exit,
            &zone.at(&o.updated_at),
        );
        let command = printable(&o.display);
        let mut lines = Vec::new();
        if layout.op_own_line {
            lines.push(format!("{marks}{}", printable(&o.op_id)));
            lines.push(format!("{INDENT}{cols}"));
        } else {
            lines.push(format!("{marks}{} {cols}", pad(&printable(&o.op_id), op_w)));
        }
        if command_own_line {
            let room = match fit_to {
                Fit::Screen(w) => w.saturating_sub(INDENT.len() + 2),
                Fit::Wide => usize::MAX,
            };
            lines.push(format!("{INDENT}$ {}", fit(&command, room)));
        } else if let Some(last) = lines.last_mut() {
            last.push_str(&fit(&command, layout.room));
        }
        for l in lines {
            out.push_str(l.trim_end());
            out.push('\n');
        }
    }
    let room = if command_own_line {
        match fit_to {
            Fit::Screen(w) => w.saturating_sub(INDENT.len() + 2),
            Fit::Wide => usize::MAX,
        }
    } else {
        layout.room
    };
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
            ", {needs_human} NEED{} A HUMAN (marked H)",
            if needs_human == 1 { "S" } else { "" }
        ));
    }
    let contradicted = ops.iter().filter(|o| o.contradictions > 0).count();
    if contradicted > 0 {
        // Only when present, so the common footer stays as it was.
        out.push_str(&format!(
            ", {contradicted} CONTRADICTED (marked C; `opmark show OP` says how)"
        ));
    }
    if needs_human > 0 {
        out.push_str(&format!(
            "\nH: unresolved longer than escalate_after {}: reconcile, then resolve",
            crate::duration::format_duration(escalate_after)
        ));
    }
    out.push_str(&format!("\ntimes: {}", zone.label()));
    if !wide && ops.iter().any(|o| width(&printable(&o.display)) > room) {
        out.push_str("; commands cut to the screen (`--wide` shows them whole)");
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
        assert_eq!(Zone::Utc.at(at), "2026-03-04 22:30:59");
        assert_eq!(Zone::UtcFallback.at(at), "2026-03-04 22:30:59");
        assert_eq!(Zone::Local(east).at(at), "2026-03-05 04:00:59");
        assert_eq!(
            Zone::Local(east).at("2026-03-04 garbage"),
            "2026-03-04 garbage"
        );
    }
}
