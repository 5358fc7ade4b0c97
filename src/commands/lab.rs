//! `opmark lab up|down|status|cut|restore`: disposable local sshd targets for trying
//! opmark (see `crate::lab`). `up` leaves the servers running after opmark exits.

use std::path::{Path, PathBuf};

use crate::cli::{GlobalArgs, LabAction, LabArgs, PlacementArg};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::lab::{Lab, LabError, LabSpec, Placement};

/// Runs one `opmark lab` action; returns the exit code.
pub fn run(global: &GlobalArgs, args: &LabArgs) -> Result<u8> {
    match &args.action {
        LabAction::Up {
            count,
            placement,
            dir,
        } => up(global, *count, *placement, &lab_dir(dir.as_deref())?),
        LabAction::Down { dir } => down(global, &lab_dir(dir.as_deref())?),
        LabAction::Status { dir } => status(global, &lab_dir(dir.as_deref())?),
        LabAction::Cut { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.cut(target))
                .map_err(to_error)?;
            eprintln!("opmark: {target}: link cut (packets dropped both ways); undo with `opmark lab restore {target}{}`", dir_flag(&dir));
            Ok(exit_code::OK)
        }
        LabAction::Restore { target, dir } => {
            let dir = lab_dir(dir.as_deref())?;
            Lab::load(&dir)
                .and_then(|lab| lab.restore(target))
                .map_err(to_error)?;
            eprintln!("opmark: {target}: link restored");
            Ok(exit_code::OK)
        }
    }
}

fn up(global: &GlobalArgs, count: usize, placement: PlacementArg, dir: &Path) -> Result<u8> {
    let placement = match placement {
        PlacementArg::Loopback => Placement::Loopback,
        PlacementArg::Netns => Placement::Netns,
    };
    let mut lab = Lab::start(&LabSpec {
        count,
        placement,
        dir: dir.to_path_buf(),
    })
    .map_err(to_error)?;
    lab.set_stop_on_drop(false); // the point of `up`: the servers outlive this process
    if global.json {
        super::common::print_json(&describe(&lab))?;
        return Ok(exit_code::OK);
    }
    let cfg = lab.ssh_config().display().to_string();
    let flag = dir_flag(lab.dir());
    println!(
        "opmark lab: {} target(s) running ({}), lab dir {}",
        lab.targets().len(),
        placement_name(lab.placement()),
        lab.dir().display()
    );
    print_targets(&lab);
    println!("\nTry:");
    println!("  ssh -F {cfg} target1 'echo hello from $XDG_STATE_HOME'");
    println!("  opmark -F {cfg} run target1 -- echo hello");
    if lab.placement() == Placement::Netns {
        println!("  opmark lab cut target1{flag}      # drop its packets silently");
        println!("  opmark lab restore target1{flag}");
    }
    println!("Stop and remove with:\n  opmark lab down{flag}");
    Ok(exit_code::OK)
}

fn down(global: &GlobalArgs, dir: &Path) -> Result<u8> {
    let lab = Lab::load(dir).map_err(to_error)?;
    let n = lab.targets().len();
    let stopped = lab.stop();
    // Remove the files even if some process would not die: the next `up` needs a clean dir.
    crate::lab::remove_lab_dir(dir).map_err(to_error)?;
    stopped.map_err(to_error)?;
    if global.json {
        super::common::print_json(&serde_json::json!({ "stopped": n, "dir": dir }))?;
    } else {
        eprintln!(
            "opmark: lab in {} stopped and removed ({n} target(s))",
            dir.display()
        );
    }
    Ok(exit_code::OK)
}

fn status(global: &GlobalArgs, dir: &Path) -> Result<u8> {
    let lab = Lab::load(dir).map_err(to_error)?;
    let all_up = lab.is_running();
    if global.json {
        super::common::print_json(&describe(&lab))?;
    } else {
        println!(
            "opmark lab in {} ({}), ssh config {}",
            lab.dir().display(),
            placement_name(lab.placement()),
            lab.ssh_config().display()
        );
        print_targets(&lab);
    }
    // Stopped targets are a finding, like `doctor`'s failing checks.
    Ok(if all_up {
        exit_code::OK
    } else {
        exit_code::FINDINGS
    })
}

fn print_targets(lab: &Lab) {
    for t in lab.targets() {
        let state = if t.sshd_pid().is_none() {
            "stopped"
        } else if t.netns.is_some() && lab.is_cut(&t.alias).unwrap_or(false) {
            "cut"
        } else {
            "running"
        };
        let place = match &t.netns {
            Some(ns) => format!("  netns {ns}"),
            None => String::new(),
        };
        println!(
            "  {:<9} {:<26} {:<8} markers in {}{place}",
            t.alias,
            format!("{}@{}", t.user, t.known_hosts_host()),
            state,
            t.marker_root().display()
        );
    }
}

/// The lab as one JSON document (for `--json`).
fn describe(lab: &Lab) -> serde_json::Value {
    let targets: Vec<_> = lab
        .targets()
        .iter()
        .map(|t| {
            serde_json::json!({
                "alias": t.alias,
                "addr": t.addr.to_string(),
                "port": t.port,
                "user": t.user,
                "state_home": t.state_home,
                "marker_root": t.marker_root(),
                "netns": t.netns,
                "log": t.log,
                "running": t.sshd_pid().is_some(),
                "cut": t.netns.is_some() && lab.is_cut(&t.alias).unwrap_or(false),
            })
        })
        .collect();
    serde_json::json!({
        "dir": lab.dir(),
        "placement": placement_name(lab.placement()),
        "ssh_config": lab.ssh_config(),
        "known_hosts": lab.known_hosts(),
        "client_key": lab.client_key(),
        "targets": targets,
    })
}

fn placement_name(p: Placement) -> &'static str {
    match p {
        Placement::Loopback => "loopback",
        Placement::Netns => "netns",
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
        | LabError::UnderTmp(_)
        | LabError::BadDir(_)
        | LabError::BadCount(_)
        | LabError::AlreadyRunning(_)
        | LabError::NoLab(_)
        | LabError::UnknownTarget { .. }
        | LabError::NotNetns { .. }
        | LabError::BadKey(_) => ErrorKind::InvalidInput,
        LabError::MissingTool { .. }
        | LabError::Io { .. }
        | LabError::State { .. }
        | LabError::Command { .. }
        | LabError::StartFailed { .. } => ErrorKind::LocalIo,
    };
    Error::new(kind, e.to_string())
}
