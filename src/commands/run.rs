//! `opmark run`: one operation end to end (the lifecycle itself is in `operation/`).

use std::io::Read;

use serde::Serialize;

use super::common;
use crate::cli::{FamilyArg, GlobalArgs, RunArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::op_id::OpId;
use crate::operation::{self, RunEnv, RunInput};
use crate::ssh::Pool;
use crate::vocab::{ReasonCode, Verdict};

/// Runs the command; the exit status is the command's own or the verdict's reserved code.
pub fn run(global: &GlobalArgs, args: RunArgs) -> Result<u8> {
    let (op, minted) = match &args.op {
        Some(text) => match OpId::parse(text) {
            Ok(op) => (op, false),
            Err(e) => return refuse_before_anything(global, args.op.as_deref(), &e.to_string()),
        },
        None => (OpId::mint(), true),
    };
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
    let policy = common::load_policy(global)?;
    let mut ledger = common::open_ledger(global, &policy)?;
    let key = common::installation_key()?;
    let stdin = if args.stdin {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map_err(|e| {
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
        eprintln!("opmark: op {op}");
    }
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
    let runtime = common::runtime()?;
    let pool = Pool::new(10);
    let report = runtime.block_on(operation::run(
        RunEnv {
            ledger: &mut ledger,
            policy: &policy,
            key: &key,
            session_id: common::session_id(),
            pool: &pool,
        },
        input,
    ))?;
    if global.json {
        common::print_json(&report)?;
    } else {
        let (out, err) = report.dropped;
        if out + err > 0 {
            eprintln!("opmark: output truncated on the host: {out} stdout and {err} stderr bytes beyond the cap were not kept");
        }
        if report.timed_out {
            eprintln!("opmark: the command was killed at its --timeout");
        }
        match report.verdict {
            Verdict::Completed => {}
            other => eprintln!("opmark: {other}: {}", report.reason),
        }
    }
    let status = report.exit_status();
    drop(runtime);
    Ok(status)
}

fn family_of(arg: FamilyArg) -> Family {
    match arg {
        FamilyArg::ReadOnly => Family::ReadOnly,
        FamilyArg::Convergent => Family::Convergent,
        FamilyArg::AppendOnly => Family::AppendOnly,
        FamilyArg::Destructive => Family::Destructive,
    }
}

#[derive(Serialize)]
struct Refused<'a> {
    op_id: Option<&'a str>,
    verdict: Verdict,
    exit_code: Option<i32>,
    reason: &'a str,
    reason_code: ReasonCode,
    retryable: bool,
}

/// Invalid input: the verdict is `refused`, nothing is recorded or sent.
fn refuse_before_anything(global: &GlobalArgs, op: Option<&str>, reason: &str) -> Result<u8> {
    if global.json {
        common::print_json(&Refused {
            op_id: op.filter(|o| OpId::parse(o).is_ok()),
            verdict: Verdict::Refused,
            exit_code: None,
            reason,
            reason_code: ReasonCode::InvalidInput,
            retryable: false,
        })?;
    } else {
        eprintln!("opmark: refused: {reason}");
    }
    Ok(Verdict::Refused.reserved_exit_code().unwrap_or(245))
}
