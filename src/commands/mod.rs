//! One file per subcommand: each takes its parsed args and returns an exit code.
//!
//! `dispatch` is the only place that maps a `Command` to its implementation. Commands
//! never import each other; what several need lives in `common` (policy, ledger, the
//! process's one runtime, JSON documents), `render` (text for people) and `reach` (an
//! operation's host by its recorded route). They talk to hosts only through
//! [`crate::host`].

mod classify;
mod completions;
mod lab;
mod man;
mod policy;

use crate::cli::{Cli, Command};
use crate::error::Result;

mod audit;
pub mod cancel;
pub mod common;
mod config;
mod doctor;
mod gc;
mod host_changed;
mod ledger;
pub mod list;
mod mcp;
mod mux;
pub mod probe;
mod reach;
pub mod reconcile;
pub mod render;
mod resolve;
pub mod run;
pub mod show;
mod stats;

/// The redactor for messages that may quote the user's input: the built-in rules plus
/// the policy's patterns when the policy loads (an error about the policy itself must
/// still be shown, with the built-in rules).
pub fn redactor_for_errors(policy: Option<&std::path::Path>) -> crate::ledger::Redactor {
    let extra = crate::policy::Policy::load(policy)
        .map(|p| p.redact_patterns().to_vec())
        .unwrap_or_default();
    crate::ledger::Redactor::with_patterns(&extra)
}

/// Runs the parsed command line; returns the process exit code.
pub fn dispatch(cli: Cli) -> Result<u8> {
    let global = cli.global;
    crate::host::keeper::set_persist(global.persist);
    match cli.command {
        Command::Run(args) => run::run(&global, args),
        Command::Probe(args) => probe::run(&global, &args),
        Command::List(args) => list::run(&global, &args),
        Command::Show(args) => show::run(&global, &args),
        Command::Reconcile(args) => reconcile::run(&global, &args),
        Command::Resolve(args) => resolve::run(&global, &args),
        Command::Classify(args) => classify::run(&global, &args),
        Command::Audit(args) => audit::run(&global, &args),
        Command::Ledger(args) => ledger::run(&global, &args),
        Command::Gc(args) => gc::run(&global, &args),
        Command::Stats => stats::run(&global),
        Command::Doctor(args) => doctor::run(&global, &args),
        Command::Lab(args) => lab::run(&global, &args),
        Command::Cancel(args) => cancel::run(&global, &args),
        Command::Config(args) => config::run(&global, &args),
        Command::Mcp(args) => mcp::run(&global, &args),
        Command::Policy(args) => policy::run(&global, &args),
        Command::Completions(args) => completions::run(&global, &args),
        Command::Man => man::run(&global),
        Command::Mux(args) => mux::run(&global, &args),
    }
}
