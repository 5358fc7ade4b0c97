//! One exec channel: sending the command (never with a pty), feeding stdin, and turning
//! the channel's messages into events until the channel closes or the connection is lost.

use std::collections::VecDeque;
use std::sync::Arc;

use russh::{ChannelMsg, ChannelReadHalf, Sig};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;

use super::exec_event::{ExecError, ExecEvent};
use super::session::{settle_lost_reason, Carrier, ConnState, Session};

/// A running exec channel, on this process's connection or through the keeper.
/// Dropping it abandons the channel (the remote side sees the channel end like a client
/// that went away).
pub struct Exec {
    kind: ExecKind,
}

enum ExecKind {
    Direct(DirectExec),
    Keeper(super::keeper::client::RemoteExec),
}

/// An exec channel on this process's own connection.
pub(crate) struct DirectExec {
    read: ChannelReadHalf,
    pending: VecDeque<ChannelMsg>,
    shared: Arc<ConnState>,
    end: Option<ExecEvent>,
    writer: Option<JoinHandle<()>>,
    /// The channel's writing half, to close it when nobody reads it any more (`None`: a
    /// resident's channel, which its [`OpenInput`] closes when dropped).
    closer: Option<Arc<russh::ChannelWriteHalf<russh::client::Msg>>>,
    /// Keeps this channel counted against the connection's channel limit.
    _permit: OwnedSemaphorePermit,
    /// Keeps the connection alive while the channel is in use.
    _session: Session,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            ExecKind::Direct(d) => f.debug_struct("Exec").field("end", &d.end).finish(),
            ExecKind::Keeper(_) => f.debug_struct("Exec").field("via_keeper", &true).finish(),
        }
    }
}

impl Drop for DirectExec {
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            w.abort();
        }
    }
}

impl Session {
    /// Opens a channel and sends `command` as an exec request (no pty, ever), then feeds
    /// `stdin` followed by EOF (EOF at once when `None`, so readers of stdin do not hang).
    /// The data follows the request at once, without waiting for the host's answer (sshd
    /// holds it until the command starts, and drops it if the request is refused): a
    /// command reading its input costs no extra round trip.
    ///
    /// Returns once the host accepted the request. `NotSent` means nothing can run;
    /// `Lost` means the request left and the answer did not come back.
    pub async fn exec(&self, command: &str, stdin: Option<Vec<u8>>) -> Result<Exec, ExecError> {
        // The caller's side, the same lines whichever way the connection goes (`-v`).
        let via = if self.via_keeper() {
            "through the keeper"
        } else {
            "direct"
        };
        tracing::debug!(
            "exec on {} ({via}): {} bytes of request, {} of stdin",
            self.destination().display(),
            command.len(),
            stdin.as_ref().map_or(0, Vec::len)
        );
        let started = self.exec_any(command, stdin).await;
        match &started {
            Ok(_) => tracing::debug!("the host accepted the exec request"),
            Err(e) => tracing::info!("exec on {} ({via}): {e:?}", self.destination().display()),
        }
        started
    }

    async fn exec_any(&self, command: &str, stdin: Option<Vec<u8>>) -> Result<Exec, ExecError> {
        let inner = match &self.kind {
            Carrier::Direct(inner) => inner,
            Carrier::Keeper(remote) => {
                return Ok(Exec {
                    kind: ExecKind::Keeper(remote.exec(command, stdin).await?),
                })
            }
        };
        let permit = inner
            .channels
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ExecError::NotSent("the session is shutting down".into()))?;
        self.exec_permitted(permit, command, stdin).await
    }

    /// A free place under this connection's channel limit, without waiting (the keeper
    /// opens another connection rather than queue behind sshd's `MaxSessions`).
    pub(crate) fn try_channel(&self) -> Option<OwnedSemaphorePermit> {
        match &self.kind {
            Carrier::Direct(inner) => inner.channels.clone().try_acquire_owned().ok(),
            Carrier::Keeper(_) => None,
        }
    }

    /// Waits for a place under this connection's channel limit.
    pub(crate) async fn wait_channel(&self) -> Option<OwnedSemaphorePermit> {
        match &self.kind {
            Carrier::Direct(inner) => inner.channels.clone().acquire_owned().await.ok(),
            Carrier::Keeper(_) => None,
        }
    }

    /// [`Session::exec`] on this process's connection, the place under the channel
    /// limit already taken.
    pub(crate) async fn exec_permitted(
        &self,
        permit: OwnedSemaphorePermit,
        command: &str,
        stdin: Option<Vec<u8>>,
    ) -> Result<Exec, ExecError> {
        let Carrier::Direct(inner) = &self.kind else {
            return Err(ExecError::NotSent(
                "a keeper session has no local channel limit".into(),
            ));
        };
        if self.is_closed() {
            return Err(ExecError::NotSent(format!(
                "the connection is closed: {}",
                self.lost_reason().unwrap_or_else(|| "ended".into())
            )));
        }
        let channel = tokio::time::timeout(
            inner.dest.connect_timeout,
            inner.handle.channel_open_session(),
        )
        .await
        .map_err(|_| ExecError::NotSent("opening a channel timed out".into()))?
        .map_err(|e| ExecError::NotSent(format!("opening a channel failed: {e}")))?;
        let (mut read, write) = channel.split();
        // An error here means the request never reached the connection's event loop.
        write
            .exec(true, command)
            .await
            .map_err(|e| ExecError::NotSent(format!("sending the exec request failed: {e}")))?;

        let write = Arc::new(write);
        let closer = write.clone();
        let writer = tokio::spawn(async move {
            if let Some(bytes) = stdin {
                // Owned bytes go out in packets of the host's maximum size (32 KiB from
                // sshd); `data` copies through an 8 KiB buffer, four times the packets
                // for sshd to take apart, and put 100 MB through at half OpenSSH's rate.
                if let Err(e) = write.data_bytes(bytes).await {
                    tracing::debug!("stdin not fully sent: {e}");
                    return;
                }
            }
            if let Err(e) = write.eof().await {
                tracing::debug!("stdin EOF not sent: {e}");
            }
        });

        // The request has left. Wait for the host's answer: a refusal means nothing ran.
        let mut pending = VecDeque::new();
        loop {
            match read.wait().await {
                Some(ChannelMsg::Success) => break,
                Some(ChannelMsg::Failure) => {
                    writer.abort();
                    return Err(ExecError::NotSent(
                        "the host refused the exec request (nothing ran)".into(),
                    ));
                }
                Some(ChannelMsg::WindowAdjusted { .. }) => {}
                Some(other) => pending.push_back(other),
                None => {
                    writer.abort();
                    let why = settle_lost_reason(&inner.shared)
                        .await
                        .unwrap_or_else(|| "the channel ended before the host answered".into());
                    return Err(ExecError::Lost(why));
                }
            }
        }

        Ok(Exec {
            kind: ExecKind::Direct(DirectExec {
                read,
                pending,
                shared: inner.shared.clone(),
                end: None,
                writer: Some(writer),
                closer: Some(closer),
                _permit: permit,
                _session: self.clone(),
            }),
        })
    }
}

/// The input side of a channel that stays open (a resident host session): each `send`
/// is written to the channel in order; dropping it sends EOF and closes the channel, so
/// the host side reads its end of input and exits.
#[derive(Debug)]
pub struct OpenInput {
    tx: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
}

impl OpenInput {
    /// Queues `bytes` for the channel; `false` when the channel's writer is gone (the
    /// channel or the connection ended).
    pub fn send(&self, bytes: Vec<u8>) -> bool {
        self.tx.send(bytes).is_ok()
    }
}

impl Session {
    /// [`Session::exec_permitted`] for a channel that stays open: `data` follows the
    /// request at once, then no EOF; more is sent through the returned [`OpenInput`],
    /// whose drop ends the input and closes the channel.
    pub(crate) async fn exec_open(
        &self,
        permit: OwnedSemaphorePermit,
        command: &str,
        data: Vec<u8>,
    ) -> Result<(Exec, OpenInput), ExecError> {
        let Carrier::Direct(inner) = &self.kind else {
            return Err(ExecError::NotSent(
                "a keeper session has no local channel limit".into(),
            ));
        };
        if self.is_closed() {
            return Err(ExecError::NotSent("the connection is closed".into()));
        }
        let channel = tokio::time::timeout(
            inner.dest.connect_timeout,
            inner.handle.channel_open_session(),
        )
        .await
        .map_err(|_| ExecError::NotSent("opening a channel timed out".into()))?
        .map_err(|e| ExecError::NotSent(format!("opening a channel failed: {e}")))?;
        let (mut read, write) = channel.split();
        write
            .exec(true, command)
            .await
            .map_err(|e| ExecError::NotSent(format!("sending the exec request failed: {e}")))?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let _ = tx.send(data);
        // Not aborted with the channel's reader: it ends by itself once the input is
        // dropped, after EOF and close, so the host side never waits on a dead channel.
        tokio::spawn(async move {
            while let Some(bytes) = rx.recv().await {
                if bytes.is_empty() {
                    continue;
                }
                if let Err(e) = write.data_bytes(bytes).await {
                    tracing::debug!("resident input not fully sent: {e}");
                    return;
                }
            }
            let _ = write.eof().await;
            let _ = write.close().await;
        });
        let mut pending = VecDeque::new();
        loop {
            match read.wait().await {
                Some(ChannelMsg::Success) => break,
                Some(ChannelMsg::Failure) => {
                    return Err(ExecError::NotSent(
                        "the host refused the exec request (nothing ran)".into(),
                    ));
                }
                Some(ChannelMsg::WindowAdjusted { .. }) => {}
                Some(other) => pending.push_back(other),
                None => {
                    let why = settle_lost_reason(&inner.shared)
                        .await
                        .unwrap_or_else(|| "the channel ended before the host answered".into());
                    return Err(ExecError::Lost(why));
                }
            }
        }
        Ok((
            Exec {
                kind: ExecKind::Direct(DirectExec {
                    read,
                    pending,
                    shared: inner.shared.clone(),
                    end: None,
                    writer: None,
                    closer: None,
                    _permit: permit,
                    _session: self.clone(),
                }),
            },
            OpenInput { tx },
        ))
    }
}

impl Session {
    /// The keeper's side of this session, when it goes through the keeper: the host's
    /// resident shim is reached through it.
    pub(crate) fn keeper_remote(&self) -> Option<&Arc<super::keeper::client::Remote>> {
        match &self.kind {
            Carrier::Keeper(remote) => Some(remote),
            Carrier::Direct(_) => None,
        }
    }
}

impl Exec {
    /// An event that is already there, without waiting (`None`: nothing yet). An idle
    /// resident channel must have none: anything on it means it is not in step.
    pub(crate) async fn ready_event(&mut self) -> Option<ExecEvent> {
        tokio::time::timeout(std::time::Duration::ZERO, self.next())
            .await
            .ok()
    }

    /// Closes the channel from this side, for a reply nobody will read (its caller
    /// left): stdin stops, and sshd stops reading the host process's output, which ends
    /// as on a lost connection instead of sending the rest of its output to be thrown
    /// away. [`Exec::next`] still gives `Closed` once sshd has let go of the channel.
    pub(crate) async fn close(&mut self) {
        let ExecKind::Direct(d) = &mut self.kind else {
            return;
        };
        if d.end.is_some() {
            return;
        }
        if let Some(w) = d.writer.take() {
            w.abort();
        }
        if let Some(closer) = &d.closer {
            let _ = closer.close().await;
        }
    }

    /// The next event. Keeps reading after the exit status until the channel closes:
    /// the order of exit status and EOF varies, and output can follow either (docs/findings.md#russh-exit-status-and-eof).
    pub async fn next(&mut self) -> ExecEvent {
        let event = match &mut self.kind {
            ExecKind::Direct(d) => d.next().await,
            ExecKind::Keeper(k) => k.next().await,
        };
        match &event {
            ExecEvent::Stdout(b) => tracing::trace!("frame: {} bytes of stdout", b.len()),
            ExecEvent::Stderr(b) => tracing::trace!("frame: {} bytes of stderr", b.len()),
            ExecEvent::ExitStatus(status) => tracing::debug!("exit status {status}"),
            ExecEvent::ExitSignal { signal, .. } => tracing::debug!("exit signal {signal}"),
            ExecEvent::Closed => tracing::debug!("channel closed"),
            ExecEvent::Lost(why) => tracing::info!("connection lost: {why}"),
        }
        event
    }
}

impl DirectExec {
    async fn next(&mut self) -> ExecEvent {
        loop {
            if let Some(end) = &self.end {
                return end.clone();
            }
            let msg = match self.pending.pop_front() {
                Some(m) => Some(m),
                None => self.read.wait().await,
            };
            match msg {
                Some(ChannelMsg::Data { data }) => return ExecEvent::Stdout(data.to_vec()),
                Some(ChannelMsg::ExtendedData { data, .. }) => {
                    return ExecEvent::Stderr(data.to_vec())
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => {
                    return ExecEvent::ExitStatus(exit_status)
                }
                Some(ChannelMsg::ExitSignal {
                    signal_name,
                    core_dumped,
                    error_message,
                    ..
                }) => {
                    return ExecEvent::ExitSignal {
                        signal: signal_name_of(&signal_name),
                        core_dumped,
                        message: error_message,
                    }
                }
                Some(ChannelMsg::Close) => self.end = Some(ExecEvent::Closed),
                Some(_) => {}
                None => {
                    let why = settle_lost_reason(&self.shared).await.unwrap_or_else(|| {
                        "the connection ended without closing the channel".into()
                    });
                    self.end = Some(ExecEvent::Lost(why));
                }
            }
        }
    }
}

fn signal_name_of(sig: &Sig) -> String {
    match sig {
        Sig::ABRT => "ABRT",
        Sig::ALRM => "ALRM",
        Sig::FPE => "FPE",
        Sig::HUP => "HUP",
        Sig::ILL => "ILL",
        Sig::INT => "INT",
        Sig::KILL => "KILL",
        Sig::PIPE => "PIPE",
        Sig::QUIT => "QUIT",
        Sig::SEGV => "SEGV",
        Sig::TERM => "TERM",
        Sig::USR1 => "USR1",
        Sig::Custom(name) => name,
    }
    .to_string()
}
