//! `opmark completions`: a shell completion script generated from the clap definition,
//! so completions know exactly the subcommands and flags this binary accepts.

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::{Cli, CompletionsArgs, GlobalArgs, ShellArg};
use crate::error::{exit_code, Result};

/// Writes the script for the chosen shell on stdout; with `--json`, one document
/// `{"shell", "script"}` (the contract holds for every command).
pub fn run(global: &GlobalArgs, args: &CompletionsArgs) -> Result<u8> {
    let (shell, name) = match args.shell {
        ShellArg::Bash => (Shell::Bash, "bash"),
        ShellArg::Zsh => (Shell::Zsh, "zsh"),
        ShellArg::Fish => (Shell::Fish, "fish"),
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "opmark", &mut script);
    let script = String::from_utf8_lossy(&script);
    if global.json {
        super::common::print_json(&serde_json::json!({ "shell": name, "script": script }))?;
    } else {
        // A reader that went away ends us as quietly as any other command (exit 141).
        crate::out!("{script}");
    }
    Ok(exit_code::OK)
}
