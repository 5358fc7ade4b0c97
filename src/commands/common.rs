//! What several subcommands need: the library's [`Context`] and [`HostOptions`] from the
//! parsed command line, and stdout through the one output object of [`super::render`].

use crate::cli::{GlobalArgs, HostArgs};
use crate::error::Result;
use crate::host::HostSpec;
use crate::ledger::Ledger;
use crate::ops::{Context, HostOptions};
use crate::policy::Policy;
use crate::ssh::destination::FlagPositions;

pub use crate::ops::document::{error_document, json_document, SCHEMA};
pub use crate::ops::{block_on, operator, operator_name, reach_error, redacted_error, session_id};

/// The library's context from the global options.
pub fn context(global: &GlobalArgs) -> Context {
    Context {
        ssh_config: global.ssh_config.clone(),
        ledger: global.ledger.clone(),
        ledger_key: global.ledger_key.clone(),
        policy: global.policy.clone(),
    }
}

/// The library's connection options from `-p -i -J -l -o -4 -6`, with where the flags
/// stood on this process's command line.
pub fn host_options(args: &HostArgs) -> HostOptions {
    let offset = usize::from(args.ipv4 || args.ipv6);
    HostOptions {
        port: args.port,
        identity: args.identity.clone(),
        jump: args.jump.clone(),
        login: args.login.clone(),
        option: args.option.clone(),
        ipv4: args.ipv4,
        ipv6: args.ipv6,
        flag_positions: flag_positions(args, offset),
    }
}

/// The policy named by `--policy`/`OPMARK_POLICY`, the user's file, or the built-in one.
pub fn load_policy(global: &GlobalArgs) -> Result<Policy> {
    crate::ops::load_policy(&context(global))
}

/// Opens (creating if needed) the ledger, with the policy's extra redaction patterns.
pub fn open_ledger(global: &GlobalArgs, policy: &Policy) -> Result<Ledger> {
    crate::ops::open_ledger(&context(global), policy)
}

/// Where to connect, from the host argument and the OpenSSH-style flags.
pub fn host_spec(global: &GlobalArgs, host: &str, args: &HostArgs) -> HostSpec {
    crate::ops::host_spec(&context(global), host, &host_options(args))
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

/// Prints one JSON document on stdout, through [`Out`](super::render::Out).
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    super::render::Out.json(value)
}

/// Prints `run`'s document, through [`Out`](super::render::Out).
pub fn print_run_json(report: &crate::operation::RunReport) -> Result<()> {
    super::render::Out.run_json(report)
}

/// `print!` for a command's answer, through [`Out`](super::render::Out): returns from
/// the calling function with [`ErrorKind::StdoutClosed`](crate::error::ErrorKind) (exit
/// 141) when stdout cannot take it.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::commands::render::Out.text(&format!($($arg)*))?
    };
}

/// `println!` as [`out!`](crate::out) does it.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::commands::render::Out.text(&format!("{}\n", format_args!($($arg)*)))?
    };
}

/// Prints `text` on stdout, through [`Out`](super::render::Out).
pub fn print_text(text: &str) -> Result<()> {
    super::render::Out.text(text)
}
