//! The lab itself: real sshd targets on loopback and in network namespaces, reachable
//! with the OpenSSH client through the generated ssh_config; cut/restore; restarts.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{self, text, Lab, LabSpec, Placement};

fn ssh_out(lab: &Lab, alias: &str, command: &str) -> std::process::Output {
    support::ssh(lab)
        .args(["-o", "ConnectTimeout=5", alias, command])
        .output()
        .expect("run ssh")
}

/// True while `pid` exists and is not a zombie (a daemonised sshd is reaped by init,
/// which may take a moment).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn loopback_targets_answer_through_generated_ssh_config_with_own_state_dir() {
    let Some(lab) = crate::loopback_lab!(3) else {
        return;
    };
    assert_eq!(lab.targets().len(), 3);
    for t in lab.targets() {
        let out = ssh_out(&lab, &t.alias, "echo hello-$XDG_STATE_HOME; id -un");
        assert!(out.status.success(), "{}: {}", t.alias, text(&out.stderr));
        let stdout = text(&out.stdout);
        let mut lines = stdout.lines();
        assert_eq!(
            lines.next(),
            Some(format!("hello-{}", t.state_home.display()).as_str())
        );
        assert_eq!(lines.next(), Some(t.user.as_str()));
        assert!(t.addr.is_loopback() && t.port != 22, "{t:?}");
        assert!(t.state_home.starts_with(lab.dir()), "{t:?}");
    }
    let ports: std::collections::BTreeSet<u16> = lab.targets().iter().map(|t| t.port).collect();
    assert_eq!(ports.len(), 3, "distinct ports");
}

#[test]
fn namespace_targets_answer_and_a_cut_link_times_out_then_answers_after_restore() {
    let Some(lab) = crate::netns_lab!(2) else {
        return;
    };
    for t in lab.targets() {
        assert!(t.netns.is_some() && !t.addr.is_loopback(), "{t:?}");
        let out = ssh_out(&lab, &t.alias, "echo $XDG_STATE_HOME");
        assert!(out.status.success(), "{}: {}", t.alias, text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), t.state_home.display().to_string());
    }

    lab.cut("target1").expect("cut");
    assert!(lab.is_cut("target1").unwrap());
    let started = Instant::now();
    let out = support::ssh(&lab)
        .args(["-o", "ConnectTimeout=2", "target1", "true"])
        .output()
        .expect("run ssh");
    let waited = started.elapsed();
    eprintln!("connect to a cut target gave up after {waited:?}");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("timed out"), "expected a timeout, got: {err}");
    assert!(
        waited >= Duration::from_millis(1900),
        "gave up too early: {waited:?}"
    );

    // The other target is unaffected.
    assert!(ssh_out(&lab, "target2", "true").status.success());

    lab.restore("target1").expect("restore");
    assert!(!lab.is_cut("target1").unwrap());
    let out = ssh_out(&lab, "target1", "echo back");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "back");
}

#[test]
fn established_connection_over_a_cut_link_hangs_instead_of_being_reset() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    // Keepalives off on the client: we want to see what the network alone does.
    let mut child = support::ssh(&lab)
        .args(["-o", "ServerAliveInterval=0", "target1"])
        .arg("echo ready; while :; do sleep 0.2; echo tick; done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ssh");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "ready");
    rx.recv_timeout(Duration::from_secs(5))
        .expect("ticks before the cut");

    lab.cut("target1").expect("cut");
    // Drain what was already in flight (generously: a busy machine may take a while to
    // hand ssh what its socket already holds), then nothing more may arrive, and ssh must
    // not exit (a RST or FIN would end it at once).
    std::thread::sleep(Duration::from_secs(2));
    while rx.try_recv().is_ok() {}
    let quiet = Duration::from_secs(3);
    let got = rx.recv_timeout(quiet);
    assert!(got.is_err(), "data arrived over a cut link: {got:?}");
    let status = child.try_wait().expect("try_wait");
    assert!(status.is_none(), "ssh exited over a cut link: {status:?}");
    eprintln!("established connection stayed silent and open for {quiet:?} after the cut");

    child.kill().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let _ = child.wait();
    assert!(!err.contains("reset"), "connection was reset: {err}");
    lab.restore("target1").expect("restore");
}

#[test]
fn target_that_cannot_start_reports_its_sshd_log() {
    if !support::require_tool("sshd") {
        return;
    }
    // Break a started target's config and restart it: sshd refuses to start.
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = lab.target("target1").unwrap().clone();
    lab.stop_sshd("target1").unwrap();
    let mut cfg = std::fs::read_to_string(t.sshd_config()).unwrap();
    cfg.push_str("NoSuchSshdOption yes\n");
    std::fs::write(t.sshd_config(), cfg).unwrap();
    let err = lab
        .start_sshd("target1")
        .expect_err("broken config must not start");
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(msg.contains("target1 did not start"), "{msg}");
    assert!(msg.contains("NoSuchSshdOption"), "log missing from: {msg}");
}

#[test]
fn sshd_stopped_refuses_connections_and_restarted_answers_with_same_keys_and_state() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = lab.target("target1").unwrap();
    let marker = t.state_home.join("kept");
    std::fs::write(&marker, "x").unwrap();
    let before = t.port;

    lab.stop_sshd("target1").unwrap();
    assert!(t.sshd_pid().is_none());
    let out = ssh_out(&lab, "target1", "true");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("refused"),
        "{}",
        text(&out.stderr)
    );

    lab.start_sshd("target1").unwrap();
    let out = ssh_out(&lab, "target1", "cat \"$XDG_STATE_HOME/kept\"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "x");
    assert_eq!(lab.target("target1").unwrap().port, before);
}

#[test]
fn authorized_key_added_later_logs_in_on_every_target() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let key = lab.dir().join("extra_key");
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let pubkey = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    lab.authorize_key(&pubkey).unwrap();
    assert!(lab.authorize_key("not a key\nsecond line").is_err());
    for t in lab.targets() {
        let out = support::ssh(&lab)
            .arg("-i")
            .arg(&key)
            .args(["-o", "IdentitiesOnly=yes", "-o", "IdentityFile=none"])
            .args([t.alias.as_str(), "echo ok"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

#[test]
fn dropping_a_lab_kills_its_sshd_and_what_ran_through_it() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    // A detached command, as the shim starts them: not below sshd any more.
    let out = ssh_out(
        &lab,
        "target1",
        "setsid -f sleep 300 </dev/null >/dev/null 2>&1; echo started",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listener = lab.target("target1").unwrap().sshd_pid().unwrap();
    let state = lab.target("target1").unwrap().state_home.clone();
    let dir = lab.dir().to_path_buf();
    drop(lab);
    assert!(!running(listener), "sshd {listener} survived the drop");
    let leftover = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "grep -lz 'XDG_STATE_HOME={}' /proc/[0-9]*/environ 2>/dev/null || true",
            state.display()
        ))
        .output()
        .unwrap();
    assert_eq!(text(&leftover.stdout).trim(), "", "processes left behind");
    // The state survives for `lab down`/inspection; a new lab may reuse the dir.
    assert!(dir.join("lab.json").exists());
    let again = Lab::start(&LabSpec {
        count: 1,
        placement: Placement::Loopback,
        dir,
    })
    .expect("restart in the same dir");
    assert!(again.is_running());
}

/// `opmark --json ARGS...` against a lab, parsed.
fn opmark_json(
    env: &support::Sealed,
    lab: &Lab,
    args: &[&str],
) -> (Option<i32>, serde_json::Value) {
    let out = env
        .opmark_with_lab(lab)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    (out.status.code(), doc)
}

/// The doctor's `persistent` check on target1.
fn persistent_check(env: &support::Sealed, lab: &Lab) -> serde_json::Value {
    let (_, doc) = opmark_json(env, lab, &["doctor", "target1"]);
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "persistent")
        .cloned()
        .unwrap_or_else(|| panic!("no persistent check: {doc}"))
}

/// Lab targets are disposable (docs/host-protocol.md#lab-targets), so a lab made under /tmp (a clone of the project
/// there, say) works; a target that stops saying so is a real host again, and its shim
/// refuses the same marker root.
#[test]
fn a_lab_under_tmp_runs_operations_and_a_target_not_declared_disposable_refuses_that_root() {
    let name = crate::test_name!();
    if !support::require_tools(name, &["sshd", "ssh", "ssh-keygen"]) {
        return;
    }
    let dir = std::path::PathBuf::from(format!("/tmp/opmark-{name}-{}", std::process::id()));
    let mut lab = Lab::start(&LabSpec {
        count: 1,
        placement: Placement::Loopback,
        dir: dir.clone(),
    })
    .unwrap_or_else(|e| panic!("a lab under /tmp must start: {e}"));
    let env = support::Sealed::new(name);
    let root = lab.target("target1").unwrap().marker_root();
    assert!(root.starts_with("/tmp"), "{}", root.display());

    let (code, doc) = opmark_json(
        &env,
        &lab,
        &["run", "target1", "--op", "in-tmp", "--", "echo hi"],
    );
    assert_eq!(doc["verdict"], "completed", "{doc}");
    assert_eq!(
        (code, doc["stdout"].as_str()),
        (Some(0), Some("hi\n")),
        "{doc}"
    );
    assert!(root.join("ops/in-tmp/exit").exists());
    let check = persistent_check(&env, &lab);
    assert_eq!(check["status"], "pass", "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("disposable"),
        "{check}"
    );

    lab.set_disposable("target1", false).unwrap();
    let (_, doc) = opmark_json(
        &env,
        &lab,
        &["run", "target1", "--op", "not-in-tmp", "--", "echo hi"],
    );
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert!(
        doc["reason"].as_str().unwrap().contains("volatile_path"),
        "{doc}"
    );
    assert!(!root.join("ops/not-in-tmp").exists(), "nothing claimed");
    let check = persistent_check(&env, &lab);
    assert_eq!(check["status"], "fail", "{check}");
    assert!(!check["fix"].as_str().unwrap().is_empty(), "{check}");

    drop(lab);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_up_leaves_targets_running_after_opmark_exits_until_lab_down() {
    if !crate::support::require_tools(crate::test_name!(), &["sshd", "ssh", "ssh-keygen"]) {
        return;
    }
    let env = support::Sealed::new(crate::test_name!());
    let dir = env.root.join("lab");
    let out = env
        .opmark()
        .args(["lab", "up", "2", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let cfg = dir.join("ssh_config");
    assert!(
        printed.contains(&format!("ssh -F {} target1", cfg.display())),
        "{printed}"
    );

    // A second process finds the lab and reaches its targets.
    let lab = Lab::load(&dir).unwrap();
    assert!(lab.is_running());
    let out = ssh_out(&lab, "target2", "echo up");
    assert_eq!(text(&out.stdout).trim(), "up", "{}", text(&out.stderr));

    let status = env
        .opmark()
        .args(["--json", "lab", "status", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(doc["targets"].as_array().unwrap().len(), 2);
    assert_eq!(doc["targets"][0]["running"], true);

    // Cutting a loopback target is a usage problem with a fix, nothing more.
    let cut = env
        .opmark()
        .args(["lab", "cut", "target1", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(cut.status.code(), Some(245));
    assert!(text(&cut.stderr).contains("--placement netns"));

    let pid = lab.target("target1").unwrap().sshd_pid().unwrap();
    let down = env
        .opmark()
        .args(["lab", "down", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(!running(pid));
    assert!(!dir.exists());
}

#[test]
fn rotated_host_keys_make_openssh_refuse_the_target() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    lab.rotate_host_keys("target1").unwrap();
    let out = ssh_out(&lab, "target1", "true");
    assert_eq!(out.status.code(), Some(255));
    let err = text(&out.stderr);
    assert!(
        err.contains("HOST IDENTIFICATION HAS CHANGED")
            || err.contains("Host key verification failed"),
        "{err}"
    );
}

/// sshd appends to its log across restarts, and its connections log lines such as
/// `ssh_dispatch_run_fatal: ... Broken pipe` when a client leaves mid-handshake. A
/// restart judged by those old lines was reported as "sshd exited" (seen in the chaos
/// test, which kills clients at random).
#[test]
fn a_restarted_sshd_is_judged_by_its_own_log_lines_not_by_earlier_ones() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let log = lab.target("target1").unwrap().log.clone();
    for _ in 0..5 {
        lab.stop_sshd("target1").unwrap();
        let mut old = std::fs::read_to_string(&log).unwrap();
        old.push_str(
            "ssh_dispatch_run_fatal: Connection from 127.0.0.1 port 4242: Broken pipe [preauth]\n\
             fatal: an earlier server's last words\n",
        );
        std::fs::write(&log, old).unwrap();
        lab.start_sshd("target1")
            .unwrap_or_else(|e| panic!("a sound sshd judged by stale lines: {e}"));
        let out = ssh_out(&lab, "target1", "echo up");
        assert_eq!(text(&out.stdout).trim(), "up", "{}", text(&out.stderr));
    }
}
