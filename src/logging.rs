//! `-v` tracing to stderr. Never logs command output, stdin or secrets: callers log
//! redacted display forms only.

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
        .with_target(false)
        .try_init();
}
