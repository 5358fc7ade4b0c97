//! Whether `opmark run` forwards this process's stdin, decided as a user of `ssh HOST CMD`
//! expects and never by dropping input silently (docs/guarantees.md#standard-input).
//!
//! ssh streams stdin while the command runs; opmark must know the whole input before it
//! sends anything (it is part of the intent, and a retry resends it), so it reads to EOF
//! first. That is only safe when the input ends: a file does, a terminal is the person
//! (ssh would hand it over too, but nobody expects `opmark run host uptime` to wait for
//! Ctrl-D), and a pipe may never close (agent harnesses leave one open). So:
//!
//! - `--stdin`: read to EOF and forward; on a terminal, say so first.
//! - `-n`/`--no-stdin`: never read (ssh -n).
//! - neither: a regular file is forwarded whole; a terminal, /dev/null or a closed
//!   descriptor forwards nothing; a pipe or socket is watched for [`PIPE_GRACE`]: input
//!   there (or end of file) decides, silence refuses the run before anything is sent,
//!   naming `--stdin` and `</dev/null`.

use std::io::IsTerminal;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::ops::run::Stdin;

/// How long a pipe on stdin may stay silent before opmark stops guessing and asks.
/// Long enough for a producer started in the same pipeline (`printf … | opmark run`) to
/// have written or closed; short enough that an agent whose harness leaves a pipe open
/// learns at once what to add.
pub const PIPE_GRACE: Duration = Duration::from_millis(500);

/// What the command line asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// `--stdin`.
    Forward,
    /// `-n`/`--no-stdin`, or stdin already taken (`--approval -`).
    Never,
    /// Neither: decided by what stdin is.
    Unsaid,
}

/// What stdin is, as far as the decision goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdinKind {
    Terminal,
    /// A regular file with this many bytes.
    File(u64),
    /// A pipe or socket: may be fed, may end, may stay open forever.
    Stream,
    /// /dev/null, another device, or no descriptor at all.
    Nothing,
}

/// The answer for `run`, from what was asked and what stdin is.
pub fn decide(asked: Asked) -> Result<Stdin> {
    match asked {
        Asked::Never => Ok(Stdin::None),
        Asked::Forward => {
            if std::io::stdin().is_terminal() {
                crate::logging::say(format_args!(
                    "opmark: --stdin: reading the input to forward from the terminal until end of file (Ctrl-D); nothing is sent before"
                ));
            }
            Ok(Stdin::Read)
        }
        Asked::Unsaid => match kind() {
            StdinKind::Terminal | StdinKind::Nothing | StdinKind::File(0) => Ok(Stdin::None),
            StdinKind::File(_) => Ok(Stdin::Read),
            StdinKind::Stream => match readable_within(PIPE_GRACE) {
                Some(true) => Ok(Stdin::Read),
                Some(false) => Ok(Stdin::None),
                None => Err(silent_pipe()),
            },
        },
    }
}

fn silent_pipe() -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!(
            "stdin is a pipe that neither sent anything nor closed within {} ms, so opmark cannot tell whether the command needs it (ssh would stream it; opmark reads the whole input before sending, as it is part of the operation). Give --stdin to forward it (read to end of file), or -n (or </dev/null) to run without it; nothing was sent",
            PIPE_GRACE.as_millis()
        ),
    )
}

fn kind() -> StdinKind {
    use rustix::fs::{FileType, SeekFrom};
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return StdinKind::Terminal;
    }
    let Ok(st) = rustix::fs::fstat(&stdin) else {
        return StdinKind::Nothing;
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            // Bytes from the current offset on are what `cat` would read.
            let at = rustix::fs::seek(&stdin, SeekFrom::Current(0)).unwrap_or(0);
            let size = u64::try_from(st.st_size).unwrap_or(0);
            StdinKind::File(size.saturating_sub(at))
        }
        FileType::Fifo | FileType::Socket => StdinKind::Stream,
        _ => StdinKind::Nothing,
    }
}

/// `Some(true)`: bytes are waiting; `Some(false)`: end of file (the writer closed with
/// nothing sent); `None`: still open and silent after `grace`.
fn readable_within(grace: Duration) -> Option<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let stdin = std::io::stdin();
    let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
    let timeout = Timespec::try_from(grace).ok()?;
    let ready = rustix::event::poll(&mut fds, Some(&timeout)).ok()?;
    if ready == 0 {
        return None;
    }
    let revents = fds[0].revents();
    if revents.contains(PollFlags::IN) {
        // Readable: bytes, or end of file on a socket. FIONREAD tells them apart
        // without consuming anything.
        return Some(rustix::io::ioctl_fionread(&stdin).map_or(true, |n| n > 0));
    }
    // HUP without IN: the writer closed and nothing is left.
    Some(false)
}
