//! The `opmark` binary: parse the command line, call the library, map errors to exit codes.

use std::process::ExitCode;

use opmark::commands::render::Out;
use opmark::error::exit_code;
use opmark::ops::document::error_document;

fn main() -> ExitCode {
    opmark::cli::forget_empty_env();
    if let Err(message) = opmark::cli::normalise_env() {
        let usage = opmark::error::Error::new(opmark::error::ErrorKind::InvalidInput, message)
            .with_code(opmark::vocab::ErrorCode::Usage);
        if asks_for_json() {
            let _ = Out.text(&format!("{}\n", error_document(&usage)));
        }
        let _ = opmark::logging::write_all(
            opmark::logging::Stream::Stderr,
            format!("opmark: error: {}\n", usage.message).as_bytes(),
        );
        return ExitCode::from(exit_code::USAGE);
    }
    // A shell asking for completions (`COMPLETE=bash opmark -- WORDS...`, from the script
    // `opmark completions` prints) is answered here and the process exits; otherwise
    // this costs one environment lookup.
    clap_complete::CompleteEnv::with_factory(<opmark::cli::Cli as clap::CommandFactory>::command)
        .var(opmark::cli::COMPLETE_VAR)
        .complete();
    let parsed = opmark::cli::command()
        .try_get_matches()
        .and_then(|matches| opmark::cli::Cli::from_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(mut err) => {
            drop_env_options_from_usage(&mut err);
            // --help and --version are "errors" to clap that print and exit 0.
            let code = if err.use_stderr() {
                exit_code::USAGE
            } else {
                exit_code::OK
            };
            let hint = err.use_stderr().then(|| dashes_hint(&err)).flatten();
            if err.use_stderr() && asks_for_json() {
                // clap's whole message (which argument, what was wrong, the usage line),
                // not only its kind's "invalid value for one of the arguments".
                let mut message = usage_message(&err);
                if let Some(hint) = hint {
                    message.push_str("; ");
                    message.push_str(hint);
                }
                let usage =
                    opmark::error::Error::new(opmark::error::ErrorKind::InvalidInput, message)
                        .with_code(opmark::vocab::ErrorCode::Usage);
                let _ = Out.text(&format!("{}\n", error_document(&usage)));
            }
            // clap's own print: a failed write is returned, not a panic.
            let _ = err.print();
            if let Some(hint) = hint {
                let _ = opmark::logging::write_all(
                    opmark::logging::Stream::Stderr,
                    format!("opmark: hint: {hint}\n").as_bytes(),
                );
            }
            return ExitCode::from(code);
        }
    };
    opmark::logging::init(cli.global.verbose);
    opmark::logging::set_quiet(cli.global.quiet);
    let json = cli.global.json;
    let policy_path = cli.global.policy.clone();
    // Every answer goes through `Out`, which turns a closed stdout into
    // `ErrorKind::StdoutClosed` (and remembers the `BrokenPipe` for `closed_pipe`), so no
    // write here can panic.
    match opmark::commands::dispatch(cli) {
        // A reader that went away mid-run (`opmark run … | head -2`): the run went on and
        // its verdict is recorded; the status is the one a process that SIGPIPE ended
        // would give. (An error keeps its own status and message below.)
        Ok(_) if opmark::logging::closed_pipe() => ExitCode::from(exit_code::BROKEN_PIPE),
        Ok(code) => ExitCode::from(code),
        // Nobody can read the answer: a closed pipe leaves nothing to say and nowhere to
        // say it; a full stdout is worth a line on stderr, if that takes it.
        Err(err) if err.kind == opmark::error::ErrorKind::StdoutClosed => {
            if !opmark::logging::closed_pipe() {
                opmark::logging::say(format_args!("opmark: error: {}", err.message));
            }
            ExitCode::from(err.kind.exit_code())
        }
        Err(mut err) => {
            // Last line of defence: a message may quote input that holds a secret.
            err.message =
                opmark::ops::redactor_for_errors(policy_path.as_deref()).redact_owned(&err.message);
            // docs/guarantees.md#the-command-line-contract: with --json an error is a document on stdout too.
            if json {
                let _ = Out.text(&format!("{}\n", error_document(&err)));
            }
            // Like ssh -q, quiet still reports a fatal error, unless the document did.
            if !(json && opmark::logging::quiet()) {
                let _ = opmark::logging::write_all(
                    opmark::logging::Stream::Stderr,
                    format!("opmark: error: {}\n", err.message).as_bytes(),
                );
            }
            ExitCode::from(err.kind.exit_code())
        }
    }
}

/// clap counts an option that its environment variable supplied as given, so a usage
/// error's usage line shows it as a required part of the command (`opmark run
/// --ssh-config <PATH> --ledger <PATH|URL> <HOST>... -- <CMD>...` with OPMARK_SSH_CONFIG
/// and OPMARK_LEDGER set). Every option the command line does not name is taken out of
/// that line: they are all optional.
fn drop_env_options_from_usage(err: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::StyledStr(usage)) = err.get(ContextKind::Usage) else {
        return;
    };
    let mut text = usage.to_string();
    let typed: Vec<String> = std::env::args().skip(1).take_while(|a| a != "--").collect();
    let root = <opmark::cli::Cli as clap::CommandFactory>::command();
    let mut commands = vec![&root];
    let mut changed = false;
    while let Some(cmd) = commands.pop() {
        commands.extend(cmd.get_subcommands());
        for arg in cmd.get_arguments().filter(|a| a.get_env().is_some()) {
            let Some(long) = arg.get_long() else {
                continue;
            };
            let flag = format!("--{long}");
            let named = typed.iter().any(|a| {
                *a == flag
                    || a.starts_with(&format!("{flag}="))
                    || arg.get_short().is_some_and(|short| {
                        a.starts_with('-') && !a.starts_with("--") && a.contains(short)
                    })
            });
            if named {
                continue;
            }
            let shown = if arg.get_action().takes_values() {
                let names: Vec<String> = match arg.get_value_names() {
                    Some(names) => names.iter().map(|n| format!("<{n}>")).collect(),
                    None => vec![format!("<{}>", arg.get_id().as_str().to_uppercase())],
                };
                format!(" {flag} {}", names.join(" "))
            } else {
                format!(" {flag}")
            };
            // Only the whole option: ` --quiet` is not the start of ` --quieter`.
            while let Some(at) = text.find(&shown) {
                let end = at + shown.len();
                if text[end..].starts_with(|c: char| !c.is_whitespace()) {
                    break;
                }
                text.replace_range(at..end, "");
                changed = true;
            }
        }
    }
    if changed {
        err.insert(ContextKind::Usage, ContextValue::StyledStr(text.into()));
    }
}

/// `--json` among the options (before `--`), for usage errors clap could not parse.
fn asks_for_json() -> bool {
    std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

/// clap's rendered error on one line, without colours, its `error: ` prefix or the
/// "try --help" line: what was wrong with which argument, and the usage line.
fn usage_message(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let mut what = Vec::new();
    let mut usage = None;
    for line in rendered.lines().map(str::trim) {
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(u);
        } else if !line.is_empty() && !line.starts_with("For more information") {
            what.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    let mut text = String::new();
    for part in what {
        if !text.is_empty() {
            text.push_str(if text.ends_with(':') { " " } else { "; " });
        }
        text.push_str(part);
    }
    if let Some(usage) = usage {
        text.push_str(&format!(" (usage: {usage})"));
    }
    text
}

/// The fix for a `run` without its command or hosts, where clap's message only names
/// the missing argument: the command goes after `--`, the hosts before it. Three ways
/// to get it wrong: no `--` (`opmark run web1 uptime` reads `uptime` as a host), `--`
/// after the command (`opmark run web1 uptime --`), `--` before the hosts (`opmark run
/// -- web1 uptime` reads `web1` as the command).
fn dashes_hint(err: &clap::Error) -> Option<&'static str> {
    let missing = err.kind() == clap::error::ErrorKind::MissingRequiredArgument;
    let in_run = err.render().to_string().contains("Usage: opmark run ");
    if !(missing && in_run) {
        return None;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    Some(match args.iter().position(|a| a == "--") {
        None => {
            "the command goes after `--`: opmark run HOST [--op ID] -- CMD (words before `--` are hosts)"
        }
        Some(at) if at + 1 == args.len() => {
            "nothing follows `--`, so there is no command: the command goes after `--`, not before it: opmark run HOST [--op ID] -- CMD (words before `--` are hosts)"
        }
        // A command after `--`, so what is missing is the host.
        Some(_) => {
            "no host before `--`: the hosts go before `--` and the command after it: opmark run HOST [--op ID] -- CMD (or --hosts-file FILE for the hosts)"
        }
    })
}
