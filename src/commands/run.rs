//! `opmark run`: one operation end to end (the lifecycle itself is in `operation/`), or
//! one operation per host over several hosts (`operation/fleet.rs` schedules them).

use std::collections::BTreeSet;
use std::io::{IsTerminal, Read};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::common;
use crate::cli::{GlobalArgs, RunArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::host::Pool;
use crate::ledger::{OpKey, OperationRecord};
use crate::op_id::OpId;
use crate::operation::fleet::{self, HostResult, Plan, Progress, Shared, Summary};
use crate::operation::interrupt::{ClientSignal, Interrupts};
use crate::operation::{self, RunEnv, RunInput};
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
    let hosts = match all_hosts(&args) {
        Ok(hosts) => hosts,
        Err(why) => return refuse_before_anything(global, Some(op.as_str()), &why),
    };
    for (option, value) in [
        ("--forks", Some(args.fleet.forks)),
        ("--serial", args.fleet.serial),
        ("--max-failures", args.fleet.max_failures),
    ] {
        if value == Some(0) {
            return refuse_before_anything(
                global,
                Some(op.as_str()),
                &format!("{option} must be at least 1; nothing was sent"),
            );
        }
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
    if let Err(e) = crate::host::check_command(&command) {
        return refuse_before_anything(
            global,
            Some(op.as_str()),
            &format!("{e}; nothing was sent"),
        );
    }
    let status = if let [host] = hosts.as_slice() {
        let host = host.clone();
        common::block_on(run_operation(
            global, args, host, op, minted, command, given,
        ))
    } else {
        common::block_on(run_on_hosts(
            global, args, hosts, op, minted, command, given,
        ))
    };
    // A stdin reader still blocked on a terminal after an interrupt does not hold the
    // exit: the process's runtime is never dropped, so nothing waits for it.
    status?
}

/// The hosts named on the command line, then those of `--hosts-file`, each checked as a
/// destination; a bad one is named (with its file and line) before anything is sent.
fn all_hosts(args: &RunArgs) -> std::result::Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for host in &args.hosts {
        // A host that cannot be a destination is bad input: refused before the ledger,
        // which would otherwise have to refuse to record it.
        crate::host::check_destination(host)?;
        hosts.push(host.clone());
    }
    if let Some(file) = &args.fleet.hosts_file {
        hosts.extend(hosts_from_file(file)?);
    }
    if hosts.is_empty() {
        return Err(
            "no hosts: name at least one HOST or a --hosts-file with hosts in it; nothing was sent"
                .to_owned(),
        );
    }
    let mut seen = BTreeSet::new();
    if let Some(twice) = hosts.iter().find(|h| !seen.insert(h.as_str())) {
        // Twice the same host is twice the same operation: one would only follow the other.
        return Err(format!(
            "host `{twice}` is named twice; name each host once; nothing was sent"
        ));
    }
    Ok(hosts)
}

/// `--hosts-file`: one host a line; `#` starts a comment; blank lines are skipped.
fn hosts_from_file(file: &Path) -> std::result::Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "cannot read the hosts file {}: {e}; nothing was sent",
            file.display()
        )
    })?;
    let mut hosts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let at = || format!("{}:{}", file.display(), number + 1);
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        if line.split_whitespace().nth(1).is_some() {
            return Err(format!(
                "{}: `{line}` is not one host: write one host a line; nothing was sent",
                at()
            ));
        }
        crate::host::check_destination(line).map_err(|why| format!("{}: {why}", at()))?;
        hosts.push(line.to_owned());
    }
    Ok(hosts)
}

/// Reads the bytes to forward (`--stdin`) off the runtime's threads, so that Ctrl-C while
/// stdin is a terminal still works; `Err` carries the exit status of an interruption.
async fn spool_stdin(
    global: &GlobalArgs,
    args: &RunArgs,
    op: &OpId,
    given: Option<Vec<u8>>,
    interrupts: &Interrupts,
) -> Result<std::result::Result<Option<Vec<u8>>, u8>> {
    if given.is_some() {
        return Ok(Ok(given));
    }
    if !args.stdin {
        return Ok(Ok(None));
    }
    let reader = tokio::task::spawn_blocking(|| {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map(|_| buf)
    });
    let read = tokio::select! {
        biased;
        signal = interrupts.wait() => return interrupted_before_anything(global, op, signal).map(Err),
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
    Ok(Ok(Some(buf)))
}

/// Everything from the first signal handler on: from here a signal is answered, never
/// the silent default death.
async fn run_operation(
    global: &GlobalArgs,
    args: RunArgs,
    host: String,
    op: OpId,
    minted: bool,
    command: String,
    given: Option<Vec<u8>>,
) -> Result<u8> {
    let interrupts = install_interrupts()?;
    let policy = common::load_policy(global)?;
    let mut ledger = common::open_ledger(global, &policy)?;
    // The key is the ledger's own (checked when it was opened), never the config dir's.
    let key = ledger.key().clone();
    let stdin = match spool_stdin(global, &args, &op, given, &interrupts).await? {
        Ok(stdin) => stdin,
        Err(status) => return Ok(status),
    };
    if minted {
        // Before dispatch, so a caller that loses us can retry with the same id.
        crate::logging::say(format_args!("opmark: op {op}"));
    }
    let op_text = op.to_string();
    let input = RunInput {
        host: common::host_spec(global, &host, &args.host_args),
        op,
        command,
        class: args.class,
        stdin,
        timeout: args.timeout,
        attempts: args.attempts,
        wait: args.wait,
        approve: args.approve.clone(),
        approver: common::operator(None),
        live_output: !global.json,
        output_cap: args.output_cap,
        prefix: None,
        detach: args.fleet.detach,
    };
    // To tell the caller about evidence this run found contradicting the ledger.
    let known = ledger.operations_by_id(input.op.as_str())?;
    interrupts.set_context(format!(
        "op {op} may be running on {host}: `opmark run` with --op {op} follows or replays it, `opmark cancel {host} {op}` stops it",
        op = op_text,
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
    tracing::info!(
        "verdict {} ({}), exit {}: {}",
        report.verdict,
        report.reason_code,
        report
            .exit_code
            .map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
        report.reason
    );
    if report.reason_code == ReasonCode::ClientInterrupted {
        let signal = interrupts.received().unwrap_or(ClientSignal::Int);
        // The document first (SPEC 10), then the words for a person at the terminal.
        if global.json {
            common::print_run_json(&report)?;
        }
        // After SIGHUP the terminal may be gone: a failed write must not turn into a panic.
        crate::logging::say(format_args!(
            "opmark: {}: {}",
            report.verdict, report.reason
        ));
        return Ok(signal.exit_code());
    }
    let key = OpKey::new(report.op_id.clone(), report.host.clone());
    let now: Vec<_> = ledger.operation(&key).ok().flatten().into_iter().collect();
    say_new_contradictions(&known, &now, false);
    if let Some(failed) = &report.ledger_error {
        // The verdict stands on the host's evidence; only its record here is missing.
        crate::logging::say(format_args!(
            "opmark: the ledger could not record this verdict ({}: {}); the host keeps the outcome, so rerunning with the same op id ({}) replays it without running the command again",
            failed.reason_code, failed.message, report.op_id
        ));
    }
    if global.json {
        warn_if_truncated(&report);
        common::print_run_json(&report)?;
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

/// Several hosts (SPEC section 11): one operation per host, scheduled by
/// [`fleet::run_fleet`]; prefixed live output, a progress line on a terminal, a summary
/// line per host on stderr, or one `--json` document holding every host's.
async fn run_on_hosts(
    global: &GlobalArgs,
    args: RunArgs,
    hosts: Vec<String>,
    op: OpId,
    minted: bool,
    command: String,
    given: Option<Vec<u8>>,
) -> Result<u8> {
    let interrupts = install_interrupts()?;
    let policy = common::load_policy(global)?;
    // Opened here once so that a ledger problem is one error before any host is tried;
    // the host tasks open their own handles.
    let ledger = common::open_ledger(global, &policy)?;
    let key = ledger.key().clone();
    // To tell the caller about evidence this run found contradicting the ledger.
    let known = ledger.operations_by_id(op.as_str())?;
    drop(ledger);
    let stdin = match spool_stdin(global, &args, &op, given, &interrupts).await? {
        Ok(stdin) => stdin,
        Err(status) => return Ok(status),
    };
    if minted {
        crate::logging::say(format_args!("opmark: op {op}"));
    }
    interrupts.set_context(format!(
        "op {op} may be running on {} hosts: `opmark run` with --op {op} and the same hosts follows or replays it, `opmark cancel HOST {op}` stops it on one",
        hosts.len()
    ));
    let prefix = !args.fleet.no_prefix;
    let inputs: Vec<RunInput> = hosts
        .iter()
        .map(|host| RunInput {
            host: common::host_spec(global, host, &args.host_args),
            op: op.clone(),
            command: command.clone(),
            class: args.class,
            stdin: stdin.clone(),
            timeout: args.timeout,
            attempts: args.attempts,
            wait: args.wait,
            approve: args.approve.clone(),
            approver: common::operator(None),
            live_output: !global.json,
            output_cap: args.output_cap,
            prefix: prefix.then(|| format!("{host}: ")),
            detach: args.fleet.detach,
        })
        .collect();
    let ledger_global = global.clone();
    let ledger_policy = policy.clone();
    let shared = Shared {
        policy: Arc::new(policy),
        key,
        session_id: common::session_id(),
        pool: Arc::new(Pool::new(10)),
        open_ledger: Arc::new(move || common::open_ledger(&ledger_global, &ledger_policy)),
    };
    let plan = Plan {
        forks: args.fleet.forks,
        max_failures: args.fleet.max_failures,
        serial: args.fleet.serial,
    };
    // A hand-written line rather than indicatif: one line of counts needs no dependency,
    // and it is drawn only when a person watches stderr.
    let show_progress = !global.json && std::io::stderr().is_terminal();
    let results = fleet::run_fleet(&shared, inputs, plan, &interrupts, |p: Progress| {
        if show_progress {
            draw_progress(p);
        }
    })
    .await;
    if show_progress {
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), "\r\x1b[K");
    }
    let summary = Summary::of(&results);
    let status = summary.exit_status;
    // SPEC 10 as for one host: the document first, then the words for a person.
    if global.json {
        common::print_json(&FleetDocument::of(&results, summary)?)?;
    }
    for result in &results {
        summary_line(result);
    }
    if let Ok(now) = common::open_ledger(global, shared.policy.as_ref())
        .and_then(|l| Ok(l.operations_by_id(op.as_str())?))
    {
        say_new_contradictions(&known, &now, true);
    }
    if let Some(signal) = interrupts.received() {
        return Ok(signal.exit_code());
    }
    Ok(status)
}

/// The signal handlers of a run: from here on a signal is answered, never the silent
/// default death.
fn install_interrupts() -> Result<Interrupts> {
    Interrupts::install().map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("cannot install the signal handlers: {e}; nothing was sent"),
        )
    })
}

/// Says on stderr which operations' host evidence contradicts the ledger since `known`
/// was read (before this run): a contradiction is recorded and never silent. With
/// `per_host`, each line names its host (a fleet run).
fn say_new_contradictions(known: &[OperationRecord], now: &[OperationRecord], per_host: bool) {
    for record in now {
        let before = known
            .iter()
            .find(|r| r.host == record.host)
            .map_or(0, |r| r.contradictions);
        if record.contradictions <= before {
            continue;
        }
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

/// `opmark: 3/20 done, 5 running, 1 failed`, redrawn in place.
fn draw_progress(p: Progress) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r\x1b[Kopmark: {}/{} done, {} running, {} failed",
        p.done, p.total, p.running, p.failed
    )
    .and_then(|()| err.flush());
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

/// The `--json` answer of a fleet run (SPEC section 11).
#[derive(Serialize)]
struct FleetDocument {
    /// One run document per host (an error document, with `host`, for a host opmark
    /// itself failed on), in the order the hosts were given.
    hosts: Vec<serde_json::Value>,
    summary: Summary,
}

impl FleetDocument {
    fn of(results: &[HostResult], summary: Summary) -> Result<FleetDocument> {
        let hosts = results
            .iter()
            .map(|r| match &r.outcome {
                Ok(report) => common::json_document(report),
                Err(e) => {
                    let mut doc = common::error_document(e);
                    doc["host"] = r.host.clone().into();
                    Ok(doc)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(FleetDocument { hosts, summary })
    }
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
