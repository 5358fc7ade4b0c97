//! Where a run's command output goes: live to the terminal in plain mode, kept in memory
//! for the JSON document with `--json`; counted and digested either way (the ledger keeps
//! counts and digests, never the output). With several hosts each line goes out whole,
//! prefixed with its host, so that concurrent hosts never mix within a line.

use sha2::{Digest, Sha256};

use crate::logging::{self, Stream};

/// The caller's view of the command's output, across attempts and re-attaches: the byte
/// counts are the offsets a re-attach resumes from, so no byte is shown twice or missed.
#[derive(Debug)]
pub struct Output {
    live: bool,
    /// `host: ` for fleet runs: live bytes are held until a newline, then written as one
    /// prefixed line (partial lines go out when the output ends).
    prefix: Option<String>,
    /// Bytes of the current unfinished line per stream, while prefixing.
    partial: [Vec<u8>; 2],
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    out_bytes: u64,
    err_bytes: u64,
    out_digest: Sha256,
    err_digest: Sha256,
}

impl Output {
    /// `live`: write to this process's stdout/stderr as bytes arrive; otherwise keep them.
    pub fn new(live: bool) -> Output {
        Output {
            live,
            prefix: None,
            partial: [Vec::new(), Vec::new()],
            stdout: Vec::new(),
            stderr: Vec::new(),
            out_bytes: 0,
            err_bytes: 0,
            out_digest: Sha256::new(),
            err_digest: Sha256::new(),
        }
    }

    /// Live output with every line prefixed by `prefix` (e.g. `web1: `).
    pub fn prefixed(prefix: String) -> Output {
        let mut output = Output::new(true);
        output.prefix = Some(prefix);
        output
    }

    /// Delivers stdout bytes.
    pub fn stdout(&mut self, bytes: &[u8]) {
        self.out_bytes += bytes.len() as u64;
        self.out_digest.update(bytes);
        if self.live && self.prefix.is_some() {
            self.prefix_lines(0, bytes);
        } else if self.live {
            // A closed stdout (the caller went away) must not stop the bookkeeping.
            let _ = logging::write_all(Stream::Stdout, bytes);
        } else {
            self.stdout.extend_from_slice(bytes);
        }
    }

    /// Delivers stderr bytes.
    pub fn stderr(&mut self, bytes: &[u8]) {
        self.err_bytes += bytes.len() as u64;
        self.err_digest.update(bytes);
        if self.live && self.prefix.is_some() {
            self.prefix_lines(1, bytes);
        } else if self.live {
            let _ = logging::write_all(Stream::Stderr, bytes);
        } else {
            self.stderr.extend_from_slice(bytes);
        }
    }

    /// Appends `bytes` to stream `which` (0 stdout, 1 stderr) and writes out every line
    /// now complete, each in one write under the stream's lock.
    fn prefix_lines(&mut self, which: usize, bytes: &[u8]) {
        let prefix = self.prefix.as_deref().unwrap_or_default();
        let partial = &mut self.partial[which];
        partial.extend_from_slice(bytes);
        let Some(last_newline) = partial.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let mut block = Vec::with_capacity(partial.len() + prefix.len() * 4);
        for line in partial[..=last_newline].split_inclusive(|b| *b == b'\n') {
            block.extend_from_slice(prefix.as_bytes());
            block.extend_from_slice(line);
        }
        partial.drain(..=last_newline);
        write_whole(which, &block);
    }

    /// Writes out unfinished lines (ended with a newline, so that the next line of
    /// another host starts on its own line). Called when the output ends.
    pub fn finish_lines(&mut self) {
        let Some(prefix) = self.prefix.clone() else {
            return;
        };
        for which in 0..2 {
            if self.partial[which].is_empty() {
                continue;
            }
            let mut block = prefix.clone().into_bytes();
            block.append(&mut self.partial[which]);
            block.push(b'\n');
            write_whole(which, &block);
        }
    }

    /// Stdout bytes delivered so far.
    pub fn out_bytes(&self) -> u64 {
        self.out_bytes
    }

    /// Stderr bytes delivered so far.
    pub fn err_bytes(&self) -> u64 {
        self.err_bytes
    }

    /// Hex SHA-256 of the stdout delivered so far.
    pub fn out_sha256(&self) -> String {
        hex::encode(self.out_digest.clone().finalize())
    }

    /// Hex SHA-256 of the stderr delivered so far.
    pub fn err_sha256(&self) -> String {
        hex::encode(self.err_digest.clone().finalize())
    }

    /// The kept stdout (empty in live mode).
    pub fn kept_stdout(&self) -> &[u8] {
        &self.stdout
    }

    /// The kept stderr (empty in live mode).
    pub fn kept_stderr(&self) -> &[u8] {
        &self.stderr
    }
}

impl Drop for Output {
    /// Every way out of a run (a verdict, an error, an interruption) ends the output: a
    /// partial last line must still reach the caller.
    fn drop(&mut self) {
        self.finish_lines();
    }
}

/// One write of whole lines to stdout (0) or stderr (1): the lock keeps other hosts'
/// lines out of it. A closed stream (the caller went away) must not stop the run.
fn write_whole(which: usize, block: &[u8]) {
    let stream = if which == 0 {
        Stream::Stdout
    } else {
        Stream::Stderr
    };
    let _ = logging::write_all(stream, block);
}
