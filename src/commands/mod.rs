//! One file per subcommand: each takes its parsed args and returns an exit code.
//!
//! `dispatch` is the only place that maps a `Command` to its implementation.

mod classify;

use crate::cli::{Cli, Command};
use crate::error::{Error, Result};

/// Runs the parsed command line; returns the process exit code.
pub fn dispatch(cli: Cli) -> Result<u8> {
    let global = cli.global;
    match cli.command {
        Command::Run(_) => Err(Error::not_implemented("run")),
        Command::Probe(_) => Err(Error::not_implemented("probe")),
        Command::List(_) => Err(Error::not_implemented("list")),
        Command::Show(_) => Err(Error::not_implemented("show")),
        Command::Reconcile(_) => Err(Error::not_implemented("reconcile")),
        Command::Resolve(_) => Err(Error::not_implemented("resolve")),
        Command::Classify(args) => classify::run(&global, &args),
        Command::Audit(_) => Err(Error::not_implemented("audit verify")),
        Command::Gc(_) => Err(Error::not_implemented("gc")),
        Command::Stats => Err(Error::not_implemented("stats")),
        Command::Doctor(_) => Err(Error::not_implemented("doctor")),
        Command::Lab(_) => {
            let _ = &global;
            Err(Error::not_implemented("lab"))
        }
    }
}
