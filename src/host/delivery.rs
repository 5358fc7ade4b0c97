//! What this client remembers of the hosts that hold its shim: one empty file per (host
//! key, login user, shim hash) under `${XDG_STATE_HOME:-~/.local/state}/opmark/shims/`,
//! written once a call ran the shim there. A call to a host with such a file runs the
//! host's cached copy (the data carries only the hash); one without sends the script in
//! its first exchange, so the first call to a host costs no extra round trip
//! (docs/host-protocol.md#delivery). The file is evidence, never trust: a host that lost
//! or damaged its copy still answers `need` and is sent the script, and a file lost here
//! costs only one call that carries the script again.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::ssh::Session;

/// The directory of the files, `None` when neither XDG_STATE_HOME nor a home is known.
fn dir() -> Option<PathBuf> {
    let state = crate::paths::absolute_env("XDG_STATE_HOME")
        .or_else(|| crate::paths::home_dir().map(|h| h.join(".local/state")))?;
    Some(state.join("opmark").join("shims"))
}

/// The file for `session`'s host: named by a digest, so that the directory does not
/// list the hosts this client calls. `None` when the session names no host key (then
/// every call sends the script, as if the host were new).
fn file(session: &Session) -> Option<PathBuf> {
    let key = session.host_key()?;
    let mut h = Sha256::new();
    for part in [
        key.as_str(),
        session.destination().user.as_str(),
        crate::shim::script_sha256(),
    ] {
        h.update(part.as_bytes());
        h.update(b"\n");
    }
    Some(dir()?.join(hex::encode(h.finalize())))
}

/// Whether a call ran this build's shim on `session`'s host before, as its login user.
pub(crate) fn host_has_shim(session: &Session) -> bool {
    file(session).is_some_and(|f| f.exists())
}

/// Notes that the shim ran on `session`'s host (it keeps a copy). A file that cannot be
/// written costs the next call the script's bytes, nothing else.
pub(crate) fn remember(session: &Session) {
    let Some(path) = file(session) else { return };
    if path.exists() {
        return;
    }
    let made = path.parent().map_or(Ok(()), |d| {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
    });
    if let Err(e) = made.and_then(|()| std::fs::write(&path, b"")) {
        tracing::debug!("not remembered that the host has the shim: {e}");
    }
}
