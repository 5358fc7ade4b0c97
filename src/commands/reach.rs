//! The CLI's door to [`crate::ops::reach`] (where an operator command reaches a host the
//! ledger knows), from the parsed global options and `-p -i -J -l -o -4 -6`.

use super::common;
use crate::cli::{GlobalArgs, HostArgs};
use crate::host::{ConnectError, Destination, Route};
use crate::ops::reach as ops;

/// [`ops::reach`] from the command line's options.
pub(crate) fn reach(
    global: &GlobalArgs,
    host: &str,
    args: &HostArgs,
    route: Option<&Route>,
) -> std::result::Result<Destination, ConnectError> {
    ops::reach(
        &common::context(global),
        host,
        &common::host_options(args),
        route,
    )
}

/// [`ops::ledger_name`] from the command line's options.
pub(crate) fn ledger_name(
    global: &GlobalArgs,
    typed: &str,
    args: &HostArgs,
) -> crate::error::Result<(String, std::result::Result<Destination, ConnectError>)> {
    ops::ledger_name(&common::context(global), typed, &common::host_options(args))
}
