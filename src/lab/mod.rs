//! Disposable local SSH targets: real OpenSSH `sshd` servers with generated host keys,
//! one client key, their own marker state dir, a known_hosts file and an ssh_config
//! with one alias per target. Used by the integration tests, the demo and `opmark lab`.
//!
//! Layout of a lab directory:
//! ```text
//! lab.json            state, so `opmark lab down/status/cut` can find a running lab
//! ssh_config          Host <id>-target1 target1 .. <id>-targetN targetN
//! known_hosts         every target's host keys
//! client_ed25519      the client key authorised on every target (+ .pub)
//! targetN/            sshd_config, host keys, authorized_keys, sshd.log, sshd.pid,
//!                     state/ (XDG_STATE_HOME of its commands), home/ (their HOME)
//! ```
//!
//! Target names are unique per lab (docs/host-protocol.md#lab-targets): each lab draws a random id when it starts,
//! and its targets' aliases are `<id>-target1`...: the ledger keys an operation by the
//! host name the caller typed, so two labs (other host keys, other marker roots) must
//! never share one. Inside one lab's ssh_config, `targetN` also matches its target, and
//! every lab call ([`Lab::target`], cut, crash...) takes either form: a shorthand for one
//! lab, which two labs sharing a ledger must not use (their `target1`s are one name).
//!
//! Lab targets are disposable (docs/host-protocol.md#lab-targets): they die with the machine and are never
//! restarted after a reboot, so their sshd tells the host shim so
//! (`OPMARK_ALLOW_VOLATILE_ROOT=1`), and a lab works from any directory, `/tmp` included.
//!
//! Docker targets (`docker.rs`) keep only keys, sshd_config and sshd.log in targetN/;
//! their markers live on a docker volume.
//!
//! This file is the lab's façade: it declares the modules and re-exports what the rest
//! of the crate names as `crate::lab::…`. No module of the lab names it, nor do any two
//! name each other in a circle: each names only modules below it. `control.rs` (start,
//! faults, stop) is on top and hands containers to `docker.rs`; below them the data
//! (`state.rs`: `Lab`, lab.json), then `sshd.rs`, `netns.rs` and the images, and at the
//! bottom `target.rs`, `files.rs`, `spec.rs` and `error.rs`.

mod control;
mod docker;
mod error;
mod files;
mod images;
mod listening;
mod netns;
mod proc;
mod progress;
mod spec;
mod sshd;
mod state;
mod target;
mod user;

pub use docker::{recipe_tag, remove_image, DockerSpec, SUDO_PASSWORD, SUDO_USER};
pub use error::LabError;
pub use files::remove_lab_dir;
pub use images::{login_shells, shell_user, HostKind, ImageSource};
pub use spec::{LabSpec, Placement, MAX_TARGETS};
pub use state::Lab;
pub use target::Target;
pub use user::effective_uid;
