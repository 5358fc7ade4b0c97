//! The `opmark` binary: parse the command line, call the library, map errors to exit codes.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;

use clap::Parser;

use opmark::error::exit_code;

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    opmark::cli::forget_empty_env();
    let cli = match opmark::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are "errors" to clap that print and exit 0.
            let code = if err.use_stderr() {
                exit_code::USAGE
            } else {
                exit_code::OK
            };
            if err.use_stderr() && asks_for_json() {
                let usage = opmark::error::Error::new(
                    opmark::error::ErrorKind::InvalidInput,
                    err.kind().to_string(),
                )
                .with_code("usage");
                let _ = opmark::commands::common::print_text(&format!(
                    "{}\n",
                    opmark::commands::common::error_document(&usage)
                ));
            }
            // clap's own print: a failed write is returned, not a panic.
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    opmark::logging::init(cli.global.verbose);
    opmark::logging::set_quiet(cli.global.quiet);
    let json = cli.global.json;
    let policy_path = cli.global.policy.clone();
    let outcome = match panic::catch_unwind(AssertUnwindSafe(|| opmark::commands::dispatch(cli))) {
        Ok(outcome) => outcome,
        Err(payload) if is_broken_pipe(payload.as_ref()) => {
            return ExitCode::from(exit_code::BROKEN_PIPE)
        }
        Err(payload) => panic::resume_unwind(payload),
    };
    match outcome {
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
            err.message = opmark::commands::redactor_for_errors(policy_path.as_deref())
                .redact_owned(&err.message);
            // SPEC 6: with --json an error is a document on stdout too.
            if json {
                let _ = opmark::commands::common::print_text(&format!(
                    "{}\n",
                    opmark::commands::common::error_document(&err)
                ));
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

/// A backstop only: every print path of `run` and of most commands goes through
/// `opmark::logging` / `out!`, which return a failed write as an error (see there). The
/// few `println!` still in commands that other work is changing (show, reconcile,
/// resolve, cancel, gc, doctor) panic when their reader has gone (Rust ignores SIGPIPE,
/// so the write fails with EPIPE); this hook keeps that panic silent, and `main` turns it
/// into 141. Those commands print after their ledger work is done, so nothing is left
/// unsettled by it.
fn quiet_on_broken_pipe() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !is_broken_pipe(info.payload()) {
            default(info);
        }
    }));
}

fn is_broken_pipe(payload: &(dyn Any + Send)) -> bool {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .is_some_and(is_broken_pipe_message)
}

/// The message std's print macros panic with when the stream is a closed pipe.
fn is_broken_pipe_message(message: &str) -> bool {
    message.starts_with("failed printing to std") && message.contains("os error 32")
}

/// `--json` among the options (before `--`), for usage errors clap could not parse.
fn asks_for_json() -> bool {
    std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}
