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
    match opmark::commands::dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("opmark: error: {err}");
            ExitCode::from(err.kind.exit_code())
        }
    }
}
