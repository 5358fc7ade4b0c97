//! The operations a user can ask for, as a library: each module takes a typed request
//! (no clap types) and returns a typed report (no printing). The CLI (`commands/`) and
//! the MCP server (`mcp/`) are two renderers over them, so a tool sees exactly what the
//! CLI computes, and a new CLI flag needs no MCP default.
//!
//! What several operations share lives here: the [`Context`] (which ssh config, ledger
//! and policy), [`HostOptions`] (OpenSSH-style connection options), the policy and
//! ledger opened with clear errors, the process's one runtime, and who is acting.

pub mod approve;
pub mod audit;
pub mod cancel;
pub mod classify;
pub mod document;
pub mod gc;
pub mod get;
pub mod host_changed;
pub mod hosts;
pub mod list;
pub mod locks;
pub mod output;
pub mod plan;
pub mod probe;
pub mod put;
pub mod reach;
pub mod reconcile;
pub mod resolve;
pub mod run;
pub mod run_each;
pub mod show;
pub mod stats;
pub mod transfer;

use std::path::PathBuf;

use crate::error::{Error, ErrorKind, Result};
use crate::host::{HostSpec, ReachError};
use crate::ledger::Ledger;
use crate::policy::Policy;
use crate::redact::Redactor;
use crate::ssh::destination::FlagPositions;
use crate::vocab::ReasonCode;

/// Where an operation finds its configuration: the files the global options name (each
/// None for the default).
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The ssh_config file (`-F`).
    pub ssh_config: Option<PathBuf>,
    /// The ledger file or URL (`--ledger`).
    pub ledger: Option<PathBuf>,
    /// True when the ledger was named by `OPMARK_LEDGER`, not `--ledger` (what the
    /// parser saw, for messages that name where a mistyped path came from).
    pub ledger_from_env: bool,
    /// The ledger's key file (`--ledger-key`).
    pub ledger_key: Option<PathBuf>,
    /// The command-classes policy (`--policy`).
    pub policy: Option<PathBuf>,
}

/// Where to connect, OpenSSH style: what `-p -i -J -l -o -4 -6` say, and where the
/// flags stood among the `-o` options (the CLI reads that from its command line; every
/// other caller leaves the default, flags first).
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// `-p`.
    pub port: Option<u16>,
    /// `-i`, in order.
    pub identity: Vec<PathBuf>,
    /// `-J`.
    pub jump: Option<String>,
    /// `-l`.
    pub login: Option<String>,
    /// `-o`, in order.
    pub option: Vec<String>,
    /// `-4`.
    pub ipv4: bool,
    /// `-6`.
    pub ipv6: bool,
    /// Where `-l`, `-p`, `-J` and the destination stood among the `-o` options above.
    pub flag_positions: FlagPositions,
}

impl HostOptions {
    /// True when any connection option was given (an override of a recorded route).
    pub fn any(&self) -> bool {
        self.port.is_some()
            || !self.identity.is_empty()
            || self.jump.is_some()
            || self.login.is_some()
            || !self.option.is_empty()
            || self.ipv4
            || self.ipv6
    }
}

/// The policy named by `--policy`/`OPMARK_POLICY`, the user's file, or the built-in one.
pub fn load_policy(ctx: &Context) -> Result<Policy> {
    Policy::load(ctx.policy.as_deref()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))
}

/// Opens (creating if needed) the ledger, with the policy's extra redaction patterns.
pub fn open_ledger(ctx: &Context, policy: &Policy) -> Result<Ledger> {
    let mut ledger = Ledger::open_default_or(ctx.ledger.as_deref(), ctx.ledger_key.as_deref())?;
    ledger.set_redactor(Redactor::with_patterns(policy.redact_patterns()));
    Ok(ledger)
}

/// Opens the ledger a command adds to but never starts (reconcile, probe, resolve,
/// cancel): it must exist, since only `run` (and `ledger keygen`/`migrate`) creates one,
/// and a mistyped path read as an empty ledger would say "all clear" while every unknown
/// outcome sits in the right one. (Commands that only read open it with
/// [`Ledger::open_existing_default_or`], read-only when this user may only read it.)
pub fn open_existing_ledger(ctx: &Context, policy: &Policy) -> Result<Ledger> {
    let path = match ctx.ledger.as_deref() {
        Some(p) => p.to_path_buf(),
        None => Ledger::default_path().map_err(|e| redacted_error(e.into()))?,
    };
    if !crate::ledger::is_postgres_url(&path) && !path.exists() {
        return Err(no_ledger_at(ctx, &path));
    }
    open_ledger(ctx, policy).map_err(redacted_error)
}

/// "no ledger at PATH (from …)", with where the path came from and the fix.
pub fn no_ledger_at(ctx: &Context, path: &std::path::Path) -> Error {
    Error::new(
        ErrorKind::LocalIo,
        format!(
            "no ledger at {} (from {}); nothing was created. Check the path (a typo?); `opmark run` creates the ledger with its first operation",
            path.display(),
            ledger_named_by(ctx)
        ),
    )
}

/// Where the ledger path came from: `--ledger`, `OPMARK_LEDGER` or the default.
fn ledger_named_by(ctx: &Context) -> &'static str {
    match (&ctx.ledger, ctx.ledger_from_env) {
        (None, _) => "the default path",
        (Some(_), true) => "OPMARK_LEDGER",
        (Some(_), false) => "--ledger",
    }
}

/// Where to connect, from the host argument and the OpenSSH-style options.
pub fn host_spec(ctx: &Context, host: &str, options: &HostOptions) -> HostSpec {
    // -4/-6 are shorthands for AddressFamily, given first so they win like ssh's flags.
    let family = match (options.ipv4, options.ipv6) {
        (true, _) => Some("AddressFamily=inet".to_owned()),
        (_, true) => Some("AddressFamily=inet6".to_owned()),
        _ => None,
    };
    HostSpec {
        host: host.to_owned(),
        port: options.port,
        identities: options.identity.clone(),
        jump: options.jump.clone(),
        config_path: ctx.ssh_config.clone(),
        user: options.login.clone(),
        options: family
            .iter()
            .cloned()
            .chain(options.option.iter().cloned())
            .collect(),
        flag_positions: options.flag_positions.behind(usize::from(family.is_some())),
    }
}

/// A host that could not be reached for a call: a connect failure as [`Error`]'s
/// `From<ConnectError>` says; a host presenting another key, user or root than the
/// operation ran against is another machine (`host_changed`, the one word every command
/// uses for it), and `nothing` says what was not done.
pub fn reach_error(e: ReachError, nothing: &str) -> Error {
    match e {
        ReachError::Connect(e) => e.into(),
        ReachError::KeyMismatch(why) | ReachError::HostChanged(why) => Error::new(
            ErrorKind::Unreachable,
            format!("{why} (host_changed); {nothing}"),
        )
        .with_code(ReasonCode::HostChanged),
    }
}

/// A reconcile (of `reconcile` or gc's settling first) that stopped: a ledger failure is
/// the ledger's error (its kind and exit code); anything else is opmark's bug.
impl From<crate::operation::reconcile::ReconcileError> for Error {
    fn from(e: crate::operation::reconcile::ReconcileError) -> Self {
        use crate::operation::reconcile::ReconcileError;
        match e {
            ReconcileError::Ledger(e) => e.into(),
            other => Error::new(ErrorKind::Internal, other.to_string()),
        }
    }
}

/// A run that stopped without a verdict: a ledger failure is the ledger's error (its kind
/// and exit code), a malformed ssh config a config error, anything else opmark's bug.
impl From<crate::operation::RunError> for Error {
    fn from(e: crate::operation::RunError) -> Self {
        use crate::operation::RunError;
        match e {
            RunError::Ledger(e) => e.into(),
            RunError::Config(message) => Error::new(ErrorKind::Config, message),
            RunError::Internal(message) => Error::new(ErrorKind::Internal, message),
            RunError::LocalIo(message) => Error::new(ErrorKind::LocalIo, message),
        }
    }
}

/// The process's one tokio runtime, for operations that talk to hosts. Built on first
/// use, not up front, so that operations that stay local (list, show, classify...) never
/// start its threads; `opmark mcp`'s tool threads share the server's. Never dropped: the
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

/// The ledger time `--since D` reaches back to (`list`, `stats`), or the caller's error
/// when D goes back before any date a ledger can hold.
pub fn since_cutoff(since: Option<std::time::Duration>) -> Result<Option<String>> {
    since
        .map(|since| {
            crate::ledger::stamp_before(since).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    "--since reaches back before any possible date; use a shorter duration such as 30d",
                )
            })
        })
        .transpose()
}

/// Masks secrets in an error message at the edge (errors may echo user input).
pub fn redacted_error(mut e: Error) -> Error {
    e.message = Redactor::default().redact_owned(&e.message);
    e
}

/// The redactor for messages that may quote the user's input: the built-in rules plus
/// the policy's patterns when the policy loads (an error about the policy itself must
/// still be shown, with the built-in rules).
pub fn redactor_for_errors(policy: Option<&std::path::Path>) -> Redactor {
    let extra = Policy::load(policy)
        .map(|p| p.redact_patterns().to_vec())
        .unwrap_or_default();
    Redactor::with_patterns(&extra)
}
