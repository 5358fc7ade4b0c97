//! Where opmark's files go by default: the user's home and the XDG directories, found
//! the way ssh finds them. Used by the ledger (its database and key) and the connection
//! keeper (its socket and state), neither of which should depend on the other for it.

use std::path::PathBuf;

/// The user's home: `$HOME` when set to an absolute path, else the home directory of the
/// effective uid's passwd entry, as ssh finds it. Cron and systemd units run without
/// `$HOME`; falling back to the current directory would give each working directory a
/// ledger and a key of its own, silently. `None` when neither names one.
pub fn home_dir() -> Option<PathBuf> {
    absolute_env("HOME").or_else(passwd_home)
}

/// The environment variable `name` when it holds an absolute path. A relative or empty
/// value is ignored, as the XDG Base Directory spec requires of `XDG_*_HOME` ("all paths
/// set in these environment variables must be absolute; if an implementation encounters
/// a relative path it should consider the path invalid and ignore it").
pub fn absolute_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// The home directory of the effective uid's passwd entry: `/etc/passwd` first, then
/// `getent passwd UID`, which also asks NSS (LDAP, sssd, systemd-homed users are not in
/// the file). Both without unsafe code; only paid when `$HOME` is unset.
fn passwd_home() -> Option<PathBuf> {
    let uid = rustix::process::geteuid().as_raw().to_string();
    let from_file = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| passwd.lines().find_map(|line| home_field(line, &uid)));
    from_file.or_else(|| {
        let out = std::process::Command::new("getent")
            .args(["passwd", &uid])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        text.lines().find_map(|line| home_field(line, &uid))
    })
}

/// The home field of a passwd line for `uid`, when it is an absolute path.
fn home_field(line: &str, uid: &str) -> Option<PathBuf> {
    let fields: Vec<&str> = line.split(':').collect();
    let home = PathBuf::from(fields.get(5)?);
    (fields.len() >= 6 && fields[2] == uid && home.is_absolute()).then_some(home)
}
