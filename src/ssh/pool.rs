//! Connection reuse inside one process: one SSH connection per resolved destination,
//! shared by every operation to it, replaced when it dies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::destination::Destination;
use super::session::Session;
use super::ConnectError;

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
        let s = Session::connect_with_limit(dest, self.max_channels).await?;
        *guard = Some(s.clone());
        Ok(s)
    }
}
