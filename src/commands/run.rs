//! `opmark run`: one operation end to end (the lifecycle itself is in `operation/`).

use std::io::Read;

use serde::Serialize;

use super::common;
use crate::cli::{FamilyArg, GlobalArgs, RunArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::ledger::OpKey;
use crate::op_id::OpId;
use crate::operation::interrupt::{ClientSignal, Interrupts};
use crate::operation::{self, RunEnv, RunInput};
use crate::ssh::Pool;
use crate::vocab::{ReasonCode, Verdict};

/// Runs the command; the exit status is the command's own or the verdict's reserved code.
pub fn run(global: &GlobalArgs, args: RunArgs) -> Result<u8> {
    run_with(global, args, None)
}

/// [`run`] with the bytes to forward given by the caller instead of read from stdin
/// (`opmark mcp`, whose stdin is the protocol stream); `given` implies `--stdin`.
pub fn run_with(global: &GlobalArgs, args: RunArgs, given: Option<Vec<u8>>) -> Result<u8> {
    let (op, minted) = match &args.op {
        Some(text) => match OpId::parse(text) {
            Ok(op) => (op, false),
            Err(e) => return refuse_before_anything(global, args.op.as_deref(), &e.to_string()),
        },
        None => (OpId::mint(), true),
    };
    // A host that cannot be a destination is bad input: refused before the ledger, which
    // would otherwise have to refuse to record it.
    if let Err(why) = crate::ssh::check_destination(&args.host) {
        return refuse_before_anything(global, args.op.as_deref(), &why);
    }
    if args.attempts == Some(0) {
        return refuse_before_anything(
            global,
            Some(op.as_str()),
            "--attempts must be at least 1; nothing was sent",
        );
    }
    let command = args.command.join(" ");
    if command.trim().is_empty() {
        return refuse_before_anything(
            global,
            Some(op.as_str()),
            "the command is empty; nothing was sent",
        );
    }
    if let Err(e) = crate::shim::check_command(&command) {
        return refuse_before_anything(
            global,
            Some(op.as_str()),
            &format!("{e}; nothing was sent"),
        );
    }
    let runtime = common::runtime()?;
    let status = runtime.block_on(run_operation(global, args, op, minted, command, given));
    // A stdin reader still blocked on a terminal after an interrupt must not hold the exit.
    runtime.shutdown_background();
    status
}

/// Everything from the first signal handler on: from here a signal is answered, never
/// the silent default death.
async fn run_operation(
    global: &GlobalArgs,
    args: RunArgs,
    op: OpId,
    minted: bool,
    command: String,
    given: Option<Vec<u8>>,
) -> Result<u8> {
    let interrupts = Interrupts::install().map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("cannot install the signal handlers: {e}; nothing was sent"),
        )
    })?;
    let policy = common::load_policy(global)?;
    let mut ledger = common::open_ledger(global, &policy)?;
    // The key is the ledger's own (checked when it was opened), never the config dir's.
    let key = ledger.key().clone();
    let stdin = if given.is_some() {
        given
    } else if args.stdin {
        // Off the runtime's threads, so that Ctrl-C while stdin is a terminal still works.
        let reader = tokio::task::spawn_blocking(|| {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map(|_| buf)
        });
        let read = tokio::select! {
            biased;
            signal = interrupts.wait() => return interrupted_before_anything(global, &op, signal),
            read = reader => read,
        };
        let buf = read
            .map_err(|e| Error::new(ErrorKind::Internal, format!("the stdin reader failed: {e}")))?
            .map_err(|e| {
                Error::new(
                    ErrorKind::LocalIo,
                    format!("cannot read stdin to forward it: {e}; nothing was sent"),
                )
            })?;
        Some(buf)
    } else {
        None
    };
    if minted {
        // Before dispatch, so a caller that loses us can retry with the same id.
        crate::logging::say(format_args!("opmark: op {op}"));
    }
    let op_text = op.to_string();
    let input = RunInput {
        host: common::host_spec(global, &args.host, &args.host_args),
        op,
        command,
        class: args.class.map(family_of),
        stdin,
        timeout: args.timeout,
        attempts: args.attempts,
        wait: args.wait,
        approve: args.approve.clone(),
        approver: common::operator(None),
        live_output: !global.json,
        output_cap: args.output_cap,
    };
    // To tell the caller about evidence this run found contradicting the ledger.
    let known = ledger.operations_by_id(input.op.as_str())?;
    interrupts.set_context(format!(
        "op {op} may be running on {host}: `opmark run` with --op {op} follows or replays it, `opmark cancel {host} {op}` stops it",
        op = op_text,
        host = args.host
    ));
    let pool = Pool::new(10);
    let report = operation::run_interruptible(
        RunEnv {
            ledger: &mut ledger,
            policy: &policy,
            key: &key,
            session_id: common::session_id(),
            pool: &pool,
        },
        input,
        &interrupts,
    )
    .await?;
    if report.reason_code == ReasonCode::ClientInterrupted {
        let signal = interrupts.received().unwrap_or(ClientSignal::Int);
        // The document first (SPEC 10), then the words for a person at the terminal.
        if global.json {
            common::print_json(&report)?;
        }
        // After SIGHUP the terminal may be gone: a failed write must not turn into a panic.
        crate::logging::say(format_args!(
            "opmark: {}: {}",
            report.verdict, report.reason
        ));
        return Ok(signal.exit_code());
    }
    let key = OpKey::new(report.op_id.clone(), report.host.clone());
    if let Some(now) = ledger.operation(&key).ok().flatten() {
        let before = known
            .iter()
            .find(|r| r.host == now.host)
            .map_or(0, |r| r.contradictions);
        if now.contradictions > before {
            crate::logging::say(format_args!(
                "opmark: CONTRADICTION: the host's evidence disagrees with what the ledger recorded for this operation (it keeps exit {}); see `opmark show {}`",
                now.exit_code.map_or("unknown".to_owned(), |c| c.to_string()),
                report.op_id
            ));
        }
    }
    if let Some(failed) = &report.ledger_error {
        // The verdict stands on the host's evidence; only its record here is missing.
        crate::logging::say(format_args!(
            "opmark: the ledger could not record this verdict ({}: {}); the host keeps the outcome, so rerunning with the same op id ({}) replays it without running the command again",
            failed.reason_code, failed.message, report.op_id
        ));
    }
    if global.json {
        warn_if_truncated(&report);
        common::print_json(&report)?;
    } else {
        warn_if_truncated(&report);
        if report.timed_out {
            crate::logging::say(format_args!(
                "opmark: the command was killed at its --timeout"
            ));
        }
        match report.verdict {
            Verdict::Completed => {}
            other => crate::logging::say(format_args!("opmark: {other}: {}", report.reason)),
        }
    }
    Ok(report.exit_status())
}

/// SPEC 3: output cut at the host's cap says so, whatever the mode.
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

fn family_of(arg: FamilyArg) -> Family {
    match arg {
        FamilyArg::ReadOnly => Family::ReadOnly,
        FamilyArg::Convergent => Family::Convergent,
        FamilyArg::AppendOnly => Family::AppendOnly,
        FamilyArg::Destructive => Family::Destructive,
    }
}

/// The answer given before anything was recorded or sent.
#[derive(Serialize)]
struct Early<'a> {
    op_id: Option<&'a str>,
    verdict: Verdict,
    exit_code: Option<i32>,
    reason: &'a str,
    reason_code: ReasonCode,
    retryable: bool,
}

/// Invalid input: the verdict is `refused`, nothing is recorded or sent.
fn refuse_before_anything(global: &GlobalArgs, op: Option<&str>, reason: &str) -> Result<u8> {
    // The reason may quote the input, and the input may hold a secret.
    let reason = &super::redactor_for_errors(global.policy.as_deref()).redact_owned(reason);
    if global.json {
        common::print_json(&Early {
            op_id: op.filter(|o| OpId::parse(o).is_ok()),
            verdict: Verdict::Refused,
            exit_code: None,
            reason,
            reason_code: ReasonCode::InvalidInput,
            retryable: false,
        })?;
    } else {
        crate::logging::say(format_args!("opmark: refused: {reason}"));
    }
    Ok(Verdict::Refused.reserved_exit_code().unwrap_or(245))
}

/// A signal before the operation was recorded (while stdin was read): nothing was
/// recorded or sent, so nothing can run.
fn interrupted_before_anything(global: &GlobalArgs, op: &OpId, signal: ClientSignal) -> Result<u8> {
    let reason = format!(
        "interrupted by {signal} before anything was recorded or sent; nothing ran. `opmark run` with op id {op} runs it (at most once)"
    );
    if global.json {
        common::print_json(&Early {
            op_id: Some(op.as_str()),
            verdict: Verdict::NotApplied,
            exit_code: None,
            reason: &reason,
            reason_code: ReasonCode::ClientInterrupted,
            retryable: ReasonCode::ClientInterrupted.retryable(),
        })?;
    }
    crate::logging::say(format_args!("opmark: {}: {reason}", Verdict::NotApplied));
    Ok(signal.exit_code())
}
