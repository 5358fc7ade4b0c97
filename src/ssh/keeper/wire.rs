//! The keeper's protocol on its unix socket: length-prefixed frames, each a tag byte and
//! a payload. Control messages are JSON (`J`); a channel's bytes travel raw (`O` stdout,
//! `E` stderr, `I` stdin) so that output costs no encoding.
//!
//! One socket connection carries one conversation: `Hello`, then one request (`Connect`,
//! `Exec`, `Status` or `Stop`) and its answers. An `Exec` is followed by the caller's
//! stdin (`I` frames, then `StdinEnd`); the keeper answers `ExecStarted` (or why not) and
//! then the channel's events until `Closed` or `Lost`. A `Call` (a request to the host's
//! resident shim, docs/host-protocol.md#the-resident-session) is followed the same way by
//! the request's bytes; the keeper answers `CallSent` (or `NoResident`: the caller then
//! calls per call), relays the resident channel's bytes, and takes the channel back for
//! the next caller when this one says `Release` after the reply's end frame (a caller
//! that leaves without it costs the channel: it is closed, never reused in an unknown
//! state). The parser has no I/O and is fed bytes in tests.

use serde::{Deserialize, Serialize};

use crate::ssh::destination::Destination;
use crate::ssh::error::{ConnectError, ConnectStage};
use crate::ssh::exec_event::ExecEvent;

/// Bumped whenever a message changes; the socket's name carries it, so a keeper started
/// by an older binary is never spoken to in a newer dialect. 2: [`KeeperReply::Alive`].
/// 3: resident calls ([`KeeperRequest::Call`]).
pub const VERSION: u32 = 3;

/// The largest frame either side accepts: bounds what a confused peer can make us hold.
pub const MAX_FRAME: usize = 8 << 20;

const TAG_JSON: u8 = b'J';
const TAG_STDOUT: u8 = b'O';
const TAG_STDERR: u8 = b'E';
const TAG_STDIN: u8 = b'I';
/// The stdin frames' size: well under [`MAX_FRAME`].
pub const STDIN_CHUNK: usize = 256 * 1024;

/// What a caller asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KeeperRequest {
    /// First message of every conversation.
    Hello {
        /// The caller's [`VERSION`].
        version: u32,
    },
    /// Make sure a connection to `dest` is held (connect, check the host key,
    /// authenticate); answered by `Connected` or `ConnectFailed`.
    Connect {
        /// The caller's connection key (see `keeper::connection_key`).
        key: String,
        /// Everything the keeper needs to connect as the caller would.
        dest: Box<Destination>,
    },
    /// Open an exec channel on a held connection (connecting when none is free).
    Exec {
        /// The caller's connection key.
        key: String,
        /// Where to, should a new connection be needed.
        dest: Box<Destination>,
        /// The host key the caller's session was opened with: a connection presenting
        /// another is never used for it.
        host_key: Option<String>,
        /// The exec request.
        command: String,
    },
    /// Send one request to the host's resident shim (docs/host-protocol.md#the-resident-session) on a held
    /// connection: an idle resident channel, or a new one. The request's bytes follow as
    /// stdin frames, then `StdinEnd`.
    Call {
        /// The caller's connection key.
        key: String,
        /// Where to, should a new connection be needed.
        dest: Box<Destination>,
        /// The host key the caller's session was opened with (as for `Exec`).
        host_key: Option<String>,
    },
    /// The reply to a `Call` is whole (its end frame arrived): the resident channel may
    /// serve the next caller.
    Release,
    /// The caller's stdin is complete.
    StdinEnd,
    /// What the keeper holds, for `opmark keeper status`.
    Status,
    /// Close every connection and exit.
    Stop,
}

/// One held connection, as `opmark keeper status` shows it (no secrets: the destination,
/// its host key fingerprint and counts).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HeldConnection {
    /// `user@host:port` and jumps.
    pub destination: String,
    /// The accepted host key's fingerprint.
    pub host_key: Option<String>,
    /// Exec channels open now.
    pub channels: usize,
    /// The most it opens at once.
    pub max_channels: usize,
    /// Channels opened on it so far.
    pub used: u64,
    /// Seconds since it was opened.
    pub age_secs: u64,
    /// Resident shim channels idle on it now, ready for the next call
    /// (docs/host-protocol.md#the-resident-session).
    #[serde(default)]
    pub idle_residents: usize,
    /// Why its host serves no resident (calls on it go per call), if it refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_resident: Option<String>,
}

/// What the keeper answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KeeperReply {
    /// The answer to `Hello`.
    Hello {
        /// The keeper's [`VERSION`].
        version: u32,
        /// The keeper's process id.
        pid: u32,
    },
    /// The request is not acceptable (wrong version, bad message).
    Refused {
        /// Why.
        message: String,
    },
    /// A connection to the destination is held.
    Connected {
        /// Its host key fingerprint.
        host_key: Option<String>,
    },
    /// Connecting failed; nothing was sent.
    ConnectFailed {
        /// The stage, as [`stage_name`] writes it.
        stage: String,
        /// What happened.
        message: String,
    },
    /// The exec request never left, or the host refused it: nothing ran.
    ExecNotSent {
        /// Why.
        message: String,
    },
    /// The exec request left and the connection was lost before the host answered.
    ExecLost {
        /// Why.
        message: String,
    },
    /// The host accepted the exec request; events follow.
    ExecStarted,
    /// A `Call`'s request was written to a resident channel; the channel's bytes follow.
    CallSent {
        /// The resident shim's pid on the host.
        resident_pid: u32,
    },
    /// No resident shim serves this connection (the host's shim refuses `serve`, or it
    /// could not start): nothing of the request was sent; call the shim per call.
    NoResident {
        /// Why.
        message: String,
    },
    /// The command's exit status.
    ExitStatus {
        /// The status.
        status: u32,
    },
    /// The command died of a signal.
    ExitSignal {
        /// Signal name without `SIG`.
        signal: String,
        /// Whether a core was dumped.
        core_dumped: bool,
        /// The host's message.
        message: String,
    },
    /// The channel closed cleanly.
    Closed,
    /// The keeper's connection died before the channel closed.
    Lost {
        /// Why.
        message: String,
    },
    /// The answer to `Status`.
    Status {
        /// The keeper's process id.
        pid: u32,
        /// Its idle limit in seconds.
        persist_secs: u64,
        /// Seconds since its last caller left (0 while one is connected).
        idle_secs: u64,
        /// Callers connected now.
        callers: usize,
        /// Connections held.
        connections: Vec<HeldConnection>,
    },
    /// The answer to `Stop`: the keeper exits after sending it.
    Stopping {
        /// The keeper's process id.
        pid: u32,
    },
    /// "Still here": sent every [`heartbeat`] while a `Connect` or an `Exec` waits on the
    /// host (a silent command, a slow connect), so that a caller can tell a keeper that
    /// stopped answering (SIGSTOP, a hang) from a quiet one, within the same keepalive
    /// budget as a direct connection. Callers skip it.
    Alive,
}

/// How often the keeper says [`KeeperReply::Alive`] on a conversation about `dest`: twice per
/// keepalive interval, so that the caller's budget (interval x (count + 1)) never runs
/// out on a keeper that answers.
pub fn heartbeat(dest: &Destination) -> std::time::Duration {
    let interval = dest
        .keepalive_interval
        .unwrap_or(crate::ssh::destination::DEFAULT_KEEPALIVE_INTERVAL);
    (interval / 2).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(1),
    )
}

/// One frame, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeeperFrame {
    /// A control message, still JSON (the reader knows which type to expect).
    Json(Vec<u8>),
    /// Command stdout bytes.
    Stdout(Vec<u8>),
    /// Command stderr bytes.
    Stderr(Vec<u8>),
    /// Bytes for the command's stdin.
    Stdin(Vec<u8>),
}

impl KeeperFrame {
    /// A control message as a frame.
    pub fn json<T: Serialize>(msg: &T) -> KeeperFrame {
        KeeperFrame::Json(serde_json::to_vec(msg).unwrap_or_default())
    }

    /// The bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let (tag, body) = match self {
            KeeperFrame::Json(b) => (TAG_JSON, b),
            KeeperFrame::Stdout(b) => (TAG_STDOUT, b),
            KeeperFrame::Stderr(b) => (TAG_STDERR, b),
            KeeperFrame::Stdin(b) => (TAG_STDIN, b),
        };
        let mut out = Vec::with_capacity(5 + body.len());
        out.extend_from_slice(&((body.len() + 1) as u32).to_be_bytes());
        out.push(tag);
        out.extend_from_slice(body);
        out
    }

    /// Appends `request` as one write would carry it: the frame, then `stdin` in
    /// [`STDIN_CHUNK`] pieces, then [`KeeperRequest::StdinEnd`]. Each byte of stdin is
    /// copied once, straight into `out` (a 100 MB put went through three copies).
    pub fn encode_with_stdin(request: &KeeperFrame, stdin: &[u8], out: &mut Vec<u8>) {
        let end = KeeperFrame::json(&KeeperRequest::StdinEnd).encode();
        let pieces = stdin.len().div_ceil(STDIN_CHUNK);
        out.reserve(stdin.len() + 5 * pieces + end.len() + 64);
        out.extend_from_slice(&request.encode());
        for chunk in stdin.chunks(STDIN_CHUNK) {
            out.extend_from_slice(&((chunk.len() + 1) as u32).to_be_bytes());
            out.push(TAG_STDIN);
            out.extend_from_slice(chunk);
        }
        out.extend_from_slice(&end);
    }

    /// Decodes a control message of type `T`.
    pub fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, WireError> {
        match self {
            KeeperFrame::Json(b) => serde_json::from_slice(b)
                .map_err(|e| WireError(format!("unreadable control message: {e}"))),
            _ => Err(WireError(
                "expected a control message, got channel data".into(),
            )),
        }
    }
}

/// A peer that does not speak the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("keeper protocol error: {0}")]
pub struct WireError(pub String);

/// Splits a byte stream into frames.
/// Frames already taken are skipped by `pos` and dropped from the buffer only when that
/// is cheap (half of it or all of it), not moved down after every frame: a read that
/// holds a hundred frames would otherwise move its rest a hundred times.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    pos: usize,
}

impl FrameReader {
    /// Adds bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(bytes);
    }

    /// Reads what `read` has (at most `want` bytes) straight into the buffer; 0 at its end.
    pub async fn fill<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        read: &mut R,
        want: usize,
    ) -> std::io::Result<usize> {
        use tokio::io::AsyncReadExt as _;
        self.compact();
        self.buf.reserve(want);
        read.read_buf(&mut self.buf).await
    }

    fn compact(&mut self) {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// The next complete frame, if the buffer holds one.
    pub fn next_frame(&mut self) -> Result<Option<KeeperFrame>, WireError> {
        let avail = &self.buf[self.pos..];
        if avail.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(WireError(format!("frame length {len} out of range")));
        }
        if avail.len() < 4 + len {
            return Ok(None);
        }
        let tag = avail[4];
        let body = avail[5..4 + len].to_vec();
        self.pos += 4 + len;
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        match tag {
            TAG_JSON => Ok(Some(KeeperFrame::Json(body))),
            TAG_STDOUT => Ok(Some(KeeperFrame::Stdout(body))),
            TAG_STDERR => Ok(Some(KeeperFrame::Stderr(body))),
            TAG_STDIN => Ok(Some(KeeperFrame::Stdin(body))),
            other => Err(WireError(format!("unknown frame tag {other:#04x}"))),
        }
    }
}

/// The stable name of a connect stage on the wire (`Timeout` kept apart from `Connect`,
/// which `ConnectStage::as_str` merges).
pub fn stage_name(stage: ConnectStage) -> &'static str {
    match stage {
        ConnectStage::Config => "config",
        ConnectStage::Resolve => "resolve",
        ConnectStage::Connect => "connect",
        ConnectStage::Timeout => "timeout",
        ConnectStage::HostKey => "host_key",
        ConnectStage::Auth => "auth",
    }
}

/// A `ConnectFailed` back into the caller's error.
pub fn connect_error(stage: &str, message: String) -> ConnectError {
    let stage = match stage {
        "config" => ConnectStage::Config,
        "resolve" => ConnectStage::Resolve,
        "timeout" => ConnectStage::Timeout,
        "host_key" => ConnectStage::HostKey,
        "auth" => ConnectStage::Auth,
        _ => ConnectStage::Connect,
    };
    ConnectError::new(stage, message)
}

/// A channel event as a frame.
pub fn event_frame(event: ExecEvent) -> KeeperFrame {
    match event {
        ExecEvent::Stdout(b) => KeeperFrame::Stdout(b),
        ExecEvent::Stderr(b) => KeeperFrame::Stderr(b),
        ExecEvent::ExitStatus(status) => KeeperFrame::json(&KeeperReply::ExitStatus { status }),
        ExecEvent::ExitSignal {
            signal,
            core_dumped,
            message,
        } => KeeperFrame::json(&KeeperReply::ExitSignal {
            signal,
            core_dumped,
            message,
        }),
        ExecEvent::Closed => KeeperFrame::json(&KeeperReply::Closed),
        ExecEvent::Lost(message) => KeeperFrame::json(&KeeperReply::Lost { message }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_being_fed_one_byte_at_a_time() {
        let frames = vec![
            KeeperFrame::json(&KeeperReply::ExecStarted),
            KeeperFrame::Stdout(b"hello\n".to_vec()),
            KeeperFrame::Stderr(vec![0, 255, 10]),
            KeeperFrame::json(&KeeperReply::ExitStatus { status: 3 }),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
        let mut reader = FrameReader::default();
        let mut got = Vec::new();
        for b in wire {
            reader.push(&[b]);
            while let Some(f) = reader.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        assert_eq!(
            got[3].parse::<KeeperReply>().unwrap(),
            KeeperReply::ExitStatus { status: 3 }
        );
    }

    #[test]
    fn a_request_with_its_stdin_reads_back_as_its_frames_whatever_the_reads() {
        let stdin: Vec<u8> = (0..(2 * STDIN_CHUNK + 1000))
            .map(|i| (i % 251) as u8)
            .collect();
        let request = KeeperFrame::json(&KeeperRequest::StdinEnd);
        let mut wire = Vec::new();
        KeeperFrame::encode_with_stdin(&request, &stdin, &mut wire);
        // Reads of every size, frames taken after each: what a socket hands over.
        for piece in [1, 4999, 65536, STDIN_CHUNK + 5, wire.len()] {
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            for part in wire.chunks(piece) {
                reader.push(part);
                while let Some(f) = reader.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 5, "the request, three pieces, the end ({piece})");
            assert_eq!(got[0], request);
            let mut joined = Vec::new();
            for f in &got[1..4] {
                let KeeperFrame::Stdin(b) = f else {
                    panic!("stdin frame expected, got {f:?}");
                };
                assert!(b.len() <= STDIN_CHUNK);
                joined.extend_from_slice(b);
            }
            assert_eq!(joined, stdin, "{piece}");
            assert!(matches!(
                got[4].parse::<KeeperRequest>().unwrap(),
                KeeperRequest::StdinEnd
            ));
            assert!(reader.next_frame().unwrap().is_none());
        }
    }

    #[test]
    fn oversized_or_unknown_frames_are_refused() {
        let mut reader = FrameReader::default();
        reader.push(&((MAX_FRAME + 1) as u32).to_be_bytes());
        assert!(reader.next_frame().is_err());
        let mut reader = FrameReader::default();
        reader.push(&[0, 0, 0, 1, b'Z']);
        assert!(reader.next_frame().is_err());
    }

    #[test]
    fn every_connect_stage_crosses_the_wire_unchanged() {
        for stage in [
            ConnectStage::Config,
            ConnectStage::Resolve,
            ConnectStage::Connect,
            ConnectStage::Timeout,
            ConnectStage::HostKey,
            ConnectStage::Auth,
        ] {
            assert_eq!(connect_error(stage_name(stage), String::new()).stage, stage);
        }
    }
}
