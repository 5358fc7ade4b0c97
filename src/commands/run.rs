//! `opmark run`: the CLI's face of [`crate::ops::run`]: the request from the command
//! line, what a person watching sees meanwhile (the minted op id, a fleet's progress
//! line), then the answer: one JSON document, or the command's own output (streamed live)
//! and `opmark:` lines on stderr for anything but a clean completion.

use super::common;
use crate::cli::{GlobalArgs, RunArgs};
use crate::error::Result;
use crate::operation;
use crate::operation::fleet::HostResult;
use crate::operation::{WaitScope, DEFAULT_WAIT};
use crate::ops::run::{
    run as run_op, Early, FleetOptions, NewContradiction, RunAnswer, RunRequest,
};
use crate::vocab::{ReasonCode, Verdict};

/// Runs the command; the exit status is the command's own or the verdict's reserved code.
pub fn run(global: &GlobalArgs, args: RunArgs) -> Result<u8> {
    let token_on_stdin = args.approvals.approval.as_deref() == Some(std::path::Path::new("-"));
    let asked = match (args.stdin, args.no_stdin || token_on_stdin) {
        (true, _) => super::stdin::Asked::Forward,
        (false, true) => super::stdin::Asked::Never,
        (false, false) => super::stdin::Asked::Unsaid,
    };
    let approval = match args.approvals.approval.as_deref() {
        None => None,
        Some(path) => Some(common::read_approval(path, args.stdin)?),
    };
    let secrets = crate::secret::Spec::parse_all(&args.secrets).map_err(|e| {
        crate::error::Error::new(
            crate::error::ErrorKind::InvalidInput,
            format!("{e}; nothing was sent"),
        )
    })?;
    let stdin = super::stdin::decide(asked)?;
    if args.dry_run {
        return dry_run(global, args, stdin, approval.is_some(), secrets);
    }
    let request = RunRequest {
        hosts: args.hosts,
        op: args.op,
        class: args.class,
        stdin,
        timeout: args.timeout,
        attempts: args.attempts,
        wait: args.wait.unwrap_or(DEFAULT_WAIT),
        // Asked for, a budget bounds everything; else a connected command streams to its
        // end, as with ssh. `--wait 0s` is one look at an earlier run, without following
        // it: a command of this run is never cut before it could start.
        wait_scope: match args.wait {
            Some(w) if !w.is_zero() => WaitScope::Invocation,
            _ => WaitScope::Probes,
        },
        output_cap: args.output_cap,
        approve: args.approvals.approve,
        approval,
        repeats: args.repeats,
        amends: args.amends,
        options: common::host_options(&args.host_args),
        fleet: FleetOptions {
            hosts_file: args.fleet.hosts_file,
            forks: args.fleet.forks,
            max_failures: args.fleet.max_failures,
            serial: args.fleet.serial,
            prefix: !args.fleet.no_prefix,
            detach: args.fleet.detach,
        },
        secrets,
        become_user: args.become_user,
        locks: args.locks,
        lock_wait: args.lock_wait,
        command: args.command,
        kind: crate::shim::RunKind::Command,
        live_output: !global.json,
        tally: None,
        stdout_to: None,
    };
    let mut watch = common::SayWatch::new(global);
    let answer = run_op(&common::context(global), request, &mut watch)?;
    watch.finish();
    let status = answer.exit_status();
    match answer {
        RunAnswer::Early(early) => early_answer(global, &early)?,
        RunAnswer::One {
            report,
            interrupted: Some(_),
            ..
        } => {
            // The document first (docs/guarantees.md#interruptions-and-cancel), then the words for a person at the terminal.
            if global.json {
                common::print_run_json(&report)?;
            }
            // After SIGHUP the terminal may be gone: a failed write must not turn into a
            // panic.
            crate::logging::say(format_args!(
                "opmark: {}: {}",
                report.verdict, report.reason
            ));
        }
        RunAnswer::One {
            report,
            interrupted: None,
            contradictions,
        } => {
            say_contradictions(&contradictions, false);
            if let Some(failed) = &report.ledger_error {
                // The verdict stands on the host's evidence; only its record here is
                // missing.
                crate::logging::say(format_args!(
                    "opmark: the ledger could not record this verdict ({}: {}); the host keeps the outcome, so rerunning with the same op id ({}) replays it without running the command again",
                    failed.reason_code, failed.message, report.op_id
                ));
            }
            warn_if_truncated(&report);
            if global.json {
                common::print_run_json(&report)?;
            } else {
                if report.timed_out {
                    crate::logging::say(format_args!(
                        "opmark: the command was killed at its --timeout"
                    ));
                }
                match report.verdict {
                    Verdict::Completed => {}
                    other => {
                        crate::logging::say(format_args!("opmark: {other}: {}", report.reason))
                    }
                }
            }
        }
        RunAnswer::Fleet {
            ref results,
            ref contradictions,
            ..
        } => {
            // docs/guarantees.md#interruptions-and-cancel as for one host: the document first, then the words for a person.
            if global.json {
                common::print_text(&format!("{}\n", answer.document()?))?;
            }
            for result in results {
                summary_line(result);
            }
            say_contradictions(contradictions, true);
        }
    }
    Ok(status)
}

/// Refused, or interrupted while stdin was read: nothing was recorded or sent.
fn early_answer(global: &GlobalArgs, early: &Early) -> Result<()> {
    if global.json {
        common::print_json(early)?;
    }
    if matches!(
        early.reason_code,
        ReasonCode::ClientInterrupted | ReasonCode::NameUnresolvable
    ) {
        crate::logging::say(format_args!("opmark: {}: {}", early.verdict, early.reason));
    } else if !global.json {
        crate::logging::say(format_args!("opmark: refused: {}", early.reason));
    }
    Ok(())
}

/// Says on stderr which operations' host evidence contradicts the ledger since the run
/// began: a contradiction is recorded and never silent. With `per_host`, each line names
/// its host (a fleet run).
fn say_contradictions(found: &[NewContradiction], per_host: bool) {
    for record in found {
        let exit = record
            .exit_code
            .map_or("unknown".to_owned(), |c| c.to_string());
        let (who, show) = if per_host {
            (
                format!("{}: ", record.host),
                format!("{} --host {}", record.op_id, record.host),
            )
        } else {
            (String::new(), record.op_id.clone())
        };
        crate::logging::say(format_args!(
            "opmark: {who}CONTRADICTION: the host's evidence disagrees with what the ledger recorded for this operation (it keeps exit {exit}); see `opmark show {show}`"
        ));
    }
}

/// One line per host on stderr: the verdict, the exit status, and why when not clean.
fn summary_line(result: &HostResult) {
    let host = &result.host;
    match &result.outcome {
        Ok(report) => {
            warn_if_truncated(report);
            let exit = report
                .exit_code
                .map_or_else(|| "exit unknown".to_owned(), |c| format!("exit {c}"));
            if result.is_clean() {
                crate::logging::say(format_args!("opmark: {host}: {}, {exit}", report.verdict));
            } else {
                crate::logging::say(format_args!(
                    "opmark: {host}: {}, {exit} ({}): {}",
                    report.verdict, report.reason_code, report.reason
                ));
            }
            if let Some(failed) = &report.ledger_error {
                crate::logging::say(format_args!(
                    "opmark: {host}: the ledger could not record this verdict ({}: {}); rerunning with the same op id replays it from the host",
                    failed.reason_code, failed.message
                ));
            }
        }
        Err(e) => crate::logging::say(format_args!(
            "opmark: {host}: error ({}): {}",
            e.reason_code(),
            e.message
        )),
    }
}

/// docs/host-protocol.md#marker-layout: output cut at the host's cap says so, whatever the mode.
fn warn_if_truncated(report: &operation::RunReport) {
    if !report.truncated {
        return;
    }
    let replayed = if report.verdict == Verdict::Replayed {
        "replayed "
    } else {
        ""
    };
    let streams = [
        ("output", report.kept.0, report.dropped.0),
        ("stderr", report.kept.1, report.dropped.1),
    ];
    for (stream, kept, dropped) in streams {
        if dropped > 0 {
            crate::logging::say(format_args!(
                "opmark: {replayed}{stream} was capped at {kept} bytes; {dropped} bytes were not kept"
            ));
        }
    }
}

/// `--dry-run`: what `run` would do on each host, nothing run or recorded.
fn dry_run(
    global: &GlobalArgs,
    args: RunArgs,
    stdin: crate::ops::run::Stdin,
    approval: bool,
    secrets: Vec<crate::secret::Spec>,
) -> Result<u8> {
    use crate::ops::plan::{plan, PlanRequest};
    if args.fleet.hosts_file.is_some() {
        return Err(crate::error::Error::new(
            crate::error::ErrorKind::InvalidInput,
            "--dry-run takes its hosts as arguments, not from --hosts-file; nothing was sent",
        ));
    }
    let plans = plan(
        &common::context(global),
        &PlanRequest {
            hosts: args.hosts,
            op: args.op,
            class: args.class,
            stdin,
            approve: args.approvals.approve.is_some(),
            approval,
            repeats: args.repeats,
            amends: args.amends,
            options: common::host_options(&args.host_args),
            secrets,
            become_user: args.become_user,
            command: args.command,
        },
    )?;
    if global.json {
        common::print_json(&serde_json::json!({ "plans": plans }))?;
        return Ok(0);
    }
    for p in &plans {
        crate::outln!(
            "{}: would {}{}",
            p.host,
            p.would.action.as_str(),
            p.would
                .reason_code
                .map_or_else(String::new, |c| format!(" ({c})"))
        );
        crate::outln!("  {}", p.would.why);
        crate::outln!(
            "  family {} by {}; marker {}; ledger {}",
            p.family,
            p.rule,
            p.marker_state
                .as_deref()
                .or(p.probe_error.as_deref().map(|_| "not probed (unreachable)"))
                .unwrap_or("not probed"),
            p.ledger_state.as_deref().unwrap_or("has no record")
        );
    }
    Ok(0)
}
