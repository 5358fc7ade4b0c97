//! Everything opmark writes to its own stdout and stderr: `-v` tracing, `-q` (which
//! silences opmark's own `opmark:` lines, never the command's output), and the one rule
//! for a stream nobody reads any more. Never logs command output, stdin or secrets:
//! callers log redacted display forms only.
//!
//! A closed or full stdout/stderr (a pipe to `head`, `2>/dev/full`) never aborts a run
//! (docs/guarantees.md#the-command-line-contract): every write here reports its failure instead of panicking, the run
//! goes on to record its verdict, and [`closed_pipe`] tells `main` to exit 141, as a
//! process that SIGPIPE ended would. Rust ignores SIGPIPE, so without this a write fails
//! with EPIPE and `println!` panics; restoring SIGPIPE's default instead would let a
//! socket or a ProxyCommand pipe that closes kill a `run` mid-way.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once by `-q` before any command runs; read wherever opmark speaks on stderr.
static QUIET: AtomicBool = AtomicBool::new(false);

/// A write to stdout or stderr found its reader gone (EPIPE).
static CLOSED_PIPE: AtomicBool = AtomicBool::new(false);

/// Silences (or not) opmark's own stderr lines for the rest of the process.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// True under `-q`: an agent reads the JSON document and the exit code, not our prose.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// True once a write to stdout or stderr met a closed pipe: the process then exits 141.
pub fn closed_pipe() -> bool {
    CLOSED_PIPE.load(Ordering::Relaxed)
}

/// Which of this process's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// File descriptor 1.
    Stdout,
    /// File descriptor 2.
    Stderr,
}

/// Writes `bytes` whole to `stream` and flushes, under the stream's lock (so that lines
/// of concurrent writers never mix). A failure is returned, never a panic, and a closed
/// pipe is remembered for the exit status.
pub fn write_all(stream: Stream, bytes: &[u8]) -> std::io::Result<()> {
    // A status line on the terminal (a fleet's progress) is taken off before anything
    // else is written and drawn again after a whole line, so that output never lands
    // glued to its end (`0/3 done, 3 running, 0 failedtarget3: step 1`).
    let mut status = STATUS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if status.shown {
        let _ = erase_status();
        status.shown = false;
    }
    let written = write_raw(stream, bytes);
    if !status.line.is_empty() && bytes.ends_with(b"\n") {
        status.shown = draw_status(&status.line).is_ok();
    }
    written
}

/// The width screens are drawn to: the terminal's when stderr or stdout is one, else 80
/// (a pipe or a file gets the classic width; `--wide` forms never cut).
pub fn terminal_width() -> usize {
    let tty = terminal_size::terminal_size_of(std::io::stderr())
        .or_else(|| terminal_size::terminal_size_of(std::io::stdout()));
    match tty {
        Some((terminal_size::Width(w), _)) if w >= 20 => usize::from(w),
        _ => 80,
    }
}

/// A line kept at the bottom of the terminal on stderr (see [`set_status`]).
struct Status {
    /// What to draw, cut to the terminal's width; empty when there is none.
    line: String,
    /// Whether it is on the screen now.
    shown: bool,
}

static STATUS: std::sync::Mutex<Status> = std::sync::Mutex::new(Status {
    line: String::new(),
    shown: false,
});

/// Draws `line` as the status line on stderr (replacing the one shown), or takes it off
/// for good with `None`. The line is cut to the terminal's width (unicode width counted)
/// so it never wraps, which would leave its first half on the screen. Call it only when
/// stderr is a terminal.
pub fn set_status(line: Option<&str>) {
    let mut status = STATUS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if status.shown {
        let _ = erase_status();
        status.shown = false;
    }
    status.line = match line {
        Some(line) => crate::text::fit(line, terminal_width().saturating_sub(1)),
        None => String::new(),
    };
    if !status.line.is_empty() {
        status.shown = draw_status(&status.line).is_ok();
    }
}

fn erase_status() -> std::io::Result<()> {
    write_raw(Stream::Stderr, b"\r\x1b[K")
}

fn draw_status(line: &str) -> std::io::Result<()> {
    write_raw(Stream::Stderr, format!("\r\x1b[K{line}").as_bytes())
}

fn write_raw(stream: Stream, bytes: &[u8]) -> std::io::Result<()> {
    let written = match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.flush())
        }
        Stream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes).and_then(|()| err.flush())
        }
    };
    if let Err(e) = &written {
        note(e);
    }
    written
}

/// Remembers a closed pipe; any other failure (ENOSPC, EIO) changes nothing but the
/// lost bytes.
pub fn note(e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CLOSED_PIPE.store(true, Ordering::Relaxed);
    }
}

/// `text` on stdout: for a command's printed answer (`list`, `show`...). The error is
/// the caller's to turn into an exit status, or to ignore.
pub fn print(text: &str) -> std::io::Result<()> {
    write_all(Stream::Stdout, text.as_bytes())
}

/// Bytes on stdout, as [`print`] writes text (a command's output, not always UTF-8).
pub fn print_bytes(bytes: &[u8]) -> std::io::Result<()> {
    write_all(Stream::Stdout, bytes)
}

/// opmark's own line on stderr unless `-q`; a write error (terminal gone after SIGHUP,
/// closed pipe, full disk) costs the line, nothing else.
pub fn say(line: std::fmt::Arguments<'_>) {
    if !quiet() {
        let _ = write_all(Stream::Stderr, format!("{line}\n").as_bytes());
    }
}

/// `eprintln!` for opmark's own lines, through [`say`]: silenced by `-q`, and a stderr
/// that cannot take the line costs the line, never a panic.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::logging::say(format_args!($($arg)*))
    };
}

/// The tracing subscriber's stderr: a failed write is dropped (and a closed pipe
/// remembered), so that `-vvv … | head -2` costs the trace, not the run.
struct TraceWriter;

impl Write for TraceWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Whole, under the lock: one event is one write, as with plain stderr.
        let _ = write_all(Stream::Stderr, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
        .with_writer(|| TraceWriter)
        // Its own complaint about a failed write would go to the same stderr, by
        // `eprintln!`, which panics when that fails too.
        .log_internal_errors(false)
        // Colour codes only for a person at a terminal: in a log file or a pipe they are
        // noise that breaks grep.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
