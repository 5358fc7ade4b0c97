//! `opmark completions SHELL`: the shell's registration of opmark's dynamic completion.
//! The shell asks the binary itself (`COMPLETE=bash opmark -- WORDS...`, answered in
//! `main` before parsing), so completions know exactly the subcommands and flags this
//! binary accepts, and offer the values only it knows: hosts for HOST (the ssh config's
//! `Host` entries and known_hosts names, see [`crate::ops::hosts`]) and op ids for OP (the
//! ledger's most recently active operations).

use std::ffi::OsString;
use std::path::PathBuf;

use clap_complete::engine::CompletionCandidate;

use crate::cli::{CompletionsArgs, GlobalArgs, ShellArg};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::ops::Context;

/// The environment variable the registration scripts set when they ask for candidates.
pub const VAR: &str = "COMPLETE";

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

/// Candidates for a HOST: the ssh config's plain `Host` names and known_hosts names.
pub fn hosts() -> Vec<CompletionCandidate> {
    crate::ops::hosts::known_names(&context_of_line())
        .into_iter()
        .map(CompletionCandidate::new)
        .collect()
}

/// Candidates for an OP: the op ids of the ledger's most recently active operations
/// (never creates a ledger; none when there is none), each with its host and command.
pub fn op_ids() -> Vec<CompletionCandidate> {
    let request = crate::ops::list::ListRequest {
        limit: Some(200),
        ..Default::default()
    };
    let Ok(report) = crate::ops::list::list(&context_of_line(), &request) else {
        return Vec::new();
    };
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for o in report.operations {
        if seen.contains(&o.op_id) {
            continue;
        }
        seen.push(o.op_id.clone());
        let help = format!("{}: {}", o.host, crate::text::fit(&o.display, 40));
        out.push(CompletionCandidate::new(o.op_id).help(Some(help.into())));
    }
    out
}

/// The ssh config and ledger of the command line being completed: its `-F`, `--ledger`
/// and `--ledger-key` when typed already (the words after `--`), else the environment's.
fn context_of_line() -> Context {
    let words: Vec<OsString> = std::env::args_os()
        .skip_while(|w| w != "--")
        .skip(1)
        .collect();
    let value_of = |flags: &[&str], var: &str| -> Option<PathBuf> {
        let mut found = None;
        for (i, w) in words.iter().enumerate() {
            let Some(w) = w.to_str() else { continue };
            for flag in flags {
                if w == *flag {
                    found = words.get(i + 1).map(PathBuf::from);
                } else if let Some(v) = w.strip_prefix(&format!("{flag}=")) {
                    found = Some(PathBuf::from(v));
                }
            }
        }
        found.or_else(|| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    };
    Context {
        ssh_config: value_of(&["-F", "--ssh-config"], "OPMARK_SSH_CONFIG"),
        ledger: value_of(&["--ledger"], "OPMARK_LEDGER"),
        ledger_key: value_of(&["--ledger-key"], "OPMARK_LEDGER_KEY"),
        policy: None,
    }
}
