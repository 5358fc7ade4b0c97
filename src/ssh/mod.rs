//! The SSH transport on russh: host resolution from ssh config, TCP, ProxyJump or
//! ProxyCommand, host key and host certificate checks against known_hosts,
//! authentication (keys, agent, user certificates), exec channels with streamed output,
//! keepalive-based loss detection, a per-host connection pool, and the per-user keeper
//! that lets later processes reuse a connection (`keeper` for the callers' side,
//! `keeper_server` for the process itself; docs/trust.md#the-keeper).
//!
//! Every failure before the exec request leaves is a [`ConnectError`] (boundary
//! `not_sent`); [`Session::exec`] says whether the request left ([`ExecError`]); a lost
//! connection mid-command is an [`ExecEvent::Lost`], distinct from a clean close.

pub mod algorithms;
pub mod auth;
pub mod config;
pub mod destination;
mod error;
pub mod exec;
mod exec_event;
pub mod keeper;
pub mod keeper_server;
pub mod known_hosts;
mod pattern;
pub mod pool;
pub mod session;
mod socket;

pub use destination::{
    check_destination, resolve, resolve_route, AddressFamily, Destination, HostSpec, Route,
    StrictMode,
};
pub use error::{ConnectError, ConnectStage};
pub use exec::Exec;
pub use exec_event::{ExecError, ExecEvent};
pub use pool::Pool;
pub use session::Session;

#[cfg(test)]
pub(crate) mod test_env {
    //! What the unit tests of `config` and `destination` share.

    /// A variable this process already has, holding a plain absolute path: read, never
    /// set, because `set_var` races every other test thread that reads the environment.
    pub fn a_set_variable_holding_a_path() -> (String, String) {
        std::env::vars()
            .filter(|(k, v)| {
                k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && v.len() > 1
                    && v.starts_with('/')
                    && !v.ends_with('/')
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
            })
            .min()
            .expect(
                "a test process has some variable holding a path (HOME, PWD, CARGO_MANIFEST_DIR)",
            )
    }
}
