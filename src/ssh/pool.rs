//! Connection reuse inside one process: one SSH connection per resolved destination,
//! shared by every operation to it, replaced when it dies. Where the connection comes
//! from is decided here: the per-user keeper when reuse is on (`--persist`, docs/trust.md#the-keeper),
//! else this process connects itself, as it also does when the keeper cannot be used
//! (said once on stderr) or when only a person at this terminal could answer a prompt.
//! A connect may start early ([`Pool::prewarm`]) so that the handshake overlaps the
//! ledger's durable writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::destination::Destination;
use super::error::{ConnectError, ConnectStage};
use super::session::Session;

/// What a destination's slot holds.
#[derive(Debug, Default)]
enum Pooled {
    #[default]
    Empty,
    Ready(Session),
    /// A prewarm's connect failed: the next caller gets this error instead of waiting for
    /// a second connect to fail the same way (a dead host would cost its timeout twice).
    Failed(ConnectError),
}

/// Sessions keyed by resolved destination (user, address, port, jump path). Each session
/// runs at most `max_channels_per_host` exec channels at once; more wait their turn.
#[derive(Debug)]
pub struct Pool {
    max_channels: usize,
    /// One slot per destination; the slot's async lock makes concurrent callers share one
    /// connect instead of racing several.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Pooled>>>>,
}

impl Pool {
    /// A pool allowing `max_channels_per_host` concurrent channels per connection
    /// (sshd's default `MaxSessions` is 10).
    pub fn new(max_channels_per_host: usize) -> Self {
        Pool {
            max_channels: max_channels_per_host.max(1),
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, dest: &Destination) -> Arc<tokio::sync::Mutex<Pooled>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.entry(dest.connection_key()).or_default().clone()
    }

    /// Starts connecting to `dest` in the background, when no session to it is up or
    /// being made, so that a later [`Pool::session`] finds it ready (or its error). A
    /// connection sends nothing that runs: callers may prewarm before their ledger
    /// writes are durable, never dispatch before. Needs a tokio runtime; without one it
    /// does nothing.
    pub fn prewarm(&self, dest: &Destination) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut guard) = self.slot(dest).try_lock_owned() else {
            return;
        };
        if matches!(&*guard, Pooled::Ready(s) if !s.is_closed()) {
            return;
        }
        let dest = dest.clone();
        let max_channels = self.max_channels;
        runtime.spawn(async move {
            *guard = match open(&dest, max_channels).await {
                Ok(s) => Pooled::Ready(s),
                Err(e) => Pooled::Failed(e),
            };
        });
    }

    /// The live session for `dest`, connecting (or reconnecting, if the previous one
    /// died) when needed.
    pub async fn session(&self, dest: &Destination) -> Result<Session, ConnectError> {
        let slot = self.slot(dest);
        let mut guard = slot.lock().await;
        match std::mem::take(&mut *guard) {
            Pooled::Ready(s) if !s.is_closed() => {
                *guard = Pooled::Ready(s.clone());
                return Ok(s);
            }
            Pooled::Ready(_) => tracing::debug!("replacing dead session to {}", dest.display()),
            Pooled::Failed(e) => return Err(e),
            Pooled::Empty => {}
        }
        let s = open(dest, self.max_channels).await?;
        *guard = Pooled::Ready(s.clone());
        Ok(s)
    }
}

/// A new session to `dest`: on the keeper's connection when reuse is on, else direct.
async fn open(dest: &Destination, max_channels: usize) -> Result<Session, ConnectError> {
    match super::keeper::persist() {
        Some(_) => through_keeper(dest, max_channels).await,
        None => direct(dest, max_channels).await,
    }
}

/// A connection of this process's own, said at `-v` as the keeper's is.
async fn direct(dest: &Destination, max_channels: usize) -> Result<Session, ConnectError> {
    tracing::info!("connecting to {} directly", dest.display());
    let session = Session::connect_with_limit(dest, max_channels).await;
    match &session {
        Ok(s) => tracing::info!(
            "connected to {} directly, host key {}",
            dest.display(),
            s.host_key().as_deref().unwrap_or("unknown")
        ),
        Err(e) => tracing::info!("could not connect to {}: {e}", dest.display()),
    }
    session
}

/// A session on the keeper's connection, or a direct one when the keeper cannot serve
/// this caller.
async fn through_keeper(dest: &Destination, max_channels: usize) -> Result<Session, ConnectError> {
    use super::keeper::client::{KeeperError, Remote};
    match Remote::connect(dest).await {
        Ok(remote) => Ok(Session::through_keeper(remote)),
        Err(KeeperError::Unavailable(why)) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                crate::logging::say(format_args!(
                    "opmark: connection reuse is off for this run: {}",
                    why.0
                ))
            });
            direct(dest, max_channels).await
        }
        // The keeper asks nobody anything: no passphrase prompt, no SSH_ASKPASS (it
        // keeps none of the caller's environment but paths), no host key question.
        // This process may be able to, so an authentication it refused is tried here
        // as it would have been without reuse; a host key only when a person is at
        // this terminal to answer (otherwise the answer would be the same).
        Err(KeeperError::Connect(e))
            if e.stage == ConnectStage::Auth
                || (e.stage == ConnectStage::HostKey && super::auth::may_prompt(dest)) =>
        {
            direct(dest, max_channels).await
        }
        Err(KeeperError::Connect(e)) => Err(e),
    }
}
