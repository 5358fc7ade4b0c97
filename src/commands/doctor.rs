//! `opmark doctor HOST`: is this host usable? Each check is reported with a fix:
//! resolvable, reachable with a known host key and working authentication, the shim
//! starts through the login shell and runs under the host's `sh` with a `setsid`
//! (util-linux's or busybox's: which one, and so how runs detach, is said) and the tools
//! it uses, process identity is readable (liveness), and the marker root is absolute,
//! writable, durable through `sync` (with file arguments, or the plain fallback runs
//! use), persistent (not tmpfs/ramfs, not a path a reboot clears) and has room.

use std::collections::BTreeMap;

use serde::Serialize;

use super::common;
use super::render::printable;
use crate::cli::{DoctorArgs, GlobalArgs};
use crate::error::{exit_code, Result};
use crate::host::{resolve, CallError, ConnectError, ConnectStage, Host};

/// Least free space wanted under the marker root (captured output lives there).
pub const MIN_AVAIL_KIB: u64 = 100 * 1024;

/// File systems a reboot empties.
const VOLATILE_FS: &[&str] = &["tmpfs", "ramfs"];

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short name: `resolve`, `connect`, `host_key`, `auth`, `shim`, `setsid`, `liveness`, `tools`,
    /// `root`, `writable`, `sync`, `persistent`, `space`.
    pub name: &'static str,
    /// `pass`, `fail` or `skipped` (an earlier check failed).
    pub status: &'static str,
    /// What was seen.
    pub detail: String,
    /// How to fix it (empty when it passed).
    pub fix: String,
}

#[derive(Serialize)]
struct DoctorReport<'a> {
    host: &'a str,
    ok: bool,
    checks: &'a [Check],
    /// Every fact the shim reported (`K key=value`).
    facts: &'a BTreeMap<String, String>,
}

fn pass(name: &'static str, detail: String) -> Check {
    Check {
        name,
        status: "pass",
        detail,
        fix: String::new(),
    }
}

fn fail(name: &'static str, detail: String, fix: String) -> Check {
    Check {
        name,
        status: "fail",
        detail,
        fix,
    }
}

fn skipped(names: &[&'static str], why: &str) -> Vec<Check> {
    names
        .iter()
        .map(|name| Check {
            name,
            status: "skipped",
            detail: format!("not checked: {why}"),
            fix: String::new(),
        })
        .collect()
}

const HOST_CHECKS: &[&str] = &[
    "shim",
    "setsid",
    "liveness",
    "tools",
    "root",
    "writable",
    "sync",
    "persistent",
    "space",
];

/// Runs the checks; exit 0 when all pass, 1 otherwise.
pub fn run(global: &GlobalArgs, args: &DoctorArgs) -> Result<u8> {
    let spec = common::host_spec(global, &args.host, &args.host_args);
    let mut checks = Vec::new();
    let mut facts = BTreeMap::new();
    let host = printable(&args.host);
    match resolve(&spec) {
        Err(e) => {
            checks.push(fail(
                "resolve",
                e.message.clone(),
                format!("check the alias `{host}` in the ssh config (-F or OPMARK_SSH_CONFIG, default ~/.ssh/config) or write [user@]host"),
            ));
            checks.extend(skipped(&["connect"], "the host did not resolve"));
            checks.extend(skipped(HOST_CHECKS, "the host did not resolve"));
        }
        Ok(dest) => {
            checks.push(pass(
                "resolve",
                format!("{}@{}:{}", dest.user, dest.hostname, dest.port),
            ));
            let answer = common::block_on(async {
                let target = Host::connect(&dest).await?;
                Ok::<_, ConnectError>(target.doctor().await)
            })?;
            match answer {
                Err(e) => {
                    let (name, fix) = match e.stage {
                        ConnectStage::Resolve | ConnectStage::Config => ("resolve", format!(
                            "check the name {} (DNS, /etc/hosts), or the HostName of `{host}` in the ssh config (-F or OPMARK_SSH_CONFIG, default ~/.ssh/config)",
                            dest.hostname
                        )),
                        ConnectStage::Connect | ConnectStage::Timeout => ("connect", format!(
                            "check that {} is up and sshd listens on port {} (firewall, address, ConnectTimeout)",
                            dest.hostname, dest.port
                        )),
                        ConnectStage::HostKey => ("host_key", format!(
                            "verify the host's key out of band, then add it to known_hosts (e.g. `ssh-keyscan -p {} {} >> ~/.ssh/known_hosts`), or set StrictHostKeyChecking accept-new for first contact",
                            dest.port, dest.hostname
                        )),
                        ConnectStage::Auth => ("auth", format!(
                            "authorize one of your keys for {} on the host (ssh-copy-id), or name the right key with -i / IdentityFile, or load it into ssh-agent",
                            dest.user
                        )),
                    };
                    if name == "resolve" {
                        // One verdict per check: the ssh config gave a name (the pass
                        // above) that does not resolve, so `resolve` fails in its place.
                        checks.pop();
                        let detail = format!(
                            "`{host}` is {}@{}:{} after the ssh config, but {}",
                            dest.user, dest.hostname, dest.port, e.message
                        );
                        checks.push(fail(name, detail, fix));
                        checks.extend(skipped(&["connect"], "the host did not resolve"));
                        checks.extend(skipped(HOST_CHECKS, "the host did not resolve"));
                    } else {
                        checks.push(fail(name, e.message.clone(), fix));
                        checks.extend(skipped(HOST_CHECKS, "no SSH session"));
                    }
                }
                Ok(answer) => {
                    checks.push(pass(
                        "connect",
                        "host key known and authentication accepted".into(),
                    ));
                    let (done, never_started) = match answer {
                        Ok(all) => (Some(all), None),
                        Err((_, CallError::Lost { never_started, .. })) => (None, never_started),
                        Err(_) => (None, None),
                    };
                    if let Some(all) = done {
                        facts = all;
                        checks.extend(host_checks(&facts));
                    } else if let Some(never) = never_started {
                        checks.push(fail(
                            "shim",
                            never.describe(),
                            "make the login user's shell run `sh -c` commands (any POSIX shell, fish or tcsh will do), and keep its startup files (~/.bashrc, ~/.profile...) from exiting, reading stdin or redirecting output for non-interactive sessions".into(),
                        ));
                        checks.extend(skipped(&HOST_CHECKS[1..], "the shim did not start"));
                    } else {
                        checks.push(fail(
                            "shim",
                            "the shim did not answer the doctor call".into(),
                            "the remote login shell must run `sh -c` like OpenSSH expects: check that sh exists and that the user's shell startup files do not exit or read stdin".into(),
                        ));
                        checks.extend(skipped(&HOST_CHECKS[1..], "the shim did not run"));
                    }
                }
            }
        }
    }
    // Who can lift a hold on this machine (docs/trust.md#the-approval-flow): not a host
    // fact, but what an operator checking a setup needs to see.
    if let Ok(policy) = common::load_policy(global) {
        checks.push(pass(
            "approvals",
            match crate::approval::required(&policy) {
                Some(file) => format!("signed: a key in {} must sign them", file.display()),
                None => {
                    "self-service: --approve NOTE lifts a hold (set `approvers` for signed ones)"
                        .into()
                }
            },
        ));
    }
    let ok = checks.iter().all(|c| c.status == "pass");
    if global.json {
        common::print_json(&DoctorReport {
            host: &args.host,
            ok,
            checks: &checks,
            facts: &facts,
        })?;
    } else {
        crate::out!("{}", text(&host, &checks, ok));
    }
    Ok(if ok {
        exit_code::OK
    } else {
        exit_code::FINDINGS
    })
}

/// The checks that read the shim's facts.
pub fn host_checks(facts: &BTreeMap<String, String>) -> Vec<Check> {
    let get = |k: &str| facts.get(k).map(String::as_str).unwrap_or("unknown");
    let root = get("root");
    let mut out = vec![pass(
        "shim",
        format!(
            "ran under {} (login shell {})",
            get("shell"),
            get("login_shell")
        ),
    )];
    // Runs detach with `setsid setsid` (the shim's detach), which either kind of setsid
    // runs; only a host with none fails.
    let detach = |kind: &str| {
        let found = match get("setsid_path") {
            "applet" => "the host sh's own applet".to_owned(),
            path => format!("at {path}"),
        };
        format!(
            "runs detach with `setsid setsid` ({kind} setsid, {found}): the command keeps SIGINT and SIGQUIT as under ssh"
        )
    };
    out.push(match get("setsid") {
        "yes" => pass("setsid", detach("util-linux")),
        "no_f" => pass("setsid", detach("busybox's (no -f)")),
        _ => fail(
            "setsid",
            "no setsid on the host's PATH nor in /usr/bin, /bin, /usr/sbin or /sbin".into(),
            "install util-linux on the host (Debian/Ubuntu: `apt-get install util-linux`; Alpine: `apk add util-linux-misc`) or a busybox with its setsid applet: commands are detached with it so they survive a lost connection".into(),
        ),
    });
    out.push(if get("process_identity") == "yes" {
        pass(
            "liveness",
            "process identity (pid, start time, boot id) is readable in /proc".into(),
        )
    } else {
        fail(
            "liveness",
            "the shim cannot read process identity (no /proc, a /proc of another pid namespace, or hidepid hiding the user's own processes): it cannot tell a running command from a gone one, so it refuses every run (cannot_start, no_process_identity)".into(),
            "mount /proc for the login user (a container: run it with /proc; hidepid: let the user see its own processes), then check again".into(),
        )
    });
    out.push(match get("missing") {
        "none" => pass("tools", "every tool the shim uses is there".into()),
        missing => fail(
            "tools",
            format!("missing on the host's PATH: {missing}"),
            "install coreutils, findutils and util-linux (the shim needs POSIX tools plus dd with iflag=count_bytes, as in GNU coreutils or busybox 1.33+)".into(),
        ),
    });
    out.push(if root.starts_with('/') {
        pass("root", format!("{root} is absolute"))
    } else {
        fail(
            "root",
            format!("the marker root {root} is a relative path (XDG_STATE_HOME or OPMARK_ROOT is relative in the login's environment): every run would be refused (root_unusable, not_absolute)"),
            "set XDG_STATE_HOME (or OPMARK_ROOT) to an absolute path where the login's environment is made (sshd_config SetEnv, ~/.ssh/environment, ~/.profile or ~/.bashrc), or unset it to use ~/.local/state".into(),
        )
    });
    out.push(if get("writable") == "yes" {
        pass("writable", format!("{root} is writable"))
    } else {
        fail(
            "writable",
            format!("the marker root {root} cannot be created or written"),
            format!("make {root} a directory the login user can write (mode 0700), or point XDG_STATE_HOME (or OPMARK_ROOT) at one"),
        )
    });
    out.push(match get("sync_file") {
        "yes" => pass("sync", "sync FILE makes the records durable one by one".into()),
        "no" => pass(
            "sync",
            "this sync takes no file arguments: runs make their records durable with a plain sync instead (everything the host has to write, so slower on a busy host)".into(),
        ),
        _ => Check {
            name: "sync",
            status: "skipped",
            detail: "not checked: the marker root could not be written".into(),
            fix: String::new(),
        },
    });
    let fs = get("fstype");
    let volatile_path = ["/tmp/", "/dev/shm/", "/run/", "/var/run/"]
        .iter()
        .any(|p| format!("{root}/").starts_with(p));
    let volatile = VOLATILE_FS.contains(&fs) || volatile_path;
    out.push(if volatile && get("volatile_root_allowed") == "yes" {
        // The shim accepts such a root on a target that declares itself disposable
        // (docs/host-protocol.md#marker-layout); failing the host for it would contradict what `run` does there.
        pass(
            "persistent",
            format!("{root} is on {fs} and would not survive a reboot; allowed: the target declares itself disposable (OPMARK_ALLOW_VOLATILE_ROOT=1 in its sshd's environment)"),
        )
    } else if volatile {
        fail(
            "persistent",
            format!("the marker root {root} is on {fs}{}: a reboot erases the evidence that an operation ran", if volatile_path { " under a path cleared at boot" } else { "" }),
            "point XDG_STATE_HOME (or OPMARK_ROOT) at a disk-backed directory, e.g. ~/.local/state".into(),
        )
    } else {
        pass("persistent", format!("{root} is on {fs}"))
    });
    out.push(match get("avail_kib").parse::<u64>() {
        Ok(kib) if kib >= MIN_AVAIL_KIB => pass("space", format!("{} MiB free", kib / 1024)),
        Ok(kib) => fail(
            "space",
            format!("only {} KiB free under {root}", kib),
            format!("free space there (at least {} MiB): captured output and exit records are written to it", MIN_AVAIL_KIB / 1024),
        ),
        Err(_) => fail(
            "space",
            format!("free space under {root} is unknown (df gave nothing)"),
            "make sure `df -P` works on the host and the marker root exists".into(),
        ),
    });
    out
}

fn text(host: &str, checks: &[Check], ok: bool) -> String {
    let mut out = format!("doctor {host}\n");
    for c in checks {
        let mark = match c.status {
            "pass" => "ok  ",
            "fail" => "FAIL",
            _ => "skip",
        };
        // Wrapped under its column at 80: a detail or a fix is read whole, never cut.
        super::render::wrap_into(
            &mut out,
            &format!("  {mark} {:10} ", c.name),
            &printable(&c.detail),
        );
        if !c.fix.is_empty() {
            super::render::wrap_into(
                &mut out,
                &format!("       {:10} fix: ", ""),
                &printable(&c.fix),
            );
        }
    }
    out.push_str(if ok {
        "all checks passed\n"
    } else {
        "some checks failed (see fix:)\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tmpfs_read_only_and_small_roots_fail_with_a_fix() {
        let checks = host_checks(&facts(&[
            ("root", "/home/u/.local/state/opmark"),
            ("shell", "sh"),
            ("setsid", "yes"),
            ("process_identity", "yes"),
            ("missing", "none"),
            ("writable", "no"),
            ("fstype", "tmpfs"),
            ("avail_kib", "1024"),
        ]));
        let failed: Vec<_> = checks
            .iter()
            .filter(|c| c.status == "fail")
            .map(|c| c.name)
            .collect();
        assert_eq!(failed, ["writable", "persistent", "space"]);
        assert!(checks
            .iter()
            .all(|c| c.status != "fail" || !c.fix.is_empty()));
    }

    #[test]
    fn busybox_setsid_passes_saying_how_runs_detach_and_missing_tools_fail_with_a_fix() {
        let checks = host_checks(&facts(&[
            ("root", "/home/u/.local/state/opmark"),
            ("shell", "sh"),
            ("setsid", "no_f"),
            ("setsid_path", "setsid"),
            ("process_identity", "yes"),
            ("missing", "mkfifo,dd_count_bytes"),
            ("writable", "yes"),
            ("sync_file", "yes"),
            ("fstype", "ext2/ext3"),
            ("avail_kib", "5000000"),
        ]));
        let failed: Vec<_> = checks
            .iter()
            .filter(|c| c.status == "fail")
            .map(|c| (c.name, c.detail.as_str()))
            .collect();
        assert_eq!(
            failed,
            [("tools", "missing on the host's PATH: mkfifo,dd_count_bytes")]
        );
        let setsid = checks.iter().find(|c| c.name == "setsid").unwrap();
        assert!(setsid.detail.contains("busybox"), "{setsid:?}");
        assert!(setsid.detail.contains("setsid setsid"), "{setsid:?}");
    }

    #[test]
    fn no_setsid_at_all_fails_with_both_kinds_as_the_fix() {
        let checks = host_checks(&facts(&[("root", "/r"), ("setsid", "no")]));
        let setsid = checks.iter().find(|c| c.name == "setsid").unwrap();
        assert_eq!(setsid.status, "fail");
        assert!(setsid.fix.contains("util-linux") && setsid.fix.contains("busybox"));
    }

    #[test]
    fn a_relative_marker_root_fails_with_the_fix() {
        let checks = host_checks(&facts(&[
            ("root", "state/opmark"),
            ("setsid", "yes"),
            ("writable", "no"),
        ]));
        let root = checks.iter().find(|c| c.name == "root").unwrap();
        assert_eq!(root.status, "fail", "{root:?}");
        assert!(root.detail.contains("relative"), "{root:?}");
        assert!(root.fix.contains("absolute path"), "{root:?}");
    }

    #[test]
    fn a_sync_without_file_arguments_passes_saying_runs_use_the_plain_one() {
        let checks = host_checks(&facts(&[("root", "/r"), ("sync_file", "no")]));
        let sync = checks.iter().find(|c| c.name == "sync").unwrap();
        assert_eq!(sync.status, "pass");
        assert!(sync.detail.contains("plain sync"), "{sync:?}");
    }

    #[test]
    fn a_sound_root_passes() {
        let checks = host_checks(&facts(&[
            ("root", "/home/u/.local/state/opmark"),
            ("shell", "sh"),
            ("setsid", "yes"),
            ("process_identity", "yes"),
            ("missing", "none"),
            ("writable", "yes"),
            ("sync_file", "yes"),
            ("fstype", "ext2/ext3"),
            ("avail_kib", "5000000"),
        ]));
        assert!(checks.iter().all(|c| c.status == "pass"), "{checks:?}");
    }

    #[test]
    fn a_host_without_readable_process_identity_fails_liveness_with_a_fix() {
        let checks = host_checks(&facts(&[
            ("root", "/home/u/.local/state/opmark"),
            ("shell", "sh"),
            ("setsid", "yes"),
            ("process_identity", "no"),
            ("missing", "none"),
            ("writable", "yes"),
            ("sync_file", "yes"),
            ("fstype", "ext2/ext3"),
            ("avail_kib", "5000000"),
        ]));
        let failed: Vec<_> = checks.iter().filter(|c| c.status == "fail").collect();
        assert_eq!(failed.len(), 1, "{checks:?}");
        assert_eq!(failed[0].name, "liveness");
        assert!(failed[0].fix.contains("/proc"), "{failed:?}");
    }

    #[test]
    fn a_volatile_root_passes_only_on_a_target_that_declares_itself_disposable() {
        let facts_with = |allowed: &str| {
            facts(&[
                ("root", "/tmp/lab/target1/state/opmark"),
                ("shell", "sh"),
                ("setsid", "yes"),
                ("process_identity", "yes"),
                ("writable", "yes"),
                ("sync_file", "yes"),
                ("fstype", "tmpfs"),
                ("avail_kib", "5000000"),
                ("volatile_root_allowed", allowed),
            ])
        };
        let persistent = |allowed: &str| {
            host_checks(&facts_with(allowed))
                .into_iter()
                .find(|c| c.name == "persistent")
                .unwrap()
        };
        let refused = persistent("no");
        assert_eq!(refused.status, "fail", "{refused:?}");
        let allowed = persistent("yes");
        assert_eq!(allowed.status, "pass", "{allowed:?}");
        assert!(allowed.detail.contains("disposable"), "{allowed:?}");
    }
}
