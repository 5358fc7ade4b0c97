//! One lab target's OpenSSH server: key generation, its sshd_config, starting the
//! daemon and deciding when it is ready (a real SSH handshake, never a fixed sleep).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::LabError;
use super::target::{Target, HOST_KEYS};

/// Where sshd usually lives. sshd re-executes itself per connection and refuses to run
/// unless started by absolute path.
const SSHD_CANDIDATES: &[&str] = &["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"];

/// The absolute path of sshd, or a clear error with the install command.
pub(crate) fn sshd_path() -> Result<PathBuf, LabError> {
    SSHD_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| LabError::MissingTool {
            tool: "sshd".into(),
            fix: "install OpenSSH server (Debian/Ubuntu: `apt-get install openssh-server`)".into(),
        })
}

/// Checks that a client-side tool is on PATH.
pub(crate) fn require_on_path(tool: &str, package: &str) -> Result<(), LabError> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        Ok(())
    } else {
        Err(LabError::MissingTool {
            tool: tool.into(),
            fix: format!("install it (Debian/Ubuntu: `apt-get install {package}`)"),
        })
    }
}

/// Runs a command to completion; a non-zero exit becomes an error carrying its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<std::process::Output, LabError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command {
            command: shown.clone(),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(LabError::Command {
            command: shown,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// Generates keys with ssh-keygen, all at once (RSA generation is the slow one).
/// Each entry is (type, path of the private key); existing files are replaced.
pub(crate) fn generate_keys(keys: &[(&str, PathBuf)], comment: &str) -> Result<(), LabError> {
    let mut children = Vec::new();
    for (kind, path) in keys {
        for p in [path.clone(), path.with_extension("pub")] {
            let _ = std::fs::remove_file(p);
        }
        let mut cmd = Command::new("ssh-keygen");
        cmd.args(["-q", "-t", kind, "-N", "", "-C", comment, "-f"])
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if *kind == "rsa" {
            cmd.args(["-b", "2048"]); // enough for a disposable target, 3x faster than 3072
        }
        let child = cmd.spawn().map_err(|e| LabError::Command {
            command: "ssh-keygen".into(),
            detail: e.to_string(),
        })?;
        children.push((path.clone(), child));
    }
    for (path, child) in children {
        let out = child.wait_with_output().map_err(|e| LabError::Command {
            command: "ssh-keygen".into(),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(LabError::Command {
                command: format!("ssh-keygen -f {}", path.display()),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(())
}

/// OpenSSH (major, minor) of the installed sshd, to enable options only it knows.
pub(crate) fn sshd_version(sshd: &Path) -> Option<(u32, u32)> {
    // `sshd -V` exists since 9.1; older ones print usage, which also names the version.
    let out = Command::new(sshd)
        .arg("-V")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    let rest = &text[text.find("OpenSSH_")? + "OpenSSH_".len()..];
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The sshd_config of one target.
pub(crate) fn config_text(target: &Target, version: Option<(u32, u32)>) -> String {
    let dir = &target.dir;
    let listen = match target.addr {
        std::net::IpAddr::V4(a) => format!("{a}:{}", target.port),
        std::net::IpAddr::V6(a) => format!("[{a}]:{}", target.port),
    };
    let mut c = String::new();
    let _ = writeln!(c, "# opmark lab target {} (generated)", target.alias);
    let _ = writeln!(c, "ListenAddress {listen}");
    for (_, file) in HOST_KEYS {
        let _ = writeln!(c, "HostKey {}", dir.join(file).display());
    }
    let _ = writeln!(c, "PidFile {}", target.pid_file().display());
    let _ = writeln!(
        c,
        "AuthorizedKeysFile {}",
        target.authorized_keys().display()
    );
    // Lab files are created by whoever runs the lab, possibly with a loose umask.
    c.push_str("StrictModes no\n");
    // PAM needs root and its session modules fail in containers; keys are all we use.
    c.push_str("UsePAM no\n");
    c.push_str("PubkeyAuthentication yes\nPasswordAuthentication no\n");
    c.push_str("KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n");
    // Tests open many connections at once; the default 10:30:100 drops them (docs/findings.md#sshd-maxstartups).
    c.push_str("MaxStartups 200:30:400\nMaxSessions 200\n");
    // A silently dropped client is noticed in about 4 s, like a tuned production host.
    c.push_str("ClientAliveInterval 1\nClientAliveCountMax 3\n");
    c.push_str("LogLevel VERBOSE\nUseDNS no\nPrintMotd no\nPrintLastLog no\n");
    c.push_str("X11Forwarding no\nAllowTcpForwarding yes\n");
    if version >= Some((9, 8)) {
        // Newer sshd penalises sources that fail often; tests fail on purpose.
        c.push_str("PerSourcePenalties no\n");
    }
    // Each target is its own "host": commands see their own state dir (so the marker
    // root is <state>/opmark) and their own empty HOME (so the invoking user's shell
    // startup files neither slow down nor change remote commands). A disposable target
    // says so here, in the server's own config: the shim then accepts a marker root
    // under /tmp (a lab made there), which it refuses on a real host (docs/host-protocol.md#marker-layout).
    let _ = writeln!(
        c,
        "SetEnv XDG_STATE_HOME={} HOME={}{}",
        target.state_home.display(),
        target.home.display(),
        if target.disposable {
            " OPMARK_ALLOW_VOLATILE_ROOT=1"
        } else {
            ""
        }
    );
    c
}

/// The target's own /etc/passwd, when [`super::Lab::set_login`] gave its user another
/// login shell.
pub(crate) fn passwd_view(target: &Target) -> PathBuf {
    target.dir.join("passwd")
}

/// Starts the target's sshd (it daemonises itself and writes its pid file).
pub(crate) fn spawn(sshd: &Path, target: &Target) -> Result<(), LabError> {
    let _ = std::fs::remove_file(target.pid_file());
    let passwd = passwd_view(target);
    let mut cmd = match &target.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]);
            c
        }
        None if passwd.is_file() => Command::new("env"),
        None => Command::new(sshd),
    };
    if passwd.is_file() {
        // sshd reads the login shell from /etc/passwd: give it (and only it) a copy.
        cmd.args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/passwd && exec \"$@\"")
            .arg(&passwd);
    }
    if target.netns.is_some() || passwd.is_file() {
        cmd.arg(sshd);
    }
    cmd.arg("-f")
        .arg(target.sshd_config())
        .arg("-E")
        .arg(&target.log);
    run(&mut cmd).map_err(|e| target.start_failed(format!("sshd exited at start: {e}")))?;
    Ok(())
}

/// The log's current length: where the messages of a start about to happen will begin.
pub(crate) fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// Waits until the target answers a real SSH session (`ssh -F cfg alias true`), or
/// its sshd is gone, or the deadline passes. `log_from` is where this start's messages
/// begin in the log ([`log_len`] before the spawn): sshd appends, and what earlier
/// servers and their connections wrote says nothing about this one.
pub(crate) fn wait_ready(
    target: &Target,
    ssh_config: &Path,
    deadline: Instant,
    log_from: u64,
) -> Result<(), LabError> {
    let addr = std::net::SocketAddr::new(target.addr, target.port);
    let mut last = String::from("no answer yet");
    loop {
        let pid_alive =
            super::proc::read_pid_file(&target.pid_file()).is_some_and(super::proc::alive);
        // The pid file appears once sshd listens; until then only the log can tell.
        if !pid_alive && log_says_fatal(&target.log, log_from) {
            return Err(target.start_failed("sshd exited".into()));
        }
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
            let out = Command::new("ssh")
                .arg("-F")
                .arg(ssh_config)
                .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-n"])
                .arg(&target.alias)
                .arg("true")
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => return Ok(()),
                Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => last = format!("cannot run ssh: {e}"),
            }
        }
        if Instant::now() > deadline {
            return Err(target.start_failed(format!(
                "not ready before the deadline; last ssh attempt: {last}"
            )));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// sshd's fatal start-up messages (bad config, port in use, unreadable key) in the log
/// from byte `from` on. Only whole `fatal:` lines count: a connection's
/// `ssh_dispatch_run_fatal: ... Broken pipe` (a client that left mid-handshake) does not
/// mean the server died.
fn log_says_fatal(log: &Path, from: u64) -> bool {
    let Ok(bytes) = std::fs::read(log) else {
        return false;
    };
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).lines().any(|l| {
        l.starts_with("fatal:")
            || l.contains("Cannot bind any address")
            || l.contains("Bad configuration")
            || l.contains("terminating")
    })
}

/// True when the log shows the port was taken by someone else (retry with another).
pub(crate) fn log_says_port_in_use(log: &Path) -> bool {
    std::fs::read_to_string(log)
        .map(|t| t.contains("Address already in use"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fatal_lines_after_the_start_offset_mean_the_server_died() {
        let dir = std::env::temp_dir().join(format!("opmark-sshd-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sshd.log");
        let earlier = "fatal: an earlier server died\n";
        std::fs::write(
            &log,
            format!("{earlier}ssh_dispatch_run_fatal: Connection from 10.0.0.1 port 1: Broken pipe [preauth]\n"),
        )
        .unwrap();
        assert!(
            log_says_fatal(&log, 0),
            "a fatal line from the start counts"
        );
        let from = earlier.len() as u64;
        assert!(
            !log_says_fatal(&log, from),
            "a connection's _fatal: is not the server's"
        );
        let now = log_len(&log);
        assert!(!log_says_fatal(&log, now));
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str("Cannot bind any address.\n");
        std::fs::write(&log, text).unwrap();
        assert!(log_says_fatal(&log, now), "this start's own failure");
        assert!(!log_says_fatal(&dir.join("absent.log"), 0));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
