//! Connection reuse across opmark processes (docs/trust.md#the-keeper): an on-demand, per-user keeper
//! process (`opmark keeper serve`, started detached by the first `opmark` that wants a
//! connection) holds authenticated connections and opens exec channels on them for later
//! `opmark` processes, which stream the channel's bytes over a unix socket. The state
//! machine, the ledger and the verdicts stay in the calling process.
//!
//! This folder is the callers' side and what both sides share; the process is
//! [`super::keeper_server`]. Safety rules, each checked here, there or in `client`:
//! - the socket lives in a directory owned by the user with mode 0700 (a directory or
//!   socket with another owner, or open to others, is refused and reuse is off);
//! - every socket connection's peer is checked with `SO_PEERCRED`, both ways: the keeper
//!   serves only its own uid, a caller talks only to a keeper of its own uid;
//! - a connection is reused only for the same [`connection_key`]: a digest of the whole
//!   resolved destination (user, address, port, jumps, proxy command, identities, agent,
//!   known_hosts files, ssh config file) and of those files' identities (size, mtime,
//!   inode), so a changed known_hosts, key or config gets a connection of its own;
//! - the keeper exits after `--persist` without a caller, and when its socket is
//!   removed or replaced (a test's directory deleted, a newer keeper started);
//! - nothing secret crosses the socket: the destination holds paths, never key material.

pub mod client;
pub mod wire;

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::destination::Destination;

/// The shell a keeper starts on a held connection to serve requests (the host's resident
/// shim), as the host layer supplies it to [`super::keeper_server::serve`]: the keeper holds channels by
/// connection key and relays their bytes, and knows nothing of the protocol on them.
pub trait ResidentShell: Send + Sync {
    /// One start of it: the exec request and its input (`with_script`: the script itself
    /// in the input, for a host whose cache lacks it), and a reader of the new channel.
    fn start(&self, with_script: bool) -> Box<dyn ResidentStart>;
}

/// One resident start, reading its channel until that says how the start went.
pub trait ResidentStart: Send {
    /// The exec request.
    fn exec(&self) -> &str;
    /// The channel's input after the request (the channel stays open after it).
    fn data(&self) -> Vec<u8>;
    /// Takes what the channel said; an answer once that settles the start.
    fn read(&mut self, said: ChannelSaid<'_>) -> Option<StartAnswer>;
}

/// What a new resident's channel said.
#[derive(Debug, Clone, Copy)]
pub enum ChannelSaid<'a> {
    Stdout(&'a [u8]),
    Stderr(&'a [u8]),
    /// It closed.
    Closed,
}

/// How a resident's start went, as its channel said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAnswer {
    /// It serves; its process id.
    Ready(u32),
    /// The host has no good cached copy: start it again with the script.
    NeedScript,
    /// It does not serve (refused, another protocol): the keeper remembers why.
    Refused(String),
}

/// How long the keeper stays without a caller unless told (`--persist`), like a typical
/// `ControlPersist`.
pub const DEFAULT_PERSIST: Duration = Duration::from_secs(300);

static PERSIST: OnceLock<Duration> = OnceLock::new();

/// Turns reuse on for this process with idle limit `persist` (`0`: off). The CLI calls
/// it once; a process that never does (the library used directly) connects directly.
pub fn set_persist(persist: Duration) {
    let _ = PERSIST.set(persist);
}

/// The idle limit when reuse is on.
pub fn persist() -> Option<Duration> {
    PERSIST.get().copied().filter(|d| !d.is_zero())
}

/// Parses `--persist`: a duration, or a bare `0` for off.
pub fn parse_persist(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    crate::duration::parse_duration(text)
}

/// The socket's file name; carries the protocol version (see [`wire::VERSION`]).
pub(super) fn socket_name() -> String {
    format!("keeper-v{}.sock", wire::VERSION)
}

/// This process's effective uid. `/proc/self` belongs to it (opmark never makes itself
/// non-dumpable), which spares an unsafe `geteuid` call.
pub fn own_uid() -> std::io::Result<u32> {
    Ok(std::fs::metadata("/proc/self")?.uid())
}

/// The keeper's directory and the files in it.
#[derive(Debug, Clone)]
pub struct KeeperDir {
    /// The 0700 directory.
    pub dir: PathBuf,
}

impl KeeperDir {
    /// `$XDG_RUNTIME_DIR/opmark` (per-user, tmpfs, gone at logout), else
    /// `${XDG_STATE_HOME:-~/.local/state}/opmark/mux`.
    pub fn default_dir() -> Result<PathBuf, String> {
        // Relative XDG values are ignored, as the XDG spec says; without HOME the home
        // comes from the passwd entry, never the current directory.
        if let Some(run) = crate::paths::absolute_env("XDG_RUNTIME_DIR") {
            return Ok(run.join("opmark"));
        }
        let state = match crate::paths::absolute_env("XDG_STATE_HOME") {
            Some(s) => s,
            None => crate::paths::home_dir()
                .ok_or(
                    "neither XDG_RUNTIME_DIR nor HOME is set, and the passwd entry names no home",
                )?
                .join(".local/state"),
        };
        Ok(state.join("opmark").join("mux"))
    }

    /// The default place, created (0700) when missing and checked.
    pub fn open_default() -> Result<KeeperDir, String> {
        KeeperDir::open(&KeeperDir::default_dir()?)
    }

    /// `dir`, created (0700, parents as needed) when missing, then checked: a directory
    /// (not a link) owned by this user with no access for group or others.
    pub fn open(dir: &Path) -> Result<KeeperDir, String> {
        if std::fs::symlink_metadata(dir).is_err() {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
            }
        }
        check_private_dir(dir)?;
        Ok(KeeperDir {
            dir: dir.to_path_buf(),
        })
    }

    /// The socket's real path.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(socket_name())
    }

    /// The keeper's pid file (for people and test clean-up; never trusted for safety).
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("keeper.pid")
    }

    /// The lock a running keeper holds for its whole life: one keeper per directory.
    pub fn lock_file(&self) -> PathBuf {
        self.dir.join("keeper.lock")
    }

    /// Checks an existing socket file: a socket, ours, closed to others. `Ok(false)`
    /// when there is none.
    pub fn check_socket(&self) -> Result<bool, String> {
        let path = self.socket();
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let me = own_uid().map_err(|e| format!("cannot tell this process's uid: {e}"))?;
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{} is not a socket; remove it to let opmark reuse connections",
                path.display()
            ));
        }
        if meta.uid() != me {
            return Err(format!(
                "{} belongs to uid {}, not to you (uid {me}); refusing it. Remove it",
                path.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{} has mode {:04o}, open to other users; refusing it. Remove it",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
        Ok(true)
    }
}

/// A directory fit to hold the keeper's socket, or why not and how to fix it.
fn check_private_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let me = own_uid().map_err(|e| format!("cannot tell this process's uid: {e}"))?;
    if !meta.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory (a link or a file); remove it to let opmark reuse connections",
            dir.display()
        ));
    }
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to you (uid {me}); refusing to use it for the \
             connection keeper. Remove it, or set XDG_RUNTIME_DIR to a directory of yours",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} has mode {:04o}: other users could reach the connection keeper; refusing it. \
             Fix with `chmod 700 {}`",
            dir.display(),
            meta.permissions().mode() & 0o7777,
            dir.display()
        ));
    }
    Ok(())
}

/// A path to `file` in `dir` that fits in a unix socket address (108 bytes): the real
/// path when it fits, else the same file reached through `/proc/self/fd/N` of `dir`
/// opened here (`holder` keeps it open while the path is used).
pub(crate) fn short_path(
    dir: &Path,
    file: &str,
    holder: &mut Option<std::fs::File>,
) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    let full = dir.join(file);
    if full.as_os_str().len() < 100 {
        return Ok(full);
    }
    let d = std::fs::File::open(dir)?;
    let path = PathBuf::from(format!("/proc/self/fd/{}/{file}", d.as_raw_fd()));
    *holder = Some(d);
    Ok(path)
}

/// The digest that decides which callers may share a connection: the whole resolved
/// destination (jump hops included) and the identity of every file that decides how it
/// connects (known_hosts, identities, certificates, the ssh configs), so a change to any
/// of them opens a new connection instead of reusing one made under the old settings.
pub fn connection_key(dest: &Destination) -> String {
    let mut h = Sha256::new();
    h.update(b"opmark-keeper-connection\0");
    h.update(serde_json::to_vec(dest).unwrap_or_default());
    let mut files: Vec<PathBuf> = Vec::new();
    let mut add = |d: &Destination| {
        files.extend(d.known_hosts.iter().cloned());
        files.extend(d.global_known_hosts.iter().cloned());
        files.extend(d.identities.iter().cloned());
        files.extend(d.identities.iter().map(|p| {
            let mut s = p.clone().into_os_string();
            s.push(".pub");
            PathBuf::from(s)
        }));
        files.extend(d.certificate_files.iter().cloned());
    };
    add(dest);
    dest.jumps.iter().for_each(&mut add);
    match &dest.config_path {
        Some(p) => files.push(p.clone()),
        None => {
            if let Some(home) = super::config::home_dir() {
                files.push(home.join(".ssh/config"));
            }
            files.push(PathBuf::from(super::destination::SYSTEM_SSH_CONFIG));
        }
    }
    for f in files {
        h.update(f.as_os_str().as_encoded_bytes());
        h.update(b"\0");
        match std::fs::metadata(&f) {
            Ok(m) => h.update(format!(
                "{} {} {} {}\0",
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ino()
            )),
            Err(_) => h.update(b"absent\0"),
        }
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persist_zero_means_off_and_durations_parse() {
        assert_eq!(parse_persist("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_persist("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_persist("five").is_err());
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("opmark-keeper-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_directory_open_to_others_is_refused_with_the_fix() {
        let d = scratch("mode");
        let place = KeeperDir::open(&d).expect("created 0700");
        assert_eq!(
            std::fs::metadata(&place.dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = KeeperDir::open(&d).unwrap_err();
        assert!(err.contains("0755") && err.contains("chmod 700"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_plain_file_in_place_of_the_socket_is_refused() {
        let d = scratch("sock");
        let place = KeeperDir::open(&d).unwrap();
        assert!(!place.check_socket().unwrap());
        std::fs::write(place.socket(), b"").unwrap();
        assert!(place.check_socket().unwrap_err().contains("not a socket"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn long_directories_are_reached_through_proc() {
        let d = scratch(&"x".repeat(120));
        std::fs::create_dir_all(&d).unwrap();
        let mut holder = None;
        let p = short_path(&d, "s.sock", &mut holder).unwrap();
        assert!(p.starts_with("/proc/self/fd/") && holder.is_some(), "{p:?}");
        std::fs::write(&p, b"x").unwrap();
        assert!(d.join("s.sock").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
