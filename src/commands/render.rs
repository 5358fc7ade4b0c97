//! The render layer: [`Out`], the one object through which every command's answer
//! reaches stdout, and text for people shared by the commands (stored text made safe
//! for a terminal, cut or wrapped to a width, the ledger's times shown to the second).

use crate::error::{Error, ErrorKind, Result};
use crate::ops::document::json_document;

/// This process's stdout, the one way a command's answer leaves it. A stdout that cannot
/// take a write (a reader gone: [`std::io::ErrorKind::BrokenPipe`]; a full disk) is
/// [`ErrorKind::StdoutClosed`]: nobody can read the answer, so the process exits 141 as
/// one that SIGPIPE ended would (docs/guarantees.md#the-command-line-contract); never a panic. A broken pipe is also
/// remembered by [`crate::logging::closed_pipe`] for `main`.
#[derive(Debug, Clone, Copy)]
pub struct Out;

impl Out {
    /// `text` as it is.
    pub fn text(self, text: &str) -> Result<()> {
        crate::logging::print(text).map_err(stdout_failed)
    }

    /// Raw bytes as they are (a command's output, which need not be UTF-8).
    pub fn bytes(self, bytes: &[u8]) -> Result<()> {
        crate::logging::print_bytes(bytes).map_err(stdout_failed)
    }

    /// One JSON document: compact, one line, ending in a newline, with `schema` (see
    /// docs/guarantees.md#the-command-line-contract), so a caller can read it with one `readline`.
    pub fn json(self, value: &impl serde::Serialize) -> Result<()> {
        let doc = json_document(value)?;
        self.text(&format!("{doc}\n"))
    }

    /// `run`'s document as [`Out::json`] prints it, with `stdout` and `stderr` streamed
    /// from their spools instead of held in memory (docs/ledger.md#redaction: memory bounded by the caps,
    /// not by the output): the bytes are those `json` would print.
    pub fn run_json(self, report: &crate::operation::RunReport) -> Result<()> {
        let mut light = report.clone();
        light.stdout = Default::default();
        light.stderr = Default::default();
        let doc = json_document(&light)?;
        let serde_json::Value::Object(map) = &doc else {
            return Err(Error::new(
                ErrorKind::Internal,
                "a JSON document must be an object (opmark bug)",
            ));
        };
        let write = || -> std::io::Result<()> {
            use std::io::Write as _;
            let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
            out.write_all(b"{")?;
            for (i, (key, value)) in map.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                serde_json::to_writer(&mut out, key)?;
                out.write_all(b":")?;
                match key.as_str() {
                    "stdout" => report.stdout.write_json_string(&mut out)?,
                    "stderr" => report.stderr.write_json_string(&mut out)?,
                    _ => serde_json::to_writer(&mut out, value)?,
                }
            }
            out.write_all(b"}\n")?;
            out.flush()
        };
        write().map_err(|e| {
            crate::logging::note(&e);
            stdout_failed(e)
        })
    }
}

fn stdout_failed(e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::StdoutClosed,
        format!("cannot write to stdout: {e}"),
    )
}

/// How wide the table may be: cut to a screen, or whole (`--wide`, `-o wide`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Rows fit this many columns: the command is cut (or goes on its own line) so that
    /// the op id and host, which people copy, are never cut.
    Screen(usize),
    /// Every column whole, and the family too: one row per operation however long.
    Wide,
}

/// The width `show` wraps its timeline to.
pub const WIDTH: usize = 80;

pub use crate::text::{fit, pad, parse_at, printable, to_second, width};

/// Appends `prefix` + `text`, wrapping at [`WIDTH`] with continuation lines aligned under
/// the text's first column. Words longer than a line are split.
pub fn wrap_into(out: &mut String, prefix: &str, text: &str) {
    let indent = width(prefix);
    let room = WIDTH.saturating_sub(indent).max(20);
    let mut line = String::new();
    let mut lines = Vec::new();
    for word in text.split(' ') {
        let mut word: String = word.to_owned();
        loop {
            let used = width(&line);
            let wlen = width(&word);
            let need = if used == 0 { wlen } else { used + 1 + wlen };
            if need <= room {
                if used > 0 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if used > 0 {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A single word longer than the room: split it.
            let mut head = String::new();
            let mut rest = word.chars().peekable();
            while let Some(&c) = rest.peek() {
                if width(&head) + width(c.encode_utf8(&mut [0; 4])) > room && !head.is_empty() {
                    break;
                }
                head.push(c);
                rest.next();
            }
            lines.push(head);
            word = rest.collect();
        }
    }
    lines.push(line);
    for (i, l) in lines.iter().enumerate() {
        if i == 0 {
            out.push_str(prefix);
        } else {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(l);
        out.push('\n');
    }
}
