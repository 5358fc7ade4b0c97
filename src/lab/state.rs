//! A lab's data: what lab.json holds ([`LabState`], the docker side in [`DockerLab`]),
//! the [`Lab`] handle around it, and what reads or writes only that data (loading,
//! saving, the client files, looking up targets). Starting, faults and stopping, which
//! need sshd, namespaces or the docker engine, live in `control.rs` and `docker.rs`,
//! both above this module.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::LabError;
use super::files::{log_tail, read, write};
use super::images::{HostKind, ImageSource};
use super::spec::Placement;
use super::sshd;
use super::target::Target;

/// What lab.json holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct LabState {
    /// The lab id in its targets' aliases (empty in labs made before lab ids).
    #[serde(default)]
    pub(super) id: String,
    pub(super) placement: Placement,
    pub(super) ssh_config: PathBuf,
    pub(super) known_hosts: PathBuf,
    pub(super) client_key: PathBuf,
    pub(super) targets: Vec<Target>,
    /// Containers, volumes and network of a docker lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) docker: Option<DockerLab>,
}

/// A running lab. Dropping a lab made by [`Lab::start`] stops it (kills every sshd and
/// what ran through it, deletes namespaces); a lab made by [`Lab::load`] keeps running
/// unless [`Lab::stop`] is called.
#[derive(Debug)]
pub struct Lab {
    pub(super) dir: PathBuf,
    pub(super) state: LabState,
    pub(super) sshd: PathBuf,
    /// Stop on drop.
    pub(super) owned: bool,
}

/// The docker side of a lab, kept in lab.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DockerLab {
    /// Lab id: names of the network, containers and volumes start with `opmark-lab-<id>`.
    pub(super) id: String,
    /// The lab's bridge network.
    pub(super) network: String,
    /// Its subnet (fixed, so a restarted container keeps its address).
    pub(super) subnet: String,
    /// The image the targets run.
    pub(crate) image: String,
    /// True when the image is the lab's own (built from the recipe), which `down
    /// --purge-image` may remove; never a user's `--image`.
    pub(super) own_image: bool,
    /// One entry per target, in target order.
    pub(super) nodes: Vec<Node>,
    /// The host kind its image is (how its containers start their SSH server).
    #[serde(default)]
    pub(crate) kind: HostKind,
    /// How the image was obtained by this start (for `lab up`'s report); not saved.
    #[serde(skip)]
    pub(crate) image_source: Option<ImageSource>,
}

/// One target's container and volume.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Node {
    pub(super) alias: String,
    pub(super) container: String,
    pub(super) volume: String,
}

impl Lab {
    /// Opens the lab whose state is in `dir` (for `opmark lab down/status/cut`). The
    /// loaded lab is not stopped when dropped.
    pub fn load(dir: &Path) -> Result<Lab, LabError> {
        let path = dir.join("lab.json");
        if !path.exists() {
            return Err(LabError::NoLab(dir.to_path_buf()));
        }
        let text = read(&path)?;
        let state: LabState = serde_json::from_str(&text).map_err(|e| LabError::State {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        Ok(Lab {
            dir: dir.to_path_buf(),
            state,
            sshd: sshd::sshd_path().unwrap_or_else(|_| PathBuf::from("/usr/sbin/sshd")),
            owned: false,
        })
    }

    /// Makes a loaded lab stop when dropped (or a started one not stop: `false`).
    pub fn set_stop_on_drop(&mut self, stop: bool) {
        self.owned = stop;
    }

    /// The targets, target1 first.
    pub fn targets(&self) -> &[Target] {
        &self.state.targets
    }

    /// The target with this alias, or this short name (`target1`).
    pub fn target(&self, alias: &str) -> Option<&Target> {
        self.state.targets.iter().find(|t| t.is_named(alias))
    }

    /// The lab id in its targets' aliases (empty for a lab made before lab ids).
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// Where the targets listen.
    pub fn placement(&self) -> Placement {
        self.state.placement
    }

    /// The generated ssh_config (one `Host targetN` per target).
    pub fn ssh_config(&self) -> &Path {
        &self.state.ssh_config
    }

    /// The generated known_hosts (every target's host keys).
    pub fn known_hosts(&self) -> &Path {
        &self.state.known_hosts
    }

    /// The client private key authorised on every target (unencrypted ed25519).
    pub fn client_key(&self) -> &Path {
        &self.state.client_key
    }

    /// The lab directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub(super) fn get(&self, alias: &str) -> Result<&Target, LabError> {
        self.target(alias).ok_or_else(|| LabError::UnknownTarget {
            alias: alias.to_string(),
            known: self
                .state
                .targets
                .iter()
                .map(|t| t.alias.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    pub(super) fn netns_of(&self, alias: &str) -> Result<(&str, &str), LabError> {
        let t = self.get(alias)?;
        match (&t.netns, &t.ns_if) {
            (Some(ns), Some(ns_if)) => Ok((ns, ns_if)),
            _ => Err(LabError::NotNetns {
                alias: alias.to_string(),
            }),
        }
    }
    /// Writes ssh_config, known_hosts and lab.json from the current state.
    pub(super) fn write_client_files(&self) -> Result<(), LabError> {
        let mut cfg = String::from(
            "# opmark lab (generated): one alias per target, unique per lab (<lab id>-targetN);\n\
             # targetN is a shorthand inside this lab only: labs sharing a ledger need the full alias\n",
        );
        let mut known = String::new();
        for t in &self.state.targets {
            let names = if t.short_name() == t.alias {
                t.alias.clone()
            } else {
                format!("{} {}", t.alias, t.short_name())
            };
            let _ = write!(
                cfg,
                "\nHost {}\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n  \
                 IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
                names,
                t.addr,
                t.port,
                t.user,
                self.state.client_key.display(),
                self.state.known_hosts.display()
            );
            for key in t.host_public_keys()? {
                let _ = writeln!(known, "{} {key}", t.known_hosts_host());
            }
        }
        write(&self.state.ssh_config, &cfg, 0o600)?;
        write(&self.state.known_hosts, &known, 0o600)?;
        self.save()
    }

    pub(super) fn save(&self) -> Result<(), LabError> {
        let text = serde_json::to_string_pretty(&self.state).map_err(|e| LabError::State {
            path: self.dir.join("lab.json"),
            detail: e.to_string(),
        })?;
        write(&self.dir.join("lab.json"), &text, 0o600)
    }
    /// The last `lines` lines of every target's sshd log, each under a header naming it:
    /// the servers' side of a failure.
    pub fn log_tails(&self, lines: usize) -> String {
        self.state
            .targets
            .iter()
            .map(|t| {
                format!(
                    "--- lab {}: {} sshd log (last lines) ---\n{}\n",
                    self.dir.display(),
                    t.alias,
                    log_tail(&t.log, lines)
                )
            })
            .collect()
    }
}
