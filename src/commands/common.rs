//! What several subcommands need: the policy, the ledger, a host spec and a runtime,
//! each turned into a clear error at the edge.

use crate::cli::{GlobalArgs, HostArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{HostSpec, ReachError};
use crate::ledger::{Ledger, Redactor};
use crate::policy::Policy;
use crate::ssh::destination::FlagPositions;

/// The policy named by `--policy`/`OPMARK_POLICY`, the user's file, or the built-in one.
pub fn load_policy(global: &GlobalArgs) -> Result<Policy> {
    Policy::load(global.policy.as_deref()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))
}

/// Opens (creating if needed) the ledger, with the policy's extra redaction patterns.
pub fn open_ledger(global: &GlobalArgs, policy: &Policy) -> Result<Ledger> {
    let mut ledger =
        Ledger::open_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())?;
    ledger.set_redactor(Redactor::with_patterns(policy.redact_patterns()));
    Ok(ledger)
}

/// Where to connect, from the host argument and the OpenSSH-style flags.
pub fn host_spec(global: &GlobalArgs, host: &str, args: &HostArgs) -> HostSpec {
    // -4/-6 are shorthands for AddressFamily, given first so they win like ssh's flags.
    let family = match (args.ipv4, args.ipv6) {
        (true, _) => Some("AddressFamily=inet".to_owned()),
        (_, true) => Some("AddressFamily=inet6".to_owned()),
        _ => None,
    };
    let offset = usize::from(family.is_some());
    HostSpec {
        host: host.to_owned(),
        port: args.port,
        identities: args.identity.clone(),
        jump: args.jump.clone(),
        config_path: global.ssh_config.clone(),
        user: args.login.clone(),
        options: family
            .into_iter()
            .chain(args.option.iter().cloned())
            .collect(),
        flag_positions: flag_positions(args, offset),
    }
}

/// Where `-l`, `-p` and `-J` stood among the `-o` options of this process's command
/// line (ssh takes the first value given, flag or `-o`), read back from the arguments
/// with clap's indices. Flags first (the default) when `args` did not come from the
/// command line (the MCP server builds its own).
fn flag_positions(args: &HostArgs, offset: usize) -> FlagPositions {
    use clap::CommandFactory;
    let mut positions = FlagPositions::default();
    let Ok(top) = crate::cli::Cli::command().try_get_matches_from(std::env::args_os()) else {
        return positions;
    };
    let mut m = &top;
    while m.try_get_raw("login").is_err() {
        match m.subcommand() {
            Some((_, sub)) => m = sub,
            None => return positions,
        }
    }
    let same = m.get_one::<String>("login") == args.login.as_ref()
        && m.get_one::<String>("jump") == args.jump.as_ref()
        && m.get_one::<u16>("port") == args.port.as_ref()
        && m.get_many::<String>("option")
            .map(|v| v.cloned().collect::<Vec<_>>())
            .unwrap_or_default()
            == args.option;
    if !same {
        return positions;
    }
    let options: Vec<usize> = m
        .indices_of("option")
        .map(Iterator::collect)
        .unwrap_or_default();
    let before = |id: &str| {
        m.index_of(id)
            .map(|at| offset + options.iter().filter(|&&o| o < at).count())
            .unwrap_or(0)
    };
    positions.user = before("login");
    positions.port = before("port");
    positions.jump = before("jump");
    positions
}

/// A host that could not be reached for a call: a connect failure as [`Error`]'s
/// `From<ConnectError>` says; a host presenting another key than the operation ran
/// against is another machine (`host_key_mismatch`), and `nothing` says what was not done.
pub fn reach_error(e: ReachError, nothing: &str) -> Error {
    match e {
        ReachError::Connect(e) => e.into(),
        ReachError::KeyMismatch(why) => Error::new(
            ErrorKind::Unreachable,
            format!("{why} (host_key_mismatch); {nothing}"),
        )
        .with_code("host_key_mismatch"),
        ReachError::HostChanged(why) => Error::new(
            ErrorKind::Unreachable,
            format!("{why} (host_changed); {nothing}"),
        )
        .with_code("host_changed"),
    }
}

/// The process's one tokio runtime, for commands that talk to hosts. Built on first use,
/// not up front, so that commands that stay local (list, show, classify...) never start
/// its threads; `opmark mcp`'s tool threads share the server's. Never dropped: the
/// process exits with whatever it still runs (a channel drained in the background, a
/// tool thread blocked on a host), without waiting for it.
static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

/// Runs `future` to completion on the process's runtime (from any thread that is not
/// itself one of the runtime's).
pub fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    if RUNTIME.get().is_none() {
        let built = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("cannot start the async runtime: {e}"),
                )
            })?;
        // A thread that lost the race drops its own copy; both are fine to use.
        let _ = RUNTIME.set(built);
    }
    let runtime = RUNTIME.get().ok_or_else(|| {
        Error::new(
            ErrorKind::Internal,
            "the async runtime vanished (opmark bug)",
        )
    })?;
    Ok(runtime.block_on(future))
}

/// The session id: `OPMARK_SESSION` when the caller sets one, else a fresh one.
pub fn session_id() -> String {
    std::env::var("OPMARK_SESSION")
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 128)
        .unwrap_or_else(|| format!("s-{:016x}", rand::random::<u64>()))
}

/// Who is acting: `explicit` (`--operator`), else `$USER`, else `$LOGNAME`, else the
/// passwd name of the effective uid; None when none of them names anyone.
pub fn operator_name(explicit: Option<&str>) -> Option<String> {
    let given = |v: Option<String>| v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    given(explicit.map(str::to_owned))
        .or_else(|| given(std::env::var("USER").ok()))
        .or_else(|| given(std::env::var("LOGNAME").ok()))
        .or_else(passwd_name)
}

/// Who approved a run (`--approve`): like [`operator_name`], with a placeholder rather
/// than a refusal, since a run without $USER (cron, systemd) must still work.
pub fn operator(by: Option<&str>) -> String {
    operator_name(by).unwrap_or_else(|| "unknown-operator".to_owned())
}

/// The name /etc/passwd gives the effective uid, if it has one. Read from the file, not
/// through NSS, to stay free of unsafe code; a directory-service user sets $USER anyway.
fn passwd_name() -> Option<String> {
    let uid = rustix::process::geteuid().as_raw().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let found = fields.nth(1)? == uid;
        (found && !name.is_empty()).then(|| name.to_owned())
    })
}

/// Masks secrets in an error message at the command edge (errors may echo user input).
pub fn redacted_error(mut e: crate::error::Error) -> crate::error::Error {
    e.message = Redactor::default().redact_owned(&e.message);
    e
}

/// The `schema` field of every JSON document (SPEC section 6); bumped only when a field
/// changes meaning or disappears.
pub const SCHEMA: &str = "opmark/1";

/// `value` as the contract's document: a JSON object with `schema` set, ready to print.
pub fn json_document(value: &impl serde::Serialize) -> Result<serde_json::Value> {
    let mut doc = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("cannot encode JSON: {e}")))?;
    match &mut doc {
        serde_json::Value::Object(map) => {
            map.insert("schema".to_owned(), SCHEMA.into());
        }
        _ => {
            return Err(Error::new(
                ErrorKind::Internal,
                "a JSON document must be an object (opmark bug)",
            ))
        }
    }
    Ok(doc)
}

/// Prints one JSON document on stdout: compact, one line, ending in a newline, with
/// `schema` (SPEC section 6), so a caller can read it with one `readline`.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let doc = json_document(value)?;
    let kept = CAPTURED.with(|c| c.borrow_mut().as_mut().map(|docs| docs.push(doc.clone())));
    match kept {
        Some(()) => Ok(()),
        None => write_line(&doc),
    }
}

/// Prints `run`'s document like [`print_json`], with `stdout` and `stderr` streamed from
/// their spools instead of held in memory (SPEC 7: memory bounded by the caps, not by the
/// output): the bytes are those `print_json` would print.
pub fn print_run_json(report: &crate::operation::RunReport) -> Result<()> {
    if CAPTURED.with(|c| c.borrow().is_some()) {
        return print_json(report);
    }
    let mut light = report.clone();
    light.stdout = Default::default();
    light.stderr = Default::default();
    let doc = json_document(&light)?;
    let serde_json::Value::Object(map) = &doc else {
        return Err(Error::new(
            ErrorKind::Internal,
            "a JSON document must be an object (opmark bug)",
        ));
    };
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
        out.write_all(b"{")?;
        for (i, (key, value)) in map.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            serde_json::to_writer(&mut out, key)?;
            out.write_all(b":")?;
            match key.as_str() {
                "stdout" => report.stdout.write_json_string(&mut out)?,
                "stderr" => report.stderr.write_json_string(&mut out)?,
                _ => serde_json::to_writer(&mut out, value)?,
            }
        }
        out.write_all(b"}\n")?;
        out.flush()
    };
    write().map_err(|e| {
        crate::logging::note(&e);
        Error::new(
            ErrorKind::StdoutClosed,
            format!("cannot write to stdout: {e}"),
        )
    })
}

thread_local! {
    /// The documents printed on this thread while [`capture_json`] runs.
    static CAPTURED: std::cell::RefCell<Option<Vec<serde_json::Value>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs a command on this thread with its `--json` document kept instead of printed:
/// `opmark mcp` calls the very code the CLI runs and hands the document to its client
/// (stdout is the MCP stream there). Returns the last document and the command's result.
pub fn capture_json<T>(f: impl FnOnce() -> Result<T>) -> (Option<serde_json::Value>, Result<T>) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let result = f();
    let docs = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (docs.into_iter().last(), result)
}

fn write_line(doc: &serde_json::Value) -> Result<()> {
    print_text(&format!("{doc}\n"))
}

/// `print!` for a command's answer, returning from the calling function with
/// [`ErrorKind::StdoutClosed`] (exit 141) when stdout cannot take it, instead of the
/// panic `print!` turns a closed pipe into.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::commands::common::print_text(&format!($($arg)*))?
    };
}

/// `println!` as [`out!`](crate::out) does it.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::commands::common::print_text(&format!("{}\n", format_args!($($arg)*)))?
    };
}

/// Prints `text` on stdout. A stdout that cannot take it (a closed pipe, a full disk) is
/// [`ErrorKind::StdoutClosed`]: nobody can read the answer, so the process exits 141 as a
/// process that SIGPIPE ended would (SPEC section 6); never a panic.
pub fn print_text(text: &str) -> Result<()> {
    crate::logging::print(text).map_err(|e| {
        Error::new(
            ErrorKind::StdoutClosed,
            format!("cannot write to stdout: {e}"),
        )
    })
}

/// The JSON document of an error at the CLI edge: `error.reason_code`, `error.message`
/// and `error.retryable`; the exit code stays the kind's.
pub fn error_document(err: &Error) -> serde_json::Value {
    serde_json::json!({
        "schema": SCHEMA,
        "error": {
            "reason_code": err.reason_code(),
            "message": err.message,
            "retryable": err.retryable(),
        }
    })
}
