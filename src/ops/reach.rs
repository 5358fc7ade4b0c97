//! Where an operator command (`probe`, `cancel`, `resolve`, `gc`, `reconcile`) reaches a
//! host the ledger knows: by the route the operation's attempts took, recorded in the
//! ledger (docs/guarantees.md#host-identity), unless the user overrides it, and under the ledger's name for
//! the host.

use super::{host_spec, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{
    check_destination, resolve, resolve_route, ConnectError, ConnectStage, Destination, HostSpec,
    Route,
};
use crate::ledger::OpKey;
use crate::operation::identity::{self, Recorded};

/// The connection spec for a host string as the ledger records it
/// (`Destination::display()`: what the user typed, plus `:port` when `-p` was given).
/// An explicit `-p` wins over a recorded port.
pub fn ledger_host_spec(ctx: &Context, host: &str, args: &HostOptions) -> HostSpec {
    let mut spec = host_spec(ctx, host, args);
    if let Some((name, port)) = host.rsplit_once(':') {
        if let Ok(port) = port.parse::<u16>() {
            if !name.is_empty() && !name.contains(':') {
                spec.host = name.to_owned();
                spec.port = args.port.or(Some(port));
            }
        }
    }
    spec
}

/// Where to reach an operation's host (docs/guarantees.md#host-identity): the route its attempts took,
/// recorded in the ledger, so a changed default (another `~/.ssh/config`, a missing
/// `-i`) cannot send the probe elsewhere. An explicit `-p`, `-i`, `-J`, or a `-F` other
/// than the recorded config overrides it; the host key check applies either way.
pub fn reach(
    ctx: &Context,
    host: &str,
    args: &HostOptions,
    route: Option<&Route>,
) -> std::result::Result<Destination, ConnectError> {
    let overridden = args.any()
        || ctx
            .ssh_config
            .as_ref()
            .is_some_and(|f| route.is_none_or(|r| r.config.as_ref() != Some(f)));
    match route {
        Some(route) if !overridden => resolve_route(route),
        _ => resolve_ledger_host(ctx, host, args),
    }
}

/// Where an operator command (`probe`, `cancel`) reaches operation `op` on the host the
/// user typed: the ledger's name for that host (as `run` recorded it: what was typed,
/// plus `:port` with -p), the destination by the operation's recorded route (see
/// [`reach`]), and what the ledger recorded of its host keys, to hold the host to.
pub fn reach_operation(
    ctx: &Context,
    typed: &str,
    args: &HostOptions,
    op: &str,
    ledger: &crate::ledger::Ledger,
) -> Result<(String, Destination, Recorded)> {
    let (host, fresh) = ledger_name(ctx, typed, args)?;
    let recorded = identity::recorded(&ledger.events(&OpKey::new(op, host.clone()))?);
    let dest = match recorded.route.as_ref() {
        Some(route) => reach(ctx, &host, args, Some(route)),
        None => fresh,
    }?;
    Ok((host, dest, recorded))
}

/// The ledger's name for the host the user typed (as `run` recorded it: what was typed,
/// plus `:port` with -p), and where the typed host resolves now. A malformed or
/// unsupported ssh config is the user's to fix (exit 246), whatever the ledger recorded.
pub fn ledger_name(
    ctx: &Context,
    typed: &str,
    args: &HostOptions,
) -> Result<(String, std::result::Result<Destination, ConnectError>)> {
    check_destination(typed).map_err(|m| Error::new(ErrorKind::InvalidInput, m))?;
    let fresh = resolve(&host_spec(ctx, typed, args));
    if let Err(e) = &fresh {
        if e.stage == ConnectStage::Config {
            return Err(e.clone().into());
        }
    }
    let host = match (&fresh, args.port) {
        (Ok(d), _) => d.display(),
        (Err(_), Some(p)) => format!("{typed}:{p}"),
        (Err(_), None) => typed.to_owned(),
    };
    Ok((host, fresh))
}

/// Resolves a ledger host string for connecting.
pub fn resolve_ledger_host(
    ctx: &Context,
    host: &str,
    args: &HostOptions,
) -> std::result::Result<Destination, ConnectError> {
    resolve(&ledger_host_spec(ctx, host, args))
}
