//! The keeper process (`opmark keeper serve`): one per user and directory (an exclusive lock
//! held for its whole life), serving only its own uid (`SO_PEERCRED` on every
//! connection), holding connections keyed by the caller's connection key, several per
//! key when sshd's `MaxSessions` would be exceeded, and exiting after `persist` with no
//! caller or as soon as its socket is removed or replaced.
//!
//! Per held connection it keeps a pool of idle resident shim channels
//! (docs/host-protocol.md#the-resident-session): a `Call` takes an idle one and writes its
//! request in one go (one round trip to the host), or opens one (`serve`) when none is
//! idle; the channel comes back to the pool only when its caller saw the reply's end
//! frame and said `Release`. Anything else (a caller that left mid-reply, bytes on an idle
//! channel) closes that channel: one in an unknown state is never reused.
//!
//! It logs nothing: no stdio, no file. Whatever went wrong reaches a caller in its
//! answer, and the caller decides what to say.
//!
//! It lives beside [`super::keeper`] (the caller's side, the wire and what both sides
//! share), not inside it: the keeper holds [`Session`]s, and a session reaches a keeper
//! through `keeper::client`, so one folder for both would be an import circle.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;

use super::destination::Destination;
use super::error::ConnectError;
use super::exec::{Exec, OpenInput};
use super::exec_event::{ExecError, ExecEvent};
use super::keeper::wire::{
    self, FrameReader, HeldConnection, KeeperFrame, KeeperReply, KeeperRequest,
};
use super::keeper::{
    own_uid, short_path, ChannelSaid, KeeperDir, ResidentShell, ResidentStart, StartAnswer,
};
use super::session::{Session, DEFAULT_MAX_CHANNELS};

/// Connections held per key at most: beyond, callers wait for a free channel.
const MAX_CONNECTIONS_PER_KEY: usize = 8;

/// How long a starting keeper waits for the lock of one that is on its way out.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// One held connection.
struct Held {
    session: Session,
    opened: Instant,
    used: AtomicU64,
    /// When its last channel was opened: a connection unused for `persist` is closed
    /// even while the keeper serves other hosts (docs/trust.md#the-keeper: open "for a while after its
    /// last use").
    last_used: Mutex<Instant>,
    /// Idle resident shim channels on this connection, ready for a request.
    residents: Mutex<Vec<Resident>>,
    /// Why this connection's host serves no resident (its shim refused `serve`): calls on
    /// it go per call, and no resident is tried again on it.
    no_resident: Mutex<Option<String>>,
}

/// Room for one more request on a destination's connections.
enum Room {
    /// A free channel.
    Channel(Arc<Held>, tokio::sync::OwnedSemaphorePermit),
    /// An idle resident, handed over as it is.
    Idle(Arc<Held>, Resident),
}

/// How often a caller waiting for room on full connections looks again.
const ROOM_RECHECK: Duration = Duration::from_millis(50);

/// A resident shim channel (the shim's `serve`), idle or serving one caller.
struct Resident {
    exec: Exec,
    input: OpenInput,
    pid: u32,
}

/// Why a `Call` was not sent to a resident.
enum CallRefusal {
    /// No resident can serve it: the caller calls per call (nothing was sent).
    NoResident(String),
    /// No connection or channel: nothing was sent.
    NotSent(String),
}

/// How starting a resident ended.
enum Start {
    Ready(u32),
    /// The stub found no good cached shim: start it again with the script.
    NeedScript,
    /// The host's shim does not serve (refused, older protocol): remembered.
    Refused(String),
    /// The channel or the connection failed: not remembered.
    Failed(String),
}

impl Held {
    fn idle_residents(&self) -> usize {
        self.residents.lock().map(|r| r.len()).unwrap_or_default()
    }

    fn no_resident(&self) -> Option<String> {
        self.no_resident.lock().ok().and_then(|n| n.clone())
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    fn expired(&self, persist: Duration) -> bool {
        // Idle resident channels hold places under the channel limit but are no use.
        let idle_residents = self.idle_residents();
        let busy = self
            .session
            .channel_use()
            .is_some_and(|(n, _)| n > idle_residents);
        let idle = self
            .last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default();
        !busy && idle >= persist
    }
}

/// The connections held for one connection key (more than one when `MaxSessions`
/// would be exceeded); its async lock makes concurrent callers share one connect.
type HeldConnections = Arc<tokio::sync::Mutex<Vec<Arc<Held>>>>;

/// The keeper's state.
struct Keeper {
    /// What runs on a resident channel (the host layer's shim).
    shell: Arc<dyn ResidentShell>,
    persist: Duration,
    uid: u32,
    slots: Mutex<HashMap<String, HeldConnections>>,
    callers: AtomicUsize,
    idle_since: Mutex<Instant>,
    stop: Notify,
}

/// Counts a caller while it is connected.
struct CallerGuard(Arc<Keeper>);

impl Drop for CallerGuard {
    fn drop(&mut self) {
        if self.0.callers.fetch_sub(1, Ordering::SeqCst) == 1 {
            if let Ok(mut t) = self.0.idle_since.lock() {
                *t = Instant::now();
            }
        }
    }
}

/// Closes every descriptor above stderr that this process inherited: the keeper outlives
/// its caller, and an inherited pipe end (bash leaves a process substitution's open in
/// every command, as fd 63) would keep the caller's reader (`2> >(tee log)`) waiting for
/// as long as the keeper lives. What Rust opens is close-on-exec; what is not was
/// inherited, so only those are closed, before anything of this process is opened.
fn close_inherited() {
    const O_CLOEXEC_OCTAL: u64 = 0o2_000_000;
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
            continue; // gone (the directory's own descriptor), or not ours to read
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u64::from_str_radix(f.trim(), 8).ok());
        if flags.is_some_and(|f| f & O_CLOEXEC_OCTAL == 0) {
            let _ = nix::unistd::close(fd);
        }
    }
}

/// Runs the keeper for `dir` until it is idle for `persist`, stopped, or its socket is
/// gone. Returns at once when another keeper holds the directory.
pub fn serve(
    dir: &std::path::Path,
    persist: Duration,
    shell: Arc<dyn ResidentShell>,
) -> Result<(), String> {
    close_inherited();
    let place = KeeperDir::open(dir)?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(place.lock_file())
        .map_err(|e| format!("cannot open {}: {e}", place.lock_file().display()))?;
    let _ = lock.set_permissions(std::fs::Permissions::from_mode(0o600));
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Another keeper serves this directory.
            Err(std::fs::TryLockError::WouldBlock) => return Ok(()),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!("cannot lock {}: {e}", place.lock_file().display()))
            }
        }
    }
    // Nobody else may prompt from a background process.
    crate::ssh::auth::forbid_prompts();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the keeper's runtime: {e}"))?;
    let result = runtime.block_on(run(place.clone(), persist, shell));
    // Connections close with the runtime; the lock goes with the process.
    runtime.shutdown_timeout(Duration::from_millis(200));
    drop(lock);
    result
}

async fn run(
    place: KeeperDir,
    persist: Duration,
    shell: Arc<dyn ResidentShell>,
) -> Result<(), String> {
    let uid = own_uid().map_err(|e| format!("cannot tell this process's uid: {e}"))?;
    let socket = place.socket();
    // We hold the lock: whatever socket is there belongs to a keeper that is gone (and is
    // replaced below); `check_socket` still refuses to replace what is not our socket.
    place.check_socket()?;
    // The socket appears under its name only once it is ours alone. `bind` creates it
    // with the umask's mode (0755 under 022), and a caller polling for the keeper it
    // started refuses a socket open to others (reuse off for its whole run), so binding
    // in place left a window up to the chmod that a loaded machine widens. So: bind
    // under a name no caller looks at (ours alone while we hold the lock; a leftover of
    // a keeper killed here is removed first), restrict it, then rename it over the stale
    // one in one step: a caller sees the stale socket (refused) or the ready one.
    let staging_name = format!("{}.new", super::keeper::socket_name());
    let staging = place.dir.join(&staging_name);
    let _ = std::fs::remove_file(&staging);
    let mut holder = None;
    let path = short_path(&place.dir, &staging_name, &mut holder)
        .map_err(|e| format!("cannot open {}: {e}", place.dir.display()))?;
    let listener = UnixListener::bind(&path)
        .map_err(|e| format!("cannot listen on {}: {e}", staging.display()))?;
    drop(holder);
    let published = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", staging.display()))
        .and_then(|()| {
            std::fs::rename(&staging, &socket)
                .map_err(|e| format!("cannot move {} into place: {e}", staging.display()))
        });
    if let Err(e) = published {
        let _ = std::fs::remove_file(&staging);
        return Err(e);
    }
    let inode = std::fs::metadata(&socket).map(|m| m.ino()).ok();
    let _ = std::fs::write(place.pid_file(), format!("{}\n", std::process::id()));

    let keeper = Arc::new(Keeper {
        shell,
        persist,
        uid,
        slots: Mutex::new(HashMap::new()),
        callers: AtomicUsize::new(0),
        idle_since: Mutex::new(Instant::now()),
        stop: Notify::new(),
    });
    let tick = persist
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(50));
    let mut ticker = tokio::time::interval(tick);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let k = keeper.clone();
                    tokio::spawn(async move { k.serve_caller(stream).await });
                }
            }
            _ = ticker.tick() => {
                // Our socket removed or replaced: nobody can reach us any more.
                let ours = std::fs::symlink_metadata(&socket).map(|m| m.ino()).ok();
                if ours.is_none() || ours != inode {
                    return Ok(());
                }
                keeper.close_unused();
                if keeper.callers.load(Ordering::SeqCst) == 0 {
                    let idle = keeper.idle_since.lock().map(|t| t.elapsed()).unwrap_or_default();
                    if idle >= persist {
                        break;
                    }
                }
            }
            _ = keeper.stop.notified() => break,
        }
    }
    // Unlink first, so a caller arriving now starts a new keeper instead of finding ours.
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(place.pid_file());
    Ok(())
}

impl Keeper {
    async fn serve_caller(self: Arc<Self>, stream: UnixStream) {
        // Only our own user, checked on every connection (the directory's mode is the
        // first wall, this the second).
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == self.uid => {}
            _ => return,
        }
        self.callers.fetch_add(1, Ordering::SeqCst);
        let _guard = CallerGuard(self.clone());
        let (read, write) = stream.into_split();
        let mut conv = Conversation {
            read,
            reader: FrameReader::default(),
            write,
        };
        match conv.request().await {
            Some(KeeperRequest::Hello { version }) if version == wire::VERSION => {}
            Some(KeeperRequest::Hello { version }) => {
                let _ = conv
                    .send(&KeeperReply::Refused {
                        message: format!(
                            "the keeper speaks protocol {}, this opmark {version}",
                            wire::VERSION
                        ),
                    })
                    .await;
                return;
            }
            _ => return,
        }
        if conv
            .send(&KeeperReply::Hello {
                version: wire::VERSION,
                pid: std::process::id(),
            })
            .await
            .is_err()
        {
            return;
        }
        match conv.request().await {
            Some(KeeperRequest::Connect { key, dest }) => {
                let connected = conv.alive_while(&dest, self.connection(&key, &dest)).await;
                let reply = match connected {
                    Ok(held) => KeeperReply::Connected {
                        host_key: held.session.host_key(),
                    },
                    Err(e) => KeeperReply::ConnectFailed {
                        stage: wire::stage_name(e.stage).into(),
                        message: e.message,
                    },
                };
                let _ = conv.send(&reply).await;
            }
            Some(KeeperRequest::Exec {
                key,
                dest,
                host_key,
                command,
            }) => self.exec(conv, &key, &dest, host_key, &command).await,
            Some(KeeperRequest::Call {
                key,
                dest,
                host_key,
            }) => self.call(conv, &key, &dest, host_key).await,
            Some(KeeperRequest::Status) => {
                let reply = self.status().await;
                let _ = conv.send(&reply).await;
            }
            Some(KeeperRequest::Stop) => {
                let _ = conv
                    .send(&KeeperReply::Stopping {
                        pid: std::process::id(),
                    })
                    .await;
                self.stop.notify_one();
            }
            _ => {}
        }
    }

    /// Closes the connections nobody used for `persist` (a slot busy connecting is
    /// looked at on a later tick).
    fn close_unused(&self) {
        // Empty slots stay: a caller may hold one between looking it up and locking it.
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for slot in slots.values() {
            if let Ok(mut held) = slot.try_lock() {
                held.retain(|h| !h.session.is_closed() && !h.expired(self.persist));
            }
        }
    }

    fn slot(&self, key: &str) -> HeldConnections {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(key.to_string()).or_default().clone()
    }

    /// A live connection for `key`, connecting when none is held.
    async fn connection(&self, key: &str, dest: &Destination) -> Result<Arc<Held>, ConnectError> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        held.retain(|h| !h.session.is_closed());
        if let Some(h) = held.first() {
            h.touch();
            return Ok(h.clone());
        }
        let h = self.open(dest).await?;
        held.push(h.clone());
        Ok(h)
    }

    async fn open(&self, dest: &Destination) -> Result<Arc<Held>, ConnectError> {
        let session = Session::connect_with_limit(dest, DEFAULT_MAX_CHANNELS).await?;
        Ok(Arc::new(Held {
            session,
            opened: Instant::now(),
            used: AtomicU64::new(0),
            last_used: Mutex::new(Instant::now()),
            residents: Mutex::new(Vec::new()),
            no_resident: Mutex::new(None),
        }))
    }

    /// A connection with a free channel: a held one, else a new one (up to
    /// [`MAX_CONNECTIONS_PER_KEY`]), else the place of an idle resident, else the next
    /// place freed; see [`Keeper::room`].
    async fn channel(
        &self,
        key: &str,
        dest: &Destination,
    ) -> Result<(Arc<Held>, tokio::sync::OwnedSemaphorePermit), String> {
        match self.room(key, dest, None).await? {
            Room::Channel(h, permit) => Ok((h, permit)),
            Room::Idle(h, resident) => {
                close(resident);
                Err(format!(
                    "internal: an idle resident on {} was offered for a channel",
                    h.session.destination().display()
                ))
            }
        }
    }

    /// A place for one more request on `key`'s connections. A free channel, or a new
    /// connection's, when there is one. With every channel of every connection taken,
    /// idle residents hold places nobody uses: one that `fits` (a caller that wants a
    /// resident) is handed over as it is; else one is closed, and its channel is free as
    /// soon as sshd has closed it. Otherwise the next channel a caller frees, or a resident
    /// released meanwhile, serves this one: a waiter is never left behind idle residents
    /// (it used to wait on the first connection's channels, which idle residents held for
    /// good).
    async fn room(
        &self,
        key: &str,
        dest: &Destination,
        fits: Option<&(dyn Fn(&Held) -> bool + Sync)>,
    ) -> Result<Room, String> {
        let slot = self.slot(key);
        loop {
            let held = {
                let mut held = slot.lock().await;
                held.retain(|h| !h.session.is_closed());
                for h in held.iter() {
                    if let Some(permit) = h.session.try_channel() {
                        return Ok(Room::Channel(h.clone(), permit));
                    }
                }
                if held.len() < MAX_CONNECTIONS_PER_KEY {
                    let h = self.open(dest).await.map_err(|e| e.to_string())?;
                    held.push(h.clone());
                    let permit = h
                        .session
                        .try_channel()
                        .ok_or("a new connection had no free channel")?;
                    return Ok(Room::Channel(h, permit));
                }
                held.clone()
            };
            if held.is_empty() {
                return Err("no connection".into());
            }
            for h in &held {
                let idle = h.residents.lock().ok().and_then(|mut r| r.pop());
                let Some(resident) = idle else { continue };
                if fits.is_some_and(|fits| fits(h)) {
                    return Ok(Room::Idle(h.clone(), resident));
                }
                close(resident);
                break;
            }
            // A channel that frees up, a resident released to the pool, a connection that
            // closed: all seen at the next look.
            tokio::time::sleep(ROOM_RECHECK).await;
        }
    }

    async fn exec(
        &self,
        mut conv: Conversation,
        key: &str,
        dest: &Destination,
        host_key: Option<String>,
        command: &str,
    ) {
        // The whole request first: the exec request leaves only once the caller's stdin is
        // all here, so a caller whose write failed knows nothing was sent.
        let mut stdin = Vec::new();
        loop {
            match conv.frame().await {
                Some(KeeperFrame::Stdin(b)) if stdin.is_empty() => stdin = b,
                Some(KeeperFrame::Stdin(b)) => stdin.extend_from_slice(&b),
                Some(f @ KeeperFrame::Json(_))
                    if matches!(f.parse(), Ok(KeeperRequest::StdinEnd)) =>
                {
                    break
                }
                _ => return,
            }
        }
        let channel = conv.alive_while(dest, self.channel(key, dest)).await;
        let (held, permit) = match channel {
            Ok(c) => c,
            Err(message) => {
                let _ = conv.send(&KeeperReply::ExecNotSent { message }).await;
                return;
            }
        };
        if host_key.is_some() && held.session.host_key() != host_key {
            let message = format!(
                "the keeper's connection to {} presents host key {}, not the {} this session \
                 checked; nothing sent",
                dest.display(),
                held.session.host_key().unwrap_or_default(),
                host_key.unwrap_or_default()
            );
            let _ = conv.send(&KeeperReply::ExecNotSent { message }).await;
            return;
        }
        held.used.fetch_add(1, Ordering::Relaxed);
        held.touch();
        let stdin = (!stdin.is_empty()).then_some(stdin);
        let started = conv
            .alive_while(dest, held.session.exec_permitted(permit, command, stdin))
            .await;
        let mut exec = match started {
            Ok(e) => e,
            Err(ExecError::NotSent(message)) => {
                let _ = conv.send(&KeeperReply::ExecNotSent { message }).await;
                return;
            }
            Err(ExecError::Lost(message)) => {
                let _ = conv.send(&KeeperReply::ExecLost { message }).await;
                return;
            }
        };
        if conv.send(&KeeperReply::ExecStarted).await.is_err() {
            return drain(exec);
        }
        let Conversation {
            mut read,
            mut write,
            ..
        } = conv;
        // The caller leaving (its socket closing) is noticed while events flow.
        let gone = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
        });
        tokio::pin!(gone);
        let mut alive = heartbeat_ticker(dest);
        loop {
            let event = tokio::select! {
                ev = exec.next() => ev,
                _ = &mut gone => return drain(exec),
                _ = alive.tick() => {
                    if write.write_all(&KeeperFrame::json(&KeeperReply::Alive).encode()).await.is_err() {
                        return drain(exec);
                    }
                    continue;
                }
            };
            let last = matches!(event, ExecEvent::Closed | ExecEvent::Lost(_));
            if write
                .write_all(&wire::event_frame(event).encode())
                .await
                .is_err()
            {
                return drain(exec);
            }
            if last {
                return;
            }
        }
    }

    /// A `Call`: one request to the host's resident shim, relayed until its caller
    /// releases the channel (it goes back to the pool) or leaves (it is closed).
    async fn call(
        &self,
        mut conv: Conversation,
        key: &str,
        dest: &Destination,
        host_key: Option<String>,
    ) {
        // The whole request first, as for `Exec`: a caller whose write failed knows
        // nothing was sent.
        let mut request = Vec::new();
        loop {
            match conv.frame().await {
                Some(KeeperFrame::Stdin(b)) => request.extend_from_slice(&b),
                Some(f @ KeeperFrame::Json(_))
                    if matches!(f.parse(), Ok(KeeperRequest::StdinEnd)) =>
                {
                    break
                }
                _ => return,
            }
        }
        let got = conv
            .alive_while(dest, self.resident(key, dest, host_key.as_deref()))
            .await;
        let (held, resident) = match got {
            Ok(r) => r,
            Err(CallRefusal::NoResident(message)) => {
                let _ = conv.send(&KeeperReply::NoResident { message }).await;
                return;
            }
            Err(CallRefusal::NotSent(message)) => {
                let _ = conv.send(&KeeperReply::ExecNotSent { message }).await;
                return;
            }
        };
        held.used.fetch_add(1, Ordering::Relaxed);
        held.touch();
        if !resident.input.send(request) {
            close(resident);
            let message = "the resident channel ended before the request was written".into();
            let _ = conv.send(&KeeperReply::NoResident { message }).await;
            return;
        }
        let sent = KeeperReply::CallSent {
            resident_pid: resident.pid,
        };
        if conv.send(&sent).await.is_err() {
            // The caller left: the resident is closed (its request runs on as a call
            // whose caller left would).
            return close(resident);
        }
        relay(conv, held, resident, dest).await;
    }

    /// An idle resident on a connection for `key` that presents `host_key`, or a new
    /// one on a connection with a free channel.
    async fn resident(
        &self,
        key: &str,
        dest: &Destination,
        host_key: Option<&str>,
    ) -> Result<(Arc<Held>, Resident), CallRefusal> {
        let slot = self.slot(key);
        let held: Vec<Arc<Held>> = {
            let mut held = slot.lock().await;
            held.retain(|h| !h.session.is_closed());
            held.clone()
        };
        let fits = |h: &Held| host_key.is_none() || h.session.host_key().as_deref() == host_key;
        for h in held.iter().filter(|h| fits(h)) {
            loop {
                let idle = h.residents.lock().ok().and_then(|mut r| r.pop());
                let Some(mut r) = idle else { break };
                // Anything waiting on an idle channel (bytes, its end) means it is not in
                // step: closed, never used.
                if r.exec.ready_event().await.is_none() && !h.session.is_closed() {
                    return Ok((h.clone(), r));
                }
                close(r);
            }
        }
        if let Some(why) = held
            .iter()
            .filter(|h| fits(h))
            .find_map(|h| h.no_resident())
        {
            return Err(CallRefusal::NoResident(why));
        }
        let (h, permit) = loop {
            match self
                .room(key, dest, Some(&fits))
                .await
                .map_err(CallRefusal::NotSent)?
            {
                Room::Channel(h, permit) => break (h, permit),
                Room::Idle(h, mut r) => {
                    if r.exec.ready_event().await.is_none() && !h.session.is_closed() {
                        return Ok((h, r));
                    }
                    close(r);
                }
            }
        };
        if host_key.is_some() && h.session.host_key().as_deref() != host_key {
            return Err(CallRefusal::NotSent(format!(
                "the keeper's connection to {} presents host key {}, not the {} this session \
                 checked; nothing sent",
                dest.display(),
                h.session.host_key().unwrap_or_default(),
                host_key.unwrap_or_default()
            )));
        }
        if let Some(why) = h.no_resident() {
            return Err(CallRefusal::NoResident(why));
        }
        match start_resident(&*self.shell, &h, permit, dest).await {
            Ok(r) => Ok((h, r)),
            Err(Start::Refused(why)) => {
                if let Ok(mut n) = h.no_resident.lock() {
                    *n = Some(why.clone());
                }
                Err(CallRefusal::NoResident(why))
            }
            Err(Start::Failed(why)) => Err(CallRefusal::NoResident(why)),
            Err(Start::Ready(_) | Start::NeedScript) => Err(CallRefusal::NoResident(
                "the resident shim did not start".into(),
            )),
        }
    }

    async fn status(&self) -> KeeperReply {
        let slots: Vec<_> = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.values().cloned().collect()
        };
        let mut connections = Vec::new();
        for slot in slots {
            for h in slot.lock().await.iter() {
                if h.session.is_closed() {
                    continue;
                }
                let (channels, max_channels) = h.session.channel_use().unwrap_or_default();
                connections.push(HeldConnection {
                    destination: h.session.destination().display(),
                    host_key: h.session.host_key(),
                    channels,
                    max_channels,
                    used: h.used.load(Ordering::Relaxed),
                    age_secs: h.opened.elapsed().as_secs(),
                    idle_residents: h.idle_residents(),
                    no_resident: h.no_resident(),
                });
            }
        }
        connections.sort_by(|a, b| a.destination.cmp(&b.destination));
        let callers = self.callers.load(Ordering::SeqCst).saturating_sub(1);
        KeeperReply::Status {
            pid: std::process::id(),
            persist_secs: self.persist.as_secs(),
            idle_secs: if callers == 0 {
                self.idle_since
                    .lock()
                    .map(|t| t.elapsed().as_secs())
                    .unwrap_or_default()
            } else {
                0
            },
            callers,
            connections,
        }
    }
}

/// Starts the host's resident shim on `held` (`serve` through the stub, as any call):
/// from the host's cached copy, or, when it has none, with the script.
async fn start_resident(
    shell: &dyn ResidentShell,
    held: &Held,
    permit: tokio::sync::OwnedSemaphorePermit,
    dest: &Destination,
) -> Result<Resident, Start> {
    let mut permit = Some(permit);
    for with_script in [false, true] {
        let permit = match permit.take() {
            Some(p) => p,
            None => tokio::time::timeout(dest.connect_timeout, held.session.wait_channel())
                .await
                .ok()
                .flatten()
                .ok_or_else(|| Start::Failed("no free channel for the resident".into()))?,
        };
        let mut start = shell.start(with_script);
        let (mut exec, input) = held
            .session
            .exec_open(permit, start.exec(), start.data())
            .await
            .map_err(|e| Start::Failed(e.to_string()))?;
        let ready = tokio::time::timeout(dest.connect_timeout, await_ready(&mut exec, &mut *start))
            .await
            .unwrap_or_else(|_| Start::Failed("the resident shim did not answer in time".into()));
        match ready {
            Start::Ready(pid) => return Ok(Resident { exec, input, pid }),
            Start::NeedScript if !with_script => {
                drop(input);
                drain(exec);
            }
            other => {
                drop(input);
                drain(exec);
                return Err(other);
            }
        }
    }
    Err(Start::Refused("the host asked for the script twice".into()))
}

/// Reads a new resident channel until `start` says how the start went.
async fn await_ready(exec: &mut Exec, start: &mut dyn ResidentStart) -> Start {
    loop {
        let said =
            match exec.next().await {
                ExecEvent::Stdout(b) => start.read(ChannelSaid::Stdout(&b)),
                ExecEvent::Stderr(b) => start.read(ChannelSaid::Stderr(&b)),
                ExecEvent::Closed => Some(start.read(ChannelSaid::Closed).unwrap_or_else(|| {
                    StartAnswer::Refused("the shell ended without serving".into())
                })),
                ExecEvent::Lost(why) => return Start::Failed(why),
                _ => None,
            };
        match said {
            Some(StartAnswer::Ready(pid)) => return Start::Ready(pid),
            Some(StartAnswer::NeedScript) => return Start::NeedScript,
            Some(StartAnswer::Refused(why)) => return Start::Refused(why),
            None => {}
        }
    }
}

/// Relays a resident's reply to its caller until the caller says `Release` (the channel
/// goes back to the pool), leaves (the channel is closed), or the channel ends.
async fn relay(conv: Conversation, held: Arc<Held>, mut resident: Resident, dest: &Destination) {
    let Conversation {
        mut read,
        mut reader,
        mut write,
    } = conv;
    // The caller's next frame: `Release` is true, anything else (or leaving) false.
    let released = tokio::spawn(async move {
        let mut buf = [0u8; 512];
        loop {
            match reader.next_frame() {
                Ok(Some(f)) => return matches!(f.parse(), Ok(KeeperRequest::Release)),
                Ok(None) => {}
                Err(_) => return false,
            }
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => reader.push(&buf[..n]),
            }
        }
    });
    tokio::pin!(released);
    // The caller hears from the keeper every heartbeat, so that its own silence budget
    // only ever runs out on a keeper that stopped: a silent host is the keeper's to
    // notice and to name (the resident beats several times a second while a request
    // waits, so a silence of the keepalive budget means the link or the host stopped).
    let mut alive = heartbeat_ticker(dest);
    let budget = dest.loss_budget();
    let mut heard = tokio::time::Instant::now();
    loop {
        let silent_until = budget.map(|b| heard + b);
        let event = tokio::select! {
            ev = resident.exec.next() => ev,
            done = &mut released => {
                if matches!(done, Ok(true)) && !held.session.is_closed() {
                    held.touch();
                    if let Ok(mut idle) = held.residents.lock() {
                        idle.push(resident);
                        return;
                    }
                }
                return close(resident);
            }
            _ = alive.tick() => {
                if write.write_all(&KeeperFrame::json(&KeeperReply::Alive).encode()).await.is_err() {
                    return close(resident);
                }
                continue;
            }
            _ = sleep_until_some(silent_until) => {
                let message = format!(
                    "no word from the resident shim (pid {}) on {} for {:.0} s: it, the link \
                     or the host stopped (the connection keeper is fine)",
                    resident.pid,
                    dest.display(),
                    budget.unwrap_or_default().as_secs_f64()
                );
                let end = wire::event_frame(ExecEvent::Lost(message));
                let _ = write.write_all(&end.encode()).await;
                return close(resident);
            }
        };
        heard = tokio::time::Instant::now();
        let frame = match event {
            ExecEvent::Stdout(b) => KeeperFrame::Stdout(b),
            ExecEvent::Stderr(b) => KeeperFrame::Stderr(b),
            // The resident itself ended: its channel closes next.
            ExecEvent::ExitStatus(_) | ExecEvent::ExitSignal { .. } => continue,
            end @ (ExecEvent::Closed | ExecEvent::Lost(_)) => {
                let _ = write.write_all(&wire::event_frame(end).encode()).await;
                return;
            }
        };
        if write.write_all(&frame.encode()).await.is_err() {
            return close(resident);
        }
    }
}

/// Sleeps until `when`, or forever when there is no such moment (keepalives off).
async fn sleep_until_some(when: Option<tokio::time::Instant>) {
    match when {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Ends a resident that is not reused: EOF on its input (it exits after its request, if
/// any), and its channel is read until sshd closes it, keeping its place under the
/// channel limit until then.
fn close(resident: Resident) {
    drop(resident.input);
    drain(resident.exec);
}

/// Closes a channel nobody listens to any more, and reads it until sshd has closed it
/// too: it keeps its place under the connection's channel limit until then, so the
/// keeper never opens more channels than sshd's `MaxSessions`. Closed, not read to its
/// end: a get whose caller was killed would otherwise have the host send the rest of
/// the file, to be thrown away here.
fn drain(mut exec: Exec) {
    tokio::spawn(async move {
        exec.close().await;
        while !matches!(exec.next().await, ExecEvent::Closed | ExecEvent::Lost(_)) {}
    });
}

/// The keeper's side of one socket connection.
struct Conversation {
    read: tokio::net::unix::OwnedReadHalf,
    reader: FrameReader,
    write: OwnedWriteHalf,
}

impl Conversation {
    async fn frame(&mut self) -> Option<KeeperFrame> {
        loop {
            match self.reader.next_frame() {
                Ok(Some(f)) => return Some(f),
                Ok(None) => {}
                Err(_) => return None,
            }
            // A caller's stdin comes in 256 KiB frames: read in 64 KiB (16 KiB took four
            // times the calls), without holding a large buffer for every caller.
            match self.reader.fill(&mut self.read, 64 * 1024).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    async fn request(&mut self) -> Option<KeeperRequest> {
        self.frame().await?.parse().ok()
    }

    async fn send(&mut self, reply: &KeeperReply) -> std::io::Result<()> {
        self.write
            .write_all(&KeeperFrame::json(reply).encode())
            .await
    }

    /// Awaits `work` (a connect, an exec request on its way) while telling the caller
    /// [`KeeperReply::Alive`] every heartbeat. The work is never cut short: a caller that left
    /// meanwhile finds out nothing, and the channel is drained as before.
    async fn alive_while<T>(
        &mut self,
        dest: &Destination,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        tokio::pin!(work);
        let mut alive = heartbeat_ticker(dest);
        let mut listening = true;
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = alive.tick(), if listening => {
                    listening = self.send(&KeeperReply::Alive).await.is_ok();
                }
            }
        }
    }
}

/// A ticker for [`KeeperReply::Alive`] whose first tick is one heartbeat from now.
fn heartbeat_ticker(dest: &Destination) -> tokio::time::Interval {
    let every = wire::heartbeat(dest);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}
