//! One authenticated SSH connection (directly, through ProxyJump hops, or over a
//! ProxyCommand's stdio): connecting with bounded timeouts, the host key or host
//! certificate check (with ssh's `ask` question on a terminal), keepalives, and
//! remembering why it was lost. A session may also stand for a connection the keeper
//! holds (`ssh::keeper`): the same interface, another process's connection.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, DisconnectReason, Handle};
use russh::keys::PublicKeyOrCertificate;
use russh::{kex, Preferred};
use tokio::sync::Semaphore;

use super::auth;
use super::destination::{Destination, StrictMode};
use super::error::{ConnectError, ConnectStage};
use super::known_hosts::{self, fingerprint, CertCheck, KeyCheck, KnownHosts};
use super::socket::TunedStream;

/// Channels one connection runs at once unless told otherwise: sshd's default
/// `MaxSessions` is 10, and it refuses the 11th channel.
pub const DEFAULT_MAX_CHANNELS: usize = 10;

/// Key exchange order: curve25519 first (fast, ~35 µs), then the NIST curves, DH last
/// because russh's DH is very slow (group16 ~100 ms CPU, group-exchange ~630 ms; docs/findings.md#key-exchange-cost).
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
pub(crate) struct ConnState {
    /// Why the host key was refused, set by `check_server_key`.
    pub(crate) host_key_failure: Mutex<Option<(ConnectStage, String)>>,
    /// Why the connection ended, set by `disconnected`.
    pub(crate) lost: Mutex<Option<String>>,
    /// The fingerprint (`SHA256:...`) of the host key this connection accepted.
    pub(crate) host_key: Mutex<Option<String>>,
    /// A person is being asked about the host key right now.
    pub(crate) prompting: std::sync::atomic::AtomicBool,
    /// Time spent waiting for that person, which ConnectTimeout does not count.
    pub(crate) prompt_spent: Mutex<Duration>,
}

impl ConnState {
    pub(crate) fn lost_reason(&self) -> Option<String> {
        self.lost.lock().ok().and_then(|g| g.clone())
    }
}

/// The russh event handler: checks the host key, records disconnect reasons.
#[derive(Debug)]
pub(crate) struct Client {
    dest: Destination,
    known: KnownHosts,
    shared: Arc<ConnState>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            PublicKeyOrCertificate::Certificate(cert) => match self.verify_certificate(cert) {
                Ok(Some(fp)) => {
                    if let Ok(mut slot) = self.shared.host_key.lock() {
                        *slot = Some(fp);
                    }
                    return Ok(true);
                }
                // No CA line trusts its signer: the plain key inside must stand on its
                // own in known_hosts, as OpenSSH retries it ("No matching CA found").
                Ok(None) => russh::keys::PublicKey::new(cert.public_key().clone(), ""),
                Err(message) => {
                    self.fail(message);
                    return Ok(false);
                }
            },
        };
        match self.verify(&key).await {
            Ok(()) => {
                if let Ok(mut slot) = self.shared.host_key.lock() {
                    *slot = Some(fingerprint(&key));
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

    /// A host certificate: `Ok(Some(fingerprint))` when an `@cert-authority` line for this
    /// host trusts its signer and it is valid (the fingerprint is the certified host
    /// key's, which identifies the machine); `Ok(None)` when no such line holds its
    /// signer; an error when it is revoked or not acceptable.
    fn verify_certificate(
        &self,
        cert: &russh::keys::Certificate,
    ) -> Result<Option<String>, String> {
        let name = self.dest.known_hosts_name();
        let principal = self
            .dest
            .host_key_alias
            .clone()
            .unwrap_or_else(|| self.dest.hostname.clone());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let key = russh::keys::PublicKey::new(cert.public_key().clone(), "");
        let fp = fingerprint(&key);
        let ca_fp = cert
            .signature_key()
            .fingerprint(russh::keys::HashAlg::Sha256);
        match self.known.check_certificate(&name, &principal, cert, now) {
            CertCheck::Trusted(at) => {
                tracing::debug!(
                    "host certificate for {name} (key {fp}, id \"{}\") signed by CA {ca_fp} trusted at {at}",
                    cert.key_id()
                );
                Ok(Some(fp))
            }
            CertCheck::Revoked(at) => Err(format!(
                "the host certificate of {name} (key {fp}, CA {ca_fp}) uses a key marked @revoked \
                 at {at}; refusing to connect"
            )),
            CertCheck::Invalid(why) => Err(format!(
                "the host certificate of {name} (key {fp}, CA {ca_fp}) is refused: {why}"
            )),
            CertCheck::NoAuthority => {
                tracing::debug!(
                    "no @cert-authority line for {name} trusts CA {ca_fp}; checking the plain key"
                );
                Ok(None)
            }
        }
    }

    /// The OpenSSH rules: a known key passes, a revoked or changed key never does, an
    /// unknown key passes only with `accept-new` (learned), `ask` answered yes at the
    /// terminal (learned), or an explicit `no`.
    async fn verify(&self, key: &russh::keys::PublicKey) -> Result<(), String> {
        let name = self.dest.known_hosts_name();
        let kind = key.algorithm().as_str().to_string();
        let fp = fingerprint(key);
        match self.known.check(&name, key) {
            KeyCheck::Trusted(at) => {
                tracing::debug!("host key {kind} {fp} for {name} matches {at}");
                Ok(())
            }
            KeyCheck::Revoked(at) => Err(format!(
                "the {kind} host key {fp} of {name} is marked @revoked at {at}; refusing to connect"
            )),
            KeyCheck::Changed { expected } => Err(format!(
                "REMOTE HOST IDENTIFICATION HAS CHANGED for {name}: it offered {kind} key {fp}, \
                 but a different {kind} key is recorded at {expected}. Someone could be \
                 intercepting the connection, or the host key was replaced. If you have verified \
                 the new key, remove the old one with `ssh-keygen -R '{name}' -f {}`",
                expected.path.display()
            )),
            KeyCheck::Unknown { others } => {
                if !others.is_empty() && self.dest.strict != StrictMode::No {
                    let at: Vec<String> = others.iter().map(|l| l.to_string()).collect();
                    return Err(format!(
                        "{name} offered a {kind} host key ({fp}) but is known by other key types \
                         (at {}); refusing a key type switch. Verify the new key and add it to \
                         known_hosts",
                        at.join(", ")
                    ));
                }
                let refuse = |extra: &str| {
                    format!(
                        "no host key is known for {name} ({kind} {fp}) and strict checking is on{extra}. \
                         Verify the fingerprint, then add the key to {} (ssh-keyscan) or set \
                         `StrictHostKeyChecking accept-new`",
                        self.dest
                            .known_hosts
                            .first()
                            .map(|p| p.display().to_string())
                            .unwrap_or_else(|| "a UserKnownHostsFile".into())
                    )
                };
                match self.dest.strict {
                    StrictMode::Yes => Err(refuse("")),
                    StrictMode::Ask if !auth::may_prompt(&self.dest) => Err(refuse(
                        " (StrictHostKeyChecking ask, but nobody can answer: no terminal on \
                         stdin, BatchMode, or opmark mcp)",
                    )),
                    StrictMode::Ask => {
                        if self.ask_user(&name, key).await {
                            self.learn(&name, key)
                        } else {
                            Err(format!(
                                "the {kind} host key {fp} of {name} was not accepted at the prompt"
                            ))
                        }
                    }
                    StrictMode::AcceptNew => self.learn(&name, key),
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

    /// Appends an accepted unknown key to the first UserKnownHostsFile, as ssh does.
    fn learn(&self, name: &str, key: &russh::keys::PublicKey) -> Result<(), String> {
        let kind = key.algorithm().as_str().to_string();
        let fp = fingerprint(key);
        let Some(file) = self.dest.known_hosts.first() else {
            return Err(format!(
                "cannot learn the host key of {name}: UserKnownHostsFile is none"
            ));
        };
        known_hosts::learn(file, name, key, self.dest.hash_known_hosts).map_err(|e| {
            format!(
                "cannot add the host key of {name} to {}: {e}",
                file.display()
            )
        })?;
        tracing::warn!(
            "permanently added {kind} host key {fp} for {name} to {}",
            file.display()
        );
        Ok(())
    }

    /// Asks at the terminal, in ssh's words, whether to trust an unknown key. The time
    /// spent waiting is kept out of ConnectTimeout (see `handshake_within`).
    async fn ask_user(&self, name: &str, key: &russh::keys::PublicKey) -> bool {
        use russh::keys::Algorithm;
        let kind = match key.algorithm() {
            Algorithm::Ed25519 => "ED25519".to_string(),
            Algorithm::Ecdsa { .. } => "ECDSA".to_string(),
            Algorithm::Rsa { .. } => "RSA".to_string(),
            other => other.as_str().to_ascii_uppercase(),
        };
        let fp = fingerprint(key);
        let question = format!(
            "The authenticity of host '{name}' can't be established.\n\
             {kind} key fingerprint is {fp}.\n\
             This key is not known by any other names.\n\
             Are you sure you want to continue connecting (yes/no/[fingerprint])? "
        );
        let started = std::time::Instant::now();
        self.shared
            .prompting
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let yes = tokio::task::spawn_blocking(move || auth::confirm_on_tty(&question, &fp))
            .await
            .unwrap_or(false);
        if let Ok(mut spent) = self.shared.prompt_spent.lock() {
            *spent += started.elapsed();
        }
        self.shared
            .prompting
            .store(false, std::sync::atomic::Ordering::Relaxed);
        yes
    }
}

/// One hop's live connection.
struct LiveHop {
    handle: Handle<Client>,
    shared: Arc<ConnState>,
    /// The ProxyCommand carrying this hop, killed when the hop is dropped.
    proxy: Option<tokio::process::Child>,
}

pub(crate) struct Inner {
    /// The target's connection (last hop).
    pub(crate) handle: Handle<Client>,
    pub(crate) shared: Arc<ConnState>,
    /// Jump connections, kept alive as long as the target's.
    jumps: Vec<LiveHop>,
    /// The target's ProxyCommand, if any: held so that it lives exactly as long as the
    /// session (kill on drop).
    _proxy: Option<tokio::process::Child>,
    /// Bounds concurrent channels on this connection.
    pub(crate) channels: Arc<Semaphore>,
    /// The bound itself, for `opmark keeper status`.
    pub(crate) max_channels: usize,
    pub(crate) dest: Destination,
}

/// An authenticated connection to one destination. Cheap to clone; channels are
/// opened per [`Session::exec`], at most `max_channels` at once.
///
/// The connection is either this process's own or one held by the per-user connection
/// keeper (`ssh::keeper`, docs/trust.md#the-keeper); callers cannot tell them apart, and need not: both
/// report a lost connection the same way.
#[derive(Clone)]
pub struct Session {
    pub(crate) kind: Carrier,
}

/// Whose connection a session is.
#[derive(Clone)]
pub(crate) enum Carrier {
    /// This process's own russh connection.
    Direct(Arc<Inner>),
    /// A connection held by the keeper, reached over its unix socket.
    Keeper(Arc<super::keeper::client::Remote>),
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("dest", &self.destination().display())
            .field("via_keeper", &self.via_keeper())
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
        let mut jumps: Vec<LiveHop> = Vec::new();
        for hop in &dest.jumps {
            let via = jumps.last().map(|h| &h.handle);
            let hop_conn = connect_one(hop, via).await.map_err(|e| ConnectError {
                stage: e.stage,
                message: format!("jump host {}: {}", hop.display(), e.message),
            })?;
            jumps.push(hop_conn);
        }
        let target = connect_one(dest, jumps.last().map(|h| &h.handle)).await?;
        let max_channels = max_channels.max(1);
        Ok(Session {
            kind: Carrier::Direct(Arc::new(Inner {
                handle: target.handle,
                shared: target.shared,
                jumps,
                _proxy: target.proxy,
                channels: Arc::new(Semaphore::new(max_channels)),
                max_channels,
                dest: dest.clone(),
            })),
        })
    }

    /// A session on a connection the keeper holds.
    pub(crate) fn through_keeper(remote: super::keeper::client::Remote) -> Session {
        Session {
            kind: Carrier::Keeper(Arc::new(remote)),
        }
    }

    /// True when the connection is the keeper's, not this process's own.
    pub fn via_keeper(&self) -> bool {
        matches!(self.kind, Carrier::Keeper(_))
    }

    /// True once the connection (or one of its jump hops) has ended; a pool replaces it.
    pub fn is_closed(&self) -> bool {
        match &self.kind {
            Carrier::Direct(inner) => {
                inner.handle.is_closed()
                    || inner.shared.lost_reason().is_some()
                    || inner
                        .jumps
                        .iter()
                        .any(|h| h.handle.is_closed() || h.shared.lost_reason().is_some())
            }
            Carrier::Keeper(remote) => remote.lost_reason().is_some(),
        }
    }

    /// The destination this session is connected to.
    pub fn destination(&self) -> &Destination {
        match &self.kind {
            Carrier::Direct(inner) => &inner.dest,
            Carrier::Keeper(remote) => remote.destination(),
        }
    }

    /// The fingerprint of the host key the target presented and this connection
    /// accepted, as OpenSSH prints it (`SHA256:...`): which machine this is.
    pub fn host_key(&self) -> Option<String> {
        match &self.kind {
            Carrier::Direct(inner) => inner.shared.host_key.lock().ok().and_then(|g| g.clone()),
            Carrier::Keeper(remote) => remote.host_key(),
        }
    }

    /// Why the connection ended, if it has.
    pub fn lost_reason(&self) -> Option<String> {
        match &self.kind {
            Carrier::Direct(inner) => inner.shared.lost_reason().or_else(|| {
                inner
                    .jumps
                    .iter()
                    .find_map(|h| h.shared.lost_reason())
                    .map(|r| format!("jump host: {r}"))
            }),
            Carrier::Keeper(remote) => remote.lost_reason(),
        }
    }

    /// Exec channels open on this connection now and the most it opens at once (the
    /// keeper's status); `None` for a keeper session.
    pub(crate) fn channel_use(&self) -> Option<(usize, usize)> {
        match &self.kind {
            Carrier::Direct(inner) => Some((
                inner.max_channels - inner.channels.available_permits(),
                inner.max_channels,
            )),
            Carrier::Keeper(_) => None,
        }
    }
}

/// russh's preferred lists for `dest`: opmark's defaults, or exactly what the config's
/// `KexAlgorithms`, `HostKeyAlgorithms`, `Ciphers` and `MACs` chose (already narrowed to
/// names russh implements, in the config's order; see `ssh::algorithms`).
fn preferred(dest: &Destination, known: &KnownHosts, name: &str) -> Preferred {
    let chosen = &dest.algorithms;
    let kex = match &chosen.kex {
        None => Cow::Borrowed(KEX_ORDER),
        Some(list) => {
            let mut v: Vec<kex::Name> = list
                .iter()
                .filter_map(|n| kex::Name::try_from(n.as_str()).ok())
                .collect();
            v.push(kex::EXTENSION_SUPPORT_AS_CLIENT);
            v.push(kex::EXTENSION_OPENSSH_STRICT_KEX_AS_CLIENT);
            Cow::Owned(v)
        }
    };
    // Certificates are asked for only where an @cert-authority line can vouch for one;
    // elsewhere a certificate would only hide the plain key known_hosts holds.
    let authority = known.has_authority_for(name);
    // russh's defaults end in `ssh-rsa` (SHA-1 signatures), which ssh 9.2 no longer asks
    // for unless a config adds it: opmark's defaults are ssh's.
    let defaults: Vec<russh::keys::Algorithm> = Preferred::DEFAULT
        .key
        .iter()
        .filter(|a| !matches!(a, russh::keys::Algorithm::Rsa { hash: None }))
        .cloned()
        .collect();
    let (key, host_key_certificates) = match &chosen.host_key {
        None => (
            Cow::Owned(known.preferred_algorithms(name, &defaults)),
            if authority {
                Cow::Owned(defaults.clone())
            } else {
                Cow::Borrowed(&[][..])
            },
        ),
        // A pin is taken as written, in its order (as ssh: no known_hosts reordering).
        Some(list) => {
            let parse = |n: &str| n.parse::<russh::keys::Algorithm>().ok();
            let plain: Vec<_> = list
                .iter()
                .filter(|n| !n.ends_with("-cert-v01@openssh.com"))
                .filter_map(|n| parse(n))
                .collect();
            let certs: Vec<_> = list
                .iter()
                .filter_map(|n| n.strip_suffix("-cert-v01@openssh.com"))
                .filter_map(parse)
                .collect();
            (
                Cow::Owned(plain),
                if authority {
                    Cow::Owned(certs)
                } else {
                    Cow::Borrowed(&[][..])
                },
            )
        }
    };
    let cipher = match &chosen.ciphers {
        None => Preferred::DEFAULT.cipher,
        Some(list) => Cow::Owned(
            list.iter()
                .filter_map(|n| russh::cipher::Name::try_from(n.as_str()).ok())
                .collect(),
        ),
    };
    let mac = match &chosen.macs {
        None => Preferred::DEFAULT.mac,
        Some(list) => Cow::Owned(
            list.iter()
                .filter_map(|n| russh::mac::Name::try_from(n.as_str()).ok())
                .collect(),
        ),
    };
    Preferred {
        kex,
        key,
        host_key_certificates,
        cipher,
        mac,
        ..Preferred::DEFAULT
    }
}

/// Connects to `dest` directly or through `via` (a direct-tcpip channel of the previous
/// hop), checks its key and authenticates.
async fn connect_one(
    dest: &Destination,
    via: Option<&Handle<Client>>,
) -> Result<LiveHop, ConnectError> {
    let mut files = dest.known_hosts.clone();
    files.extend(dest.global_known_hosts.iter().cloned());
    let known = KnownHosts::load(&files);
    let name = dest.known_hosts_name();
    let config = Arc::new(client::Config {
        nodelay: true,
        keepalive_interval: dest.keepalive_interval,
        keepalive_max: dest.keepalive_max,
        // Never inactivity_timeout: it kills healthy quiet commands (docs/findings.md#keepalives-detect-a-dead-link).
        inactivity_timeout: None,
        preferred: preferred(dest, &known, &name),
        // Two round trips less per cold connection, both options of the vendored russh
        // (Cargo.toml, [patch.crates-io]; docs/findings.md#speed): the first auth request
        // rides behind the service request, and a key held here is signed at once rather
        // than queried first. A server that refuses the signed request answers as it
        // would the query, and the next key is tried (ssh::auth).
        pipeline_auth: true,
        publickey_without_query: true,
        ..client::Config::default()
    });
    let shared = Arc::new(ConnState::default());
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
    let mut proxy = None;
    let handshake = match via {
        None if dest.proxy_command.is_some() => {
            let (child, stream) = spawn_proxy(dest)?;
            proxy = Some(child);
            handshake_within(
                deadline,
                &shared,
                client::connect_stream(config, stream, handler),
            )
            .await
        }
        None => {
            let stream = tcp_connect(dest, deadline).await?;
            handshake_within(
                deadline,
                &shared,
                client::connect_stream(config, stream, handler),
            )
            .await
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
            handshake_within(
                deadline,
                &shared,
                client::connect_stream(config, channel.into_stream(), handler),
            )
            .await
        }
    };
    let mut handle = match handshake {
        None => return Err(timeout_err("key exchange with")),
        Some(Err(e)) => {
            if let Some((stage, message)) =
                shared.host_key_failure.lock().ok().and_then(|g| g.clone())
            {
                return Err(ConnectError::new(stage, message));
            }
            if let (Some(child), Some(pc)) = (proxy.as_mut(), dest.proxy_command.as_ref()) {
                return Err(proxy_failure(child, pc, &dest.display(), &e.to_string()).await);
            }
            let why = shared.lost_reason().unwrap_or_else(|| e.to_string());
            return Err(ConnectError::new(
                ConnectStage::Connect,
                format!("SSH handshake with {} failed: {why}", dest.display()),
            ));
        }
        Some(Ok(handle)) => handle,
    };
    auth::authenticate(&mut handle, dest).await?;
    Ok(LiveHop {
        handle,
        shared,
        proxy,
    })
}

/// Runs the banner and key exchange until `deadline`, not counting the time a person
/// spends answering the host key question (`StrictHostKeyChecking ask`): ssh's
/// ConnectTimeout does not run while it waits for the user either. `None` on timeout.
async fn handshake_within<F: std::future::Future>(
    deadline: tokio::time::Instant,
    shared: &ConnState,
    handshake: F,
) -> Option<F::Output> {
    tokio::pin!(handshake);
    let mut until = deadline;
    loop {
        match tokio::time::timeout_at(until, &mut handshake).await {
            Ok(v) => return Some(v),
            Err(_) if shared.prompting.load(std::sync::atomic::Ordering::Relaxed) => {
                until = tokio::time::Instant::now() + Duration::from_millis(200);
            }
            Err(_) => {
                let spent = shared.prompt_spent.lock().map(|g| *g).unwrap_or_default();
                let extended = deadline + spent;
                if spent.is_zero() || extended <= tokio::time::Instant::now() {
                    return None;
                }
                until = extended;
            }
        }
    }
}

/// Starts `ProxyCommand` as ssh does (`exec` through the shell, so the command itself is
/// the child and is what gets killed), with its stdin/stdout as the transport. Its
/// stderr is opmark's, so the proxy's own complaints reach the user as under ssh.
fn spawn_proxy(
    dest: &Destination,
) -> Result<
    (
        tokio::process::Child,
        tokio::io::Join<tokio::process::ChildStdout, tokio::process::ChildStdin>,
    ),
    ConnectError,
> {
    let pc = dest
        .proxy_command
        .as_ref()
        .ok_or_else(|| ConnectError::new(ConnectStage::Config, "no ProxyCommand"))?;
    tracing::debug!("ProxyCommand for {}: {}", dest.display(), pc.command);
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec {}", pc.command))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            ConnectError::new(
                ConnectStage::Connect,
                format!("{}: cannot start ProxyCommand with /bin/sh: {e}", pc.origin),
            )
        })?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(ConnectError::new(
            ConnectStage::Connect,
            format!("{}: ProxyCommand started without pipes", pc.origin),
        ));
    };
    Ok((child, tokio::io::join(stdout, stdin)))
}

/// Why the SSH handshake over a ProxyCommand failed. The proxy usually exited: exit 126
/// or 127 means the shell could not run the command at all, a mistake in the config that
/// no retry fixes (stage `Config`, exit 246); any other end is a connect failure (the
/// proxy could not reach the host this time), retryable like a refused TCP connect.
async fn proxy_failure(
    child: &mut tokio::process::Child,
    pc: &super::destination::ProxyCommand,
    shown: &str,
    why: &str,
) -> ConnectError {
    // The proxy's stdout closes a moment before its exit status is collectable.
    let status = tokio::time::timeout(Duration::from_secs(1), child.wait())
        .await
        .ok()
        .and_then(|r| r.ok());
    match status.and_then(|s| s.code()) {
        Some(code @ (126 | 127)) => ConnectError::new(
            ConnectStage::Config,
            format!(
                "{}: ProxyCommand `{}` could not run (exit {code}: {}); fix the command in \
                 the config",
                pc.origin,
                pc.command,
                if code == 127 {
                    "command not found"
                } else {
                    "not executable"
                }
            ),
        ),
        Some(code) => ConnectError::new(
            ConnectStage::Connect,
            format!(
                "ProxyCommand `{}` ({}) exited with status {code} before the SSH handshake \
                 with {shown} finished: {why}",
                pc.command, pc.origin
            ),
        ),
        None => ConnectError::new(
            ConnectStage::Connect,
            format!(
                "SSH handshake with {shown} over ProxyCommand `{}` ({}) failed: {why}",
                pc.command, pc.origin
            ),
        ),
    }
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
        super::destination::AddressFamily::Any => format!("no address for `{}`", dest.hostname),
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
                // Nagle and delayed ACKs add ~40 ms per small exchange (docs/findings.md#nagle-and-delayed-acks).
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
pub(crate) async fn settle_lost_reason(shared: &ConnState) -> Option<String> {
    for _ in 0..20 {
        if let Some(r) = shared.lost_reason() {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
