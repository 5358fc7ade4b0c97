//! One call of the host shim over an SSH session: send the verb, feed the replies to the
//! frame parser, hand output and frames to an observer as they arrive, and say how the
//! call ended (final frame, never sent, or lost on the way).

use crate::shim::{self, Frame, Reply, ReplyParser, Verb};
use crate::ssh::{ExecError, ExecEvent, Session};

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
        /// Whether the shim's header arrived (the shim itself started).
        shim_started: bool,
        /// What the transport said.
        reason: String,
    },
}

/// Runs `verb` through the shim on `session`, streaming to `observer`.
pub async fn call_shim(
    session: &Session,
    verb: &Verb<'_>,
    stdin: Option<Vec<u8>>,
    observer: &mut dyn CallObserver,
) -> CallEnd {
    let command = shim::remote_command(verb);
    let mut exec = match session.exec(&command, stdin).await {
        Ok(exec) => exec,
        Err(ExecError::NotSent(why)) => return CallEnd::NotSent(why),
        Err(ExecError::Lost(why)) => {
            return CallEnd::Lost {
                frames: Vec::new(),
                shim_started: false,
                reason: why,
            }
        }
    };
    if let Verb::Run(_) = verb {
        super::fault_point("after_dispatch");
    }
    let mut parser = ReplyParser::new();
    let mut frames = Vec::new();
    let mut replies = Vec::new();
    let mut finished = false;
    loop {
        let event = exec.next().await;
        let pushed = match &event {
            ExecEvent::Stdout(b) => parser.push_stdout(b, &mut replies),
            ExecEvent::Stderr(b) => parser.push_stderr(b, &mut replies),
            _ => Ok(()),
        };
        if let Err(e) = pushed {
            // A reply we cannot read is as good as a lost one: the evidence must come from
            // a probe, never from a guess.
            return CallEnd::Lost {
                frames,
                shim_started: parser.shim_started(),
                reason: e.to_string(),
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
        match event {
            ExecEvent::Closed => {
                return if finished {
                    CallEnd::Finished(frames)
                } else {
                    CallEnd::Lost {
                        frames,
                        shim_started: parser.shim_started(),
                        reason: "the channel closed before the shim's final frame".into(),
                    }
                };
            }
            ExecEvent::Lost(why) => {
                return if finished {
                    CallEnd::Finished(frames)
                } else {
                    CallEnd::Lost {
                        frames,
                        shim_started: parser.shim_started(),
                        reason: why,
                    }
                };
            }
            _ => {}
        }
    }
}

/// An observer that keeps frames only (probe, fence, gc, doctor).
#[derive(Debug, Default)]
pub struct FramesOnly;

impl CallObserver for FramesOnly {
    fn stdout(&mut self, _: &[u8]) {}
    fn stderr(&mut self, _: &[u8]) {}
    fn frame(&mut self, _: &Frame) {}
}
