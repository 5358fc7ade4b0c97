//! Hosts opmark meets in the wild, as real sshd targets: login shells that are not POSIX
//! (fish, tcsh), startup files that exit, print a fake header or a banner without a
//! newline, a busybox-only host, a sync that takes no files, a relative XDG_STATE_HOME,
//! and commands far beyond the host's argument limit. Each host either works (runs once,
//! replays) or fails at once with `not_applied`, a reason code and `retryable: false`;
//! `opmark doctor` tells which.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::lab::Lab;
use opmark::shim::{Frame, Invocation, Reply, ReplyParser, RunCall, Verb};
use serde_json::Value;

use crate::support::{self, fresh_dir, json, text, tool_path, Sealed};

/// `opmark --json run target1 --op OP -- WORDS...`.
fn run_words(env: &Sealed, lab: &Lab, op: &str, words: &[&str]) -> (Value, i32) {
    let out = env
        .opmark_with_lab(lab)
        .args(["--json", "run", "target1", "--op", op, "--"])
        .args(words)
        .output()
        .unwrap();
    (json(&out), out.status.code().unwrap_or(-1))
}

/// `opmark --json doctor target1`: (ok, the failed checks' names, the document).
fn doctor_checks(env: &Sealed, lab: &Lab) -> (bool, Vec<String>, Value) {
    let out = env
        .opmark_with_lab(lab)
        .args(["--json", "doctor", "target1"])
        .output()
        .unwrap();
    let doc = json(&out);
    let failed = doc["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("no checks: {doc}"))
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let ok = doc["ok"].as_bool().unwrap();
    assert_eq!(out.status.code(), Some(if ok { 0 } else { 1 }), "{doc}");
    (ok, failed, doc)
}

/// Runs a command twice under one op id: it ran once (one line in a file the command
/// appends to), exited with its own status, and the second run replays it.
fn assert_runs_once_and_replays(env: &Sealed, lab: &Lab, op: &str) {
    assert_runs_once_and_replays_with(env, lab, op, ">&2");
}

/// [`assert_runs_once_and_replays`] with `to_stderr` as the redirection to stderr: the
/// login shell runs the command, as ssh does, and csh has no `>&2`. What the command
/// prints is what `ssh target1 CMD` prints (with what the login's startup files print for
/// a command, as under ssh).
fn assert_runs_once_and_replays_with(env: &Sealed, lab: &Lab, op: &str, to_stderr: &str) {
    let effects = fresh_dir(op).join("effects");
    let cmd = format!(
        "echo ran >> {}; echo out; echo err {to_stderr}; exit 3",
        effects.display()
    );
    let by_ssh = support::ssh(lab)
        .args(["-o", "ConnectTimeout=5", "target1", &cmd])
        .output()
        .unwrap();
    let (out, err) = (text(&by_ssh.stdout), text(&by_ssh.stderr));
    assert!(
        out.ends_with("out\n") && err.ends_with("err\n") && by_ssh.status.code() == Some(3),
        "over ssh: {by_ssh:?}"
    );
    std::fs::remove_file(&effects).unwrap();
    let (first, status) = run_words(env, lab, op, &[&cmd]);
    assert_eq!(first["verdict"], "completed", "{first}");
    assert_eq!(
        (first["exit_code"].as_i64(), status),
        (Some(3), 3),
        "{first}"
    );
    assert_eq!(first["stdout"], out, "{first}");
    assert_eq!(first["stderr"], err, "{first}");
    let (again, status) = run_words(env, lab, op, &[&cmd]);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(
        (again["exit_code"].as_i64(), status),
        (Some(3), 3),
        "{again}"
    );
    assert_eq!(again["stdout"], out, "{again}");
    assert_eq!(std::fs::read_to_string(&effects).unwrap(), "ran\n");
}

/// The host cannot run the shim: one attempt, `not_applied` with `code`, not retryable,
/// nothing claimed. Returns the verdict, the command and the file it appends to.
fn assert_fails_fast(env: &Sealed, lab: &Lab, op: &str, code: &str) -> (Value, String, PathBuf) {
    let effects = fresh_dir(op).join("effects");
    let cmd = format!("echo ran >> {}", effects.display());
    let (doc, status) = run_words(env, lab, op, &[&cmd]);
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert_eq!(status, 241, "{doc}");
    assert_eq!(doc["reason_code"], code, "{doc}");
    assert_eq!(doc["retryable"], false, "{doc}");
    assert_eq!(doc["attempts"].as_array().unwrap().len(), 1, "{doc}");
    assert!(!effects.exists(), "the command ran: {doc}");
    let marker = lab.targets()[0].marker_root().join("ops").join(op);
    assert!(!marker.exists(), "a claim was left behind: {doc}");
    (doc, cmd, effects)
}

/// A one-target loopback lab whose login shell can be changed (root only).
fn lab_for_host_kinds(name: &str) -> Option<Lab> {
    if !support::require_root(name) {
        return None;
    }
    support::loopback_lab_named(name, 1)
}

#[test]
fn the_exec_stub_runs_the_shim_under_every_login_shell() {
    crate::require_tool!("dash", "bash", "zsh", "fish", "tcsh", "busybox");
    let dir = fresh_dir("stub-shells");
    let ash = dir.join("ash");
    std::os::unix::fs::symlink(tool_path("busybox"), &ash).unwrap();
    let shells = [
        tool_path("dash"),
        tool_path("bash"),
        tool_path("zsh"),
        tool_path("fish"),
        tool_path("tcsh"),
        ash,
    ];
    for (n, login_shell) in shells.iter().enumerate() {
        let state = dir.join(format!("state{n}"));
        std::fs::create_dir_all(&state).unwrap();
        let op = opmark::op_id::OpId::parse("stub:1").unwrap();
        // $0, $# and our variables as the command sees them, and an exit of its own.
        let command = "echo \"$0 $# ${c-unset} ${s-unset} ${t-unset}\"; exit 5";
        let fp = "ab".repeat(32);
        let verb = Verb::Run(RunCall {
            op: &op,
            attempt_id: "a1",
            host_fingerprint: &fp,
            family: opmark::family::Family::ReadOnly,
            timeout: None,
            output_cap: 1024,
            stdin: None,
            supersede_interrupted: false,
            repeat: opmark::shim::RepeatCheck::OFF,
            command,
            secrets: opmark::secret::Secrets::none(),
            become_user: None,
            locks: &[],
            lock_wait: std::time::Duration::ZERO,
            kind: opmark::shim::RunKind::Command,
            put_from: 0,
        });
        let call = Invocation::new(&verb, None);
        let mut child = Command::new(login_shell)
            .arg("-c")
            .arg(&call.exec)
            .env("XDG_STATE_HOME", &state)
            .env("HOME", &state)
            // The command's shell is the login's $SHELL (as sshd sets it): pinned here so
            // that this test is about the stub, whatever shell runs the tests.
            .env("SHELL", "/bin/sh")
            // A disposable test host, whose state may be under /tmp (a clone there).
            .env("OPMARK_ALLOW_VOLATILE_ROOT", "1")
            .current_dir(&state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&call.data).unwrap();
        let out = child.wait_with_output().unwrap();
        let mut parser = ReplyParser::expecting(&call.token);
        let mut replies = Vec::new();
        parser
            .push_stderr(&out.stderr, &mut replies)
            .unwrap_or_else(|e| panic!("{login_shell:?}: {e}: {}", text(&out.stderr)));
        parser.push_stdout(&out.stdout, &mut replies).unwrap();
        let stdout: Vec<u8> = replies
            .iter()
            .filter_map(|r| match r {
                Reply::Stdout(b) => Some(b.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        let exit = replies.iter().find_map(|r| match r {
            Reply::Frame(Frame::Exit(x)) => Some(x.code),
            _ => None,
        });
        assert_eq!(exit, Some(5), "{login_shell:?}: {}", text(&out.stderr));
        assert_eq!(text(&stdout), "sh 0 unset unset unset\n", "{login_shell:?}");
        let kept = state.join("opmark/ops/stub:1/cmd");
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), command);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{login_shell:?}");
    }
}

#[test]
fn a_one_megabyte_command_and_a_120_kb_one_run_once_and_replay() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new("huge-commands");
    for (op, words, word_len) in [("mega", 10, 100_000), ("k120", 1, 120_000)] {
        let effects = fresh_dir(op).join("effects");
        let filler = "x".repeat(word_len);
        let append = format!("echo ran >> {}", effects.display());
        let mut command: Vec<&str> = vec![":"];
        command.extend(std::iter::repeat_n(filler.as_str(), words));
        command.extend([";", &append, ";", "echo", "ok;", "exit", "4"]);
        let joined = command.join(" ");
        assert!(joined.len() >= words * word_len);
        let (first, status) = run_words(&env, &lab, op, &command);
        assert_eq!(first["verdict"], "completed", "{op}: {first}");
        assert_eq!((first["exit_code"].as_i64(), status), (Some(4), 4), "{op}");
        assert_eq!(first["stdout"], "ok\n", "{op}");
        assert_eq!(first["attempts"].as_array().unwrap().len(), 1, "{op}");
        let (again, status) = run_words(&env, &lab, op, &command);
        assert_eq!(again["verdict"], "replayed", "{op}: {again}");
        assert_eq!((again["exit_code"].as_i64(), status), (Some(4), 4), "{op}");
        assert_eq!(std::fs::read_to_string(&effects).unwrap(), "ran\n", "{op}");
        let kept = lab.targets()[0]
            .marker_root()
            .join("ops")
            .join(op)
            .join("cmd");
        assert_eq!(std::fs::read_to_string(kept).unwrap(), joined, "{op}");
    }
}

#[test]
fn the_command_is_in_no_process_arguments_on_the_host() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new("no-argv");
    let dir = fresh_dir("no-argv");
    let gate = dir.join("gate");
    let started = dir.join("started");
    let canary = "CANARY-7f3e9a";
    let cmd = format!(
        ": {canary}; touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo done",
        started.display(),
        gate.display()
    );
    let client = env
        .opmark_with_lab(&lab)
        .args(["--json", "run", "target1", "--op", "argv", "--", &cmd])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every process but the local client (whose own argv holds what the caller typed).
    let mut seen = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == client.id() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if text(&cmdline).contains(canary) {
            seen.push(text(&cmdline).replace('\0', " "));
        }
    }
    std::fs::write(&gate, "").unwrap();
    let out = client.wait_with_output().unwrap();
    assert_eq!(json(&out)["stdout"], "done\n");
    assert!(seen.is_empty(), "the command shows in ps: {seen:?}");
}

#[test]
fn fish_as_login_shell_works() {
    crate::require_tool!("fish");
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    lab.set_login("target1", &tool_path("fish"), None).unwrap();
    let env = Sealed::new("fish");
    assert_runs_once_and_replays(&env, &lab, "fish-op");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(ok, "{failed:?} {doc}");
    assert!(doc.to_string().contains("fish"), "{doc}");
}

#[test]
fn tcsh_as_login_shell_works() {
    crate::require_tool!("tcsh");
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    lab.set_login("target1", &tool_path("tcsh"), None).unwrap();
    let env = Sealed::new("tcsh");
    assert_runs_once_and_replays_with(&env, &lab, "tcsh-op", ">/dev/stderr");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(ok, "{failed:?} {doc}");
}

#[test]
fn a_bashrc_that_exits_fails_fast_as_not_applied() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    // The classic mistake: meant to skip the rest for non-interactive shells.
    let home = &lab.targets()[0].home;
    std::fs::write(
        home.join(".bashrc"),
        "echo 'bashrc: not interactive, bye' >&2\n[ -z \"$PS1\" ] && exit\n",
    )
    .unwrap();
    let env = Sealed::new("bashrc-exit");
    let (doc, _, _) = assert_fails_fast(&env, &lab, "bashrc-exit", "shim_did_not_start");
    let reason = doc["reason"].as_str().unwrap();
    assert!(reason.contains("bashrc: not interactive, bye"), "{reason}");
    assert!(reason.contains("opmark doctor"), "{reason}");
    let (ok, failed, _) = doctor_checks(&env, &lab);
    assert!(!ok);
    assert_eq!(failed, ["shim"]);
}

#[test]
fn a_bashrc_that_reads_stdin_fails_fast_and_runs_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    // Eats the start of the channel's data: the shim and command after it no longer line
    // up with what the stub expects, so nothing may run.
    let home = &lab.targets()[0].home;
    std::fs::write(home.join(".bashrc"), "read -r first_line\n").unwrap();
    let env = Sealed::new("bashrc-stdin");
    assert_fails_fast(&env, &lab, "bashrc-stdin", "shim_did_not_start");
}

#[test]
fn a_bashrc_that_silences_output_fails_fast_and_runs_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    // The shim would claim and run unheard; it must stop before acting instead, since a
    // channel that closes without its header reads as "nothing ran".
    let home = &lab.targets()[0].home;
    std::fs::write(home.join(".bashrc"), "exec >/dev/null 2>&1\n").unwrap();
    let env = Sealed::new("bashrc-silent");
    assert_fails_fast(&env, &lab, "bashrc-silent", "shim_did_not_start");
}

#[test]
fn a_bashrc_printing_a_fake_header_does_not_fool_the_client() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let fake = "OPMARK/1 0123456789abcdef0123456789abcdef H v=1";
    let home = &lab.targets()[0].home;
    std::fs::write(
        home.join(".bashrc"),
        format!("echo '{fake}'\necho '{fake}' >&2\n"),
    )
    .unwrap();
    let env = Sealed::new("bashrc-header");
    // The fake lines are the command's output too (bash reads ~/.bashrc for a command
    // sshd starts, so ssh prints them): what counts is that the verdict, the exit code
    // and the run-once hold.
    assert_runs_once_and_replays(&env, &lab, "fake-header");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(ok, "{failed:?} {doc}");
}

#[test]
fn a_busybox_only_host_runs_once_replays_and_doctor_says_how_it_detaches() {
    crate::require_tool!("busybox");
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    // A PATH that holds only busybox applets (no util-linux setsid -f, no stdbuf), and
    // busybox sh as the login shell.
    let bin = fresh_dir("busybox-only").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let busybox = tool_path("busybox");
    let list = Command::new(&busybox).arg("--list").output().unwrap();
    for applet in text(&list.stdout).lines() {
        std::os::unix::fs::symlink(&busybox, bin.join(applet)).unwrap();
    }
    lab.set_login("target1", &bin.join("sh"), Some(bin.to_str().unwrap()))
        .unwrap();
    let env = Sealed::new("busybox-only");
    assert_runs_once_and_replays(&env, &lab, "bb-op");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(ok, "{failed:?} {doc}");
    assert_eq!(doc["facts"]["detach"], "setsid_setsid", "{doc}");
    assert_eq!(
        doc["facts"]["capture"], "dd_per_read",
        "no stdbuf here: {doc}"
    );
    let setsid = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "setsid")
        .unwrap();
    assert!(
        setsid["detail"].as_str().unwrap().contains("busybox"),
        "{doc}"
    );
    // The capture without stdbuf keeps exact counts: the live stream whole, the copy
    // kept for replays exactly the cap, the rest counted.
    for attempt in ["first", "replay"] {
        let out = env
            .opmark_with_lab(&lab)
            .args([
                "--json",
                "run",
                "target1",
                "--op",
                "bb-cap",
                "--output-cap",
                "1k",
                "--",
            ])
            .arg("head -c 5000 /dev/zero | tr '\\0' a")
            .output()
            .unwrap();
        let doc = json(&out);
        let want = if attempt == "first" { 5000 } else { 1024 };
        assert_eq!(
            doc["stdout"].as_str().map(str::len),
            Some(want),
            "{attempt}: {doc}"
        );
        assert_eq!(doc["dropped"][0], 5000 - 1024, "{attempt}: {doc}");
    }
}

#[test]
fn a_sync_that_takes_no_files_still_makes_runs_durable_and_doctor_says_how() {
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    // Some busybox builds: `sync` alone works, `sync FILE` is refused.
    let bin = fresh_dir("sync-no-files").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let sync = bin.join("sync");
    std::fs::write(
        &sync,
        "#!/bin/sh\nif [ $# -gt 0 ]; then echo 'sync: no arguments allowed' >&2; exit 1; fi\nexec /bin/sync\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sync, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    lab.set_login("target1", Path::new("/bin/bash"), Some(&path))
        .unwrap();
    let env = Sealed::new("sync-no-files");
    assert_runs_once_and_replays(&env, &lab, "sync-op");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(ok, "{failed:?} {doc}");
    assert_eq!(doc["facts"]["sync_file"], "no", "{doc}");
    let check = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sync")
        .unwrap();
    assert!(
        check["detail"].as_str().unwrap().contains("plain sync"),
        "{doc}"
    );
}

#[test]
fn a_relative_xdg_state_home_is_failed_by_doctor_with_the_fix() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let home = &lab.targets()[0].home;
    std::fs::write(home.join(".bashrc"), "export XDG_STATE_HOME=state\n").unwrap();
    let env = Sealed::new("relative-state");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(!ok, "{doc}");
    assert!(failed.contains(&"root".to_owned()), "{failed:?} {doc}");
    let check = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "root")
        .unwrap();
    assert!(
        check["detail"].as_str().unwrap().contains("relative"),
        "{doc}"
    );
    assert!(
        check["fix"].as_str().unwrap().contains("absolute path"),
        "{doc}"
    );
}

#[test]
fn a_startup_banner_without_a_newline_does_not_stop_the_first_contact() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    // Printed before the stub's request for the script (the host has no cached copy yet)
    // and before every header, on the same line.
    let home = &lab.targets()[0].home;
    std::fs::write(home.join(".bashrc"), "printf Welcome\n").unwrap();
    let env = Sealed::new("banner");
    let effects = fresh_dir("banner").join("effects");
    let cmd = format!("echo ran >> {}; echo out; exit 3", effects.display());
    let (doc, status) = run_words(&env, &lab, "banner-op", &[&cmd]);
    assert_eq!(doc["verdict"], "completed", "{doc}");
    assert_eq!(status, 3, "{doc}");
    assert!(doc["stdout"].as_str().unwrap().ends_with("out\n"), "{doc}");
    let (again, _) = run_words(&env, &lab, "banner-op", &[&cmd]);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(std::fs::read_to_string(&effects).unwrap(), "ran\n");
}

#[test]
fn a_login_shell_that_cannot_run_commands_fails_fast() {
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    lab.set_login("target1", Path::new("/usr/sbin/nologin"), None)
        .unwrap();
    let env = Sealed::new("nologin");
    assert_fails_fast(&env, &lab, "nologin-op", "shim_did_not_start");
    let (ok, failed, _) = doctor_checks(&env, &lab);
    assert!(!ok);
    assert_eq!(failed, ["shim"]);
}

#[test]
fn a_setsid_that_fails_runs_nothing_and_leaves_no_claim_or_leftover() {
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    // A setsid that cannot start anything (a broken install, a seccomp policy).
    let bin = fresh_dir("setsid-fails").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let setsid = bin.join("setsid");
    std::fs::write(&setsid, "#!/bin/sh\necho 'setsid: failed' >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&setsid, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    lab.set_login("target1", Path::new("/bin/bash"), Some(&path))
        .unwrap();
    let env = Sealed::new("setsid-fails");
    let (doc, cmd, effects) = assert_fails_fast(&env, &lab, "sf-op", "shim_cannot_start");
    assert!(
        doc["reason"].as_str().unwrap().contains("setsid_failed"),
        "{doc}"
    );
    // Nothing ran and nothing can: no failed-start leftover for gc to find later.
    let superseded = lab.targets()[0].marker_root().join("superseded");
    let left: Vec<_> = std::fs::read_dir(&superseded)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
    // Fixed, the same op id runs.
    lab.set_login("target1", Path::new("/bin/bash"), Some("/usr/bin:/bin"))
        .unwrap();
    let (fixed, status) = run_words(&env, &lab, "sf-op", &[&cmd]);
    assert_eq!(
        (fixed["verdict"].as_str(), status),
        (Some("completed"), 0),
        "{fixed}"
    );
    assert_eq!(std::fs::read_to_string(&effects).unwrap(), "ran\n");
}

#[test]
fn a_static_busybox_login_shell_on_a_full_host_runs_and_doctor_names_its_applet() {
    crate::require_tool!("busybox");
    let Some(lab) = lab_for_host_kinds(crate::test_name!()) else {
        return;
    };
    // Debian's busybox-static as the login shell: it answers its own applets before PATH
    // (`command -v setsid` says `setsid` with util-linux's installed), which once made the
    // refusal ask for util-linux, installed all along.
    let bin = fresh_dir("static-busybox-sh").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(tool_path("busybox"), bin.join("sh")).unwrap();
    lab.set_login("target1", &bin.join("sh"), Some("/usr/bin:/bin"))
        .unwrap();
    let env = Sealed::new("static-busybox-sh");
    assert_runs_once_and_replays(&env, &lab, "sbb-op");
    let (ok, failed, doc) = doctor_checks(&env, &lab);
    assert!(ok, "{failed:?} {doc}");
    let applet = Command::new(tool_path("busybox"))
        .args(["sh", "-c", "command -v setsid"])
        .output()
        .unwrap();
    if text(&applet.stdout).trim() == "setsid" {
        assert_eq!(doc["facts"]["setsid_path"], "applet", "{doc}");
        assert_eq!(doc["facts"]["setsid_kind"], "busybox", "{doc}");
    }
}
