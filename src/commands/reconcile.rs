//! `opmark reconcile [OP...] [--host H] [--wide]`: probe the hosts of unresolved operations and
//! record what the evidence settles (the decisions live in `operation::reconcile`).
//! Contradicted operations (docs/ledger.md#contradictions) in scope are reported too, and keep the exit
//! status at 1: evidence that disagrees is never settled away. The work is
//! [`crate::ops::reconcile`]'s; this file draws its progress and its table (op ids and
//! hosts whole, reasons wrapped whole, and for each open operation a `resolve` command
//! that runs as printed).

use std::io::IsTerminal;

use super::common;
use super::render::{fit, pad, printable, width, Fit};
use crate::cli::{GlobalArgs, ReconcileArgs};
use crate::error::Result;
use crate::ledger::Decision;
use crate::operation::identity;
use crate::operation::reconcile::Outcome;
use crate::ops::reconcile::{reconcile, ReconcileRequest};

/// Reconciles and prints a table (or one JSON document); exit 1 when anything stays
/// unresolved.
pub fn run(global: &GlobalArgs, args: &ReconcileArgs) -> Result<u8> {
    // Drawn only for a person watching: a pipe or a JSON reader gets the answer only.
    let show_progress = !global.json && std::io::stderr().is_terminal();
    let mut drawn = false;
    let report = reconcile(
        &common::context(global),
        &ReconcileRequest {
            ops: args.ops.clone(),
            host: args.host.clone(),
            limit: args.limit,
        },
        |done, total| {
            if show_progress {
                drawn = true;
                crate::logging::set_status(Some(&format!(
                    "opmark: reconciled {done}/{total} operations"
                )));
            }
        },
    );
    if drawn {
        crate::logging::set_status(None);
    }
    let report = report?;
    if global.json {
        common::print_json(&report)?;
    } else {
        crate::out!(
            "{}",
            table(
                &report.operations,
                &report.already_settled,
                report.unresolved,
                if args.wide.wide() {
                    Fit::Wide
                } else {
                    Fit::Screen(crate::logging::terminal_width())
                },
                &global_flags(global),
            )
        );
        if report.not_contacted > 0 {
            crate::logging::say(format_args!(
                "opmark: {} more unresolved operation{} not contacted (--limit); run `opmark reconcile` again for them",
                report.not_contacted,
                if report.not_contacted == 1 { "" } else { "s" },
            ));
        }
        for c in &report.contradicted {
            crate::outln!(
                "C {} on {}: CONTRADICTED ({} contradiction{} between evidence; the ledger keeps exit {}); see `opmark show {}`",
                printable(&c.op_id),
                printable(&c.host),
                c.contradictions,
                if c.contradictions == 1 { "" } else { "s" },
                c.exit_code.map_or("unknown".to_owned(), |e| e.to_string()),
                printable(&c.op_id)
            );
        }
        for h in &report.needs_human {
            crate::outln!(
                "H {} on {}: NEEDS A HUMAN (unresolved since {}, longer than escalate_after; state {}); decide with `opmark resolve {} --host {} --as applied|not-applied|abandoned --note WHY`",
                printable(&h.op_id),
                printable(&h.host),
                super::render::to_second(&h.since),
                printable(&h.state),
                printable(&h.op_id),
                printable(&h.host),
            );
        }
    }
    Ok(report.exit_status())
}

/// The words to repeat in a printed command so that it reaches the same ledger, policy
/// and ssh config as this one (a ledger URL is left out: it may hold a password, and
/// whoever set it in the environment has it there for the next command too).
fn global_flags(global: &GlobalArgs) -> String {
    let mut flags = String::new();
    let mut add = |flag: &str, var: &str, value: Option<&std::path::Path>| {
        if let Some(v) = value {
            // Set in the environment: the next command gets it from there too.
            if std::env::var_os(var).is_some_and(|e| e == v.as_os_str()) {
                return;
            }
            let v = v.to_string_lossy();
            if !v.contains("://") {
                flags.push_str(&format!(" {flag} {}", shell_word(&v)));
            }
        }
    };
    add("-F", "OPMARK_SSH_CONFIG", global.ssh_config.as_deref());
    add("--ledger", "OPMARK_LEDGER", global.ledger.as_deref());
    add(
        "--ledger-key",
        "OPMARK_LEDGER_KEY",
        global.ledger_key.as_deref(),
    );
    add("--policy", "OPMARK_POLICY", global.policy.as_deref());
    flags
}

/// A word as a POSIX shell reads it back: bare when it holds nothing a shell treats
/// specially (op ids and hosts usually), else quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/@%+=,-".contains(c));
    if plain {
        word.to_owned()
    } else {
        crate::shim::quote(word)
    }
}

/// Where the lines under an op id start.
const INDENT: &str = "      ";

/// A line of advice, wrapped at word boundaries unless the output is for a program.
fn prose(out: &mut String, wide: bool, line: &str) {
    if wide {
        out.push_str(&format!("  {line}\n"));
    } else {
        super::render::wrap_into(out, "  ", line);
    }
}

/// `  LABEL word word word`, or, too wide for the screen, one word a line ending in `\`
/// as a shell reads a pasted command.
fn command_line(out: &mut String, fit_to: Fit, label: &str, words: &[String]) {
    let one_line = format!("  {label}{}", words.join(" "));
    match fit_to {
        Fit::Screen(w) if width(&one_line) > w => {
            out.push_str(&format!(
                "  {label}{}",
                words.join(&format!(" \\\n{INDENT}"))
            ));
            out.push('\n');
        }
        _ => out.push_str(&format!("{one_line}\n")),
    }
}

fn table(
    outcomes: &[Outcome],
    already: &[Outcome],
    unresolved: usize,
    fit_to: Fit,
    flags: &str,
) -> String {
    let all: Vec<&Outcome> = outcomes.iter().chain(already).collect();
    if all.is_empty() {
        return "no unresolved operations; nothing to reconcile\n".to_owned();
    }
    let col = |f: &dyn Fn(&Outcome) -> usize, min: usize, max: usize| {
        all.iter().map(|o| f(o)).max().unwrap_or(0).clamp(min, max)
    };
    let wide = fit_to == Fit::Wide;
    let cap = |narrow: usize| if wide { usize::MAX } else { narrow };
    // Op ids and hosts are never cut: people copy them into `show` and `resolve`.
    let op_w = col(&|o| width(&printable(&o.op_id)), 2, usize::MAX);
    let host_w = col(&|o| width(&printable(&o.host)), 4, usize::MAX);
    let before_w = col(&|o| width(&o.before.to_string()), 6, cap(13));
    let decision_w = col(&|o| width(o.decision.as_str()), 8, usize::MAX);
    let rest = host_w + 1 + before_w + 1 + 1 + decision_w;
    // A row too wide for the screen puts the op id on a line of its own (whole), and
    // the other columns under it.
    let op_own_line = match fit_to {
        Fit::Wide => false,
        Fit::Screen(w) => 2 + op_w + 1 + rest + 8 > w,
    };
    let before_cols = if op_own_line {
        INDENT.len()
    } else {
        2 + op_w + 1
    };
    let ev_w = match fit_to {
        Fit::Wide => col(&|o| width(&printable(&o.evidence)), 8, usize::MAX),
        Fit::Screen(w) => col(&|o| width(&printable(&o.evidence)), 8, usize::MAX)
            .min(w.saturating_sub(before_cols + rest).max(8)),
    };
    let columns = |host: &str, before: &str, evidence: &str, decision: &str| {
        format!(
            "{} {} {} {decision}",
            pad(host, host_w),
            pad(&fit(before, before_w), before_w),
            pad(&fit(evidence, ev_w), ev_w),
        )
    };
    let head = columns("HOST", "BEFORE", "EVIDENCE", "DECISION");
    let mut out = if op_own_line {
        format!("  OP\n{INDENT}{head}\n")
    } else {
        format!("  {} {head}\n", pad("OP", op_w))
    };
    for o in &all {
        let mark = if o.settled { " " } else { "!" };
        let cols = columns(
            &printable(&o.host),
            &printable(&o.before.to_string()),
            &printable(&o.evidence),
            &printable(o.decision.as_str()),
        );
        if op_own_line {
            out.push_str(&format!("{mark} {}\n{INDENT}{cols}\n", printable(&o.op_id)));
        } else {
            out.push_str(&format!(
                "{mark} {} {cols}\n",
                pad(&printable(&o.op_id), op_w)
            ));
        }
    }
    let open: Vec<&&Outcome> = all.iter().filter(|o| !o.settled).collect();
    for o in &open {
        // The store of evidence its attempts reached (in full in --json's root_id).
        let root = o.root_id.as_deref().map_or_else(String::new, |r| {
            format!(" [marker root {}]", printable(identity::short_root(r)))
        });
        let line = format!(
            "{} on {}{root}: {}",
            printable(&o.op_id),
            printable(&o.host),
            printable(&o.detail)
        );
        // Whole, wrapped at word boundaries: the reason is read, and its op id copied.
        if wide {
            out.push_str(&format!("! {line}\n"));
        } else {
            super::render::wrap_into(&mut out, "! ", &line);
        }
        let op = shell_word(&o.op_id);
        let host = shell_word(&o.host);
        let resolve = |choices: &str| {
            [
                format!("opmark{flags} resolve"),
                op.clone(),
                format!("--host {host}"),
                format!("--as {choices}"),
                "--note '<what you found>'".to_owned(),
            ]
        };
        match o.decision {
            // The host was not heard from: the command may be running there behind a cut
            // link. Waiting and looking come first, and no decision is offered ready to
            // paste: it would claim a check that did not happen (and an abandon now is
            // contradicted when the host comes back).
            Decision::HostUnreachable => {
                prose(
                    &mut out,
                    wide,
                    "the command may still be running there: an unreachable host is often only a cut link",
                );
                command_line(
                    &mut out,
                    fit_to,
                    "wait, and when the host is back: ",
                    &[format!("opmark{flags} reconcile")],
                );
                command_line(
                    &mut out,
                    fit_to,
                    "look: ",
                    &[
                        format!("opmark{flags} show"),
                        op.clone(),
                        format!("--host {host}"),
                    ],
                );
                prose(
                    &mut out,
                    wide,
                    "check the host by other means, then decide with what you found there:",
                );
                command_line(
                    &mut out,
                    fit_to,
                    "then: ",
                    &resolve("applied|not-applied|abandoned"),
                );
                prose(
                    &mut out,
                    wide,
                    "(abandoned while the host cannot be reached needs --force: see `opmark resolve --help`)",
                );
            }
            Decision::StillRunning => {
                command_line(
                    &mut out,
                    fit_to,
                    "it runs; later: ",
                    &[format!("opmark{flags} reconcile")],
                );
                command_line(
                    &mut out,
                    fit_to,
                    "follow: ",
                    &[
                        format!("opmark{flags} show"),
                        op.clone(),
                        format!("--host {host}"),
                    ],
                );
            }
            // The host answered and its evidence needs a person: `abandoned` claims
            // nothing about what happened, and fences the op id so nothing more can run.
            _ => {
                command_line(&mut out, fit_to, "decide: ", &resolve("abandoned"));
                out.push_str(
                    "    (or --as applied [--exit N] when it ran, --as not-applied when it did not)\n",
                );
            }
        }
    }
    out.push_str(&format!(
        "{} reconciled, {unresolved} still unresolved (marked !)\n",
        outcomes.len()
    ));
    out
}
