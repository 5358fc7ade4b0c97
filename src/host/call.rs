//! One call of the host shim over an SSH session: send the verb, feed the replies to the
//! frame parser, hand output and frames to an observer as they arrive, and say how the
//! call ended (final frame, never sent, lost on the way, a reply that broke the protocol,
//! or a shim that never started). The only code that execs the shim.

use super::delivery;
use crate::shim::{Frame, Invocation, ProtocolError, Reply, ReplyParser, Verb};
use crate::ssh::{Exec, ExecError, ExecEvent, Session};

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

/// Runs `verb` through the shim on `session`, streaming to `observer`.
///
/// To a host this client has seen run its shim ([`delivery`]), the first try runs the
/// host's cached copy, so the common call sends no script. A host without a good copy
/// answers that it needs the script, having run nothing (not even the shim: no claim, no
/// frame), and the call is made again with the script, which the host then keeps: one
/// more exchange (a host that lost or damaged its copy, or has neither `sha256sum` nor
/// `shasum` to check one). To a host not seen yet, the script goes in the first call's
/// data: no extra exchange on the first call to a host.
///
/// `root`: the marker root id the operation's attempts reached (docs/guarantees.md#evidence-identity), when known: the
/// shim refuses (`root_changed`) before acting when its root's is another.
pub async fn call_shim(
    session: &Session,
    verb: &Verb<'_>,
    root: Option<&str>,
    stdin: Option<Vec<u8>>,
    observer: &mut dyn CallObserver,
) -> CallEnd {
    // Through the keeper, the host's resident shim answers when it has one (one round
    // trip, no shim start); `None`: it has none, and the call goes per call.
    if let Some(end) = super::resident::call(session, verb, root, stdin.as_deref(), observer).await
    {
        return remembered(session, end);
    }
    if delivery::host_has_shim(session) {
        let cached = Invocation::cached_expecting(verb, stdin.as_deref(), root);
        match exchange(session, verb, cached, true, observer).await {
            Exchange::End(end) => return remembered(session, end),
            Exchange::NeedScript => {
                tracing::debug!("the host has no usable cached shim; sending it")
            }
        }
    }
    let call = Invocation::new_expecting(verb, stdin.as_deref(), root);
    drop(stdin);
    match exchange(session, verb, call, false, observer).await {
        Exchange::End(end) => remembered(session, end),
        Exchange::NeedScript => unreachable!("only a cached call can ask for the script"),
    }
}

/// `end`, after noting that the host has the shim when it ran there (it gave frames).
fn remembered(session: &Session, end: CallEnd) -> CallEnd {
    match &end {
        CallEnd::Finished(frames) | CallEnd::Lost { frames, .. } if !frames.is_empty() => {
            delivery::remember(session)
        }
        _ => {}
    }
    end
}

/// How one exchange with the stub ended.
enum Exchange {
    End(CallEnd),
    /// The stub found no good cached shim and ran nothing.
    NeedScript,
}

/// One exec of the stub; `cached` when the data does not carry the script.
async fn exchange(
    session: &Session,
    verb: &Verb<'_>,
    mut call: Invocation,
    cached: bool,
    observer: &mut dyn CallObserver,
) -> Exchange {
    let data = std::mem::take(&mut call.data);
    let end = 'call: {
        let mut exec = match session.exec(&call.exec, Some(data)).await {
            Ok(exec) => exec,
            Err(ExecError::NotSent(why)) => break 'call CallEnd::NotSent(why),
            Err(ExecError::Lost(why)) => {
                break 'call CallEnd::Lost {
                    frames: Vec::new(),
                    reason: why,
                    never_started: None,
                    protocol: None,
                }
            }
        };
        if let Verb::Run(_) = verb {
            crate::fault::point("after_dispatch");
        }
        let mut parser = ReplyParser::expecting(&call.token);
        let mut frames = Vec::new();
        let mut replies = Vec::new();
        let mut finished = false;
        let mut exit_status = None;
        let mut exited = false;
        loop {
            let event = exec.next().await;
            match &event {
                ExecEvent::ExitStatus(s) => exit_status = Some(*s),
                ExecEvent::ExitSignal { .. } => exited = true,
                _ => {}
            }
            exited |= exit_status.is_some();
            let pushed = match &event {
                ExecEvent::Stdout(b) => parser.push_stdout(b, &mut replies),
                ExecEvent::Stderr(b) => parser.push_stderr(b, &mut replies),
                _ => Ok(()),
            };
            if let Err(e) = pushed {
                // A reply we cannot read is as good as a lost one: the evidence must come from
                // a probe, never from a guess.
                break 'call CallEnd::Lost {
                    frames,
                    reason: e.to_string(),
                    never_started: None,
                    protocol: Some(e),
                };
            }
            for reply in replies.drain(..) {
                match reply {
                    Reply::Stdout(b) => observer.stdout(&b),
                    Reply::Stderr(b) => observer.stderr(&b),
                    Reply::Frame(f) => {
                        observer.frame(&f);
                        finished |= f.is_final();
                        frames.push(f);
                    }
                }
            }
            if finished && exited {
                // The outcome is known and the shim is gone: nothing after this can change
                // it. Waiting for sshd's EOF and close costs a round trip (and, with sshd's
                // Nagle, a delayed-ACK stall), so the caller does not. The channel is
                // drained in the background instead of dropped: it keeps its place under
                // the connection's channel limit until sshd has closed it, so a pooled
                // connection never opens more channels than sshd's MaxSessions. A process
                // that exits now simply drops the task.
                drain_in_background(exec);
                break 'call CallEnd::Finished(frames);
            }
            // The stub asked for the script and exited, having run nothing: no need to wait
            // for the close either (a process the login shell left holding the session's
            // pipes would hold it).
            if cached
                && exited
                && !parser.header_seen()
                && call.asked_for_script(&parser.preamble(4096).0)
            {
                drain_in_background(exec);
                return Exchange::NeedScript;
            }
            match event {
                ExecEvent::Closed => {
                    break 'call if finished {
                        CallEnd::Finished(frames)
                    } else if !parser.header_seen() {
                        if cached && call.asked_for_script(&parser.preamble(4096).0) {
                            return Exchange::NeedScript;
                        }
                        // An orderly close delivers everything the host wrote; the shim writes
                        // its header before it touches anything (and stops if its output goes
                        // elsewhere), so no header means no claim.
                        let never = NeverStarted::new(exit_status, &parser);
                        CallEnd::Lost {
                            frames,
                            reason: never.describe(),
                            never_started: Some(never),
                            protocol: None,
                        }
                    } else {
                        CallEnd::Lost {
                            frames,
                            reason: "the channel closed before the shim's final frame".into(),
                            never_started: None,
                            protocol: None,
                        }
                    };
                }
                ExecEvent::Lost(why) => {
                    break 'call if finished {
                        CallEnd::Finished(frames)
                    } else {
                        CallEnd::Lost {
                            frames,
                            reason: why,
                            never_started: None,
                            protocol: None,
                        }
                    };
                }
                _ => {}
            }
        }
    };
    Exchange::End(end)
}

/// Reads a channel whose outcome is known until sshd closes it, without anyone waiting:
/// it keeps its place under the connection's channel limit until then. A process that
/// exits first simply drops the task.
fn drain_in_background(mut exec: Exec) {
    tokio::spawn(async move {
        while !matches!(exec.next().await, ExecEvent::Closed | ExecEvent::Lost(_)) {}
    });
}

/// An observer that keeps frames only (probe, fence, gc, doctor).
#[derive(Debug, Default)]
pub struct FramesOnly;

impl CallObserver for FramesOnly {
    fn stdout(&mut self, _: &[u8]) {}
    fn stderr(&mut self, _: &[u8]) {}
    fn frame(&mut self, _: &Frame) {}
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
