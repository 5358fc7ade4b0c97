//! One file per subcommand: each turns its parsed args into a request, calls one
//! library operation ([`crate::ops`]) and renders the report; it returns an exit code.
//!
//! `dispatch` is the only place that maps a `Command` to its implementation. Commands
//! never import each other (tests/it/architecture.rs checks it); what several need
//! lives in `common` (the library's context from the global options) and `render` (the
//! one output object, [`render::Out`], and text for people).

mod classify;
mod completions;
mod lab;
mod man;
mod policy;

use crate::cli::{Cli, Command};
use crate::error::Result;

mod approve;
mod audit;
mod cancel;
pub mod common;
mod config;
mod doctor;
mod gc;
mod get;
mod host_changed;
mod keeper;
mod ledger;
mod list;
mod locks;
mod mcp;
mod output;
mod probe;
mod put;
mod reconcile;
pub mod render;
mod resolve;
mod run;
mod show;
mod stats;
mod stdin;

pub use crate::ops::redactor_for_errors;

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
        Command::Approve(args) => approve::run(&global, &args),
        Command::Classify(args) => classify::run(&global, &args),
        Command::Audit(args) => audit::run(&global, &args),
        Command::Ledger(args) => ledger::run(&global, &args),
        Command::Gc(args) => gc::run(&global, &args),
        Command::Stats(args) => stats::run(&global, &args),
        Command::Doctor(args) => doctor::run(&global, &args),
        Command::Locks(args) => locks::run(&global, &args),
        Command::Put(args) => put::run(&global, args),
        Command::Get(args) => get::run(&global, args),
        Command::Lab(args) => lab::run(&global, &args),
        Command::Cancel(args) => cancel::run(&global, &args),
        Command::Config(args) => config::run(&global, &args),
        Command::Output(args) => output::run(&global, &args),
        Command::Mcp(args) => mcp::run(&global, &args),
        Command::Policy(args) => policy::run(&global, &args),
        Command::Completions(args) => completions::run(&global, &args),
        Command::Man => man::run(&global),
        Command::Keeper(args) => keeper::run(&global, &args),
    }
}
