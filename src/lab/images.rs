//! Host kinds other than the lab's Debian image, for the docker placement: a busybox
//! userland (Debian's static busybox as every tool, as on Alpine) with OpenSSH's sshd, or
//! with dropbear, and one user per login shell. Built from files this machine has
//! installed (no registry, no network): each binary with the shared libraries `ldd`
//! names, in a rootfs that is `docker import`ed and cached under a tag derived from the
//! recipe and the identity (path, size, modification time) of every file copied, so that
//! an upgraded package builds anew and nothing else does.
//!
//! Also what every lab image shares, the Debian one of `docker.rs` included: the import
//! of a rootfs as an image, and where a lab's image came from.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::error::LabError;
use super::files::write;
use super::progress::{BuildProgress, Phase};

/// What a docker target runs: its userland and its SSH server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostKind {
    /// The lab's own debootstrap image: Debian's userland and OpenSSH (the default).
    #[default]
    Debian,
    /// busybox-static as every tool, OpenSSH's sshd, users per login shell.
    Busybox,
    /// busybox-static as every tool, dropbear as the server (root only).
    Dropbear,
}

impl HostKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HostKind::Debian => "debian",
            HostKind::Busybox => "busybox",
            HostKind::Dropbear => "dropbear",
        }
    }
}

/// Where the image of a lab came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSource {
    /// Found under its recipe tag: nothing was built.
    Cached,
    /// Built now, taking this long.
    Built(Duration),
    /// The user's `--image`.
    Given,
}

/// Repository of these images; the tag is the recipe hash.
const REPO: &str = "opmark-lab-host";
/// Bump when the build below changes in a way the file list cannot show.
const BUILD_REVISION: &str = "1";
/// Where the container's start script is.
pub(crate) const START_SCRIPT: &str = "/opmark-start";

/// Login shells a busybox image offers, one user each (`sh-<name>`): the name, where the
/// image has it, and where this machine may have it (the first that exists). `ash` is
/// busybox's own sh.
pub const LOGIN_SHELLS: &[(&str, &str, &[&str])] = &[
    ("ash", "/bin/sh", &[]),
    ("bash", "/bin/bash", &["/usr/bin/bash", "/bin/bash"]),
    ("dash", "/bin/dash", &["/usr/bin/dash", "/bin/dash"]),
    ("zsh", "/bin/zsh", &["/usr/bin/zsh", "/bin/zsh"]),
    ("mksh", "/bin/mksh", &["/usr/bin/mksh", "/bin/mksh"]),
    ("ksh", "/bin/ksh", &["/usr/bin/ksh93", "/bin/ksh93"]),
    ("yash", "/bin/yash", &["/usr/bin/yash", "/bin/yash"]),
    ("posh", "/bin/posh", &["/usr/bin/posh", "/bin/posh"]),
    ("tcsh", "/bin/tcsh", &["/usr/bin/tcsh", "/bin/tcsh"]),
    ("fish", "/usr/bin/fish", &["/usr/bin/fish"]),
];

/// The static busybox Debian's busybox-static installs.
const BUSYBOX: &[&str] = &["/bin/busybox", "/usr/bin/busybox"];
const SSHD: &str = "/usr/sbin/sshd";
const DROPBEAR: &str = "/usr/sbin/dropbear";
const DROPBEARCONVERT: &str = "/usr/lib/dropbear/dropbearconvert";

/// The user for login shell `name` in a busybox image.
pub fn shell_user(name: &str) -> String {
    format!("sh-{name}")
}

/// What a build copies: (path on this machine, path in the image).
fn files(kind: HostKind) -> Result<Vec<(PathBuf, String)>, LabError> {
    let mut out = Vec::new();
    let busybox = first_existing(BUSYBOX).ok_or_else(|| LabError::MissingTool {
        tool: "busybox".into(),
        fix: "install busybox-static (Debian/Ubuntu: `apt-get install busybox-static`, or `bash scripts/install-deps.sh`)".into(),
    })?;
    out.push((busybox, "/bin/busybox".to_owned()));
    match kind {
        HostKind::Busybox => {
            out.push((required(SSHD, "openssh-server")?, SSHD.to_owned()));
            for (name, inside, here) in LOGIN_SHELLS {
                if *name == "ash" {
                    continue;
                }
                if let Some(p) = first_existing(here) {
                    out.push((p, (*inside).to_owned()));
                }
            }
        }
        HostKind::Dropbear => {
            out.push((required(DROPBEAR, "dropbear-bin")?, DROPBEAR.to_owned()));
            out.push((
                required(DROPBEARCONVERT, "dropbear-bin")?,
                DROPBEARCONVERT.to_owned(),
            ));
        }
        HostKind::Debian => {}
    }
    Ok(out)
}

fn first_existing(paths: &[&str]) -> Option<PathBuf> {
    paths.iter().map(PathBuf::from).find(|p| p.is_file())
}

fn required(path: &str, package: &str) -> Result<PathBuf, LabError> {
    let p = PathBuf::from(path);
    if p.is_file() {
        Ok(p)
    } else {
        Err(LabError::MissingTool {
            tool: path.into(),
            fix: format!("install {package} (Debian/Ubuntu: `apt-get install {package}`, or `bash scripts/install-deps.sh`)"),
        })
    }
}

/// The shells an image of `kind` built now would offer (name, path in the image).
pub fn login_shells(kind: HostKind) -> Vec<(&'static str, &'static str)> {
    if kind != HostKind::Busybox {
        return vec![("ash", "/bin/sh")];
    }
    LOGIN_SHELLS
        .iter()
        .filter(|(name, _, here)| *name == "ash" || first_existing(here).is_some())
        .map(|(name, inside, _)| (*name, *inside))
        .collect()
}

/// The shared libraries `ldd` names for `bin` (none for a static binary).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldd").arg(bin).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Everything whose change must give another image: the recipe's own text and each file
/// copied (path, size, modification time), libraries included.
fn recipe_lines(kind: HostKind, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut lines = vec![
        format!("revision={BUILD_REVISION}"),
        format!("kind={}", kind.as_str()),
        format!("start={}", start_script(kind)),
    ];
    let mut seen = BTreeSet::new();
    for (here, inside) in files {
        let mut all = vec![here.clone()];
        all.extend(libraries(here));
        for p in all {
            if !seen.insert(p.clone()) {
                continue;
            }
            let meta = std::fs::metadata(&p).ok();
            let size = meta.as_ref().map_or(0, |m| m.len());
            let mtime = meta
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            lines.push(format!(
                "file={} as={inside} size={size} mtime={mtime}",
                p.display()
            ));
        }
    }
    lines
}

fn tag_of(lines: &[String]) -> String {
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    format!("{}:{}", repository(REPO), &hex::encode(h.finalize())[..16])
}

/// The image tag of `kind` as this machine would build it now.
pub fn recipe_tag(kind: HostKind) -> Result<String, LabError> {
    let files = files(kind)?;
    Ok(tag_of(&recipe_lines(kind, &files)))
}

/// The container's start script: keys for each user, then the server in the foreground.
fn start_script(kind: HostKind) -> String {
    let keys = "for h in /root /home/*; do\n\
                \t[ -d \"$h\" ] || continue\n\
                \tu=$(stat -c %U \"$h\")\n\
                \tmkdir -p \"$h/.ssh\" && cp /opmark-lab/authorized_keys \"$h/.ssh/authorized_keys\"\n\
                \tchown -R \"$u\" \"$h/.ssh\" && chmod 700 \"$h/.ssh\" && chmod 600 \"$h/.ssh/authorized_keys\"\n\
                done\n";
    // The volume's top, where root's marker root is (0700 itself), is also where tests
    // leave files any user's command may append to.
    let shared = "chmod 1777 /var/lib/opmark-lab\n";
    match kind {
        HostKind::Dropbear => format!(
            "#!/bin/sh\n{keys}{shared}\
             # dropbear has no SetEnv: the default marker root (~/.local/state) is the volume.\n\
             mkdir -p /root/.local /etc/dropbear && ln -sfn /var/lib/opmark-lab /root/.local/state\n\
             set --\n\
             for k in ed25519 ecdsa rsa; do\n\
             \t{DROPBEARCONVERT} openssh dropbear /opmark-lab/ssh_host_${{k}}_key /etc/dropbear/$k >/dev/null 2>&1 &&\n\
             \t\tset -- \"$@\" -r /etc/dropbear/$k\n\
             done\n\
             exec {DROPBEAR} -F -E -p 22 -K 1 \"$@\" 2>>/opmark-lab/sshd.log\n"
        ),
        _ => format!(
            "#!/bin/sh\n{keys}{shared}mkdir -p /run/sshd && chmod 755 /run/sshd\n\
             exec {SSHD} -D -f /opmark-lab/sshd_config -E /opmark-lab/sshd.log\n"
        ),
    }
}

/// The repository lab images are tagged in: `default`, or `OPMARK_LAB_IMAGE_REPO` when
/// set to a docker repository name (lower-case letters, digits, `.`, `_`, `-`, `/`).
/// The tag is still the recipe's hash; another repository is another cache, which is how
/// a test builds an image cold without removing the one everybody else reuses.
pub(crate) fn repository(default: &str) -> String {
    match std::env::var("OPMARK_LAB_IMAGE_REPO") {
        Ok(r)
            if !r.is_empty()
                && r.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c)
                }) =>
        {
            r
        }
        Ok(r) if !r.is_empty() => {
            crate::say!(
                "opmark: OPMARK_LAB_IMAGE_REPO={} is no docker repository name (a-z 0-9 . _ - /); using {default}",
                crate::text::printable(&r)
            );
            default.to_owned()
        }
        _ => default.to_owned(),
    }
}

/// The phases of a host-files image and what they usually take (a few seconds each on
/// the machines its tests run on: nothing is downloaded).
const PHASES: &[Phase] = &[
    Phase {
        name: "copy files",
        usual: std::time::Duration::from_secs(2),
    },
    Phase {
        name: "docker import",
        usual: std::time::Duration::from_secs(5),
    },
];

/// Builds the image of `kind` under `tag` in `scratch` (root only: file owners),
/// showing its progress.
pub(crate) fn build(kind: HostKind, tag: &str, scratch: &Path) -> Result<(), LabError> {
    let progress = BuildProgress::start(tag, PHASES);
    progress.phase(0);
    let built = copy_and_import(kind, tag, scratch, &progress);
    let _ = std::fs::remove_dir_all(scratch);
    if built.is_ok() {
        progress.phase_done();
        progress.finish();
    }
    built
}

/// The root filesystem of `kind` from this machine's files, then its import.
fn copy_and_import(
    kind: HostKind,
    tag: &str,
    scratch: &Path,
    progress: &BuildProgress,
) -> Result<(), LabError> {
    let files = files(kind)?;
    let rootfs = scratch.join("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LabError::Io { path, source }
    };
    for dir in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "etc",
        "root",
        "home",
        "tmp",
        "run",
        "var/empty",
        "var/lib/opmark-lab",
        "dev",
        "proc",
        "sys",
    ] {
        let d = rootfs.join(dir);
        std::fs::create_dir_all(&d).map_err(io(&d))?;
    }
    let tmp = rootfs.join("tmp");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).map_err(io(&tmp))?;
    let root_home = rootfs.join("root");
    std::fs::set_permissions(&root_home, std::fs::Permissions::from_mode(0o700))
        .map_err(io(&root_home))?;
    let mut copied = BTreeSet::new();
    for (here, inside) in &files {
        copy_into(&rootfs, here, inside)?;
        for lib in libraries(here) {
            if copied.insert(lib.clone()) {
                copy_into(&rootfs, &lib, &lib.to_string_lossy())?;
            }
        }
    }
    // fish reads its functions from its share directory.
    if files.iter().any(|(_, inside)| inside.ends_with("/fish")) {
        let share = rootfs.join("usr/share");
        std::fs::create_dir_all(&share).map_err(io(&share))?;
        let status = Command::new("cp")
            .args(["-a", "/usr/share/fish"])
            .arg(&share)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            return Err(LabError::Command {
                command: format!("cp -a /usr/share/fish {}", share.display()),
                detail: "fish's share directory could not be copied".into(),
            });
        }
    }
    // Every applet as a link to busybox, where no real binary was copied.
    let list = Command::new(rootfs.join("bin/busybox"))
        .arg("--list-full")
        .output()
        .map_err(|e| LabError::Command {
            command: "busybox --list-full".into(),
            detail: e.to_string(),
        })?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let link = rootfs.join(applet.trim_start_matches('/'));
        if applet.is_empty() || link.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        symlink("/bin/busybox", &link).map_err(io(&link))?;
    }
    let shells = login_shells(kind);
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\nsshd:x:74:65534::/run/sshd:/bin/false\nnobody:x:65534:65534::/nonexistent:/bin/false\n");
    let mut group = String::from("root:x:0:\nnogroup:x:65534:\n");
    let mut shadow = String::from("root:*:19000:0:99999:7:::\n");
    let mut etc_shells = String::new();
    for (n, (name, inside)) in shells.iter().enumerate() {
        let _ = writeln!(etc_shells, "{inside}");
        if kind != HostKind::Busybox {
            continue;
        }
        let user = shell_user(name);
        let uid = 2000 + n;
        let _ = writeln!(passwd, "{user}:x:{uid}:{uid}::/home/{user}:{inside}");
        let _ = writeln!(group, "{user}:x:{uid}:");
        let _ = writeln!(shadow, "{user}:*:19000:0:99999:7:::");
        let home = rootfs.join("home").join(&user);
        std::fs::create_dir_all(&home).map_err(io(&home))?;
        std::os::unix::fs::chown(&home, Some(uid as u32), Some(uid as u32)).map_err(io(&home))?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))
            .map_err(io(&home))?;
    }
    if kind == HostKind::Busybox {
        // A login that runs no commands: the matrix's refused cell.
        let user = shell_user("false");
        let _ = writeln!(passwd, "{user}:x:2999:2999::/home/{user}:/bin/false");
        let _ = writeln!(group, "{user}:x:2999:");
        let _ = writeln!(shadow, "{user}:*:19000:0:99999:7:::");
        let home = rootfs.join("home").join(&user);
        std::fs::create_dir_all(&home).map_err(io(&home))?;
        std::os::unix::fs::chown(&home, Some(2999), Some(2999)).map_err(io(&home))?;
    }
    let etc = rootfs.join("etc");
    for (name, text, mode) in [
        ("passwd", passwd.as_str(), 0o644),
        ("group", group.as_str(), 0o644),
        ("shadow", shadow.as_str(), 0o600),
        ("shells", etc_shells.as_str(), 0o644),
    ] {
        write(&etc.join(name), text, mode)?;
    }
    write(
        &rootfs.join(START_SCRIPT.trim_start_matches('/')),
        &start_script(kind),
        0o755,
    )?;
    progress.phase_done();
    progress.phase(1);
    import_rootfs(&rootfs, tag, &["/bin/sh", START_SCRIPT])
}

/// `tar -C rootfs -c . | docker import -c CMD - tag`.
pub(crate) fn import_rootfs(rootfs: &Path, tag: &str, cmd: &[&str]) -> Result<(), LabError> {
    let cmd_json = serde_json::to_string(cmd).unwrap_or_default();
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LabError::Command {
            command: "tar".into(),
            detail: e.to_string(),
        })?;
    let tar_out = tar
        .stdout
        .take()
        .map(Stdio::from)
        .unwrap_or_else(Stdio::null);
    let imported = Command::new("docker")
        .args(["import", "-c", &format!("CMD {cmd_json}"), "-"])
        .arg(tag)
        .stdin(tar_out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| LabError::Command {
            command: "docker import".into(),
            detail: e.to_string(),
        })?;
    let tar_status = tar.wait_with_output();
    if !imported.status.success() {
        return Err(LabError::Command {
            command: format!("docker import - {tag}"),
            detail: String::from_utf8_lossy(&imported.stderr).trim().to_string(),
        });
    }
    match tar_status {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(LabError::Command {
            command: format!("tar -C {} -c .", rootfs.display()),
            detail: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        }),
        Err(e) => Err(LabError::Command {
            command: "tar".into(),
            detail: e.to_string(),
        }),
    }
}

/// Copies `here` to `inside` under `rootfs` (its content: a link's target).
fn copy_into(rootfs: &Path, here: &Path, inside: &str) -> Result<(), LabError> {
    let dest = rootfs.join(inside.trim_start_matches('/'));
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|source| LabError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::copy(here, &dest).map_err(|source| LabError::Io {
        path: here.to_path_buf(),
        source,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines() -> Vec<String> {
        vec![
            "revision=1".into(),
            "kind=busybox".into(),
            "file=/usr/sbin/sshd as=/usr/sbin/sshd size=100 mtime=5".into(),
        ]
    }

    #[test]
    fn the_tag_is_stable_for_one_recipe_and_changes_with_any_file_copied() {
        let tag = tag_of(&lines());
        assert_eq!(tag, tag_of(&lines()), "same recipe, same tag");
        assert!(tag.starts_with("opmark-lab-host:") && tag.len() == REPO.len() + 1 + 16);
        let mut upgraded = lines();
        upgraded[2] = "file=/usr/sbin/sshd as=/usr/sbin/sshd size=100 mtime=6".into();
        assert_ne!(tag_of(&upgraded), tag, "an upgraded sshd builds anew");
        let mut other_kind = lines();
        other_kind[1] = "kind=dropbear".into();
        assert_ne!(tag_of(&other_kind), tag);
    }

    #[test]
    fn start_scripts_give_every_user_the_keys_and_run_the_server_in_the_foreground() {
        let sshd = start_script(HostKind::Busybox);
        assert!(sshd.contains("exec /usr/sbin/sshd -D"), "{sshd}");
        assert!(sshd.contains("/home/*"), "{sshd}");
        let db = start_script(HostKind::Dropbear);
        assert!(db.contains("exec /usr/sbin/dropbear -F -E"), "{db}");
        assert!(
            db.contains("ln -sfn /var/lib/opmark-lab /root/.local/state"),
            "{db}"
        );
    }
}
