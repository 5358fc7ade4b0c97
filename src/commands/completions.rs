//! `opmark completions`: a shell completion script generated from the clap definition,
//! so completions know exactly the subcommands and flags this binary accepts.

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::{Cli, CompletionsArgs, ShellArg};
use crate::error::{exit_code, Result};

/// Writes the script for the chosen shell on stdout.
pub fn run(args: &CompletionsArgs) -> Result<u8> {
    let shell = match args.shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "opmark", &mut script);
    // print! so that a reader that went away ends us as quietly as any other command
    // (main turns that panic into exit 141).
    print!("{}", String::from_utf8_lossy(&script));
    Ok(exit_code::OK)
}
