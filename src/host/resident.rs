//! One call of the shim through the host's resident shim (docs/host-protocol.md#the-resident-session):
//! the request goes to a resident channel the keeper holds open, and the reply is read
//! with the same parser, the same observer and the same ends as a call of its own
//! ([`super::CallEnd`]), up to the resident's end frame. Only sessions through the keeper
//! have one; `OPMARK_RESIDENT=0` in the caller's environment turns it off.

use crate::shim::{Reply, ReplyParser, Request, Verb};
use crate::ssh::keeper::client::CallRefused;
use crate::ssh::keeper::{ChannelSaid, ResidentShell, ResidentStart, StartAnswer};
use crate::ssh::{ExecEvent, Session};

use super::reply::{CallEnd, CallObserver, ReplyReader};

/// Whether this process may use resident shims (`OPMARK_RESIDENT=0` turns them off).
fn enabled() -> bool {
    std::env::var_os("OPMARK_RESIDENT").is_none_or(|v| v != "0")
}

/// `verb` through the host's resident shim; `None` when there is none to use (not
/// through the keeper, turned off, or the host's shim does not serve): nothing was sent,
/// and the caller calls per call.
pub(crate) async fn call(
    session: &Session,
    verb: &Verb<'_>,
    root: Option<&str>,
    stdin: Option<&[u8]>,
    observer: &mut dyn CallObserver,
) -> Option<CallEnd> {
    let remote = session.keeper_remote()?;
    if !enabled() {
        return None;
    }
    let request = Request::new(verb, stdin, root);
    let mut reply = match remote.call(request.bytes).await {
        Ok(reply) => reply,
        Err(CallRefused::NoResident(why)) => {
            tracing::debug!("no resident shim on this host's connection ({why}); calling per call");
            return None;
        }
        Err(CallRefused::NotSent(why)) => return Some(CallEnd::NotSent(why)),
        Err(CallRefused::Lost(why)) => return Some(CallEnd::lost_before_reply(why)),
    };
    if let Verb::Run(_) = verb {
        crate::fault::point("after_dispatch");
    }
    let mut read = ReplyReader::expecting(&request.token);
    loop {
        let event = reply.next().await;
        // As for a call of its own: a reply we cannot read is a lost one, and the
        // resident, out of step now, is closed (dropping the reply never releases it).
        if let Err(end) = read.feed(&event, observer) {
            return Some(end);
        }
        if let Some(status) = read.parser.end_status() {
            tracing::debug!("end of the request, status {status}");
            if read.finished() {
                if stale(read.frames()) {
                    // The resident lost its script and claimed nothing (it ends, and the
                    // keeper never hands it out again): per call, the script travels.
                    tracing::debug!("the resident shim lost its cached script; calling per call");
                    return None;
                }
                // The reply is whole: the channel may serve the next caller.
                if status == 0 {
                    reply.release().await;
                }
                return Some(read.finish());
            }
            return Some(read.lost(format!(
                "the host's resident shim ended the request (status {status}) before its final frame"
            )));
        }
        match event {
            ExecEvent::Closed => {
                return Some(
                    read.lost("the resident shim's channel closed before the shim's final frame"),
                )
            }
            ExecEvent::Lost(why) => return Some(read.lost(why)),
            _ => {}
        }
    }
}

/// The resident refused the request because the cached script it was started from is
/// gone (`cannot_start reason=resident_stale`): it claimed nothing, so calling per call
/// is safe.
fn stale(frames: &[crate::shim::Frame]) -> bool {
    frames.iter().any(|f| {
        matches!(f, crate::shim::Frame::Refused(r)
            if r.reason == crate::shim::RefusalReason::CannotStart
                && r.fields.get("reason").map(String::as_str) == Some("resident_stale"))
    })
}

/// The shim's `serve` verb as the keeper's [`ResidentShell`]: what it runs on a resident
/// channel, and how it tells a shim that serves from one that refuses or wants the script.
#[derive(Debug)]
pub struct ShimResident;

impl ResidentShell for ShimResident {
    fn start(&self, with_script: bool) -> Box<dyn ResidentStart> {
        let call = crate::shim::Invocation::serve(with_script);
        let parser = ReplyParser::expecting(&call.token);
        Box::new(ShimStart {
            call,
            parser,
            replies: Vec::new(),
        })
    }
}

/// One start of the resident shim: its call, and the parser of its channel.
struct ShimStart {
    call: crate::shim::Invocation,
    parser: ReplyParser,
    replies: Vec<Reply>,
}

impl ResidentStart for ShimStart {
    fn exec(&self) -> &str {
        &self.call.exec
    }

    fn data(&self) -> Vec<u8> {
        self.call.data.clone()
    }

    fn read(&mut self, said: ChannelSaid<'_>) -> Option<StartAnswer> {
        let pushed = match said {
            ChannelSaid::Stdout(b) => self.parser.push_stdout(b, &mut self.replies),
            ChannelSaid::Stderr(b) => self.parser.push_stderr(b, &mut self.replies),
            ChannelSaid::Closed => Ok(()),
        };
        if let Err(e) = pushed {
            // Another protocol version (an older shim) or a reply we cannot read.
            return Some(StartAnswer::Refused(e.to_string()));
        }
        for reply in self.replies.drain(..) {
            if let Reply::Frame(crate::shim::Frame::Refused(r)) = reply {
                return Some(StartAnswer::Refused(format!(
                    "the host's shim refuses to serve: {} {}",
                    r.reason,
                    r.fields.get("reason").cloned().unwrap_or_default()
                )));
            }
        }
        if let Some(pid) = self.parser.ready_pid() {
            return Some(StartAnswer::Ready(pid));
        }
        if !matches!(said, ChannelSaid::Closed) {
            return None;
        }
        if !self.parser.header_seen() && self.call.asked_for_script(&self.parser.preamble(4096).0) {
            return Some(StartAnswer::NeedScript);
        }
        Some(StartAnswer::Refused(
            "the shim ended without serving".into(),
        ))
    }
}
