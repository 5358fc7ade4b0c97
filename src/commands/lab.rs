//! `opmark lab up|down|status|env|cut|restore|pause|resume|crash|reboot`: disposable local sshd
//! targets for trying opmark (see `crate::lab`). `up` leaves the servers running after
//! opmark exits.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::render::printable;
use crate::cli::{GlobalArgs, LabAction, LabArgs, LabKindArg, PlacementArg};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::lab::{DockerSpec, HostKind, ImageSource, Lab, LabError, LabSpec, Placement};

/// Runs one `opmark lab` action; returns the exit code.
pub fn run(global: &GlobalArgs, args: &LabArgs) -> Result<u8> {
    match &args.action {
        LabAction::Up {
            count,
            placement,
            image,
            kind,
            dir,
        } => up(
            global,
            &Up {
                count: *count,
                placement: *placement,
                image: image.as_deref(),
                kind: *kind,
            },
            &lab_dir(dir.as_deref())?,
        ),
        LabAction::Down { dir, purge_image } => {
            down(global, &lab_dir(dir.as_deref())?, *purge_image)
        }
        LabAction::Status { dir, limit } => status(global, &lab_dir(dir.as_deref())?, *limit),
        LabAction::Env { dir } => env(global, &lab_dir(dir.as_deref())?),
        LabAction::Cut { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.cut(target))
                .map_err(to_error)?;
            crate::say!("opmark: {target}: link cut (packets dropped both ways); undo with `opmark lab restore {target}{}`", dir_flag(&dir));
            Ok(exit_code::OK)
        }
        LabAction::Restore { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.restore(target))
                .map_err(to_error)?;
            crate::say!("opmark: {target}: link restored");
            Ok(exit_code::OK)
        }
        LabAction::Pause { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.pause(target))
                .map_err(to_error)?;
            crate::say!("opmark: {target}: paused (every process frozen); undo with `opmark lab resume {target}{}`", dir_flag(&dir));
            Ok(exit_code::OK)
        }
        LabAction::Resume { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.resume(target))
                .map_err(to_error)?;
            crate::say!("opmark: {target}: resumed");
            Ok(exit_code::OK)
        }
        LabAction::Crash { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.crash(target))
                .map_err(to_error)?;
            crate::say!("opmark: {target}: crashed (every process killed) and started again; markers kept, running commands gone");
            Ok(exit_code::OK)
        }
        LabAction::Reboot { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.reboot(target))
                .map_err(to_error)?;
            crate::say!("opmark: {target}: rebooted (every process killed, a new boot id) and started again; markers kept, running commands gone");
            Ok(exit_code::OK)
        }
    }
}

/// What `lab up` was asked for.
struct Up<'a> {
    count: usize,
    placement: PlacementArg,
    image: Option<&'a str>,
    kind: Option<LabKindArg>,
}

fn up(global: &GlobalArgs, req: &Up<'_>, dir: &Path) -> Result<u8> {
    let Up {
        count,
        placement,
        image,
        kind,
    } = *req;
    let placement = match placement {
        PlacementArg::Loopback => Placement::Loopback,
        PlacementArg::Netns => Placement::Netns,
        PlacementArg::Docker => Placement::Docker,
    };
    if image.is_some() && placement != Placement::Docker {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--image applies to docker targets only: add `--placement docker`, or drop --image",
        ));
    }
    if kind.is_some() && placement != Placement::Docker {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--kind picks the image of docker targets only: add `--placement docker`, or drop --kind",
        ));
    }
    let kind = match kind {
        None | Some(LabKindArg::Debian) => HostKind::Debian,
        Some(LabKindArg::Busybox) => HostKind::Busybox,
        Some(LabKindArg::Dropbear) => HostKind::Dropbear,
    };
    let spec = LabSpec {
        count,
        placement,
        dir: dir.to_path_buf(),
    };
    let mut lab = if placement == Placement::Docker {
        Lab::start_docker(
            &spec,
            &DockerSpec {
                image: image.map(str::to_owned),
                kind,
            },
        )
    } else {
        Lab::start(&spec)
    }
    .map_err(to_error)?;
    lab.set_stop_on_drop(false); // the point of `up`: the servers outlive this process
    if global.json {
        super::common::print_json(&describe(&lab, usize::MAX))?;
        return Ok(exit_code::OK);
    }
    let cfg = lab.ssh_config().display().to_string();
    let flag = dir_flag(lab.dir());
    crate::outln!(
        "opmark lab: {} target(s) running ({}), lab dir {}",
        lab.targets().len(),
        placement_name(lab.placement()),
        lab.dir().display()
    );
    if let Some((image, source)) = lab.image() {
        // Said on stdout: whether this `up` built the image is part of its result.
        match source {
            Some(ImageSource::Cached) => crate::outln!("image {image} (cached: nothing built)"),
            Some(ImageSource::Built(took)) => {
                crate::outln!("image {image} (built in {} s)", took.as_secs())
            }
            _ => crate::outln!("image {image} (given with --image)"),
        }
    }
    print_targets(&lab, usize::MAX)?;
    crate::outln!("\nTry:");
    crate::outln!("  ssh -F {cfg} target1 'echo hello from $XDG_STATE_HOME'");
    crate::outln!("  opmark -F {cfg} run target1 -- echo hello");
    if matches!(lab.placement(), Placement::Netns | Placement::Docker) {
        crate::outln!("  opmark lab cut target1{flag}      # drop its packets silently");
        crate::outln!("  opmark lab restore target1{flag}");
    }
    if lab.placement() == Placement::Docker {
        crate::outln!("  opmark lab pause target1{flag}    # freeze it (resume thaws)");
        crate::outln!("  opmark lab crash target1{flag}    # kill all, start again");
        crate::outln!("  opmark lab reboot target1{flag}   # crash, with a new boot id");
    }
    crate::outln!("Stop and remove with:\n  opmark lab down{flag}");
    Ok(exit_code::OK)
}

/// `lab env --json` (schemas/lab-env.schema.json).
#[derive(Debug, Serialize)]
struct LabEnvDocument {
    ssh_config: PathBuf,
    /// The shell line, quoted for a POSIX shell.
    export: String,
}

/// `lab down --json` (schemas/lab-down.schema.json).
#[derive(Debug, Serialize)]
struct LabDownDocument {
    /// Targets stopped.
    stopped: usize,
    dir: PathBuf,
    /// The lab's image (kept unless removed).
    image: Option<String>,
    image_removed: bool,
    /// Unresolved operations whose only evidence went with the removed targets.
    unresolved_operations: Vec<Unresolved>,
}

/// An operation named by [`LabDownDocument`].
#[derive(Debug, Serialize)]
struct Unresolved {
    op_id: String,
    host: String,
}

/// `export OPMARK_SSH_CONFIG=...`: the line that lets every later `opmark` (and
/// `eval "$(opmark lab env)"`) reach the lab's targets without `-F`.
fn env(global: &GlobalArgs, dir: &Path) -> Result<u8> {
    let lab = Lab::load(dir).map_err(to_error)?;
    let cfg = lab.ssh_config().display().to_string();
    let line = format!("export OPMARK_SSH_CONFIG={}", crate::shim::quote(&cfg));
    if global.json {
        super::common::print_json(&LabEnvDocument {
            ssh_config: lab.ssh_config().to_path_buf(),
            export: line,
        })?;
    } else {
        crate::outln!("{line}");
        crate::outln!(
            "# then: opmark run target1 -- echo hello   (eval \"$(opmark lab env{})\" sets it)",
            dir_flag(dir)
        );
    }
    Ok(exit_code::OK)
}

/// The ledger's unresolved operations on this lab's targets: removing a target removes
/// the only place their evidence was, so `down` names them. Only this lab's: another
/// lab's `target1` is the same short name for another machine (see [`ran_on`]).
fn unresolved_on(global: &GlobalArgs, lab: &Lab) -> Vec<(String, String)> {
    let request = crate::ops::list::ListRequest {
        unresolved: true,
        all: true,
        ..Default::default()
    };
    let ctx = super::common::context(global);
    // A ledger that cannot be read costs the warning, never the `down`.
    let Ok(report) = crate::ops::list::list(&ctx, &request) else {
        return Vec::new();
    };
    let keys: Vec<Vec<String>> = lab
        .targets()
        .iter()
        .map(crate::lab::Target::host_key_fingerprints)
        .collect();
    report
        .operations
        .into_iter()
        .filter(|o| {
            lab.targets()
                .iter()
                .zip(&keys)
                .any(|(t, keys)| ran_on(&ctx, t, keys, &o.op_id, &o.host))
        })
        .map(|o| (o.record.op_id, o.record.host))
        .collect()
}

/// Did operation `op` on ledger host `host` run on target `t` (whose host keys have the
/// fingerprints `keys`)? Its alias (`<lab id>-target1`) is this lab's alone; the short
/// name `target1` is every lab's, so under it only the ledger's evidence counts: an
/// attempt that saw one of the target's host keys, or reached its address and port.
fn ran_on(
    ctx: &crate::ops::Context,
    t: &crate::lab::Target,
    keys: &[String],
    op: &str,
    host: &str,
) -> bool {
    if host == t.alias && t.alias != t.short_name() {
        return true;
    }
    if !t.is_named(host) {
        return false;
    }
    let request = crate::ops::show::ShowRequest {
        op: op.to_owned(),
        host: Some(host.to_owned()),
        limit: None,
    };
    let Ok(report) = crate::ops::show::show(ctx, &request) else {
        return false;
    };
    report.pages().iter().flat_map(|p| &p.attempts).any(|a| {
        let a = &a.attempt;
        a.host_key.as_ref().is_some_and(|k| keys.contains(k))
            || a.route
                .as_ref()
                .is_some_and(|r| r.port == t.port && r.hostname == t.addr.to_string())
    })
}

fn down(global: &GlobalArgs, dir: &Path, purge_image: bool) -> Result<u8> {
    let lab = Lab::load(dir).map_err(to_error)?;
    let n = lab.targets().len();
    let unresolved = unresolved_on(global, &lab);
    if purge_image && lab.placement() != Placement::Docker {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--purge-image applies to docker labs only; this lab has no image",
        ));
    }
    // The image outlives the lab (it is the slow part); removed only when asked, and
    // only the lab's own (never a user's --image).
    let purge = if purge_image { lab.own_image() } else { None };
    let image = lab.image().map(|(i, _)| i.to_owned());
    let stopped = lab.stop();
    // Remove the files even if some process would not die: the next `up` needs a clean dir.
    crate::lab::remove_lab_dir(dir).map_err(to_error)?;
    stopped.map_err(to_error)?;
    if let Some(tag) = &purge {
        crate::lab::remove_image(tag).map_err(to_error)?;
    }
    if global.json {
        super::common::print_json(&LabDownDocument {
            stopped: n,
            dir: dir.to_path_buf(),
            image: image.clone(),
            image_removed: purge.is_some(),
            unresolved_operations: unresolved
                .iter()
                .map(|(op, host)| Unresolved {
                    op_id: op.clone(),
                    host: host.clone(),
                })
                .collect(),
        })?;
    } else {
        if !unresolved.is_empty() {
            crate::say!(
                "opmark: {} unresolved operation{} lost {} evidence with the removed targets (their markers are gone); record what happened with `opmark resolve OP --host HOST --as abandoned --note ...`:",
                unresolved.len(),
                if unresolved.len() == 1 { "" } else { "s" },
                if unresolved.len() == 1 { "its" } else { "their" },
            );
            for (op, host) in &unresolved {
                crate::say!("opmark:   {} on {}", printable(op), printable(host));
            }
        }
        crate::say!(
            "opmark: lab in {} stopped and removed ({n} target(s))",
            dir.display()
        );
        match (&image, &purge) {
            (_, Some(tag)) => crate::say!("opmark: image {tag} removed"),
            (Some(tag), None) => crate::say!(
                "opmark: image {tag} kept for the next `lab up` (remove it with `lab down --purge-image`, or `docker image rm {tag}`)"
            ),
            (None, None) => {}
        }
    }
    Ok(exit_code::OK)
}

fn status(global: &GlobalArgs, dir: &Path, limit: Option<usize>) -> Result<u8> {
    if limit == Some(0) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "--limit 0 would show no target; give at least 1, or leave it out for all",
        ));
    }
    let lab = Lab::load(dir).map_err(to_error)?;
    let all_up = lab.is_running();
    let shown = limit.unwrap_or(usize::MAX);
    if global.json {
        super::common::print_json(&describe(&lab, shown))?;
    } else {
        crate::outln!(
            "opmark lab in {} ({})",
            lab.dir().display(),
            placement_name(lab.placement()),
        );
        crate::outln!("ssh config {}", lab.ssh_config().display());
        print_targets(&lab, shown)?;
        let more = lab.targets().len().saturating_sub(shown);
        if more > 0 {
            crate::say!("opmark: {more} more target(s) not shown; drop --limit to see all");
        }
    }
    // Stopped targets are a finding, like `doctor`'s failing checks.
    Ok(if all_up {
        exit_code::OK
    } else {
        exit_code::FINDINGS
    })
}

/// A target's state as `lab status` names it.
fn target_state(lab: &Lab, t: &crate::lab::Target) -> &'static str {
    let paused = lab.placement() == Placement::Docker
        && lab.container_state(&t.alias).is_ok_and(|s| s == "paused");
    if !lab.target_running(&t.alias) {
        "stopped"
    } else if paused {
        "paused"
    } else if can_cut(lab, t) && lab.is_cut(&t.alias).unwrap_or(false) {
        "cut"
    } else {
        "running"
    }
}

/// The first `shown` targets, two lines each.
fn print_targets(lab: &Lab, shown: usize) -> Result<()> {
    for t in lab.targets().iter().take(shown) {
        let state = target_state(lab, t);
        let place = match (&t.netns, lab.container(&t.alias)) {
            (Some(ns), _) => Some(format!("netns {ns}")),
            (None, Ok(container)) => Some(format!("container {container}")),
            (None, Err(_)) => None,
        };
        // Short lines rather than one of 110 columns: the paths and names below the
        // address are copied whole.
        crate::outln!(
            "  {:<9} {:<26} {state}",
            t.alias,
            format!("{}@{}", t.user, t.known_hosts_host()),
        );
        if let Some(place) = place {
            crate::outln!("  {:<9} {place}", "");
        }
        crate::outln!("  {:<9} markers in {}", "", t.marker_root().display());
    }
    Ok(())
}

/// `lab up --json` and `lab status --json` (schemas/lab.schema.json), fields in this
/// order.
#[derive(Debug, Serialize)]
struct LabDocument {
    dir: PathBuf,
    placement: &'static str,
    ssh_config: PathBuf,
    known_hosts: PathBuf,
    client_key: PathBuf,
    /// The image docker targets run (null for loopback and netns).
    image: Option<String>,
    /// `cached`, `built` (by this `up`) or `given` (`--image`); null without an image.
    image_source: Option<&'static str>,
    /// How long this `up` took to build the image; null unless it built it.
    image_build_seconds: Option<u64>,
    /// Targets in the lab, whether or not `--limit` shows them all.
    target_count: usize,
    targets: Vec<LabTarget>,
}

/// One target of [`LabDocument`].
#[derive(Debug, Serialize)]
struct LabTarget {
    alias: String,
    addr: String,
    port: u16,
    user: String,
    state_home: PathBuf,
    marker_root: PathBuf,
    /// Where the markers are on this machine (a docker target's volume).
    markers_on_host: Option<PathBuf>,
    netns: Option<String>,
    container: Option<String>,
    log: PathBuf,
    /// `running`, `stopped`, `paused` or `cut`, as the text says.
    target_state: &'static str,
    running: bool,
    cut: bool,
}

/// The lab as one JSON document (for `--json`), its first `shown` targets.
fn describe(lab: &Lab, shown: usize) -> LabDocument {
    let targets = lab
        .targets()
        .iter()
        .take(shown)
        .map(|t| LabTarget {
            alias: t.alias.clone(),
            addr: t.addr.to_string(),
            port: t.port,
            user: t.user.clone(),
            state_home: t.state_home.clone(),
            marker_root: t.marker_root(),
            markers_on_host: lab.marker_root_on_host(&t.alias).ok(),
            netns: t.netns.clone(),
            container: lab.container(&t.alias).ok(),
            log: t.log.clone(),
            target_state: target_state(lab, t),
            running: lab.target_running(&t.alias),
            cut: can_cut(lab, t) && lab.is_cut(&t.alias).unwrap_or(false),
        })
        .collect();
    let source = lab.image().and_then(|(_, source)| source);
    LabDocument {
        dir: lab.dir().to_path_buf(),
        placement: placement_name(lab.placement()),
        ssh_config: lab.ssh_config().to_path_buf(),
        known_hosts: lab.known_hosts().to_path_buf(),
        client_key: lab.client_key().to_path_buf(),
        image: lab.image().map(|(i, _)| i.to_owned()),
        image_source: source.map(|s| match s {
            ImageSource::Cached => "cached",
            ImageSource::Built(_) => "built",
            ImageSource::Given => "given",
        }),
        image_build_seconds: match source {
            Some(ImageSource::Built(took)) => Some(took.as_secs()),
            _ => None,
        },
        target_count: lab.targets().len(),
        targets,
    }
}

/// True when the target can be cut (a namespace or a running container).
fn can_cut(lab: &Lab, t: &crate::lab::Target) -> bool {
    t.netns.is_some() || lab.placement() == Placement::Docker && lab.target_running(&t.alias)
}

fn placement_name(p: Placement) -> &'static str {
    match p {
        Placement::Loopback => "loopback",
        Placement::Netns => "netns",
        Placement::Docker => "docker",
    }
}

/// `--dir D` to repeat in printed hints, empty for the default dir.
fn dir_flag(dir: &Path) -> String {
    match default_dir() {
        Ok(default) if default == dir => String::new(),
        _ => format!(" --dir {}", dir.display()),
    }
}

/// The given dir, or `${XDG_STATE_HOME:-~/.local/state}/opmark/lab`.
fn lab_dir(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(d) if d.is_absolute() => Ok(d.to_path_buf()),
        Some(d) => std::env::current_dir()
            .map(|cwd| cwd.join(d))
            .map_err(|e| Error::new(ErrorKind::LocalIo, format!("current directory: {e}"))),
        None => default_dir(),
    }
}

fn default_dir() -> Result<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(h) => PathBuf::from(h).join(".local").join("state"),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "neither XDG_STATE_HOME nor HOME is set; pass --dir DIR",
                ))
            }
        },
    };
    Ok(state.join("opmark").join("lab"))
}

/// Lab errors at the CLI edge: bad requests are invalid input, the rest local failures.
fn to_error(e: LabError) -> Error {
    let kind = match e {
        LabError::NeedsRoot { .. }
        | LabError::BadDir(_)
        | LabError::BadCount(_)
        | LabError::AlreadyRunning(_)
        | LabError::NoLab(_)
        | LabError::UnknownTarget { .. }
        | LabError::NotNetns { .. }
        | LabError::NotDocker { .. }
        | LabError::NoImage(_)
        | LabError::BadKey(_) => ErrorKind::InvalidInput,
        LabError::MissingTool { .. }
        | LabError::Io { .. }
        | LabError::State { .. }
        | LabError::Command { .. }
        | LabError::StartFailed { .. } => ErrorKind::LocalIo,
    };
    Error::new(kind, e.to_string())
}
