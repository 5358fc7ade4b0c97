//! What a lab start is asked for: how many targets and where they listen.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Most targets one lab may hold.
pub const MAX_TARGETS: usize = 64;

/// Where targets listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// 127.0.0.1 at free ports. Works without root.
    Loopback,
    /// Each target in its own network namespace behind a veth pair, port 22. Root only;
    /// allows `cut`/`restore`.
    Netns,
    /// Each target a container on a bridge network of the lab, port 22; allows every
    /// fault verb (see `docker.rs`).
    Docker,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct LabSpec {
    /// Number of targets (1..=64), named target1..targetN.
    pub count: usize,
    /// Where they listen.
    pub placement: Placement,
    /// Lab directory (created; may be anywhere, /tmp included: the targets are disposable).
    pub dir: PathBuf,
}
