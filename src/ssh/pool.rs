//! Connection reuse inside one process: one SSH connection per resolved destination,
//! shared by every operation to it, replaced when it dies. Where the connection comes
//! from is decided here: the per-user keeper when reuse is on (`--persist`, SPEC 15),
//! else this process connects itself, as it also does when the keeper cannot be used
//! (said once on stderr) or when only a person at this terminal could answer a prompt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::destination::Destination;
use super::session::Session;
use super::{ConnectError, ConnectStage};

/// Sessions keyed by resolved destination (user, address, port, jump path). Each session
/// runs at most `max_channels_per_host` exec channels at once; more wait their turn.
#[derive(Debug)]
pub struct Pool {
    max_channels: usize,
    /// One slot per destination; the slot's async lock makes concurrent callers share one
    /// connect instead of racing several.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Session>>>>>,
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

    /// The live session for `dest`, connecting (or reconnecting, if the previous one
    /// died) when needed.
    pub async fn session(&self, dest: &Destination) -> Result<Session, ConnectError> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.entry(dest.connection_key()).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some(s) = guard.as_ref() {
            if !s.is_closed() {
                return Ok(s.clone());
            }
            tracing::debug!("replacing dead session to {}", dest.display());
        }
        let s = match super::keeper::persist() {
            Some(_) => self.through_keeper(dest).await?,
            None => Session::connect_with_limit(dest, self.max_channels).await?,
        };
        *guard = Some(s.clone());
        Ok(s)
    }

    /// A session on the keeper's connection, or a direct one when the keeper cannot
    /// serve this caller.
    async fn through_keeper(&self, dest: &Destination) -> Result<Session, ConnectError> {
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
                Session::connect_with_limit(dest, self.max_channels).await
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
                Session::connect_with_limit(dest, self.max_channels).await
            }
            Err(KeeperError::Connect(e)) => Err(e),
        }
    }
}
