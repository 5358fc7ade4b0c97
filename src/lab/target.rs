//! One lab target: the sshd it runs, the directory it owns, its host keys and its names
//! (`<lab id>-targetN`, and `targetN` inside its own lab).

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::LabError;
use super::files::{log_tail, read};
use super::proc;

/// Host key types every target gets, and the file names of their private keys.
pub(crate) const HOST_KEYS: &[(&str, &str)] = &[
    ("ed25519", "ssh_host_ed25519_key"),
    ("ecdsa", "ssh_host_ecdsa_key"),
    ("rsa", "ssh_host_rsa_key"),
];

/// One target: an sshd and the directory it owns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// ssh_config alias, unique per lab (`<lab id>-target1`...; `target1`... in labs
    /// made before lab ids). See [`Target::short_name`].
    pub alias: String,
    /// Address sshd listens on.
    pub addr: IpAddr,
    /// Port sshd listens on.
    pub port: u16,
    /// Login user (the user who started the lab).
    pub user: String,
    /// XDG_STATE_HOME of every command run on this target; markers live in `<it>/opmark`.
    pub state_home: PathBuf,
    /// HOME of every command run on this target (an empty directory of its own).
    pub home: PathBuf,
    /// Network namespace name, for netns placement.
    pub netns: Option<String>,
    /// sshd's log file (`-E`).
    pub log: PathBuf,
    /// The target's directory.
    pub dir: PathBuf,
    /// Target-side veth name (netns placement), used by cut/restore.
    pub(super) ns_if: Option<String>,
    /// Host-side veth name (netns placement), deleted on stop.
    pub(super) host_if: Option<String>,
    /// Whether the target declares itself disposable to the host shim, which then accepts
    /// a marker root a reboot erases. True for every lab target unless a test turns it
    /// off with [`Lab::set_disposable`](super::Lab::set_disposable) to play a real host.
    #[serde(default = "yes")]
    pub disposable: bool,
}

fn yes() -> bool {
    true
}

impl Target {
    /// `targetN`: the alias without the lab id, also matched by the lab's ssh_config.
    pub fn short_name(&self) -> &str {
        short_of(&self.alias)
    }

    /// Is `name` this target's alias or its short name?
    pub fn is_named(&self, name: &str) -> bool {
        self.alias == name || self.short_name() == name
    }

    /// The host marker root commands on this target use: `<state_home>/opmark`.
    pub fn marker_root(&self) -> PathBuf {
        self.state_home.join("opmark")
    }

    /// The known_hosts host pattern: `[addr]:port`, or `addr` for port 22.
    pub fn known_hosts_host(&self) -> String {
        if self.port == 22 {
            self.addr.to_string()
        } else {
            format!("[{}]:{}", self.addr, self.port)
        }
    }

    /// The target's sshd_config.
    pub fn sshd_config(&self) -> PathBuf {
        self.dir.join("sshd_config")
    }

    /// The pid file of the target's listening sshd.
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("sshd.pid")
    }

    /// The authorized_keys file sshd reads for this target.
    pub fn authorized_keys(&self) -> PathBuf {
        self.dir.join("authorized_keys")
    }

    /// The pid of the listening sshd, when it runs.
    pub fn sshd_pid(&self) -> Option<i32> {
        // Checked by name too: after a crash or reboot the pid may belong to another program.
        proc::read_pid_file(&self.pid_file())
            .filter(|&p| proc::info(p).is_some_and(|i| i.comm.starts_with("sshd")))
    }

    /// The target's public host keys, one `TYPE BASE64` per entry.
    pub fn host_public_keys(&self) -> Result<Vec<String>, LabError> {
        HOST_KEYS
            .iter()
            .map(|(_, file)| {
                let path = self.dir.join(file).with_extension("pub");
                let text = read(&path)?;
                Ok(text
                    .split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" "))
            })
            .collect()
    }

    /// The `SHA256:` fingerprints of the target's host keys, as the ledger records the
    /// key an attempt saw; empty when the keys cannot be read.
    pub fn host_key_fingerprints(&self) -> Vec<String> {
        self.host_public_keys()
            .unwrap_or_default()
            .iter()
            .filter_map(|line| russh::keys::ssh_key::PublicKey::from_openssh(line).ok())
            .map(|key| crate::ssh::known_hosts::fingerprint(&key))
            .collect()
    }

    pub(super) fn start_failed(&self, reason: String) -> LabError {
        LabError::StartFailed {
            alias: self.alias.clone(),
            reason,
            log_path: self.log.clone(),
            log: log_tail(&self.log, 40),
        }
    }
}

/// `targetN` of an alias `<id>-targetN` (an alias without a lab id is its own).
fn short_of(alias: &str) -> &str {
    match alias.split_once('-') {
        Some((_, short)) if short.starts_with("target") => short,
        _ => alias,
    }
}

/// A fresh lab id: 5 characters of `[a-z0-9]`, a letter first (about 2^25 ids), drawn
/// at random, so two labs (even one after another in the same directory, with new host
/// keys) never name a target alike.
pub(super) fn new_lab_id() -> String {
    use rand::Rng as _;
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut id = String::with_capacity(5);
    id.push(LETTERS[rng.random_range(0..LETTERS.len())] as char);
    for _ in 0..4 {
        id.push(ALNUM[rng.random_range(0..ALNUM.len())] as char);
    }
    id
}

/// The alias of target `index` in the lab `id`.
pub(crate) fn alias_of(id: &str, index: usize) -> String {
    format!("{id}-target{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_ids_are_short_letter_first_and_differ() {
        let ids: std::collections::BTreeSet<String> = (0..50).map(|_| new_lab_id()).collect();
        assert!(ids.len() > 45, "ids repeat: {ids:?}");
        for id in &ids {
            assert_eq!(id.len(), 5, "{id}");
            assert!(id.starts_with(|c: char| c.is_ascii_lowercase()), "{id}");
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{id}"
            );
        }
    }

    #[test]
    fn the_short_name_drops_the_lab_id_only() {
        assert_eq!(short_of(&alias_of("k3x9q", 2)), "target2");
        assert_eq!(alias_of("k3x9q", 2), "k3x9q-target2");
        // Labs made before lab ids keep their aliases.
        assert_eq!(short_of("target1"), "target1");
        assert_eq!(short_of("web-1"), "web-1");
    }
}
