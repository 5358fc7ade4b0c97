//! What an exec channel yields, whichever way it runs (this process's connection or a
//! keeper's): why it did not start, and its events in arrival order.

use thiserror::Error;

/// Why an exec did not start.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExecError {
    /// The exec request never left, or the host refused it: nothing can run
    /// (boundary stays `not_sent`).
    #[error("exec request not sent: {0}")]
    NotSent(String),
    /// The exec request left, then the connection was lost before the host answered it:
    /// the command may or may not have started (boundary `sent_no_response` at least).
    #[error("connection lost after the exec request was sent: {0}")]
    Lost(String),
}

/// What an exec channel reports, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Bytes the command wrote to stdout, as they arrived.
    Stdout(Vec<u8>),
    /// Bytes the command wrote to stderr, as they arrived.
    Stderr(Vec<u8>),
    /// The command's exit status. More output may follow; read on until `Closed`.
    ExitStatus(u32),
    /// The command died of a signal (name without `SIG`, e.g. `TERM`).
    ExitSignal {
        /// Signal name, e.g. `TERM`.
        signal: String,
        /// Whether a core was dumped.
        core_dumped: bool,
        /// The host's message, often empty.
        message: String,
    },
    /// The channel closed cleanly; no more events. Repeated on later calls.
    Closed,
    /// The connection died before the channel closed (keepalive timeout, reset, EOF
    /// without close). Repeated on later calls.
    Lost(String),
}
