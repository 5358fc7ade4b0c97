//! The calling side: reach the keeper (starting it when there is none, replacing a stale
//! socket before anything is sent), and sessions and exec channels that live on the
//! keeper's connections.
//!
//! Boundaries stay honest: everything up to the keeper's answer to `Hello` is "nothing
//! sent" and a dead keeper found there is replaced silently; the keeper sends an exec
//! request only after it has the caller's whole `Exec` message and stdin, so a write that
//! fails means nothing left; once that write succeeded, a keeper that vanishes before
//! answering is a connection lost after dispatch (the run path then probes).

use std::sync::Mutex;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::wire::{self, FrameReader, KeeperFrame, KeeperReply, KeeperRequest};
use super::{connection_key, own_uid, persist, short_path, KeeperDir};
use crate::ssh::destination::Destination;
use crate::ssh::error::ConnectError;
use crate::ssh::exec_event::{ExecError, ExecEvent};

/// How long a caller waits for a keeper it started to listen.
const START_WAIT: Duration = Duration::from_secs(5);
/// How long a keeper has to answer `Hello` before it counts as hung.
const HELLO_WAIT: Duration = Duration::from_secs(3);

/// The environment a keeper keeps from the caller that starts it: paths for
/// `ProxyCommand` and `~`, the locale, and where the user's files are. Every destination
/// arrives fully resolved (agent socket included), so nothing else is needed.
const KEEPER_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
];

/// Why the keeper cannot be used; the caller connects directly instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// How reaching a connection through the keeper failed.
#[derive(Debug)]
pub enum KeeperError {
    /// No usable keeper (bad directory, cannot start): connect directly.
    Unavailable(Unavailable),
    /// The keeper tried and the host could not be reached or refused us: nothing sent.
    Connect(ConnectError),
}

/// One conversation with the keeper.
pub(crate) struct KeeperLink {
    stream: UnixStream,
    reader: FrameReader,
    /// The keeper's pid, from its `Hello`.
    pub(crate) pid: u32,
    /// The longest silence allowed once a request is made: the destination's keepalive
    /// budget, as on a direct connection (the keeper says [`KeeperReply::Alive`] meanwhile).
    /// `None`: no deadline (keepalives off, or a control request).
    budget: Option<Duration>,
}

impl KeeperLink {
    /// Sends frames in one write.
    pub(crate) async fn send(&mut self, frames: &[KeeperFrame]) -> std::io::Result<()> {
        let mut buf = Vec::new();
        for f in frames {
            buf.extend_from_slice(&f.encode());
        }
        self.stream.write_all(&buf).await
    }

    /// Sends `request` with `stdin` after it and its end, in one write.
    pub(crate) async fn send_with_stdin(
        &mut self,
        request: &KeeperFrame,
        stdin: &[u8],
    ) -> std::io::Result<()> {
        let mut buf = Vec::new();
        KeeperFrame::encode_with_stdin(request, stdin, &mut buf);
        self.stream.write_all(&buf).await
    }

    /// The next frame, heartbeats skipped; `Err` when the keeper went away, spoke
    /// nonsense, or said nothing for the whole budget (stopped, hung): a keeper that stops
    /// answering is a lost connection like any other (docs/trust.md#the-keeper).
    pub(crate) async fn recv(&mut self) -> Result<KeeperFrame, String> {
        loop {
            let frame = match self.budget {
                Some(budget) => tokio::time::timeout(budget, self.next_frame())
                    .await
                    .map_err(|_| {
                        format!(
                            "the connection keeper (pid {}) did not answer for {} ms (stopped or hung; the keepalive budget of this destination)",
                            self.pid,
                            budget.as_millis()
                        )
                    })??,
                None => self.next_frame().await?,
            };
            if is_alive(&frame) {
                tracing::trace!("keeper (pid {}) is alive", self.pid);
                continue;
            }
            return Ok(frame);
        }
    }

    /// The next frame as it comes (cancel-safe: a read cut short consumed nothing).
    async fn next_frame(&mut self) -> Result<KeeperFrame, String> {
        loop {
            match self.reader.next_frame() {
                Ok(Some(f)) => return Ok(f),
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
            // Output frames are the host's packets (32 KiB from sshd): a few per read.
            match self.reader.fill(&mut self.stream, 64 * 1024).await {
                Ok(0) => return Err("the keeper closed the socket".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("reading the keeper's socket: {e}")),
            }
        }
    }

    /// The next control message.
    pub(crate) async fn reply(&mut self) -> Result<KeeperReply, String> {
        self.recv().await?.parse().map_err(|e| e.to_string())
    }
}

/// Is `frame` the keeper's heartbeat?
fn is_alive(frame: &KeeperFrame) -> bool {
    matches!(frame, KeeperFrame::Json(b) if b.len() < 64)
        && frame.parse::<KeeperReply>() == Ok(KeeperReply::Alive)
}

/// What trying the socket found.
enum Try {
    Ready(KeeperLink),
    /// No keeper listens (no socket, refused, or it closed before answering `Hello`).
    Stale(String),
}

/// A conversation with this user's keeper, starting one when none answers.
pub(crate) async fn open_link(
    place: &KeeperDir,
    persist: Duration,
) -> Result<KeeperLink, Unavailable> {
    match try_link(place).await? {
        Try::Ready(link) => return Ok(link),
        Try::Stale(why) => tracing::debug!("no keeper answers ({why}); starting one"),
    }
    spawn_keeper(place, persist)?;
    let deadline = tokio::time::Instant::now() + START_WAIT;
    let mut last;
    loop {
        match try_link(place).await? {
            Try::Ready(link) => return Ok(link),
            Try::Stale(why) => last = why,
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Unavailable(format!(
                "the connection keeper did not start within {} s ({last})",
                START_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Connects to the socket and says hello, checking who listens.
async fn try_link(place: &KeeperDir) -> Result<Try, Unavailable> {
    if !place.check_socket().map_err(Unavailable)? {
        return Ok(Try::Stale("no socket".into()));
    }
    let mut holder = None;
    let path = short_path(&place.dir, &super::socket_name(), &mut holder)
        .map_err(|e| Unavailable(format!("cannot open {}: {e}", place.dir.display())))?;
    let stream = match UnixStream::connect(&path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::ConnectionRefused
                    // A listener being torn down (a keeper on its way out) resets.
                    | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            return Ok(Try::Stale(format!("stale socket: {e}")))
        }
        Err(e) => {
            return Err(Unavailable(format!(
                "cannot reach the keeper at {}: {e}",
                place.socket().display()
            )))
        }
    };
    drop(holder);
    let me = own_uid().map_err(|e| Unavailable(format!("cannot tell this process's uid: {e}")))?;
    let peer = stream
        .peer_cred()
        .map_err(|e| Unavailable(format!("cannot check who serves the keeper socket: {e}")))?;
    if peer.uid() != me {
        return Err(Unavailable(format!(
            "the keeper socket {} is served by uid {}, not by you (uid {me}); refusing it",
            place.socket().display(),
            peer.uid()
        )));
    }
    let mut link = KeeperLink {
        stream,
        reader: FrameReader::default(),
        pid: 0,
        budget: None,
    };
    let hello = async {
        link.send(&[KeeperFrame::json(&KeeperRequest::Hello {
            version: wire::VERSION,
        })])
        .await
        .map_err(|e| e.to_string())?;
        link.reply().await
    };
    match tokio::time::timeout(HELLO_WAIT, hello).await {
        Ok(Ok(KeeperReply::Hello { version, pid })) if version == wire::VERSION => {
            link.pid = pid;
            Ok(Try::Ready(link))
        }
        Ok(Ok(KeeperReply::Refused { message })) => Err(Unavailable(message)),
        Ok(Ok(other)) => Err(Unavailable(format!(
            "the keeper answered hello with {other:?}"
        ))),
        // A keeper on its way out closes without answering: start another.
        Ok(Err(why)) => Ok(Try::Stale(why)),
        Err(_) => Err(Unavailable(format!(
            "the keeper did not answer within {} s",
            HELLO_WAIT.as_secs()
        ))),
    }
}

/// Starts `opmark keeper serve` detached: its own process group (a terminal's Ctrl-C is not
/// for it), no inherited stdio (it must not hold a caller's pipes open), cwd `/`.
fn spawn_keeper(place: &KeeperDir, persist: Duration) -> Result<(), Unavailable> {
    let exe = std::env::current_exe().map_err(|e| {
        Unavailable(format!(
            "cannot find the opmark binary to start the keeper: {e}"
        ))
    })?;
    use std::os::unix::process::CommandExt as _;
    let mut cmd = std::process::Command::new(exe);
    // Only what connecting needs: a caller's other variables (tokens, anything) have no
    // business living on in a background process.
    cmd.env_clear();
    for (k, v) in std::env::vars_os() {
        if KEEPER_ENV.iter().any(|keep| k == *keep) {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .arg("keeper")
        .arg("serve")
        .arg("--persist")
        .arg(format!("{}ms", persist.as_millis()))
        .arg("--dir")
        .arg(&place.dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .current_dir("/")
        .process_group(0)
        .spawn()
        .map_err(|e| Unavailable(format!("cannot start the connection keeper: {e}")))?;
    // Reap it if this process outlives it (a long-lived `opmark mcp`).
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// A session on a connection the keeper holds for this caller's destination.
pub struct Remote {
    place: KeeperDir,
    dest: Destination,
    key: String,
    host_key: Option<String>,
    /// Set when a conversation on it broke: the pool then asks the keeper again (and
    /// starts a new one if it is gone).
    lost: Mutex<Option<String>>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("dest", &self.dest.display())
            .finish()
    }
}

impl Remote {
    /// Asks the keeper for a connection to `dest` (it connects, checks the host key and
    /// authenticates with the caller's resolved settings when it holds none).
    pub async fn connect(dest: &Destination) -> Result<Remote, KeeperError> {
        let persist = persist().unwrap_or(super::DEFAULT_PERSIST);
        let place =
            KeeperDir::open_default().map_err(|e| KeeperError::Unavailable(Unavailable(e)))?;
        let mut link = open_link(&place, persist)
            .await
            .map_err(KeeperError::Unavailable)?;
        let key = connection_key(dest);
        let pid = link.pid;
        link.budget = dest.loss_budget();
        tracing::info!(
            "connecting to {} through the connection keeper (pid {pid})",
            dest.display()
        );
        // Nothing was sent to the host yet: a keeper that vanishes or stops answering
        // here only costs the reuse, and the caller connects directly.
        let lost_keeper = |why: String| {
            KeeperError::Unavailable(Unavailable(format!(
                "the connection keeper (pid {}) failed while connecting to {}: {why}",
                pid,
                dest.display()
            )))
        };
        link.send(&[KeeperFrame::json(&KeeperRequest::Connect {
            key: key.clone(),
            dest: Box::new(dest.clone()),
        })])
        .await
        .map_err(|e| lost_keeper(e.to_string()))?;
        match link.reply().await {
            Ok(KeeperReply::Connected { host_key }) => {
                tracing::info!(
                    "connected to {} through the keeper (pid {pid}), host key {}",
                    dest.display(),
                    host_key.as_deref().unwrap_or("unknown")
                );
                Ok(Remote {
                    place,
                    dest: dest.clone(),
                    key,
                    host_key,
                    lost: Mutex::new(None),
                })
            }
            Ok(KeeperReply::ConnectFailed { stage, message }) => {
                tracing::info!(
                    "the keeper could not connect to {} ({stage}): {message}",
                    dest.display()
                );
                Err(KeeperError::Connect(wire::connect_error(&stage, message)))
            }
            Ok(other) => Err(lost_keeper(format!("unexpected answer {other:?}"))),
            Err(why) => Err(lost_keeper(why)),
        }
    }

    pub(crate) fn destination(&self) -> &Destination {
        &self.dest
    }

    pub(crate) fn host_key(&self) -> Option<String> {
        self.host_key.clone()
    }

    pub(crate) fn lost_reason(&self) -> Option<String> {
        self.lost.lock().ok().and_then(|g| g.clone())
    }

    fn mark_lost(&self, why: &str) {
        if let Ok(mut slot) = self.lost.lock() {
            slot.get_or_insert_with(|| why.to_string());
        }
    }

    /// Opens an exec channel through the keeper; see the module header for what each
    /// failure means.
    pub(crate) async fn exec(
        self: &std::sync::Arc<Self>,
        command: &str,
        stdin: Option<Vec<u8>>,
    ) -> Result<RemoteExec, ExecError> {
        let persist = persist().unwrap_or(super::DEFAULT_PERSIST);
        let mut link = open_link(&self.place, persist).await.map_err(|e| {
            self.mark_lost(&e.0);
            ExecError::NotSent(format!("the connection keeper is unavailable: {}", e.0))
        })?;
        link.budget = self.dest.loss_budget();
        tracing::debug!("exec request to the connection keeper (pid {})", link.pid);
        let request = KeeperFrame::json(&KeeperRequest::Exec {
            key: self.key.clone(),
            dest: Box::new(self.dest.clone()),
            host_key: self.host_key.clone(),
            command: command.to_string(),
        });
        if let Err(e) = link
            .send_with_stdin(&request, stdin.as_deref().unwrap_or_default())
            .await
        {
            let why = format!("the connection keeper (pid {}) went away: {e}", link.pid);
            self.mark_lost(&why);
            return Err(ExecError::NotSent(why));
        }
        match link.reply().await {
            Ok(KeeperReply::ExecStarted) => Ok(RemoteExec {
                link,
                remote: self.clone(),
                end: None,
            }),
            Ok(KeeperReply::ExecNotSent { message }) => Err(ExecError::NotSent(message)),
            Ok(KeeperReply::ExecLost { message }) => {
                self.mark_lost(&message);
                Err(ExecError::Lost(message))
            }
            Ok(other) => {
                let why = format!("the keeper answered the exec request with {other:?}");
                self.mark_lost(&why);
                Err(ExecError::Lost(why))
            }
            Err(e) => {
                let why = format!(
                    "the connection keeper (pid {}) went away after taking the exec request: {e}",
                    link.pid
                );
                self.mark_lost(&why);
                Err(ExecError::Lost(why))
            }
        }
    }
}

/// Why a resident call was not made.
#[derive(Debug)]
pub enum CallRefused {
    /// No resident serves this host's connection: nothing was sent; call per call.
    NoResident(String),
    /// Nothing was sent (no keeper, no connection).
    NotSent(String),
    /// The request may have left, and the keeper went away before saying.
    Lost(String),
}

impl Remote {
    /// Sends `request` (a resident request's bytes, see `host::resident`) to the host's resident shim
    /// through the keeper: one write to the host on a resident channel that is already
    /// open, or a new one when none is idle.
    pub(crate) async fn call(
        self: &std::sync::Arc<Self>,
        request: Vec<u8>,
    ) -> Result<ResidentCall, CallRefused> {
        let persist = persist().unwrap_or(super::DEFAULT_PERSIST);
        let mut link = open_link(&self.place, persist).await.map_err(|e| {
            self.mark_lost(&e.0);
            CallRefused::NotSent(format!("the connection keeper is unavailable: {}", e.0))
        })?;
        link.budget = self.dest.loss_budget();
        tracing::debug!(
            "resident request to the connection keeper (pid {}): {} bytes",
            link.pid,
            request.len()
        );
        let call = KeeperFrame::json(&KeeperRequest::Call {
            key: self.key.clone(),
            dest: Box::new(self.dest.clone()),
            host_key: self.host_key.clone(),
        });
        if let Err(e) = link.send_with_stdin(&call, &request).await {
            let why = format!("the connection keeper (pid {}) went away: {e}", link.pid);
            self.mark_lost(&why);
            return Err(CallRefused::NotSent(why));
        }
        match link.reply().await {
            Ok(KeeperReply::CallSent { resident_pid }) => {
                tracing::debug!(
                    "the request went to the host's resident shim (pid {resident_pid})"
                );
                Ok(ResidentCall {
                    link,
                    remote: self.clone(),
                    resident_pid,
                    end: None,
                })
            }
            Ok(KeeperReply::NoResident { message }) => Err(CallRefused::NoResident(message)),
            Ok(KeeperReply::ExecNotSent { message }) => Err(CallRefused::NotSent(message)),
            Ok(other) => {
                let why = format!("the keeper answered the resident request with {other:?}");
                self.mark_lost(&why);
                Err(CallRefused::Lost(why))
            }
            Err(e) => {
                let why = format!(
                    "the connection keeper (pid {}) went away after taking the request: {e}",
                    link.pid
                );
                self.mark_lost(&why);
                Err(CallRefused::Lost(why))
            }
        }
    }
}

/// One request's reply from the host's resident shim, through the keeper.
pub struct ResidentCall {
    link: KeeperLink,
    remote: std::sync::Arc<Remote>,
    /// The resident shim's pid on the host.
    pub resident_pid: u32,
    end: Option<ExecEvent>,
}

impl std::fmt::Debug for ResidentCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidentCall")
            .field("resident_pid", &self.resident_pid)
            .field("end", &self.end)
            .finish()
    }
}

impl ResidentCall {
    /// The next bytes of the reply (`Stdout`/`Stderr`), or its end (`Closed`, `Lost`).
    /// A silence longer than the keepalive budget is `Lost`: the resident beats while a
    /// request waits, so silence means a stopped resident, keeper or link.
    pub(crate) async fn next(&mut self) -> ExecEvent {
        let (resident, keeper) = (self.resident_pid, self.link.pid);
        next_event(&mut self.link, &self.remote, &mut self.end, false, |why| {
            format!(
                "no word from the host's resident shim (pid {resident}) through the connection keeper (pid {keeper}): {why}"
            )
        })
        .await
    }

    /// The reply is whole (its end frame came): the keeper may give the resident channel
    /// to the next caller. Without this, the keeper closes it.
    pub(crate) async fn release(mut self) {
        let _ = self
            .link
            .send(&[KeeperFrame::json(&KeeperRequest::Release)])
            .await;
    }
}

/// An exec channel on the keeper's connection.
pub struct RemoteExec {
    link: KeeperLink,
    remote: std::sync::Arc<Remote>,
    end: Option<ExecEvent>,
}

impl std::fmt::Debug for RemoteExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteExec")
            .field("end", &self.end)
            .finish()
    }
}

impl RemoteExec {
    /// The next event, as [`crate::ssh::Exec::next`]: the keeper dying is `Lost`.
    pub(crate) async fn next(&mut self) -> ExecEvent {
        let keeper = self.link.pid;
        next_event(&mut self.link, &self.remote, &mut self.end, true, |why| {
            format!("the connection keeper (pid {keeper}) went away: {why}")
        })
        .await
    }
}

/// The next event of a channel relayed by the keeper: bytes, or its end (`Closed`,
/// `Lost`), which is kept in `end` and answered from then on, and a loss marks `remote`
/// lost. An exec channel also ends with the command's exit (`exits`); a resident's reply
/// has none (its end frame is in the bytes), so an exit there is out of step.
async fn next_event(
    link: &mut KeeperLink,
    remote: &Remote,
    end: &mut Option<ExecEvent>,
    exits: bool,
    gone: impl FnOnce(&str) -> String,
) -> ExecEvent {
    if let Some(end) = end {
        return end.clone();
    }
    let event = match link.recv().await {
        Ok(KeeperFrame::Stdout(b)) => ExecEvent::Stdout(b),
        Ok(KeeperFrame::Stderr(b)) => ExecEvent::Stderr(b),
        Ok(f @ KeeperFrame::Json(_)) => match f.parse::<KeeperReply>() {
            Ok(KeeperReply::ExitStatus { status }) if exits => ExecEvent::ExitStatus(status),
            Ok(KeeperReply::ExitSignal {
                signal,
                core_dumped,
                message,
            }) if exits => ExecEvent::ExitSignal {
                signal,
                core_dumped,
                message,
            },
            Ok(KeeperReply::Closed) => ExecEvent::Closed,
            Ok(KeeperReply::Lost { message }) => ExecEvent::Lost(message),
            Ok(other) => ExecEvent::Lost(format!("the keeper sent {other:?} mid-channel")),
            Err(e) => ExecEvent::Lost(e.to_string()),
        },
        Ok(KeeperFrame::Stdin(_)) => ExecEvent::Lost("the keeper sent stdin bytes".into()),
        Err(why) => ExecEvent::Lost(gone(&why)),
    };
    if let ExecEvent::Closed | ExecEvent::Lost(_) = &event {
        if let ExecEvent::Lost(why) = &event {
            remote.mark_lost(why);
        }
        *end = Some(event.clone());
    }
    event
}

/// One control request (`status`, `stop`) to the keeper that is already running, never
/// starting one: its answer, or `None` when none runs.
pub async fn control(
    place: &KeeperDir,
    request: &KeeperRequest,
) -> Result<Option<KeeperReply>, String> {
    let Some(mut link) = existing_link(place).await.map_err(|e| e.0)? else {
        return Ok(None);
    };
    link.send(&[KeeperFrame::json(request)])
        .await
        .map_err(|e| format!("the keeper went away: {e}"))?;
    link.reply()
        .await
        .map(Some)
        .map_err(|e| format!("the keeper went away: {e}"))
}

/// A conversation with a keeper that is already running, without starting one (for
/// `opmark keeper status` and `stop`); `None` when none answers.
pub(crate) async fn existing_link(place: &KeeperDir) -> Result<Option<KeeperLink>, Unavailable> {
    Ok(match try_link(place).await? {
        Try::Ready(link) => Some(link),
        Try::Stale(_) => None,
    })
}
