//! Starting, faulting and stopping a lab: the sshd targets on loopback or in network
//! namespaces here, containers handed to `docker.rs`. This module sits on top of the
//! others (none names it): it is where a placement is chosen, so it is the one that
//! names them all.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::docker::{self, DockerSpec};
use super::error::LabError;
use super::files::{mkdir, read, remove_contents, write};
use super::listening::{free_port, wait_listening, READY_TIMEOUT};
use super::netns;
use super::proc;
use super::spec::{LabSpec, Placement, MAX_TARGETS};
use super::sshd;
use super::state::{Lab, LabState};
use super::target::{alias_of, new_lab_id, Target, HOST_KEYS};
use super::user::{current_user, effective_uid};

/// Attempts at a free loopback port (another process may take it between probe and bind).
const PORT_ATTEMPTS: usize = 5;

impl Lab {
    /// Starts `spec.count` targets and waits until each answers a real SSH session.
    /// Blocking. A target that fails to start makes the whole start fail (and stop what
    /// did start), with that target's sshd log in the error.
    pub fn start(spec: &LabSpec) -> Result<Lab, LabError> {
        if spec.count == 0 || spec.count > MAX_TARGETS {
            return Err(LabError::BadCount(spec.count));
        }
        if spec.placement == Placement::Docker {
            return Lab::start_docker(spec, &DockerSpec::default());
        }
        let uid = effective_uid();
        if spec.placement == Placement::Netns && uid != 0 {
            return Err(LabError::NeedsRoot { uid });
        }
        let sshd = sshd::sshd_path()?;
        sshd::require_on_path("ssh", "openssh-client")?;
        sshd::require_on_path("ssh-keygen", "openssh-client")?;
        if spec.placement == Placement::Netns {
            sshd::require_on_path("ip", "iproute2")?;
        }
        let dir = prepare_dir(&spec.dir)?;
        if uid == 0 {
            // sshd's privilege-separation chroot; absent in containers that never ran sshd.
            mkdir(Path::new("/run/sshd"), 0o755)?;
        }
        let user = current_user()?;

        let client_key = dir.join("client_ed25519");
        sshd::generate_keys(&[("ed25519", client_key.clone())], "opmark-lab-client")?;
        let client_pub = read(&client_key.with_extension("pub"))?;

        let mut lab = Lab {
            state: LabState {
                id: new_lab_id(),
                placement: spec.placement,
                ssh_config: dir.join("ssh_config"),
                known_hosts: dir.join("known_hosts"),
                client_key,
                targets: Vec::new(),
                docker: None,
            },
            dir: dir.clone(),
            sshd,
            owned: true, // from here on, an error drops the lab and stops what started
        };
        for i in 1..=spec.count {
            let target = lab.prepare_target(i, &user, &client_pub)?;
            lab.state.targets.push(target);
            lab.save()?;
        }
        lab.write_client_files()?;
        lab.boot_all()?;
        Ok(lab)
    }

    /// Starts a docker lab with docker-only options (`--image`). Blocking; builds the
    /// lab image first when it is not cached.
    pub fn start_docker(spec: &LabSpec, options: &DockerSpec) -> Result<Lab, LabError> {
        if spec.count == 0 || spec.count > MAX_TARGETS {
            return Err(LabError::BadCount(spec.count));
        }
        let mut spec = spec.clone();
        spec.placement = Placement::Docker;
        docker::preflight(options)?;
        let dir = prepare_dir(&spec.dir)?;
        docker::start(&spec, options, dir)
    }

    /// True when every target's sshd is running.
    pub fn is_running(&self) -> bool {
        self.state
            .targets
            .iter()
            .all(|t| self.target_running(&t.alias))
    }

    /// True when the target's sshd (or, for docker, its container) is running.
    pub fn target_running(&self, alias: &str) -> bool {
        match (&self.state.docker, self.target(alias)) {
            (Some(_), Some(_)) => self.docker_running(alias),
            (None, Some(t)) => t.sshd_pid().is_some(),
            (_, None) => false,
        }
    }

    /// Silently drops every packet to and from a namespace target (no RST, FIN or
    /// ICMP): established connections hang, new connects time out.
    pub fn cut(&self, alias: &str) -> Result<(), LabError> {
        if self.state.docker.is_some() {
            return self.docker_cut(alias);
        }
        let (ns, ns_if) = self.netns_of(alias)?;
        netns::cut(ns, ns_if)
    }

    /// Undoes [`Lab::cut`]. Idempotent.
    pub fn restore(&self, alias: &str) -> Result<(), LabError> {
        if self.state.docker.is_some() {
            return self.docker_restore(alias);
        }
        let (ns, _) = self.netns_of(alias)?;
        netns::restore(ns)
    }

    /// True when the target's link is cut.
    pub fn is_cut(&self, alias: &str) -> Result<bool, LabError> {
        if self.state.docker.is_some() {
            return self.docker_is_cut(alias);
        }
        let (ns, _) = self.netns_of(alias)?;
        Ok(netns::is_cut(ns))
    }

    /// Stops the target's sshd as if it crashed: the listener and every per-connection
    /// sshd are killed, so established connections close and new ones are refused.
    /// Commands started through it are left alone (as on a real host). Keys, port and
    /// state are kept for [`Lab::start_sshd`].
    pub fn stop_sshd(&self, alias: &str) -> Result<(), LabError> {
        let target = self.get(alias)?;
        let Some(listener) = proc::read_pid_file(&target.pid_file()) else {
            return Ok(());
        };
        let procs = proc::all();
        let sshds: std::collections::BTreeSet<i32> = proc::descendants(&procs, listener)
            .into_iter()
            .filter(|pid| {
                *pid == listener
                    || procs
                        .iter()
                        .any(|p| p.pid == *pid && p.comm.starts_with("sshd"))
            })
            .collect();
        proc::kill_all(&sshds, Duration::from_secs(5));
        let _ = std::fs::remove_file(target.pid_file());
        Ok(())
    }

    /// Starts a stopped target's sshd again (same keys, port and state) and waits until
    /// it answers.
    pub fn start_sshd(&self, alias: &str) -> Result<(), LabError> {
        let target = self.get(alias)?;
        if target.sshd_pid().is_some() {
            return Ok(());
        }
        let log_from = sshd::log_len(&target.log);
        sshd::spawn(&self.sshd, target)?;
        sshd::wait_ready(
            target,
            self.ssh_config(),
            Instant::now() + READY_TIMEOUT,
            log_from,
        )
    }

    /// Replaces a target's host keys with new ones and restarts its sshd, leaving
    /// known_hosts as it was: the target now presents a changed host key.
    pub fn rotate_host_keys(&self, alias: &str) -> Result<(), LabError> {
        let target = self.get(alias)?;
        self.stop_sshd(alias)?;
        let keys: Vec<(&str, PathBuf)> = HOST_KEYS
            .iter()
            .map(|(kind, file)| (*kind, target.dir.join(file)))
            .collect();
        sshd::generate_keys(&keys, &format!("opmark-lab-{alias}-rotated"))?;
        sshd::spawn(&self.sshd, target)?;
        // Not `wait_ready`: ssh would refuse the changed key. A TCP accept plus the
        // banner is enough to know it listens.
        wait_listening(target, Instant::now() + READY_TIMEOUT)
    }

    /// Makes a target declare itself disposable or not (see [`Target::disposable`]) and
    /// restarts its sshd so that new sessions see it. A target that is not disposable
    /// plays a real host: its shim refuses a marker root under /tmp.
    pub fn set_disposable(&mut self, alias: &str, disposable: bool) -> Result<(), LabError> {
        self.stop_sshd(alias)?; // also checks the alias
        let version = sshd::sshd_version(&self.sshd);
        if let Some(target) = self.state.targets.iter_mut().find(|t| t.is_named(alias)) {
            target.disposable = disposable;
            write(
                &target.sshd_config(),
                &sshd::config_text(target, version),
                0o600,
            )?;
        }
        self.save()?;
        self.start_sshd(alias)
    }

    /// Makes the target look like a host whose login user has `shell` as login shell
    /// (fish, tcsh, busybox `sh`...) and, with `path`, that PATH in every session; then
    /// restarts its sshd. The target's sshd runs in a mount namespace of its own where
    /// /etc/passwd is a copy with that shell for the lab's user, so sshd itself starts
    /// the shell as it would on such a host; nothing outside the target changes. Root
    /// only. For tests of hosts opmark must drive or refuse clearly.
    pub fn set_login(&self, alias: &str, shell: &Path, path: Option<&str>) -> Result<(), LabError> {
        let uid = effective_uid();
        if uid != 0 {
            return Err(LabError::Command {
                command: format!("set_login {alias}"),
                detail: format!(
                    "needs root (running as uid {uid}): the target's sshd gets a private view of /etc/passwd, which takes a mount namespace"
                ),
            });
        }
        let target = self.get(alias)?;
        let passwd = read(Path::new("/etc/passwd"))?;
        let prefix = format!("{}:", target.user);
        let mut found = false;
        let mut text = String::new();
        for line in passwd.lines() {
            let mut fields: Vec<&str> = line.split(':').collect();
            let shell_text = shell.display().to_string();
            if line.starts_with(&prefix) && fields.len() == 7 {
                fields[6] = &shell_text;
                found = true;
                text.push_str(&fields.join(":"));
            } else {
                text.push_str(line);
            }
            text.push('\n');
        }
        if !found {
            return Err(LabError::Command {
                command: "set_login".into(),
                detail: format!("user {} is not in /etc/passwd", target.user),
            });
        }
        write(&sshd::passwd_view(target), &text, 0o644)?;
        if let Some(path) = path {
            let config = read(&target.sshd_config())?;
            let config: String = config
                .lines()
                .map(|l| {
                    if l.starts_with("SetEnv ") {
                        format!("{} PATH={path}\n", l.split(" PATH=").next().unwrap_or(l))
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            write(&target.sshd_config(), &config, 0o600)?;
        }
        self.stop_sshd(alias)?;
        sshd::spawn(&self.sshd, target)?;
        // Not `wait_ready`: `ssh target true` fails by design where the login shell
        // cannot run commands. Listening is what the tests need.
        wait_listening(target, Instant::now() + READY_TIMEOUT)
    }

    /// Appends a public key line to every target's authorized_keys.
    pub fn authorize_key(&self, pubkey_line: &str) -> Result<(), LabError> {
        let line = pubkey_line.trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.contains('\n')
            || words.len() < 2
            || !words[0].contains("ssh-") && !words[0].starts_with("ecdsa-")
        {
            return Err(LabError::BadKey(line.chars().take(40).collect()));
        }
        for t in &self.state.targets {
            let path = t.authorized_keys();
            let mut text = read(&path)?;
            if !text.ends_with('\n') && !text.is_empty() {
                text.push('\n');
            }
            text.push_str(line);
            text.push('\n');
            write(&path, &text, 0o600)?;
        }
        Ok(())
    }

    /// Stops every target: kills each sshd and everything that ran through it, deletes
    /// the namespaces. Files stay (logs are worth reading); `opmark lab down` removes them.
    pub fn stop(mut self) -> Result<(), LabError> {
        self.owned = false;
        self.stop_all()
    }

    fn stop_all(&self) -> Result<(), LabError> {
        if let Some(d) = &self.state.docker {
            return docker::stop_all(d);
        }
        // Several rounds, because one snapshot of /proc can miss a process: one forked
        // while the snapshot was taken, or one in the middle of execve, whose environment
        // reads as empty for an instant (seen in CI: a detached `sleep` survived the drop).
        let mut all_gone = true;
        for _round in 0..5 {
            let victims = self.processes_of_targets();
            if victims.is_empty() {
                break;
            }
            all_gone = proc::kill_all(&victims, Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(20));
        }
        for t in &self.state.targets {
            let _ = std::fs::remove_file(t.pid_file());
            if let Some(ns) = &t.netns {
                netns::destroy(ns, t.host_if.as_deref());
            }
        }
        if all_gone {
            Ok(())
        } else {
            Err(LabError::Command {
                command: "kill -9".into(),
                detail: "some lab processes did not exit within 5 s".into(),
            })
        }
    }

    /// Every live process of the lab's targets: each sshd listener (while it still is
    /// one: pids get reused) and its descendants, every command started through a target
    /// (found by the XDG_STATE_HOME that sshd's SetEnv gives it, even once detached), and
    /// everything in a target's network namespace.
    fn processes_of_targets(&self) -> std::collections::BTreeSet<i32> {
        let procs = proc::all();
        let mut victims = std::collections::BTreeSet::new();
        for t in &self.state.targets {
            if let Some(listener) = proc::read_pid_file(&t.pid_file()) {
                if procs
                    .iter()
                    .any(|p| p.pid == listener && p.comm.starts_with("sshd"))
                {
                    victims.extend(proc::descendants(&procs, listener));
                }
            }
            let env = format!("XDG_STATE_HOME={}", t.state_home.display());
            victims.extend(proc::with_env(&procs, &env));
            if let Some(ns) = &t.netns {
                victims.extend(netns::pids(ns));
            }
        }
        victims
    }

    fn prepare_target(
        &self,
        index: usize,
        user: &str,
        client_pub: &str,
    ) -> Result<Target, LabError> {
        let alias = alias_of(&self.state.id, index);
        let dir = self.dir.join(format!("target{index}"));
        mkdir(&dir, 0o700)?;
        let state_home = dir.join("state");
        let home = dir.join("home");
        mkdir(&state_home, 0o700)?;
        mkdir(&home, 0o700)?;
        let keys: Vec<(&str, PathBuf)> = HOST_KEYS
            .iter()
            .map(|(kind, file)| (*kind, dir.join(file)))
            .collect();
        sshd::generate_keys(&keys, &format!("opmark-lab-{alias}"))?;
        let mut target = Target {
            alias,
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            user: user.to_string(),
            state_home,
            home,
            netns: None,
            log: dir.join("sshd.log"),
            dir,
            ns_if: None,
            host_if: None,
            disposable: true,
        };
        match self.state.placement {
            Placement::Loopback => target.port = free_port()?,
            // Containers are prepared by docker.rs; this is never reached for them.
            Placement::Docker => {}
            Placement::Netns => {
                let slot = netns::create()?;
                target.addr = netns::ip(&slot);
                target.port = 22;
                target.netns = Some(slot.ns);
                target.ns_if = Some(slot.ns_if);
                target.host_if = Some(slot.host_if);
            }
        }
        write(&target.authorized_keys(), client_pub, 0o600)?;
        Ok(target)
    }

    /// Spawns every sshd, then waits for all of them in parallel.
    fn boot_all(&mut self) -> Result<(), LabError> {
        let version = sshd::sshd_version(&self.sshd);
        for attempt in 1..=PORT_ATTEMPTS {
            for t in &self.state.targets {
                if t.sshd_pid().is_none() {
                    let _ = std::fs::remove_file(&t.log);
                    write(&t.sshd_config(), &sshd::config_text(t, version), 0o600)?;
                    sshd::spawn(&self.sshd, t)?;
                }
            }
            let deadline = Instant::now() + READY_TIMEOUT;
            let cfg = self.state.ssh_config.clone();
            let results: Vec<Result<(), LabError>> = std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .state
                    .targets
                    .iter()
                    .map(|t| {
                        let cfg = &cfg;
                        // Each spawn above started a fresh log.
                        s.spawn(move || sshd::wait_ready(t, cfg, deadline, 0))
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
                    .collect()
            });
            // A loopback port taken between our probe and sshd's bind: pick another.
            let mut retry = false;
            for (i, r) in results.iter().enumerate() {
                let t = &self.state.targets[i];
                if r.is_err()
                    && self.state.placement == Placement::Loopback
                    && attempt < PORT_ATTEMPTS
                    && t.sshd_pid().is_none()
                    && sshd::log_says_port_in_use(&t.log)
                {
                    retry = true;
                }
            }
            if retry {
                for i in 0..self.state.targets.len() {
                    if self.state.targets[i].sshd_pid().is_none() {
                        self.state.targets[i].port = free_port()?;
                    }
                }
                self.save()?;
                self.write_client_files()?;
                continue;
            }
            return results.into_iter().collect();
        }
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if std::thread::panicking() {
            // A failing test is easier to read with the servers' side of the story.
            eprint!("{}", self.log_tails(30));
        }
        let _ = self.stop_all();
    }
}

/// Creates the lab directory (refusing unquotable paths); clears a stale lab, refuses a
/// running one.
fn prepare_dir(dir: &Path) -> Result<PathBuf, LabError> {
    std::fs::create_dir_all(dir).map_err(|source| LabError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let dir = dir.canonicalize().map_err(|source| LabError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    match dir.to_str() {
        Some(s)
            if !s
                .chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\'') => {}
        _ => return Err(LabError::BadDir(dir)),
    }
    if dir.join("lab.json").exists() {
        let old = Lab::load(&dir)?;
        if old
            .state
            .targets
            .iter()
            .any(|t| old.target_running(&t.alias))
        {
            return Err(LabError::AlreadyRunning(dir));
        }
        let _ = old.stop_all(); // stale: clear namespaces a crashed run left behind
        remove_contents(&dir)?;
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        LabError::Io {
            path: dir.clone(),
            source,
        }
    })?;
    Ok(dir)
}
