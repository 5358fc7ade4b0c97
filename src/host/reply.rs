//! A shim call's reply as it arrives, and how the call ended: the one reader of a reply,
//! for a call of its own ([`super::call`]) and for a request to the host's resident shim
//! ([`super::resident`]). Output and frames go to the call's observer as they arrive;
//! a reply that cannot be read is a lost one (the evidence must then come from a probe).

use crate::shim::{Frame, ProtocolError, Reply, ReplyParser};
use crate::ssh::ExecEvent;

/// Receives a call's output and frames as they arrive.
pub trait CallObserver {
    /// Command stdout bytes.
    fn stdout(&mut self, bytes: &[u8]);
    /// Command stderr bytes.
    fn stderr(&mut self, bytes: &[u8]);
    /// A frame from the shim (data frames excluded).
    fn frame(&mut self, frame: &Frame);
}

/// How a shim call ended.
#[derive(Debug)]
pub enum CallEnd {
    /// The exec request never left: nothing can run because of this call.
    NotSent(String),
    /// The shim gave its final frame (the frames of the call, in order).
    Finished(Vec<Frame>),
    /// The request left, but the reply ended before the final frame.
    Lost {
        /// Frames seen before the loss.
        frames: Vec<Frame>,
        /// What the transport said, or why the reply could not be read.
        reason: String,
        /// `Some` when the channel closed in order (every byte the host wrote arrived)
        /// without the shim's header: the shim never started, so it claimed nothing.
        never_started: Option<NeverStarted>,
        /// `Some` when the reply broke the protocol (bytes that are not frames, a shim
        /// speaking another protocol version): what the shim did is unknown.
        protocol: Option<ProtocolError>,
    },
}

impl CallEnd {
    /// The request left (or may have), and the transport lost it before any reply.
    pub(crate) fn lost_before_reply(reason: String) -> CallEnd {
        CallEnd::Lost {
            frames: Vec::new(),
            reason,
            never_started: None,
            protocol: None,
        }
    }
}

/// A channel that closed before the shim said anything: the login shell, its startup
/// files or the host's tools stopped it. Nothing of the verb happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeverStarted {
    /// The exit status the host sent for the session, if any.
    pub exit_status: Option<u32>,
    /// The first line the host printed instead (stderr first), cut short and made
    /// printable: usually the login shell's complaint.
    pub said: String,
}

impl NeverStarted {
    fn new(exit_status: Option<u32>, parser: &ReplyParser) -> NeverStarted {
        let (out, err) = parser.preamble(4096);
        let text = String::from_utf8_lossy(if err.iter().any(|b| !b.is_ascii_whitespace()) {
            &err
        } else {
            &out
        })
        .into_owned();
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or_default();
        let said: String = line
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(160)
            .collect();
        NeverStarted {
            exit_status,
            said: without_digests(&said),
        }
    }

    /// The cause and the fix, in words.
    pub fn describe(&self) -> String {
        let status = self
            .exit_status
            .map_or_else(|| "no exit status".to_owned(), |s| format!("exit {s}"));
        let said = if self.said.is_empty() {
            "it printed nothing".to_owned()
        } else {
            format!("it said: {}", self.said)
        };
        format!(
            "the shim never started: the host's login shell ended the session ({status}) before running it, so nothing was claimed or run ({said}). Check that the login shell runs `sh -c` commands and that its startup files (e.g. ~/.bashrc) neither exit nor read stdin; `opmark doctor HOST` checks the host"
        )
    }
}

/// A shell complaining about the exec request may quote it, and with it the intent's
/// plain SHA-256, which the ledger must never hold (it keeps an HMAC so that a copy
/// cannot be used to guess a short secret offline): long hex runs become `<hex>`.
fn without_digests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        if run.len() >= 32 {
            out.push_str("<hex>");
        } else {
            out.push_str(&run);
        }
        run.clear();
        out.push(c);
    }
    out.pop();
    out
}

/// One reply as it arrives: its frame parser, its frames so far, whether the final one
/// came.
pub(crate) struct ReplyReader {
    pub(crate) parser: ReplyParser,
    frames: Vec<Frame>,
    replies: Vec<Reply>,
    finished: bool,
}

impl ReplyReader {
    /// A reader of the reply to the call whose token is `token`.
    pub(crate) fn expecting(token: &str) -> ReplyReader {
        ReplyReader {
            parser: ReplyParser::expecting(token),
            frames: Vec::new(),
            replies: Vec::new(),
            finished: false,
        }
    }

    /// Takes what the channel said, handing output and frames to `observer`; the call's
    /// end when the reply broke the protocol.
    pub(crate) fn feed(
        &mut self,
        event: &ExecEvent,
        observer: &mut dyn CallObserver,
    ) -> Result<(), CallEnd> {
        let pushed = match event {
            ExecEvent::Stdout(b) => self.parser.push_stdout(b, &mut self.replies),
            ExecEvent::Stderr(b) => self.parser.push_stderr(b, &mut self.replies),
            _ => Ok(()),
        };
        if let Err(e) = pushed {
            return Err(CallEnd::Lost {
                frames: std::mem::take(&mut self.frames),
                reason: e.to_string(),
                never_started: None,
                protocol: Some(e),
            });
        }
        for reply in self.replies.drain(..) {
            match reply {
                Reply::Stdout(b) => observer.stdout(&b),
                Reply::Stderr(b) => observer.stderr(&b),
                Reply::Frame(f) => {
                    observer.frame(&f);
                    self.finished |= f.is_final();
                    self.frames.push(f);
                }
            }
        }
        Ok(())
    }

    /// Whether the shim's final frame came.
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// The frames so far.
    pub(crate) fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The call ended with its final frame.
    pub(crate) fn finish(self) -> CallEnd {
        CallEnd::Finished(self.frames)
    }

    /// The call ended without it: lost (`reason`), unless the final frame had come.
    pub(crate) fn lost(self, reason: impl Into<String>) -> CallEnd {
        if self.finished {
            return self.finish();
        }
        CallEnd::Lost {
            frames: self.frames,
            reason: reason.into(),
            never_started: None,
            protocol: None,
        }
    }

    /// The channel closed in order without the shim's header (the host sent
    /// `exit_status`): the shim never started.
    pub(crate) fn never_started(self, exit_status: Option<u32>) -> CallEnd {
        let never = NeverStarted::new(exit_status, &self.parser);
        CallEnd::Lost {
            frames: self.frames,
            reason: never.describe(),
            never_started: Some(never),
            protocol: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_host_said_never_carries_a_digest() {
        let fp = "ab".repeat(32);
        let said = format!("fish: Unknown command: 'run' 'op' '{fp}' at 0xdead");
        assert_eq!(
            without_digests(&said),
            "fish: Unknown command: 'run' 'op' '<hex>' at 0xdead"
        );
    }
}
