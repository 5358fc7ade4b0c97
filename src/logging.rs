//! `-v` tracing to stderr, and `-q`, which silences opmark's own `opmark:` lines (never
//! the command's output). Never logs command output, stdin or secrets: callers log
//! redacted display forms only.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once by `-q` before any command runs; read wherever opmark speaks on stderr.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Silences (or not) opmark's own stderr lines for the rest of the process.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// True under `-q`: an agent reads the JSON document and the exit code, not our prose.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// opmark's own line on stderr unless `-q`; a write error (terminal gone after SIGHUP,
/// closed pipe) is ignored rather than turned into a panic.
pub fn say(line: std::fmt::Arguments<'_>) {
    if !quiet() {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// Installs a stderr subscriber at a level chosen by the count of `-v`.
pub fn init(verbose: u8) {
    let level = match verbose {
        0 => return,
        1 => "opmark=info",
        2 => "opmark=debug",
        _ => "opmark=trace,russh=debug",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(level))
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: in a log file or a pipe they are
        // noise that breaks grep.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
