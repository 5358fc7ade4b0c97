//! The `opmark` binary: parse the command line, call the library, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match opmark::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are "errors" to clap that print and exit 0.
            let code = if err.use_stderr() {
                opmark::error::exit_code::USAGE
            } else {
                opmark::error::exit_code::OK
            };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    opmark::logging::init(cli.global.verbose);
    let policy_path = cli.global.policy.clone();
    match opmark::commands::dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // Last line of defence: a message may quote input that holds a secret.
            let message = opmark::commands::redactor_for_errors(policy_path.as_deref())
                .redact_owned(&err.message);
            eprintln!("opmark: error: {message}");
            ExitCode::from(err.kind.exit_code())
        }
    }
}
