//! What several subcommands need: the policy, the ledger, a host spec and a runtime,
//! each turned into a clear error at the edge.

use crate::cli::{GlobalArgs, HostArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::ledger::{Ledger, Redactor};
use crate::policy::Policy;
use crate::ssh::{ConnectError, ConnectStage, HostSpec};

/// The policy named by `--policy`/`OPMARK_POLICY`, the user's file, or the built-in one.
pub fn load_policy(global: &GlobalArgs) -> Result<Policy> {
    Policy::load(global.policy.as_deref()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))
}

/// Opens (creating if needed) the ledger, with the policy's extra redaction patterns.
pub fn open_ledger(global: &GlobalArgs, policy: &Policy) -> Result<Ledger> {
    let mut ledger =
        Ledger::open_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())?;
    ledger.set_redactor(Redactor::new(policy.redact_patterns()));
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
    }
}

/// A host that could not be resolved: a config problem is a config error (exit 246),
/// anything else leaves the host unreachable (exit 247).
pub fn resolve_error(e: ConnectError) -> Error {
    let kind = if e.stage == ConnectStage::Config {
        ErrorKind::Config
    } else {
        ErrorKind::Unreachable
    };
    Error::new(kind, e.to_string())
}

/// A tokio runtime for commands that talk to hosts.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("cannot start the async runtime: {e}"),
            )
        })
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
    let uid = crate::lab::effective_uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let found = fields.nth(1)? == uid;
        (found && !name.is_empty()).then(|| name.to_owned())
    })
}

/// Prints one JSON document on stdout.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("cannot encode JSON: {e}")))?;
    println!("{text}");
    Ok(())
}
