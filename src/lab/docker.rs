//! Docker placement: each target is a container running a real OpenSSH sshd, on a
//! user-defined bridge network of the lab with a fixed address, its markers on a named
//! volume that outlives the container's processes. The image is built here, without any
//! registry (debootstrap of a minimal Debian, then `docker import`), and cached under a
//! tag derived from the hash of its recipe; `--image` uses one the user already has.
//! Keys and sshd_config are injected at start through a bind mount of the target's
//! directory, so any image with an sshd works. Faults: `cut`/`restore` (nftables inside
//! the container's network namespace: a silent drop, where `docker network disconnect`
//! would reset connections), `pause`/`resume` (docker pause: a frozen host) and `crash`
//! (every process killed, container started again: markers stay, the command does not).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::error::LabError;
use super::files::{log_tail, mkdir, read, write};
use super::images::{self, HostKind, ImageSource};
use super::listening::READY_TIMEOUT;
use super::progress::{BuildProgress, Phase};
use super::spec::{LabSpec, Placement};
use super::sshd::{self, run};
use super::state::{DockerLab, Lab, LabState, Node};
use super::target::{self, Target, HOST_KEYS};
use super::user::effective_uid;

/// What the built image is made of. Any change here changes the tag, so a new recipe is
/// built once and an old image is never mistaken for it.
const RECIPE: &[(&str, &str)] = &[
    ("recipe", "2"),
    ("suite", "bookworm"),
    ("variant", "minbase"),
    // sshd; busybox so the shim can be tried under ash too; procps to look around; sudo
    // for --become.
    ("include", "openssh-server,busybox,procps,sudo"),
    // A login user whose sudo asks for a password (`run --become` with SUDO_PASSWORD).
    ("sudo_user", SUDO_USER),
    ("sudo_password", SUDO_PASSWORD),
    // Host keys made by the package's postinst would be shared by every container.
    (
        "strip",
        "etc/ssh/ssh_host_* var/cache/apt/archives/*.deb var/lib/apt/lists/*",
    ),
    ("cmd", START_SSHD),
];
/// Where debootstrap fetches packages (not part of the recipe: any mirror gives the same
/// packages).
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Repository of the built image; the tag is the recipe hash.
const IMAGE_REPO: &str = "opmark-lab";
/// Where the target's directory (keys, sshd_config, log) is mounted in the container.
const INJECT_DIR: &str = "/opmark-lab";
/// Where the marker volume is mounted; it is the commands' XDG_STATE_HOME, so the marker
/// root is `<it>/opmark`, a disk-backed path the shim accepts.
const STATE_HOME: &str = "/var/lib/opmark-lab";
/// The container's command: the privilege-separation dir is not in every image, the
/// injected keys (readable by root only) are copied to every other user's home, and sshd
/// in the foreground is the container's life.
const START_SSHD: &str = "mkdir -p /run/sshd && for h in /home/*; do [ -d \"$h\" ] || continue; \
     u=$(stat -c %U \"$h\"); mkdir -p \"$h/.ssh\" && cp /opmark-lab/authorized_keys \"$h/.ssh/\" && \
     chown -R \"$u\" \"$h/.ssh\" && chmod 700 \"$h/.ssh\" && chmod 600 \"$h/.ssh/authorized_keys\"; done; \
     exec /usr/sbin/sshd -D -f /opmark-lab/sshd_config -E /opmark-lab/sshd.log";
/// The Debian image's login user whose sudo (`ALL=(ALL:ALL) ALL`) asks for a password.
pub const SUDO_USER: &str = "opmark-sudo";
/// That user's password: a disposable lab's, known to its tests (never a real one).
pub const SUDO_PASSWORD: &str = "lab-sudo-pw-7e1d";
/// nftables table of a cut, inside the container's network namespace.
const CUT_TABLE: &str = "opmark_lab_cut";
/// The boot id a rebooted target reads, in its directory (mounted at [`INJECT_DIR`]).
const BOOT_ID_FILE: &str = "boot_id";
/// First host number given to a target in the lab's subnet (.1 is the bridge).
const FIRST_HOST: u32 = 10;

/// Options only the docker placement has.
#[derive(Debug, Clone, Default)]
pub struct DockerSpec {
    /// An image the user already has, with sshd at /usr/sbin/sshd; None builds (or reuses)
    /// the lab's own image of `kind`.
    pub image: Option<String>,
    /// The host kind of the lab's own image (ignored with `image`): Debian by default.
    pub kind: HostKind,
}

/// The tag of the lab's own image: `opmark-lab:<first 16 hex of the recipe's SHA-256>`.
pub fn recipe_tag() -> String {
    tag_of(RECIPE)
}

fn tag_of(recipe: &[(&str, &str)]) -> String {
    let mut h = Sha256::new();
    for (k, v) in recipe {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    format!(
        "{}:{}",
        images::repository(IMAGE_REPO),
        &hex::encode(h.finalize())[..16]
    )
}

fn recipe(key: &str) -> &'static str {
    RECIPE
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .unwrap_or("")
}

fn docker(args: &[&str]) -> Result<String, LabError> {
    run(Command::new("docker").args(args))
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Docker on PATH and its engine answering, or a clear error with the fix.
pub(crate) fn require_engine() -> Result<(), LabError> {
    sshd::require_on_path("docker", "docker.io")?;
    docker(&["version", "--format", "{{.Server.Version}}"]).map_err(|e| LabError::MissingTool {
        tool: "a running Docker engine".into(),
        fix: format!(
            "start it (e.g. `systemctl start docker`) and make sure this user may use it \
             (root or the docker group); docker said: {e}"
        ),
    })?;
    Ok(())
}

/// True when the image exists locally.
fn image_exists(image: &str) -> bool {
    docker(&["image", "inspect", "--format", "{{.Id}}", image]).is_ok()
}

/// The lab's own image, built when no image carries the recipe's tag. One builder at a
/// time per user (a lock file), so parallel `lab up`s and tests build it once.
/// The other kinds are built from this machine's own files (see `images`), in seconds
/// and without network.
pub fn ensure_image_of(kind: HostKind, scratch: &Path) -> Result<(String, ImageSource), LabError> {
    let tag = match kind {
        HostKind::Debian => recipe_tag(),
        _ => images::recipe_tag(kind)?,
    };
    if image_exists(&tag) {
        return Ok((tag, ImageSource::Cached));
    }
    let lock_path = std::env::temp_dir().join(format!(
        "opmark-lab-image-{}-{}.lock",
        kind.as_str(),
        effective_uid()
    ));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| LabError::Io {
            path: lock_path.clone(),
            source,
        })?;
    lock.lock().map_err(|source| LabError::Io {
        path: lock_path.clone(),
        source,
    })?;
    // Another builder may have finished while this one waited for the lock.
    if image_exists(&tag) {
        return Ok((tag, ImageSource::Cached));
    }
    let started = Instant::now();
    match kind {
        HostKind::Debian => build_image(&tag, scratch)?,
        _ => {
            if effective_uid() != 0 {
                return Err(LabError::MissingTool {
                    tool: format!(
                        "root (to build the {} lab image: file owners)",
                        kind.as_str()
                    ),
                    fix: "run it once as root; the image is cached afterwards".into(),
                });
            }
            mkdir(scratch, 0o700)?;
            images::build(kind, &tag, scratch)?
        }
    }
    Ok((tag, ImageSource::Built(started.elapsed())))
}

fn build_image(tag: &str, scratch: &Path) -> Result<(), LabError> {
    let uid = effective_uid();
    if uid != 0 {
        return Err(LabError::MissingTool {
            tool: "root (to build the lab image with debootstrap)".into(),
            fix: format!(
                "run `opmark lab up --placement docker` once as root (running as uid {uid}; \
                 the image {tag} is cached afterwards), or pass --image IMG with an image \
                 you have that contains sshd"
            ),
        });
    }
    sshd::require_on_path("debootstrap", "debootstrap")?;
    sshd::require_on_path("tar", "tar")?;
    let rootfs = scratch.join("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    mkdir(scratch, 0o700)?;
    let progress = BuildProgress::start(tag, DEBIAN_PHASES);
    let result = debootstrap(&rootfs, &progress)
        .and_then(|()| add_sudo_user(&rootfs))
        .and_then(|()| import(&rootfs, tag, &progress));
    let _ = std::fs::remove_dir_all(scratch);
    if result.is_ok() {
        progress.finish();
    }
    result
}

/// The phases of the Debian image and what they usually take: debootstrap took 53 s on
/// a quiet 2-core VM and 92 s beside other builds (docs/operating.md#lab-disposable-ssh-targets), and issue 28
/// timed a cold build at about two minutes, the last ~23 s of it docker import.
const DEBIAN_PHASES: &[Phase] = &[
    Phase {
        name: "debootstrap",
        usual: Duration::from_secs(75),
    },
    Phase {
        name: "docker import",
        usual: Duration::from_secs(23),
    },
];

/// Runs debootstrap, its last line shown in the build's status line.
fn debootstrap(rootfs: &Path, progress: &BuildProgress) -> Result<(), LabError> {
    progress.phase(0);
    let mirror = std::env::var("OPMARK_LAB_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.into());
    let mut child = Command::new("debootstrap")
        .arg(format!("--variant={}", recipe("variant")))
        .arg(format!("--include={}", recipe("include")))
        .arg(recipe("suite"))
        .arg(rootfs)
        .arg(&mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LabError::Command {
            command: "debootstrap".into(),
            detail: e.to_string(),
        })?;
    let stderr = child.stderr.take();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut s) = stderr {
            let _ = std::io::Read::read_to_string(&mut s, &mut text);
        }
        text
    });
    let mut tail: Vec<String> = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            progress.detail(&line);
            tail.push(line);
            if tail.len() > 20 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait().map_err(|e| LabError::Command {
        command: "debootstrap".into(),
        detail: e.to_string(),
    })?;
    let stderr_text = stderr_reader.join().unwrap_or_default();
    if !status.success() {
        let log = rootfs.join("debootstrap/debootstrap.log");
        return Err(LabError::Command {
            command: format!("debootstrap ... {} {}", rootfs.display(), mirror),
            detail: format!(
                "{status}; is {mirror} reachable (set OPMARK_LAB_MIRROR to another Debian \
                 mirror)?\n{}\n{}\n{}",
                tail.join("\n"),
                stderr_text.trim(),
                log_tail(&log, 15)
            ),
        });
    }
    progress.phase_done();
    Ok(())
}

/// The recipe's sudo user: made with the image's own useradd and chpasswd (in a chroot),
/// allowed every command through sudo with its password.
fn add_sudo_user(rootfs: &Path) -> Result<(), LabError> {
    let user = recipe("sudo_user");
    let chroot = |args: &[&str], input: Option<String>| -> Result<(), LabError> {
        let mut child = Command::new("chroot")
            .arg(rootfs)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| LabError::Command {
                command: format!("chroot {}", args.join(" ")),
                detail: e.to_string(),
            })?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            let _ = stdin.write_all(text.as_bytes());
        }
        let out = child.wait_with_output().map_err(|e| LabError::Command {
            command: format!("chroot {}", args.join(" ")),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(LabError::Command {
                command: format!("chroot ROOTFS {}", args.join(" ")),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(())
    };
    chroot(&["useradd", "-m", "-s", "/bin/bash", user], None)?;
    chroot(
        &["chpasswd"],
        Some(format!("{user}:{}\n", recipe("sudo_password"))),
    )?;
    let sudoers = rootfs.join("etc/sudoers.d/opmark-lab");
    write(&sudoers, &format!("{user} ALL=(ALL:ALL) ALL\n"), 0o440)
}

/// Strips what must not be shared, then `tar -C rootfs -c . | docker import`.
fn import(rootfs: &Path, tag: &str, progress: &BuildProgress) -> Result<(), LabError> {
    for pattern in recipe("strip").split_whitespace() {
        let (dir, name) = pattern.rsplit_once('/').unwrap_or(("", pattern));
        let (pre, post) = name.split_once('*').unwrap_or((name, ""));
        let Ok(entries) = std::fs::read_dir(rootfs.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let file = e.file_name();
            let file = file.to_string_lossy();
            let matches = if name.contains('*') {
                file.starts_with(pre) && file.ends_with(post)
            } else {
                file == name
            };
            if matches && e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    // The import is silent for its ~20 s: the ticking status line says it is under way.
    progress.phase(1);
    let imported = images::import_rootfs(rootfs, tag, &["/bin/sh", "-c", START_SSHD]);
    if imported.is_ok() {
        progress.phase_done();
    }
    imported
}

/// The lab id: a hash of the lab directory, so a lab's docker objects can be found from
/// its directory even when lab.json is gone.
fn lab_id(dir: &Path) -> String {
    hex::encode(Sha256::digest(dir.as_os_str().as_encoded_bytes()))[..10].to_string()
}

/// Checks what a docker lab needs before its directory is touched: the engine, the ssh
/// client tools and a given `--image`.
pub(crate) fn preflight(options: &DockerSpec) -> Result<(), LabError> {
    require_engine()?;
    sshd::require_on_path("ssh", "openssh-client")?;
    sshd::require_on_path("ssh-keygen", "openssh-client")?;
    if let Some(image) = &options.image {
        if !image_exists(image) {
            return Err(LabError::NoImage(image.clone()));
        }
    }
    Ok(())
}

/// Starts a docker lab in `dir`, prepared by the caller after [`preflight`] (called by
/// [`Lab::start`] and [`Lab::start_docker`], which clear a stale lab there first).
pub(crate) fn start(spec: &LabSpec, options: &DockerSpec, dir: PathBuf) -> Result<Lab, LabError> {
    let (image, source) = match &options.image {
        Some(i) => (i.clone(), ImageSource::Given),
        None => ensure_image_of(options.kind, &dir.join("image-build"))?,
    };
    let kind = match options.image {
        Some(_) => HostKind::Debian,
        None => options.kind,
    };
    let id = lab_id(&dir);
    // Leftovers of a crashed lab in this directory would hold the names.
    remove_objects(&id);

    let client_key = dir.join("client_ed25519");
    sshd::generate_keys(&[("ed25519", client_key.clone())], "opmark-lab-client")?;
    let client_pub = read(&client_key.with_extension("pub"))?;
    let network = format!("opmark-lab-{id}");
    let mut lab = Lab {
        state: LabState {
            id: target::new_lab_id(),
            placement: Placement::Docker,
            ssh_config: dir.join("ssh_config"),
            known_hosts: dir.join("known_hosts"),
            client_key,
            targets: Vec::new(),
            docker: Some(DockerLab {
                id: id.clone(),
                network: network.clone(),
                subnet: String::new(),
                image: image.clone(),
                own_image: options.image.is_none(),
                nodes: Vec::new(),
                kind,
                image_source: Some(source),
            }),
        },
        dir: dir.clone(),
        sshd: PathBuf::from("/usr/sbin/sshd"),
        owned: true, // from here on, an error drops the lab and removes what started
    };
    let (subnet, base) = create_network(&network, &id, &dir)?;
    if let Some(d) = lab.state.docker.as_mut() {
        d.subnet = subnet;
    }
    lab.save()?;
    for i in 1..=spec.count {
        let addr = Ipv4Addr::from(u32::from(base) + FIRST_HOST + i as u32 - 1);
        let (target, node) = prepare_target(&lab, i, addr, &client_pub)?;
        lab.state.targets.push(target);
        if let Some(d) = lab.state.docker.as_mut() {
            d.nodes.push(node);
        }
        lab.save()?;
    }
    lab.write_client_files()?;
    for (t, n) in lab.state.targets.iter().zip(docker_nodes(&lab)) {
        run_container(&lab, t, n)?;
    }
    wait_all_ready(&lab)?;
    Ok(lab)
}

fn docker_nodes(lab: &Lab) -> Vec<&Node> {
    lab.state
        .docker
        .as_ref()
        .map(|d| d.nodes.iter().collect())
        .unwrap_or_default()
}

/// Creates the lab's network with a subnet of its own. Docker picks a free one (it avoids
/// the host's routes and other networks); the network is then made again with that
/// subnet stated, because only a stated subnet lets a container keep a fixed address
/// across a restart (the crash verb) instead of taking the next free one.
fn create_network(name: &str, id: &str, dir: &Path) -> Result<(String, Ipv4Addr), LabError> {
    let label_id = format!("opmark.lab.id={id}");
    let label_dir = format!("opmark.lab.dir={}", dir.display());
    let mut last = None;
    for _ in 0..5 {
        docker(&["network", "create", "--label", &label_id, name])?;
        let subnet = docker(&[
            "network",
            "inspect",
            "--format",
            "{{range .IPAM.Config}}{{.Subnet}} {{end}}",
            name,
        ]);
        let _ = docker(&["network", "rm", name]);
        let subnet = subnet?;
        let Some((base, prefix)) = subnet
            .split_whitespace()
            .find_map(|s| parse_v4_subnet(s).filter(|(_, p)| *p <= 24))
        else {
            return Err(LabError::Command {
                command: format!("docker network inspect {name}"),
                detail: format!("no IPv4 subnet of /24 or larger: {subnet:?}"),
            });
        };
        let cidr = format!("{base}/{prefix}");
        match docker(&[
            "network", "create", "--driver", "bridge", "--subnet", &cidr, "--label", &label_id,
            "--label", &label_dir, name,
        ]) {
            Ok(_) => return Ok((cidr, base)),
            // Another network took the subnet in between: ask again.
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| LabError::Command {
        command: "docker network create".into(),
        detail: "no free subnet".into(),
    }))
}

fn parse_v4_subnet(s: &str) -> Option<(Ipv4Addr, u32)> {
    let (addr, prefix) = s.split_once('/')?;
    Some((addr.parse().ok()?, prefix.parse().ok()?))
}

fn prepare_target(
    lab: &Lab,
    index: usize,
    addr: Ipv4Addr,
    client_pub: &str,
) -> Result<(Target, Node), LabError> {
    let alias = target::alias_of(lab.id(), index);
    // Directory, container, volume and hostname keep the short name: the lab's docker
    // id already makes the container and volume names unique on this machine.
    let short = format!("target{index}");
    let dir = lab.dir.join(&short);
    mkdir(&dir, 0o700)?;
    let keys: Vec<(&str, PathBuf)> = HOST_KEYS
        .iter()
        .map(|(kind, file)| (*kind, dir.join(file)))
        .collect();
    sshd::generate_keys(&keys, &format!("opmark-lab-{alias}"))?;
    let target = Target {
        alias: alias.clone(),
        addr: IpAddr::V4(addr),
        port: 22,
        user: "root".into(),
        state_home: PathBuf::from(STATE_HOME),
        home: PathBuf::from("/root"),
        netns: None,
        log: dir.join("sshd.log"),
        dir,
        ns_if: None,
        host_if: None,
        // Its markers live on the container's volume, not under a volatile path; a
        // container is erased with the lab all the same.
        disposable: true,
    };
    write(&target.authorized_keys(), client_pub, 0o600)?;
    write(&target.sshd_config(), &config_text(&alias), 0o600)?;
    let id = &lab.docker()?.id;
    let node = Node {
        container: format!("opmark-lab-{id}-{short}"),
        volume: format!("opmark-lab-{id}-{short}-markers"),
        alias,
    };
    Ok((target, node))
}

/// The sshd_config as the container sees it (paths inside the container).
fn config_text(alias: &str) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "# opmark lab docker target {alias} (generated)");
    c.push_str("ListenAddress 0.0.0.0:22\n");
    for (_, file) in HOST_KEYS {
        let _ = writeln!(c, "HostKey {INJECT_DIR}/{file}");
    }
    // Not in the bind mount: a pid of the container's namespace means nothing outside.
    c.push_str("PidFile /run/sshd.pid\n");
    // The injected file is readable by root only; other users (one per login shell in the
    // busybox image) get a copy in their home from the start script.
    let _ = writeln!(
        c,
        "AuthorizedKeysFile {INJECT_DIR}/authorized_keys .ssh/authorized_keys"
    );
    // The injected files belong to whoever ran the lab, not to root in the container.
    c.push_str("StrictModes no\nUsePAM no\n");
    c.push_str("PubkeyAuthentication yes\nPasswordAuthentication no\n");
    c.push_str("KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n");
    // Tests open many connections at once; the default 10:30:100 drops them (docs/findings.md#sshd-maxstartups).
    c.push_str("MaxStartups 200:30:400\nMaxSessions 200\n");
    c.push_str("ClientAliveInterval 1\nClientAliveCountMax 3\n");
    c.push_str("LogLevel VERBOSE\nUseDNS no\nPrintMotd no\nPrintLastLog no\n");
    c.push_str("X11Forwarding no\nAllowTcpForwarding yes\n");
    // root's markers live on the volume: they survive a crash of the container (other
    // users' stay in their homes, in the container's own layer, which a crash keeps too).
    // Last: a Match block runs to the end of the file.
    let _ = writeln!(c, "Match User root\n\tSetEnv XDG_STATE_HOME={STATE_HOME}");
    c
}

fn run_container(lab: &Lab, t: &Target, n: &Node) -> Result<(), LabError> {
    let d = lab.docker()?;
    let label_id = format!("opmark.lab.id={}", d.id);
    let label_dir = format!("opmark.lab.dir={}", lab.dir.display());
    let _ = std::fs::remove_file(&t.log);
    docker(&[
        "volume", "create", "--label", &label_id, "--label", &label_dir, &n.volume,
    ])?;
    let ip = t.addr.to_string();
    let inject = format!("{}:{INJECT_DIR}", t.dir.display());
    let markers = format!("{}:{STATE_HOME}", n.volume);
    docker(
        &[
            "run",
            "-d",
            "--name",
            &n.container,
            "--hostname",
            t.short_name(),
            "--network",
            &d.network,
            "--ip",
            &ip,
            "--label",
            &label_id,
            "--label",
            &label_dir,
            "-v",
            &inject,
            "-v",
            &markers,
            &d.image,
        ]
        .into_iter()
        .chain(start_command(d.kind))
        .collect::<Vec<_>>(),
    )
    .map_err(|e| t.start_failed(format!("docker run failed: {e}")))?;
    Ok(())
}

/// The container's command: the Debian image's sshd line, or the other kinds' script.
fn start_command(kind: HostKind) -> Vec<&'static str> {
    match kind {
        HostKind::Debian => vec!["/bin/sh", "-c", START_SSHD],
        _ => vec!["/bin/sh", images::START_SCRIPT],
    }
}

fn wait_all_ready(lab: &Lab) -> Result<(), LabError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let cfg = lab.state.ssh_config.clone();
    std::thread::scope(|s| {
        let handles: Vec<_> = lab
            .state
            .targets
            .iter()
            .zip(docker_nodes(lab))
            .map(|(t, n)| {
                let cfg = &cfg;
                s.spawn(move || {
                    wait_listening(t, n, deadline)?;
                    // A fresh log per lab: all of it is this start's.
                    sshd::wait_ready(t, cfg, deadline, 0)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(LabError::Command {
                        command: "readiness check".into(),
                        detail: "its thread panicked".into(),
                    })
                })
            })
            .collect::<Result<Vec<()>, LabError>>()
    })?;
    Ok(())
}

/// Waits until the container's port 22 accepts TCP; a container that exits first (an
/// image without sshd, a config its sshd refuses) fails at once with its output, rather
/// than at the deadline.
fn wait_listening(t: &Target, n: &Node, deadline: Instant) -> Result<(), LabError> {
    let addr = std::net::SocketAddr::new(t.addr, t.port);
    loop {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
            return Ok(());
        }
        let state = docker(&["inspect", "--format", "{{.State.Status}}", &n.container])
            .unwrap_or_else(|e| e.to_string());
        if state != "running" && state != "created" {
            let logs = run(Command::new("docker").args(["logs", "--tail", "20", &n.container]))
                .map(|o| {
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_default();
            return Err(t.start_failed(format!(
                "container {} is {state} (its image needs /bin/sh and /usr/sbin/sshd); its \
                 output: {}",
                n.container,
                logs.trim()
            )));
        }
        if Instant::now() > deadline {
            return Err(t.start_failed("port 22 not listening before the deadline".into()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes every container, volume and the network labelled with this lab id. Missing
/// objects are fine.
fn remove_objects(id: &str) -> bool {
    let filter = format!("label=opmark.lab.id={id}");
    let mut ok = true;
    if let Ok(ids) = docker(&["ps", "-aq", "--filter", &filter]) {
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(ids);
            ok &= docker(&args).is_ok();
        }
    }
    if let Ok(vols) = docker(&["volume", "ls", "-q", "--filter", &filter]) {
        let vols: Vec<&str> = vols.split_whitespace().collect();
        if !vols.is_empty() {
            let mut args = vec!["volume", "rm", "-f"];
            args.extend(vols);
            ok &= docker(&args).is_ok();
        }
    }
    if let Ok(nets) = docker(&["network", "ls", "-q", "--filter", &filter]) {
        for net in nets.split_whitespace() {
            ok &= docker(&["network", "rm", net]).is_ok();
        }
    }
    ok
}

/// Removes the lab's containers (and so everything that ran in them), volumes and network.
pub(crate) fn stop_all(d: &DockerLab) -> Result<(), LabError> {
    if remove_objects(&d.id) {
        Ok(())
    } else {
        Err(LabError::Command {
            command: format!("docker rm/volume rm/network rm (lab {})", d.id),
            detail: "some docker objects of the lab could not be removed; see `docker ps -a \
                     --filter label=opmark.lab.id=<id>`"
                .replace("<id>", &d.id),
        })
    }
}

/// The nftables ruleset of a cut: drop everything on the container's eth0 before
/// connection tracking (priority raw), so nothing answers: no RST, FIN or ICMP.
/// Runs `argv` (an `nft -f -`, perhaps through nsenter) with `script` on its input.
fn nft(argv: &[&str], script: &str) -> Result<String, LabError> {
    sshd::require_on_path("nft", "nftables")?;
    let shown = argv.join(" ");
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LabError::Command {
            command: shown.clone(),
            detail: e.to_string(),
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| LabError::Command {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            command: shown,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Drops (`on`) every packet this machine sends to `t`, in this machine's own network
/// namespace, so the block outlives the container's restart; `off` removes it.
fn host_block(t: &Target, on: bool) -> Result<(), LabError> {
    let table = format!(
        "opmark_lab_boot_{}",
        t.addr.to_string().replace(['.', ':'], "_")
    );
    let family = if t.addr.is_ipv4() { "ip" } else { "ip6" };
    let exists = nft(&["nft", "-f", "-"], "list tables\n")?
        .lines()
        .any(|l| l.trim() == format!("table inet {table}"));
    let mut script = String::new();
    if exists {
        let _ = writeln!(script, "delete table inet {table}");
    }
    if on {
        let _ = writeln!(
            script,
            "table inet {table} {{\n\tchain output {{ type filter hook output priority raw; policy accept; {family} daddr {} drop; }}\n}}",
            t.addr
        );
    }
    if !script.is_empty() {
        nft(&["nft", "-f", "-"], &script)?;
    }
    Ok(())
}

fn cut_rules() -> String {
    format!(
        "table inet {CUT_TABLE} {{\n\
         \tchain input {{ type filter hook input priority raw; policy accept; iifname \"eth0\" drop; }}\n\
         \tchain output {{ type filter hook output priority raw; policy accept; oifname \"eth0\" drop; }}\n\
         }}\n"
    )
}

impl Lab {
    pub(crate) fn docker(&self) -> Result<&DockerLab, LabError> {
        self.state
            .docker
            .as_ref()
            .ok_or_else(|| LabError::NotDocker {
                alias: self
                    .state
                    .targets
                    .first()
                    .map(|t| t.alias.clone())
                    .unwrap_or_default(),
            })
    }

    fn node(&self, alias: &str) -> Result<&Node, LabError> {
        let target = self.get(alias)?;
        self.state
            .docker
            .as_ref()
            .and_then(|d| d.nodes.iter().find(|n| n.alias == target.alias))
            .ok_or_else(|| LabError::NotDocker {
                alias: alias.to_string(),
            })
    }

    /// The container running target `alias` (docker placement).
    pub fn container(&self, alias: &str) -> Result<String, LabError> {
        Ok(self.node(alias)?.container.clone())
    }

    /// The image the lab's containers run, and whether this start built it (docker).
    /// The source is known only to the process that started the lab.
    pub fn image(&self) -> Option<(&str, Option<ImageSource>)> {
        self.state
            .docker
            .as_ref()
            .map(|d| (d.image.as_str(), d.image_source))
    }

    /// Where the target's marker root is on this machine: for a docker target the
    /// marker volume's directory, otherwise [`Target::marker_root`].
    pub fn marker_root_on_host(&self, alias: &str) -> Result<PathBuf, LabError> {
        let t = self.get(alias)?;
        match self.state.docker.as_ref() {
            None => Ok(t.marker_root()),
            Some(_) => {
                let n = self.node(alias)?;
                let mount = docker(&[
                    "volume",
                    "inspect",
                    "--format",
                    "{{.Mountpoint}}",
                    &n.volume,
                ])?;
                Ok(PathBuf::from(mount).join("opmark"))
            }
        }
    }

    /// `running`, `paused`, `exited`... of the target's container (docker placement).
    pub fn container_state(&self, alias: &str) -> Result<String, LabError> {
        let n = self.node(alias)?;
        docker(&["inspect", "--format", "{{.State.Status}}", &n.container])
    }

    /// Freezes every process of the target (docker pause): connections stay open, nothing
    /// answers.
    pub fn pause(&self, alias: &str) -> Result<(), LabError> {
        let n = self.node(alias)?;
        // The cgroup freezer can miss a process caught starting (runc: "unable to
        // freeze", seen in CI while the target's shim forked): the container stays
        // running, and a try a moment later freezes it.
        let mut tries = 0;
        loop {
            if self.container_state(alias)? == "paused" {
                return Ok(());
            }
            match docker(&["pause", &n.container]) {
                Ok(_) => return Ok(()),
                Err(e) if tries < 5 && e.to_string().contains("unable to freeze") => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Undoes [`Lab::pause`]. Idempotent.
    pub fn resume(&self, alias: &str) -> Result<(), LabError> {
        let n = self.node(alias)?;
        if self.container_state(alias)? == "paused" {
            docker(&["unpause", &n.container])?;
        }
        Ok(())
    }

    /// Kills every process of the target at once (SIGKILL to the container's init takes
    /// its whole pid namespace), then starts it again at the same address and waits until
    /// it answers SSH. The marker volume keeps every record; the running command is gone,
    /// and the host's boot id is unchanged (the last [`Lab::reboot`]'s, if any), as after
    /// a crash of the service, not a reboot.
    pub fn crash(&self, alias: &str) -> Result<(), LabError> {
        self.restart(alias, false)
    }

    /// As [`Lab::crash`], and the host's boot id changes, as after a real reboot (pids
    /// start again from 1 as well: the container has a pid namespace of its own). A
    /// container shares this machine's kernel and so its boot id: the lab binds a file of
    /// its own (`boot_id` in the target's directory) over the container's
    /// `/proc/sys/kernel/random/boot_id` once it is up, with the target's port blocked
    /// from this machine until then, so no session can read the kernel's id first and
    /// see its own boot change under it.
    pub fn reboot(&self, alias: &str) -> Result<(), LabError> {
        self.restart(alias, true)
    }

    fn restart(&self, alias: &str, new_boot: bool) -> Result<(), LabError> {
        let n = self.node(alias)?;
        let t = self.get(alias)?;
        let boot_file = t.dir.join(BOOT_ID_FILE);
        if new_boot {
            // The kernel hands out a fresh random UUID on each read of this file.
            let id = read(Path::new("/proc/sys/kernel/random/uuid"))?;
            write(&boot_file, &id, 0o644)?;
        }
        let bind_boot = boot_file.exists();
        if self.container_state(alias)? == "paused" {
            docker(&["unpause", &n.container])?;
        }
        if bind_boot {
            host_block(t, true)?;
        }
        let started = self.kill_and_start(alias).and_then(|()| {
            if bind_boot {
                self.bind_boot_id(alias)
            } else {
                Ok(())
            }
        });
        let unblocked = if bind_boot {
            host_block(t, false)
        } else {
            Ok(())
        };
        started?;
        unblocked?;
        let deadline = Instant::now() + READY_TIMEOUT;
        wait_listening(t, n, deadline)?;
        // The old log was moved aside: the new one holds this start's lines only.
        sshd::wait_ready(t, &self.state.ssh_config, deadline, 0)
    }

    /// SIGKILL to the container, then `docker start` once it is gone.
    fn kill_and_start(&self, alias: &str) -> Result<(), LabError> {
        let n = self.node(alias)?;
        let t = self.get(alias)?;
        let _ = docker(&["kill", "--signal", "KILL", &n.container]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while docker(&["inspect", "--format", "{{.State.Running}}", &n.container])? == "true" {
            if Instant::now() > deadline {
                return Err(LabError::Command {
                    command: format!("docker kill {}", n.container),
                    detail: "the container still runs 20 s after SIGKILL".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The readiness check reads a `fatal:` in the log as a dead sshd (there is no pid
        // file outside the container); connections cut short before the crash may have
        // written one. The old log is kept beside the new.
        let _ = std::fs::rename(&t.log, t.log.with_extension("log.before-crash"));
        docker(&["start", &n.container])
            .map_err(|e| t.start_failed(format!("docker start failed: {e}")))?;
        Ok(())
    }

    /// Binds the target's `boot_id` file over the kernel's in the container's mount
    /// namespace. `mount -N` runs this machine's mount and makes only the system call
    /// there, so the image needs no mount program of its own.
    fn bind_boot_id(&self, alias: &str) -> Result<(), LabError> {
        sshd::require_on_path("mount", "mount")?;
        let pid = self.container_pid(alias)?;
        let ns = format!("/proc/{pid}/ns/mnt");
        let source = format!("{INJECT_DIR}/{BOOT_ID_FILE}");
        let out = run(Command::new("mount").args([
            "-N",
            &ns,
            "--bind",
            &source,
            "/proc/sys/kernel/random/boot_id",
        ]))?;
        if !out.status.success() {
            return Err(LabError::Command {
                command: format!("mount -N {ns} --bind {source} /proc/sys/kernel/random/boot_id"),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(())
    }

    /// The pid (in this machine's namespace) of the container's init, for nsenter.
    fn container_pid(&self, alias: &str) -> Result<String, LabError> {
        let n = self.node(alias)?;
        let pid = docker(&["inspect", "--format", "{{.State.Pid}}", &n.container])?;
        if pid.is_empty() || pid == "0" {
            return Err(LabError::Command {
                command: format!("docker inspect {}", n.container),
                detail: format!(
                    "target {alias} is not running; start it again with `opmark lab crash {alias}` \
                     (which restarts it) or `opmark lab up`"
                ),
            });
        }
        Ok(pid)
    }

    fn nft_in_container(&self, alias: &str, script: &str) -> Result<String, LabError> {
        sshd::require_on_path("nsenter", "util-linux")?;
        let pid = self.container_pid(alias)?;
        nft(&["nsenter", "-t", &pid, "-n", "nft", "-f", "-"], script)
    }

    pub(crate) fn docker_cut(&self, alias: &str) -> Result<(), LabError> {
        let _ = self.docker_restore(alias);
        self.nft_in_container(alias, &cut_rules()).map(|_| ())
    }

    pub(crate) fn docker_restore(&self, alias: &str) -> Result<(), LabError> {
        if self.docker_is_cut(alias)? {
            self.nft_in_container(alias, &format!("delete table inet {CUT_TABLE}\n"))?;
        }
        Ok(())
    }

    pub(crate) fn docker_is_cut(&self, alias: &str) -> Result<bool, LabError> {
        Ok(self
            .nft_in_container(alias, "list tables\n")?
            .contains(CUT_TABLE))
    }

    /// True when the target's container runs (paused counts as running: it is frozen,
    /// not gone).
    pub(crate) fn docker_running(&self, alias: &str) -> bool {
        self.node(alias)
            .and_then(|n| docker(&["inspect", "--format", "{{.State.Running}}", &n.container]))
            .is_ok_and(|s| s == "true")
    }

    /// The lab's own image (built from the recipe), which `lab down --purge-image`
    /// removes; None for a user's `--image` (never removed) and other placements.
    pub fn own_image(&self) -> Option<String> {
        self.state
            .docker
            .as_ref()
            .filter(|d| d.own_image)
            .map(|d| d.image.clone())
    }
}

/// Removes an image (after its lab's containers are gone); an absent one is fine.
pub fn remove_image(image: &str) -> Result<(), LabError> {
    if image_exists(image) {
        docker(&["image", "rm", image])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_tag_is_the_hash_of_the_recipe_stable_and_names_the_repository() {
        let tag = recipe_tag();
        assert!(tag.starts_with("opmark-lab:") && tag.len() == "opmark-lab:".len() + 16);
        // The same recipe, rebuilt as another value, gives the same tag: the cache hits.
        let copy: Vec<(String, String)> = RECIPE
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let copy: Vec<(&str, &str)> = copy.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(tag_of(&copy), tag);
        // Every entry counts: changing any one value, or dropping any entry, moves the tag.
        for i in 0..RECIPE.len() {
            let mut changed = copy.clone();
            let other = format!("{}-changed", changed[i].1);
            changed[i].1 = &other;
            assert_ne!(
                tag_of(&changed),
                tag,
                "changing {} kept the tag",
                RECIPE[i].0
            );
            let mut dropped = copy.clone();
            dropped.remove(i);
            assert_ne!(
                tag_of(&dropped),
                tag,
                "dropping {} kept the tag",
                RECIPE[i].0
            );
        }
    }

    #[test]
    fn a_changed_recipe_gets_another_tag_so_it_is_built_anew() {
        let mut changed = RECIPE.to_vec();
        for entry in &mut changed {
            if entry.0 == "include" {
                entry.1 = "openssh-server,busybox,procps,curl";
            }
        }
        assert_ne!(tag_of(&changed), recipe_tag());
    }

    #[test]
    fn container_sshd_config_keeps_markers_on_the_volume_and_allows_concurrency() {
        let c = config_text("target1");
        assert!(c.contains("SetEnv XDG_STATE_HOME=/var/lib/opmark-lab\n"));
        assert!(c.contains("MaxStartups 200:30:400\nMaxSessions 200\n"));
        assert!(c.contains("HostKey /opmark-lab/ssh_host_ed25519_key\n"));
    }

    #[test]
    fn subnets_parse_only_when_ipv4_with_a_prefix() {
        assert_eq!(
            parse_v4_subnet("172.18.0.0/16"),
            Some((Ipv4Addr::new(172, 18, 0, 0), 16))
        );
        assert_eq!(parse_v4_subnet("fd00::/64"), None);
        assert_eq!(parse_v4_subnet("172.18.0.0"), None);
    }
}
