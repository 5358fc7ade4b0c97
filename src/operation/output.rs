//! Where a run's command output goes: live to the terminal in plain mode, kept for the
//! JSON document with `--json`; counted and digested either way (the ledger keeps counts
//! and digests, never the output). With several hosts each line goes out whole,
//! prefixed with its host, so that concurrent hosts never mix within a line.
//!
//! Kept output ([`Captured`]) stays in memory up to [`SPILL`] bytes per stream, then goes
//! to a spool file (mode 0600, unlinked at once: nothing is left behind, whatever ends
//! the process), and the JSON document streams its string escape from there
//! ([`Captured::write_json_string`]): memory stays bounded whatever the command writes.
//!
//! A get's content goes to a local file instead ([`Output::into_file`]): bytes found in
//! it are the stream's first bytes, from an earlier invocation cut while it read them,
//! and a replay of the host's copy starts after them ([`Output::replay_offsets`]).

use sha2::{Digest, Sha256};

use crate::logging::{self, Stream};

/// Bytes of output delivered so far, shared with whoever reports a run's progress while
/// it goes on (an MCP client's progress notifications).
#[derive(Debug, Default)]
pub struct OutputBytes {
    out: std::sync::atomic::AtomicU64,
    err: std::sync::atomic::AtomicU64,
}

impl OutputBytes {
    /// Stdout bytes delivered so far (every host's, for a fleet).
    pub fn stdout(&self) -> u64 {
        self.out.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stderr bytes delivered so far.
    pub fn stderr(&self) -> u64 {
        self.err.load(std::sync::atomic::Ordering::Relaxed)
    }
}

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
    stdout: Captured,
    stderr: Captured,
    out_bytes: u64,
    err_bytes: u64,
    out_digest: Sha256,
    err_digest: Sha256,
    tally: Option<std::sync::Arc<OutputBytes>>,
    /// Stdout written to a local file instead of kept (a get's content).
    file: Option<StdoutFile>,
}

/// A local file stdout is written to, as it arrives.
#[derive(Debug)]
struct StdoutFile {
    file: std::fs::File,
    /// Bytes it held when the run began, taken as the stream's first bytes; zero once
    /// the stream starts over.
    held: u64,
    /// A write failed: nothing more is written, and the file holds fewer bytes than were
    /// delivered (the read's check against the host's digest says so).
    failed: bool,
}

impl Output {
    /// Counts what is delivered in `tally` too.
    pub fn with_tally(mut self, tally: Option<std::sync::Arc<OutputBytes>>) -> Output {
        self.tally = tally;
        self
    }

    /// `live`: write to this process's stdout/stderr as bytes arrive; otherwise keep them.
    pub fn new(live: bool) -> Output {
        Output {
            live,
            prefix: None,
            partial: [Vec::new(), Vec::new()],
            stdout: Captured::default(),
            stderr: Captured::default(),
            out_bytes: 0,
            err_bytes: 0,
            out_digest: Sha256::new(),
            err_digest: Sha256::new(),
            tally: None,
            file: None,
        }
    }

    /// Stdout goes to `file` (read and write) as it arrives, after the bytes it holds,
    /// which count as the stream's first ones (counted and digested here): a read cut
    /// in an earlier invocation goes on from there. The file is the caller's to check
    /// against the digest the host says.
    pub fn into_file(mut self, mut file: std::fs::File) -> std::io::Result<Output> {
        use std::io::{Read as _, Seek as _};
        file.seek(std::io::SeekFrom::Start(0))?;
        let mut buf = vec![0u8; CHUNK];
        let mut held = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            self.out_digest.update(&buf[..n]);
            held += n as u64;
        }
        self.out_bytes = held;
        self.live = false;
        self.file = Some(StdoutFile {
            file,
            held,
            failed: false,
        });
        Ok(self)
    }

    /// Where an attach that replays the marker's output should start (stdout, stderr).
    /// From the bytes the local file held at the start when that is all this output has
    /// (a resumed read); else from the start, a file's bytes dropped first so that none
    /// is written twice. Output kept or shown (not to a file) always starts at 0.
    pub fn replay_offsets(&mut self) -> (u64, u64) {
        match &self.file {
            Some(f) if f.held > 0 && self.out_bytes == f.held && self.err_bytes == 0 => (f.held, 0),
            Some(_) => {
                self.start_over();
                (0, 0)
            }
            None => (0, 0),
        }
    }

    /// A new claim's output begins at byte 0: what a local file holds from before is
    /// dropped (a kept or shown output has nothing from before a dispatch to drop).
    pub fn start_over(&mut self) {
        let Some(f) = &mut self.file else {
            return;
        };
        if self.out_bytes == 0 && self.err_bytes == 0 {
            return;
        }
        use std::io::Seek as _;
        f.failed = f.file.set_len(0).is_err() || f.file.seek(std::io::SeekFrom::Start(0)).is_err();
        f.held = 0;
        self.out_bytes = 0;
        self.err_bytes = 0;
        self.out_digest = Sha256::new();
        self.err_digest = Sha256::new();
        self.stderr = Captured::default();
    }

    /// The bytes a local file held when the run began and still counts as the stream's
    /// first ones.
    pub fn held(&self) -> u64 {
        self.file.as_ref().map_or(0, |f| f.held)
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
        if let Some(t) = &self.tally {
            t.out
                .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        self.out_digest.update(bytes);
        if let Some(f) = &mut self.file {
            use std::io::Write as _;
            if !f.failed && f.file.write_all(bytes).is_err() {
                f.failed = true;
            }
        } else if self.live && self.prefix.is_some() {
            self.prefix_lines(0, bytes);
        } else if self.live {
            // A closed stdout (the caller went away) must not stop the bookkeeping.
            let _ = logging::write_all(Stream::Stdout, bytes);
        } else {
            self.stdout.push(bytes);
        }
    }

    /// Delivers stderr bytes.
    pub fn stderr(&mut self, bytes: &[u8]) {
        self.err_bytes += bytes.len() as u64;
        if let Some(t) = &self.tally {
            t.err
                .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        self.err_digest.update(bytes);
        if self.live && self.prefix.is_some() {
            self.prefix_lines(1, bytes);
        } else if self.live {
            let _ = logging::write_all(Stream::Stderr, bytes);
        } else {
            self.stderr.push(bytes);
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
    pub fn kept_stdout(&self) -> Captured {
        self.stdout.clone()
    }

    /// The kept stderr (empty in live mode).
    pub fn kept_stderr(&self) -> Captured {
        self.stderr.clone()
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

/// Kept bytes beyond which a stream goes to its spool file.
pub const SPILL: usize = 1 << 20;

/// How much of a spool is read at a time when it is written out.
const CHUNK: usize = 64 * 1024;

/// One stream's kept output: the spool file's bytes (if it spilled), then the bytes in
/// memory. Cloning shares the spool. Serialised (for `opmark mcp`, which hands the
/// document over whole, and fleets) as [`String::from_utf8_lossy`] of the bytes; the CLI
/// streams it with [`Captured::write_json_string`] instead, to the same bytes.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    /// The spool and how many of its bytes are ours (appends past a failed write are
    /// never counted).
    spool: Option<(std::sync::Arc<std::fs::File>, u64)>,
    /// The spool could not be made or written: keep the rest in memory (said once).
    no_spool: bool,
    /// Bytes after the spool's.
    tail: Vec<u8>,
}

impl Captured {
    /// Appends `bytes`.
    pub fn push(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
        if self.tail.len() >= SPILL && !self.no_spool {
            if let Err(e) = self.spill() {
                self.no_spool = true;
                crate::logging::say(format_args!(
                    "opmark: cannot spool the command's output to a temporary file ({e}); keeping it in memory"
                ));
            }
        }
    }

    /// Moves the bytes in memory to the end of the spool (made on first use).
    fn spill(&mut self) -> std::io::Result<()> {
        use std::io::Write as _;
        if self.spool.is_none() {
            self.spool = Some((std::sync::Arc::new(spool_file()?), 0));
        }
        if let Some((file, len)) = &mut self.spool {
            (&**file).write_all(&self.tail)?;
            *len += self.tail.len() as u64;
            self.tail = Vec::new();
        }
        Ok(())
    }

    /// Bytes kept.
    pub fn len(&self) -> u64 {
        self.spool.as_ref().map_or(0, |(_, len)| *len) + self.tail.len() as u64
    }

    /// Nothing kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `each` with the kept bytes in order, in pieces of at most [`CHUNK`] from the
    /// spool, then the bytes in memory.
    fn for_each_piece(
        &self,
        mut each: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        if let Some((file, len)) = &self.spool {
            let mut buf = vec![0u8; CHUNK];
            let mut at = 0u64;
            while at < *len {
                let want = CHUNK.min((*len - at) as usize);
                let n = file.read_at(&mut buf[..want], at)?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the output spool is shorter than what was written to it",
                    ));
                }
                each(&buf[..n])?;
                at += n as u64;
            }
        }
        each(&self.tail)
    }

    /// Writes the bytes as they came (`opmark get` keeps a file's content).
    pub fn write_raw(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.for_each_piece(|piece| out.write_all(piece))
    }

    /// The bytes as text, invalid UTF-8 replaced as [`String::from_utf8_lossy`] does (in
    /// memory: for documents handed over whole).
    pub fn lossy_string(&self) -> String {
        let mut out = Vec::new();
        match self.write_json_string(&mut out) {
            Ok(()) => serde_json::from_slice(&out).unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Writes the bytes as one JSON string, exactly as `serde_json` writes
    /// `String::from_utf8_lossy(bytes)`, reading the spool piece by piece: a character
    /// split between two pieces is joined, each invalid sequence becomes one U+FFFD.
    pub fn write_json_string(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        out.write_all(b"\"")?;
        let mut carry: Vec<u8> = Vec::new();
        let total = self.len();
        let mut seen = 0u64;
        self.for_each_piece(|piece| {
            seen += piece.len() as u64;
            carry.extend_from_slice(piece);
            let done = escape_valid(&carry, seen >= total, out)?;
            carry.drain(..done);
            Ok(())
        })?;
        // Whatever is left is an incomplete sequence at the very end.
        if !carry.is_empty() {
            escape_str("\u{FFFD}", out)?;
        }
        out.write_all(b"\"")
    }
}

impl serde::Serialize for Captured {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.lossy_string())
    }
}

/// Escapes the longest prefix of `bytes` that can be decided now (all of it at `end`,
/// else up to an incomplete last character); returns how many bytes it consumed.
fn escape_valid(bytes: &[u8], end: bool, out: &mut dyn std::io::Write) -> std::io::Result<usize> {
    let mut at = 0;
    loop {
        match std::str::from_utf8(&bytes[at..]) {
            Ok(text) => {
                escape_str(text, out)?;
                return Ok(bytes.len());
            }
            Err(e) => {
                let valid = &bytes[at..at + e.valid_up_to()];
                escape_str(std::str::from_utf8(valid).unwrap_or_default(), out)?;
                at += e.valid_up_to();
                match e.error_len() {
                    Some(bad) => {
                        escape_str("\u{FFFD}", out)?;
                        at += bad;
                    }
                    // Cut by the end of the piece: the next piece may complete it.
                    None if !end => return Ok(at),
                    None => {
                        escape_str("\u{FFFD}", out)?;
                        return Ok(bytes.len());
                    }
                }
            }
        }
    }
}

/// `text` JSON-escaped, without the quotes (escaping is per character, so pieces cut at
/// character boundaries escape to the escape of the whole).
fn escape_str(text: &str, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    let quoted = serde_json::to_vec(text).map_err(std::io::Error::other)?;
    out.write_all(&quoted[1..quoted.len() - 1])
}

/// A new spool file: in the temp directory, mode 0600, unlinked at once so that only
/// this process's descriptor reaches it and nothing outlives the process.
fn spool_file() -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = std::env::temp_dir().join(format!(
        ".opmark-output-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--json` printed before output was spooled: the lossy string, encoded whole.
    fn expected(bytes: &[u8]) -> Vec<u8> {
        serde_json::to_vec(&String::from_utf8_lossy(bytes)).unwrap()
    }

    fn streamed(captured: &Captured) -> Vec<u8> {
        let mut out = Vec::new();
        captured.write_json_string(&mut out).unwrap();
        out
    }

    /// Multi-byte characters across every piece boundary (pushes, the spill, the spool's
    /// read chunks), invalid bytes, control characters, quotes: the same JSON as before.
    #[test]
    fn spooled_output_encodes_to_exactly_the_lossy_json_string() {
        let mut bytes = Vec::new();
        let unit: &[u8] = "é€😀\"\\\n\t\u{1}a".as_bytes();
        while bytes.len() < SPILL * 3 + 12_345 {
            bytes.extend_from_slice(unit);
            if bytes.len() % 7 == 0 {
                // A lone continuation byte, a truncated 3-byte sequence, an invalid lead.
                bytes.extend_from_slice(&[0x80, 0xe2, 0x82, b'x', 0xff]);
            }
        }
        // An incomplete sequence at the very end.
        bytes.extend_from_slice(&[0xf0, 0x9f, 0x98]);
        for piece in [1, 2, 3, 4093, CHUNK - 1, CHUNK + 3] {
            let mut captured = Captured::default();
            for p in bytes.chunks(piece) {
                captured.push(p);
            }
            assert!(captured.spool.is_some(), "piece {piece}: it spilled");
            assert!(captured.tail.len() < SPILL, "piece {piece}: memory bounded");
            assert_eq!(captured.len(), bytes.len() as u64);
            assert!(
                streamed(&captured) == expected(&bytes),
                "piece {piece}: the streamed JSON differs from the lossy string's"
            );
            assert_eq!(captured.lossy_string(), String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn small_output_stays_in_memory_and_encodes_the_same() {
        for bytes in [
            &b""[..],
            b"plain\n",
            b"\xff\xfe",
            "ünïcödé".as_bytes(),
            b"\xe2\x82",
            b"a\x00b",
        ] {
            let mut captured = Captured::default();
            captured.push(bytes);
            assert!(captured.spool.is_none());
            assert_eq!(streamed(&captured), expected(bytes), "{bytes:?}");
            assert_eq!(
                serde_json::to_vec(&captured).unwrap(),
                expected(bytes),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn the_spool_is_unlinked_and_private() {
        use std::os::unix::fs::MetadataExt as _;
        let file = spool_file().unwrap();
        let meta = file.metadata().unwrap();
        assert_eq!(meta.nlink(), 0, "no name on disk");
        assert_eq!(meta.mode() & 0o777, 0o600);
    }

    fn file_with(bytes: &[u8]) -> std::fs::File {
        use std::io::Write as _;
        let mut f = spool_file().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    fn content_of(f: &std::fs::File) -> Vec<u8> {
        use std::io::{Read as _, Seek as _};
        let mut f = f.try_clone().unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn a_file_holding_the_streams_start_is_resumed_after_it_and_digested_whole() {
        let f = file_with(b"hello ");
        let mut output = Output::new(false)
            .into_file(f.try_clone().unwrap())
            .unwrap();
        assert_eq!(output.held(), 6);
        assert_eq!(
            output.out_bytes(),
            6,
            "the held bytes are the stream's first"
        );
        assert_eq!(
            output.replay_offsets(),
            (6, 0),
            "a replay starts after them"
        );
        output.stdout(b"world");
        assert_eq!(content_of(&f), b"hello world");
        assert_eq!(
            output.out_sha256(),
            hex::encode(Sha256::digest(b"hello world")),
            "the digest is the whole stream's"
        );
        assert!(output.kept_stdout().is_empty(), "nothing is kept in memory");
    }

    #[test]
    fn a_claims_output_or_a_second_replay_starts_the_file_over() {
        // A new claim's output (a dispatch) begins at byte 0: the file's bytes go.
        let f = file_with(b"stale bytes");
        let mut output = Output::new(false)
            .into_file(f.try_clone().unwrap())
            .unwrap();
        output.start_over();
        assert_eq!((output.out_bytes(), output.held()), (0, 0));
        output.stdout(b"fresh");
        assert_eq!(content_of(&f), b"fresh");
        assert_eq!(output.out_sha256(), hex::encode(Sha256::digest(b"fresh")));

        // Once more than the held bytes arrived, a replay from the start cannot go on
        // from the file: it starts over rather than write any byte twice.
        let f = file_with(b"ab");
        let mut output = Output::new(false)
            .into_file(f.try_clone().unwrap())
            .unwrap();
        output.stdout(b"cd");
        output.stderr(b"opmark-get: ...\n");
        assert_eq!(output.replay_offsets(), (0, 0));
        assert_eq!(content_of(&f), b"");
        output.stdout(b"abcd");
        assert_eq!(content_of(&f), b"abcd");
        assert_eq!(output.out_bytes(), 4);
    }

    #[test]
    fn output_kept_in_memory_replays_from_the_start_as_before() {
        let mut output = Output::new(false);
        output.stdout(b"seen");
        assert_eq!(output.replay_offsets(), (0, 0));
        output.start_over();
        assert_eq!(output.out_bytes(), 4, "kept output is never dropped");
    }
}
