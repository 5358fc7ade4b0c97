//! Whether a target listens: a free loopback port to give it, and the wait for its
//! first TCP accept (for a target whose ssh handshake is expected to fail).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::error::LabError;
use super::target::Target;

/// How long a target may take from spawn to answering `ssh true`. Generous: CI runs many
/// tests at once on two cores.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until something accepts TCP on the target's address.
pub(super) fn wait_listening(target: &Target, deadline: Instant) -> Result<(), LabError> {
    let addr = std::net::SocketAddr::new(target.addr, target.port);
    loop {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(target.start_failed("not listening before the deadline".into()));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}
/// A port on 127.0.0.1 that was free a moment ago.
pub(super) fn free_port() -> Result<u16, LabError> {
    let listener =
        std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|source| LabError::Io {
            path: PathBuf::from("127.0.0.1:0"),
            source,
        })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| LabError::Io {
            path: PathBuf::from("127.0.0.1:0"),
            source,
        })
}
