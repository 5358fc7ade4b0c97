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
            if err.use_stderr() && asks_for_json() {
                let usage = opmark::error::Error::new(
                    opmark::error::ErrorKind::InvalidInput,
                    err.kind().to_string(),
                )
                .with_code("usage");
                println!("{}", opmark::commands::common::error_document(&usage));
            }
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    opmark::logging::init(cli.global.verbose);
    opmark::logging::set_quiet(cli.global.quiet);
    let json = cli.global.json;
    match opmark::commands::dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // SPEC 6: with --json an error is a document on stdout too.
            if json {
                println!("{}", opmark::commands::common::error_document(&err));
            }
            // Like ssh -q, quiet still reports a fatal error, unless the document did.
            if !(json && opmark::logging::quiet()) {
                eprintln!("opmark: error: {err}");
            }
            ExitCode::from(err.kind.exit_code())
        }
    }
}

/// `--json` among the options (before `--`), for usage errors clap could not parse.
fn asks_for_json() -> bool {
    std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}
