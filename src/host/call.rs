//! One call of the host shim over an SSH session: send the verb, feed the replies to the
//! frame parser, hand output and frames to an observer as they arrive, and say how the
//! call ended (final frame, never sent, lost on the way, a reply that broke the protocol,
//! or a shim that never started). The only code that execs the shim.

use super::delivery;
use super::reply::{CallEnd, CallObserver, ReplyReader};
use crate::shim::{Frame, Invocation, Verb};
use crate::ssh::{Exec, ExecError, ExecEvent, Session};

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
    stdin: Option<&[u8]>,
    observer: &mut dyn CallObserver,
) -> CallEnd {
    // Through the keeper, the host's resident shim answers when it has one (one round
    // trip, no shim start); `None`: it has none, and the call goes per call.
    if let Some(end) = super::resident::call(session, verb, root, stdin, observer).await {
        return remembered(session, end);
    }
    if delivery::host_has_shim(session) {
        let cached = Invocation::cached_expecting(verb, stdin, root);
        match exchange(session, verb, cached, true, observer).await {
            Exchange::End(end) => return remembered(session, end),
            Exchange::NeedScript => {
                tracing::debug!("the host has no usable cached shim; sending it")
            }
        }
    }
    let call = Invocation::new_expecting(verb, stdin, root);
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
            Err(ExecError::Lost(why)) => break 'call CallEnd::lost_before_reply(why),
        };
        if let Verb::Run(_) = verb {
            crate::fault::point("after_dispatch");
        }
        let mut reply = ReplyReader::expecting(&call.token);
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
            // A reply we cannot read is as good as a lost one: the evidence must come from
            // a probe, never from a guess.
            if let Err(end) = reply.feed(&event, observer) {
                break 'call end;
            }
            if reply.finished() && exited {
                // The outcome is known and the shim is gone: nothing after this can change
                // it. Waiting for sshd's EOF and close costs a round trip (and, with sshd's
                // Nagle, a delayed-ACK stall), so the caller does not. The channel is
                // drained in the background instead of dropped: it keeps its place under
                // the connection's channel limit until sshd has closed it, so a pooled
                // connection never opens more channels than sshd's MaxSessions. A process
                // that exits now simply drops the task.
                drain_in_background(exec);
                break 'call reply.finish();
            }
            // The stub asked for the script and exited, having run nothing: no need to wait
            // for the close either (a process the login shell left holding the session's
            // pipes would hold it).
            let asked_for_script = |reply: &ReplyReader| {
                cached
                    && !reply.parser.header_seen()
                    && call.asked_for_script(&reply.parser.preamble(4096).0)
            };
            if exited && asked_for_script(&reply) {
                drain_in_background(exec);
                return Exchange::NeedScript;
            }
            match event {
                ExecEvent::Closed => {
                    break 'call if reply.finished() {
                        reply.finish()
                    } else if !reply.parser.header_seen() {
                        if asked_for_script(&reply) {
                            return Exchange::NeedScript;
                        }
                        // An orderly close delivers everything the host wrote; the shim writes
                        // its header before it touches anything (and stops if its output goes
                        // elsewhere), so no header means no claim.
                        reply.never_started(exit_status)
                    } else {
                        reply.lost("the channel closed before the shim's final frame")
                    };
                }
                ExecEvent::Lost(why) => break 'call reply.lost(why),
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
