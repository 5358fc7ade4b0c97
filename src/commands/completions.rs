//! `opmark completions SHELL`: the shell's registration of opmark's dynamic completion.
//! The shell asks the binary itself (`COMPLETE=bash opmark -- WORDS...`, answered in
//! `main` before parsing; the candidates are `cli.rs`'s), so completions know exactly the subcommands and flags this
//! binary accepts, and offer the values only it knows: hosts for HOST (the ssh config's
//! `Host` entries and known_hosts names, see [`crate::ops::hosts`]) and op ids for OP (the
//! ledger's most recently active operations).

use crate::cli::{CompletionsArgs, GlobalArgs, ShellArg, COMPLETE_VAR as VAR};
use crate::error::{exit_code, Error, ErrorKind, Result};

/// Writes the registration script for the chosen shell on stdout; with `--json`, one
/// document `{"shell", "script"}` (the contract holds for every command).
pub fn run(global: &GlobalArgs, args: &CompletionsArgs) -> Result<u8> {
    let (shell, name): (&dyn clap_complete::env::EnvCompleter, &str) = match args.shell {
        ShellArg::Bash => (&clap_complete::env::Bash, "bash"),
        ShellArg::Zsh => (&clap_complete::env::Zsh, "zsh"),
        ShellArg::Fish => (&clap_complete::env::Fish, "fish"),
    };
    let mut script = Vec::new();
    shell
        .write_registration(VAR, "opmark", "opmark", "opmark", &mut script)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("completion script: {e}")))?;
    let script = String::from_utf8_lossy(&script);
    if global.json {
        super::common::print_json(&serde_json::json!({ "shell": name, "script": script }))?;
    } else {
        // A reader that went away ends us as quietly as any other command (exit 141).
        crate::out!("{script}");
    }
    Ok(exit_code::OK)
}
