//! Where a run's command output goes: live to the terminal in plain mode, kept in memory
//! for the JSON document with `--json`; counted and digested either way (the ledger keeps
//! counts and digests, never the output).

use std::io::Write;

use sha2::{Digest, Sha256};

/// The caller's view of the command's output, across attempts and re-attaches: the byte
/// counts are the offsets a re-attach resumes from, so no byte is shown twice or missed.
#[derive(Debug)]
pub struct Output {
    live: bool,
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
            stdout: Vec::new(),
            stderr: Vec::new(),
            out_bytes: 0,
            err_bytes: 0,
            out_digest: Sha256::new(),
            err_digest: Sha256::new(),
        }
    }

    /// Delivers stdout bytes.
    pub fn stdout(&mut self, bytes: &[u8]) {
        self.out_bytes += bytes.len() as u64;
        self.out_digest.update(bytes);
        if self.live {
            let mut out = std::io::stdout().lock();
            // A closed stdout (the caller went away) must not stop the bookkeeping.
            let _ = out.write_all(bytes).and_then(|()| out.flush());
        } else {
            self.stdout.extend_from_slice(bytes);
        }
    }

    /// Delivers stderr bytes.
    pub fn stderr(&mut self, bytes: &[u8]) {
        self.err_bytes += bytes.len() as u64;
        self.err_digest.update(bytes);
        if self.live {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(bytes).and_then(|()| err.flush());
        } else {
            self.stderr.extend_from_slice(bytes);
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
