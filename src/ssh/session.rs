//! One authenticated SSH connection (possibly through ProxyJump hops): connecting with
//! bounded timeouts, the host key check, keepalives, and remembering why it was lost.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, DisconnectReason, Handle};
use russh::keys::PublicKeyOrCertificate;
use russh::{kex, Preferred};
use tokio::sync::Semaphore;

use super::destination::{Destination, StrictMode};
use super::known_hosts::{self, fingerprint, KnownHosts, Verdict};
use super::socket::TunedStream;
use super::{auth, ConnectError, ConnectStage};

/// Channels one connection runs at once unless told otherwise: sshd's default
/// `MaxSessions` is 10, and it refuses the 11th channel.
pub const DEFAULT_MAX_CHANNELS: usize = 10;

/// Key exchange order: curve25519 first (fast, ~35 µs), then the NIST curves, DH last
/// because russh's DH is very slow (group16 ~100 ms CPU, group-exchange ~630 ms; FINDINGS).
const KEX_ORDER: &[kex::Name] = &[
    kex::CURVE25519,
    kex::CURVE25519_PRE_RFC_8731,
    kex::ECDH_SHA2_NISTP256,
    kex::ECDH_SHA2_NISTP384,
    kex::ECDH_SHA2_NISTP521,
    kex::MLKEM768X25519_SHA256,
    kex::DH_G14_SHA256,
    kex::DH_G16_SHA512,
    kex::DH_GEX_SHA256,
    kex::EXTENSION_SUPPORT_AS_CLIENT,
    kex::EXTENSION_OPENSSH_STRICT_KEX_AS_CLIENT,
];

/// What the russh event loop tells us about one connection.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Why the host key was refused, set by `check_server_key`.
    pub(crate) host_key_failure: Mutex<Option<(ConnectStage, String)>>,
    /// Why the connection ended, set by `disconnected`.
    pub(crate) lost: Mutex<Option<String>>,
    /// The fingerprint (`SHA256:...`) of the host key this connection accepted.
    pub(crate) host_key: Mutex<Option<String>>,
}

impl Shared {
    pub(crate) fn lost_reason(&self) -> Option<String> {
        self.lost.lock().ok().and_then(|g| g.clone())
    }
}

/// The russh event handler: checks the host key, records disconnect reasons.
#[derive(Debug)]
pub(crate) struct Client {
    dest: Destination,
    known: KnownHosts,
    shared: Arc<Shared>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key,
            PublicKeyOrCertificate::Certificate(_) => {
                self.fail(format!(
                    "{} presented a host certificate; opmark does not check host certificates",
                    self.dest.known_hosts_name()
                ));
                return Ok(false);
            }
        };
        match self.verify(key) {
            Ok(()) => {
                if let Ok(mut slot) = self.shared.host_key.lock() {
                    *slot = Some(fingerprint(key));
                }
                Ok(true)
            }
            Err(message) => {
                self.fail(message);
                Ok(false)
            }
        }
    }

    async fn disconnected(
        &mut self,
        reason: DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        let why = match &reason {
            DisconnectReason::ReceivedDisconnect(info) => format!(
                "the host closed the connection ({:?}: {})",
                info.reason_code, info.message
            ),
            DisconnectReason::Error(russh::Error::KeepaliveTimeout) => format!(
                "keepalive timeout: no answer from {} for {} s",
                self.dest.display(),
                self.dest.loss_budget().unwrap_or_default().as_secs_f64()
            ),
            DisconnectReason::Error(russh::Error::IO(e)) => {
                format!(
                    "connection to {} broke (reset, or closed without an SSH disconnect): {e}",
                    self.dest.display()
                )
            }
            DisconnectReason::Error(e) => {
                format!("connection to {} lost: {e}", self.dest.display())
            }
        };
        tracing::debug!("{why}");
        if let Ok(mut slot) = self.shared.lost.lock() {
            slot.get_or_insert(why);
        }
        match reason {
            DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            DisconnectReason::Error(e) => Err(e),
        }
    }
}

impl Client {
    fn fail(&self, message: String) {
        if let Ok(mut slot) = self.shared.host_key_failure.lock() {
            *slot = Some((ConnectStage::HostKey, message));
        }
    }

    /// The OpenSSH rules: a known key passes, a revoked or changed key never does, an
    /// unknown key passes only with `accept-new` (learned) or an explicit `no`.
    fn verify(&self, key: &russh::keys::PublicKey) -> Result<(), String> {
        let name = self.dest.known_hosts_name();
        let kind = key.algorithm().as_str().to_string();
        let fp = fingerprint(key);
        match self.known.check(&name, key) {
            Verdict::Trusted(at) => {
                tracing::debug!("host key {kind} {fp} for {name} matches {at}");
                Ok(())
            }
            Verdict::Revoked(at) => Err(format!(
                "the {kind} host key {fp} of {name} is marked @revoked at {at}; refusing to connect"
            )),
            Verdict::Changed { expected } => Err(format!(
                "REMOTE HOST IDENTIFICATION HAS CHANGED for {name}: it offered {kind} key {fp}, \
                 but a different {kind} key is recorded at {expected}. Someone could be \
                 intercepting the connection, or the host key was replaced. If you have verified \
                 the new key, remove the old one with `ssh-keygen -R '{name}' -f {}`",
                expected.path.display()
            )),
            Verdict::Unknown { others } => {
                if !others.is_empty() && self.dest.strict != StrictMode::No {
                    let at: Vec<String> = others.iter().map(|l| l.to_string()).collect();
                    return Err(format!(
                        "{name} offered a {kind} host key ({fp}) but is known by other key types \
                         (at {}); refusing a key type switch. Verify the new key and add it to \
                         known_hosts",
                        at.join(", ")
                    ));
                }
                match self.dest.strict {
                    StrictMode::Yes => Err(format!(
                        "no host key is known for {name} ({kind} {fp}) and strict checking is on. \
                         Verify the fingerprint, then add the key to {} (ssh-keyscan) or set \
                         `StrictHostKeyChecking accept-new`",
                        self.dest
                            .known_hosts
                            .first()
                            .map(|p| p.display().to_string())
                            .unwrap_or_else(|| "a UserKnownHostsFile".into())
                    )),
                    StrictMode::AcceptNew => {
                        let Some(file) = self.dest.known_hosts.first() else {
                            return Err(format!(
                                "cannot learn the host key of {name}: UserKnownHostsFile is none"
                            ));
                        };
                        known_hosts::learn(file, &name, key, self.dest.hash_known_hosts).map_err(
                            |e| {
                                format!(
                                    "cannot add the host key of {name} to {}: {e}",
                                    file.display()
                                )
                            },
                        )?;
                        tracing::warn!(
                            "permanently added {kind} host key {fp} for {name} to {}",
                            file.display()
                        );
                        Ok(())
                    }
                    StrictMode::No => {
                        tracing::warn!(
                            "accepting unknown host key {kind} {fp} for {name} (StrictHostKeyChecking no)"
                        );
                        Ok(())
                    }
                }
            }
        }
    }
}

/// One hop's live connection.
struct Hop {
    handle: Handle<Client>,
    shared: Arc<Shared>,
}

pub(crate) struct Inner {
    /// The target's connection (last hop).
    pub(crate) handle: Handle<Client>,
    pub(crate) shared: Arc<Shared>,
    /// Jump connections, kept alive as long as the target's.
    jumps: Vec<Hop>,
    /// Bounds concurrent channels on this connection.
    pub(crate) channels: Arc<Semaphore>,
    pub(crate) dest: Destination,
}

/// An authenticated connection to one destination. Cheap to clone; channels are
/// opened per [`Session::exec`], at most `max_channels` at once.
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("dest", &self.inner.dest.display())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Session {
    /// Connects, checks the host key and authenticates, through every ProxyJump hop.
    /// Any error means nothing was sent (boundary `not_sent`).
    pub async fn connect(dest: &Destination) -> Result<Session, ConnectError> {
        Session::connect_with_limit(dest, DEFAULT_MAX_CHANNELS).await
    }

    /// As [`Session::connect`], allowing `max_channels` concurrent exec channels.
    pub async fn connect_with_limit(
        dest: &Destination,
        max_channels: usize,
    ) -> Result<Session, ConnectError> {
        let mut jumps: Vec<Hop> = Vec::new();
        for hop in &dest.jumps {
            let via = jumps.last().map(|h| &h.handle);
            let hop_conn = connect_one(hop, via).await.map_err(|e| ConnectError {
                stage: e.stage,
                message: format!("jump host {}: {}", hop.display(), e.message),
            })?;
            jumps.push(hop_conn);
        }
        let target = connect_one(dest, jumps.last().map(|h| &h.handle)).await?;
        Ok(Session {
            inner: Arc::new(Inner {
                handle: target.handle,
                shared: target.shared,
                jumps,
                channels: Arc::new(Semaphore::new(max_channels.max(1))),
                dest: dest.clone(),
            }),
        })
    }

    /// True once the connection (or one of its jump hops) has ended; a pool replaces it.
    pub fn is_closed(&self) -> bool {
        self.inner.handle.is_closed()
            || self.inner.shared.lost_reason().is_some()
            || self
                .inner
                .jumps
                .iter()
                .any(|h| h.handle.is_closed() || h.shared.lost_reason().is_some())
    }

    /// The destination this session is connected to.
    pub fn destination(&self) -> &Destination {
        &self.inner.dest
    }

    /// The fingerprint of the host key the target presented and this connection
    /// accepted, as OpenSSH prints it (`SHA256:...`): which machine this is.
    pub fn host_key(&self) -> Option<String> {
        self.inner
            .shared
            .host_key
            .lock()
            .ok()
            .and_then(|g| g.clone())
    }

    /// Why the connection ended, if it has.
    pub fn lost_reason(&self) -> Option<String> {
        self.inner.shared.lost_reason().or_else(|| {
            self.inner
                .jumps
                .iter()
                .find_map(|h| h.shared.lost_reason())
                .map(|r| format!("jump host: {r}"))
        })
    }
}

/// Connects to `dest` directly or through `via` (a direct-tcpip channel of the previous
/// hop), checks its key and authenticates.
async fn connect_one(
    dest: &Destination,
    via: Option<&Handle<Client>>,
) -> Result<Hop, ConnectError> {
    let mut files = dest.known_hosts.clone();
    files.extend(dest.global_known_hosts.iter().cloned());
    let known = KnownHosts::load(&files);
    let name = dest.known_hosts_name();
    let config = Arc::new(client::Config {
        nodelay: true,
        keepalive_interval: dest.keepalive_interval,
        keepalive_max: dest.keepalive_max,
        // Never inactivity_timeout: it kills healthy quiet commands (FINDINGS).
        inactivity_timeout: None,
        preferred: Preferred {
            kex: Cow::Borrowed(KEX_ORDER),
            key: Cow::Owned(known.preferred_algorithms(&name, &Preferred::DEFAULT.key)),
            ..Preferred::DEFAULT
        },
        ..client::Config::default()
    });
    let shared = Arc::new(Shared::default());
    let handler = Client {
        dest: dest.clone(),
        known,
        shared: shared.clone(),
    };
    // ConnectTimeout bounds the whole connect as one budget, as in ssh: name lookup,
    // every TCP try (ConnectionAttempts), the banner and the key exchange.
    let t = dest.connect_timeout;
    let deadline = tokio::time::Instant::now() + t;
    let timeout_err = |what: &str| {
        ConnectError::new(
            ConnectStage::Timeout,
            format!(
                "{what} {} timed out after {} s (ConnectTimeout)",
                dest.display(),
                t.as_secs_f64()
            ),
        )
    };
    let handshake = match via {
        None => {
            let stream = tcp_connect(dest, deadline).await?;
            tokio::time::timeout_at(deadline, client::connect_stream(config, stream, handler)).await
        }
        Some(jump) => {
            let channel = tokio::time::timeout_at(
                deadline,
                jump.channel_open_direct_tcpip(
                    dest.hostname.clone(),
                    dest.port as u32,
                    "127.0.0.1",
                    0,
                ),
            )
            .await
            .map_err(|_| timeout_err("opening a jump channel to"))?
            .map_err(|e| {
                ConnectError::new(
                    ConnectStage::Connect,
                    format!(
                        "the jump host could not reach {}:{}: {e}",
                        dest.hostname, dest.port
                    ),
                )
            })?;
            tokio::time::timeout_at(
                deadline,
                client::connect_stream(config, channel.into_stream(), handler),
            )
            .await
        }
    };
    let mut handle = match handshake {
        Err(_) => return Err(timeout_err("key exchange with")),
        Ok(Err(e)) => {
            if let Some((stage, message)) =
                shared.host_key_failure.lock().ok().and_then(|g| g.clone())
            {
                return Err(ConnectError::new(stage, message));
            }
            let why = shared.lost_reason().unwrap_or_else(|| e.to_string());
            return Err(ConnectError::new(
                ConnectStage::Connect,
                format!("SSH handshake with {} failed: {why}", dest.display()),
            ));
        }
        Ok(Ok(handle)) => handle,
    };
    auth::authenticate(&mut handle, dest).await?;
    Ok(Hop { handle, shared })
}

/// Resolves the host name (stage `Resolve`) and connects to the first address of the
/// allowed family that answers (stage `Connect`), trying `ConnectionAttempts` times
/// 1 s apart, all within `deadline`.
async fn tcp_connect(
    dest: &Destination,
    deadline: tokio::time::Instant,
) -> Result<TunedStream, ConnectError> {
    let t = dest.connect_timeout;
    let timed_out = || format!("timed out after {} s (ConnectTimeout)", t.as_secs_f64());
    let addrs: Vec<std::net::SocketAddr> = match tokio::time::timeout_at(
        deadline,
        tokio::net::lookup_host((dest.hostname.as_str(), dest.port)),
    )
    .await
    {
        Ok(Ok(a)) => a.filter(|a| dest.address_family.allows(a)).collect(),
        Ok(Err(e)) => {
            return Err(ConnectError::new(
                ConnectStage::Resolve,
                format!("cannot resolve host name `{}`: {e}", dest.hostname),
            ))
        }
        Err(_) => {
            return Err(ConnectError::new(
                ConnectStage::Resolve,
                format!("resolving `{}` {}", dest.hostname, timed_out()),
            ))
        }
    };
    let mut last = match dest.address_family {
        super::AddressFamily::Any => format!("no address for `{}`", dest.hostname),
        family => format!(
            "no address for `{}` in AddressFamily {}",
            dest.hostname,
            family.as_str()
        ),
    };
    for attempt in 0..dest.connection_attempts.max(1) {
        if attempt > 0 && !addrs.is_empty() {
            if tokio::time::Instant::now() + Duration::from_secs(1) >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for addr in &addrs {
            match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addr)).await {
                // Nagle and delayed ACKs add ~40 ms per small exchange (FINDINGS).
                Ok(Ok(stream)) => return Ok(TunedStream::new(stream)),
                Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
                Err(_) => {
                    last = format!("connecting to {addr} {}", timed_out());
                    return Err(ConnectError::new(
                        ConnectStage::Timeout,
                        format!("cannot reach {}: {last}", dest.display()),
                    ));
                }
            }
        }
    }
    Err(ConnectError::new(
        ConnectStage::Connect,
        format!("cannot reach {}: {last}", dest.display()),
    ))
}

/// Waits briefly for the event loop to record why a connection ended: the channel can
/// report its end a moment before `disconnected` runs.
pub(crate) async fn settle_lost_reason(shared: &Shared) -> Option<String> {
    for _ in 0..20 {
        if let Some(r) = shared.lost_reason() {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
