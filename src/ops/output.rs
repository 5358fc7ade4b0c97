//! Output: any part of an operation's recorded output, read back from the copy its host
//! keeps in the marker (the ledger holds only byte counts and digests, never output).
//! Reads only: nothing is recorded, nothing runs. An agent whose result was cut to its
//! budget reads the rest here, a byte range, the tail, or the lines matching a pattern.

use regex::bytes::Regex;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::host_changed;
use super::{block_on, load_policy, open_existing_ledger, Context, HostOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::host::{
    CallError, Destination, Host, OutputFrom, OutputRange, OutputStream, RefusalReason,
};
use crate::op_id::OpId;
use crate::operation::identity::Recorded;

/// The most bytes one read brings back: a kept copy is bounded by the run's
/// `--output-cap` (8 MiB unless raised), and a read never holds more than this in memory.
pub const MAX_READ: u64 = 64 << 20;

/// Which part of the stream.
#[derive(Debug, Clone)]
pub enum Select {
    /// The whole kept copy.
    All,
    /// Bytes `from` up to, not including, `to` (`None`: to the end of the kept copy).
    Range {
        /// First byte.
        from: u64,
        /// Byte after the last.
        to: Option<u64>,
    },
    /// The last this many bytes.
    Tail(u64),
    /// The lines matching a regular expression, with their byte offsets.
    Grep(String),
}

/// What to read.
#[derive(Debug, Clone)]
pub struct OutputRequest {
    /// The op id, unchecked.
    pub op: String,
    /// The host as the user names it; `None`: the one host the ledger ran the op id on.
    pub host: Option<String>,
    /// Which stream.
    pub stream: OutputStream,
    /// Which part of it.
    pub select: Select,
    /// At most this many bytes in the answer: of the range (its `to` says where it
    /// stopped), or of `--grep`'s matching lines (`matches_left_out` counts the rest).
    pub max_bytes: u64,
    /// Connection options overriding the recorded route.
    pub options: HostOptions,
}

/// A line that matched `--grep`.
#[derive(Debug, Clone, Serialize)]
pub struct GrepMatch {
    /// Byte offset of the line's first byte in the stream.
    pub offset: u64,
    /// The line, without its newline (invalid UTF-8 replaced).
    pub line: String,
}

/// What was read.
#[derive(Debug, Clone, Serialize)]
pub struct OutputReport {
    pub op_id: String,
    pub host: String,
    /// `stdout` or `stderr`.
    pub stream: &'static str,
    /// The host marker's state when read (`running`: the kept copy may still grow).
    pub marker_state: String,
    /// Bytes of the stream the host keeps now.
    pub kept_bytes: u64,
    /// Bytes beyond the run's output cap: never kept, so no read can bring them back.
    pub dropped_bytes: u64,
    /// gc collected the output: only the exit status is left.
    pub output_collected: bool,
    /// Offset of the first byte read.
    pub from: u64,
    /// Offset after the last byte read.
    pub to: u64,
    /// SHA-256 of the bytes read (of the range, before any `--grep` filtering).
    pub sha256: String,
    /// The bytes read, as text (invalid UTF-8 replaced; `sha256` is of the raw bytes).
    /// Absent with `--grep`, whose lines are in `matches`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `--grep`'s matching lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<GrepMatch>>,
    /// Matching lines beyond the answer's size limit, not in `matches`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches_left_out: Option<u64>,
    /// The raw bytes, for the CLI's plain output.
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// Reads the part of the stream `req` selects from the host's kept copy. A host that
/// is not the one the operation ran on is answered as `probe` answers it.
pub fn output(ctx: &Context, req: &OutputRequest) -> Result<host_changed::Answered<OutputReport>> {
    let op =
        OpId::parse(&req.op).map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    let grep = match &req.select {
        Select::Grep(pattern) => Some(Regex::new(pattern).map_err(|e| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("--grep: not a regular expression: {e}; nothing was sent"),
            )
        })?),
        Select::Range { from, to: Some(to) } if to <= from => {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "--range {from}-{to} is empty: the end is the byte after the last one wanted, so it must be above the start (e.g. {from}-{}); nothing was sent",
                    from + 4096
                ),
            ))
        }
        _ => None,
    };
    let policy = load_policy(ctx)?;
    let ledger = open_existing_ledger(ctx, &policy)?;
    let typed = match &req.host {
        Some(host) => {
            crate::host::check_destination(host).map_err(|why| {
                Error::new(ErrorKind::InvalidInput, format!("{why}; nothing was sent"))
            })?;
            host.clone()
        }
        None => match ledger.hosts_of(op.as_str())?.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                    "the ledger has no operation `{op}`; name its host: `opmark output {op} HOST`"
                ),
                ))
            }
            many => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "`{op}` ran on {} hosts ({}); name one: `opmark output {op} HOST`",
                        many.len(),
                        many.join(", ")
                    ),
                ))
            }
        },
    };
    let (host, dest, recorded) =
        super::reach::reach_operation(ctx, &typed, &req.options, op.as_str(), &ledger)?;
    let limit = req.max_bytes.clamp(1, MAX_READ);
    let (from, len) = match &req.select {
        Select::All => (OutputFrom::Start(0), limit),
        Select::Grep(_) => (OutputFrom::Start(0), MAX_READ),
        Select::Range { from, to } => (
            OutputFrom::Start(*from),
            to.map_or(limit, |to| (to - from).min(limit)),
        ),
        // The last n bytes, or, above the limit, the first `limit` of them.
        Select::Tail(n) => (OutputFrom::End(*n), (*n).min(limit)),
    };
    let read = match block_on(read_checked(
        &dest, &op, &host, &recorded, req.stream, from, len,
    ))? {
        Ok(read) => read,
        Err(e) => {
            return host_changed::answer(host_changed::Subcommand::Output, op.as_str(), &host, e)
        }
    };
    let to = read.from + read.bytes.len() as u64;
    let mut left_out = 0u64;
    let matches = grep.map(|re| {
        let mut offset = read.from;
        let mut size = 0u64;
        let mut found = Vec::new();
        for line in read.bytes.split_inclusive(|&b| b == b'\n') {
            let at = offset;
            offset += line.len() as u64;
            let line = line.strip_suffix(b"\n").unwrap_or(line);
            if !re.is_match(line) {
                continue;
            }
            size += line.len() as u64 + 1;
            if size > limit {
                left_out += 1;
                continue;
            }
            found.push(GrepMatch {
                offset: at,
                line: String::from_utf8_lossy(line).into_owned(),
            });
        }
        found
    });
    Ok(host_changed::Answered::Report(OutputReport {
        op_id: op.as_str().to_owned(),
        stream: match req.stream {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        },
        marker_state: read.marker.state.as_str().to_owned(),
        kept_bytes: read.kept,
        dropped_bytes: read.dropped,
        output_collected: read.marker.output_collected(),
        from: read.from,
        to,
        sha256: hex::encode(Sha256::digest(&read.bytes)),
        text: matches
            .is_none()
            .then(|| String::from_utf8_lossy(&read.bytes).into_owned()),
        matches_left_out: matches.as_ref().map(|_| left_out),
        matches,
        bytes: read.bytes,
        host,
    }))
}

/// One read over a fresh connection, only on a host presenting a key the operation ran
/// against.
async fn read_checked(
    dest: &Destination,
    op: &OpId,
    host: &str,
    recorded: &Recorded,
    stream: OutputStream,
    from: OutputFrom,
    len: u64,
) -> Result<OutputRange> {
    let reached = Host::connect_checked(dest, recorded.root(), |key, route| {
        recorded.check(host, op.as_str(), key, Some(route))
    })
    .await;
    let reached = reached.map_err(|e| host_changed::reach_error(e, "nothing was read"))?;
    reached
        .output(op, stream, from, len)
        .await
        .map_err(|e| match e {
            CallError::Refused(r) if r.reason == RefusalReason::RootChanged => {
                host_changed::root_changed(recorded, host, op.as_str(), &r)
            }
            CallError::Refused(r) => match &r.marker {
                Some(marker) => Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "{host} holds no output of `{op}`: its marker is {}; `opmark probe {host} {op}` says more",
                        marker.summary()
                    ),
                )
                .with_code(crate::vocab::ErrorCode::UnknownOperation),
                None => Error::new(
                    ErrorKind::Unreachable,
                    format!("the host shim refused the read: {} {:?}", r.reason, r.fields),
                ),
            },
            e => Error::new(
                ErrorKind::Unreachable,
                format!("reading the output of `{op}` on {} failed: {e}", dest.display()),
            ),
        })
}
