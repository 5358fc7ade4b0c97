//! The lab's one error type, named by every other lab module; it names none of them
//! but the spec (for the target limit its message quotes).

use std::path::PathBuf;

use super::spec::MAX_TARGETS;

/// Failures of the lab. Each message names the problem and the fix.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A required external program is missing.
    #[error("{tool} not found: {fix}")]
    MissingTool {
        /// The program.
        tool: String,
        /// How to install it.
        fix: String,
    },
    /// Namespace placement asked for without root.
    #[error(
        "network-namespace targets need root (running as uid {uid}): run as root \
         (e.g. `sudo opmark lab up --placement netns`) or use `--placement loopback`"
    )]
    NeedsRoot {
        /// The effective uid.
        uid: u32,
    },
    /// The lab directory path cannot be written into an ssh_config as is.
    #[error(
        "lab directory {0} contains whitespace, quotes or a non-UTF-8 byte, which an \
         ssh_config cannot hold unquoted; choose a plain path"
    )]
    BadDir(PathBuf),
    /// Target count out of range.
    #[error("a lab holds 1 to {MAX_TARGETS} targets, not {0}")]
    BadCount(usize),
    /// A lab is already running in the directory.
    #[error(
        "a lab is already running in {0}; stop it with `opmark lab down --dir {0}` \
         or choose another --dir"
    )]
    AlreadyRunning(PathBuf),
    /// No lab state in the directory.
    #[error("no lab in {0} (no lab.json); start one with `opmark lab up --dir {0}`")]
    NoLab(PathBuf),
    /// Local file I/O.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// lab.json could not be parsed.
    #[error("{path}: malformed lab state ({detail}); remove the directory by hand")]
    State {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An external command failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command as run.
        command: String,
        /// Exit status and stderr.
        detail: String,
    },
    /// A target's sshd did not start or did not become ready; carries its log.
    #[error("target {alias} did not start: {reason}\n--- sshd log {} (last lines) ---\n{log}", log_path.display())]
    StartFailed {
        /// The target.
        alias: String,
        /// What was observed.
        reason: String,
        /// The sshd log file.
        log_path: PathBuf,
        /// The tail of that log.
        log: String,
    },
    /// No target of that name.
    #[error("no target named {alias:?} in this lab (targets: {known})")]
    UnknownTarget {
        /// The alias asked for.
        alias: String,
        /// The aliases that exist.
        known: String,
    },
    /// cut/restore asked of a loopback target.
    #[error(
        "target {alias} listens on loopback; cut/restore need a network-namespace target \
         (start the lab with `--placement netns`, as root) or a container \
         (`--placement docker`)"
    )]
    NotNetns {
        /// The target.
        alias: String,
    },
    /// pause/resume/crash asked of a target that is not a container.
    #[error(
        "target {alias} is not a container; pause, resume and crash need a docker target \
         (start the lab with `--placement docker`)"
    )]
    NotDocker {
        /// The target.
        alias: String,
    },
    /// `--image` names an image the engine does not have.
    #[error(
        "no local image {0:?}; the lab uses no registry: load or build it first (docker \
         load, docker import), or omit --image to let the lab build its own"
    )]
    NoImage(String),
    /// authorize_key got something that is not one public key line.
    #[error("not a single OpenSSH public key line (expected `TYPE BASE64 [COMMENT]`): {0}")]
    BadKey(String),
}
