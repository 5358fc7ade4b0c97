//! The core guarantees against docker targets (`opmark lab up --placement docker`): each
//! container runs a real OpenSSH sshd, its markers on a volume; faults are a silent link
//! cut (nftables in the container's network namespace), a client SIGKILL and a crash of
//! every process of the container (which shares the host's boot id, so only the recorded
//! pid and start time can tell that the command is gone). Also: doctor, and the image
//! cache (a second `lab up` builds nothing).
//!
//! Tool rule: without docker, a running Docker engine, debootstrap, nsenter or nft the
//! tests skip locally and fail in CI. The first test to need the image builds it (about
//! two minutes, once: parallel tests wait on the build lock and then find it cached).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use opmark::lab::{recipe_tag, Lab, LabSpec, Placement};
use serde_json::Value;

use crate::support::{
    self, fast_loss_config, fresh_dir, json, lines, spawn_run, text, wait_for, Sealed,
};

/// A docker lab of `count` targets named after the test, or None (after SKIP) locally
/// when docker, its engine or debootstrap is missing; panics in CI.
fn docker_lab(name: &str, count: usize) -> Option<Lab> {
    if !docker_ready(name) {
        return None;
    }
    let spec = LabSpec {
        count,
        placement: Placement::Docker,
        dir: fresh_dir(name).join("lab"),
    };
    Some(Lab::start(&spec).unwrap_or_else(|e| panic!("{name}: docker lab did not start: {e}")))
}

fn docker_ready(name: &str) -> bool {
    if !support::require_tools(
        name,
        &[
            "docker",
            "debootstrap",
            "ssh",
            "ssh-keygen",
            "nsenter",
            "nft",
        ],
    ) {
        return false;
    }
    let engine = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    if !engine.is_ok_and(|o| o.status.success()) {
        return support::skip_or_fail(name, "the Docker engine does not answer `docker version`");
    }
    support::require_root(name)
}

/// The JSON document of a finished opmark command.
fn run_doc(env: &Sealed, lab: &Lab, args: &[&str]) -> (Option<i32>, Value) {
    let out = env
        .opmark_with_lab(lab)
        .arg("--json")
        .arg("run")
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), json(&out))
}

/// The marker directory of `op` on target1, seen from this machine (the volume).
fn volume_marker(lab: &Lab, op: &str) -> PathBuf {
    lab.marker_root_on_host("target1")
        .unwrap()
        .join("ops")
        .join(op)
}

/// An effect file on target1's marker volume: (path in the container, path here).
fn effect(lab: &Lab, name: &str) -> (String, PathBuf) {
    let here = lab
        .marker_root_on_host("target1")
        .unwrap()
        .parent()
        .unwrap()
        .join(name);
    let t = lab.target("target1").unwrap();
    (format!("{}/{name}", t.state_home.display()), here)
}

#[test]
fn same_op_on_a_container_completes_then_replays_without_running_again() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let (fx, fx_here) = effect(&lab, "replay");
    let cmd = format!("echo ran >> {fx}; echo out; hostname; exit 3");
    let (code, first) = run_doc(&env, &lab, &["target1", "--op", "replay-1", "--", &cmd]);
    assert_eq!(first["verdict"], "completed", "{first}");
    assert_eq!(code, Some(3));
    assert_eq!(first["stdout"], "out\ntarget1\n", "ran in the container");
    let (code, again) = run_doc(&env, &lab, &["target1", "--op", "replay-1", "--", &cmd]);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(code, Some(3));
    assert_eq!(again["stdout"], "out\ntarget1\n");
    assert_eq!(lines(&fx_here), 1, "exactly one execution");
}

#[test]
fn sixteen_concurrent_runs_of_one_op_on_a_container_execute_once() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let (fx, fx_here) = effect(&lab, "contended");
    let cmd = format!("echo ran >> {fx}; sleep 0.3; echo done");
    let children: Vec<Child> = (0..16)
        .map(|_| {
            spawn_run(
                &mut env.opmark_with_lab(&lab),
                &["target1", "--op", "contended", "--wait", "60s", "--", &cmd],
            )
        })
        .collect();
    let docs: Vec<Value> = children
        .into_iter()
        .map(|c| json(&c.wait_with_output().unwrap()))
        .collect();
    let count = |v: &str| docs.iter().filter(|d| d["verdict"] == v).count();
    assert_eq!(count("completed"), 1, "{docs:#?}");
    assert_eq!(count("replayed"), 15, "{docs:#?}");
    for d in &docs {
        assert_eq!(d["exit_code"], 0, "{d}");
        assert_eq!(d["stdout"], "done\n", "{d}");
    }
    assert_eq!(lines(&fx_here), 1, "exactly one execution");
}

#[test]
fn client_killed_mid_command_on_a_container_then_rerun_follows_it_and_it_runs_once() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let (fx, fx_here) = effect(&lab, "killed");
    let cmd = format!("echo ran >> {fx}; sleep 2; echo out; exit 7");
    let mut client = spawn_run(
        &mut env.opmark_with_lab(&lab),
        &["target1", "--op", "killed-1", "--", &cmd],
    );
    let m = volume_marker(&lab, "killed-1");
    wait_for("the command to start", Duration::from_secs(20), || {
        m.join("started").exists() && lines(&fx_here) == 1
    });
    client.kill().unwrap(); // SIGKILL: no chance to say goodbye
    client.wait().unwrap();
    assert!(!m.join("exit").exists(), "the kill landed mid-command");

    let (code, rerun) = run_doc(&env, &lab, &["target1", "--op", "killed-1", "--", &cmd]);
    assert_eq!(
        rerun["verdict"], "replayed",
        "the killed client's attempt ran it: {rerun}"
    );
    assert_eq!(code, Some(7), "the true exit status");
    assert_eq!(rerun["stdout"], "out\n", "{rerun}");
    assert_eq!(lines(&fx_here), 1, "exactly one execution");
}

#[test]
fn link_cut_mid_command_on_a_container_then_restored_reattaches_with_the_true_status() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let cfg = fast_loss_config(&lab, &fresh_dir(crate::test_name!()));
    let m = volume_marker(&lab, "cut-1");
    let cmd = "echo first; sleep 4; echo second; exit 6";
    let child = spawn_run(
        env.opmark().arg("-F").arg(&cfg),
        &["target1", "--op", "cut-1", "--wait", "30s", "--", cmd],
    );
    wait_for("the command to start", Duration::from_secs(20), || {
        std::fs::read(m.join("out")).is_ok_and(|o| o == b"first\n")
    });
    lab.cut("target1").unwrap();
    assert!(lab.is_cut("target1").unwrap());
    // Longer than the client's keepalive budget (about 2 s), so the loss is noticed.
    std::thread::sleep(Duration::from_secs(3));
    lab.restore("target1").unwrap();
    assert!(!lab.is_cut("target1").unwrap());
    let out = child.wait_with_output().unwrap();
    let doc = json(&out);
    let stderr = text(&out.stderr);
    assert_eq!(doc["verdict"], "completed", "{doc}\n{stderr}");
    assert_eq!(doc["exit_code"], 6, "{doc}");
    assert_eq!(doc["stdout"], "first\nsecond\n", "every byte once: {doc}");
    // A silent drop: the client learnt of it from its keepalives, not from a reset.
    assert!(
        stderr.contains("lost after dispatch") && stderr.contains("keepalive"),
        "{stderr}"
    );
}

#[test]
fn container_crash_mid_command_is_interrupted_and_append_only_runs_once_more_only_when_approved() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let (fx, fx_here) = effect(&lab, "crashed");
    let (gate, gate_here) = effect(&lab, "crashed.gate");
    // The first execution sleeps until the crash; the approved re-run finds the gate open.
    let cmd = format!("echo ran >> {fx}; test -e {gate} || sleep 60; echo finished");
    let args = [
        "target1",
        "--op",
        "crash-1",
        "--class",
        "append-only",
        "--",
        cmd.as_str(),
    ];
    let child = spawn_run(&mut env.opmark_with_lab(&lab), &args);
    let m = volume_marker(&lab, "crash-1");
    wait_for("the command to start", Duration::from_secs(20), || {
        m.join("proc").exists() && lines(&fx_here) == 1
    });
    // The container shares this machine's boot id: the crash is not a reboot.
    let boot_here = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot_there = support::ssh(&lab)
        .args(["target1", "cat /proc/sys/kernel/random/boot_id"])
        .output()
        .unwrap();
    assert_eq!(text(&boot_there.stdout), boot_here);

    lab.crash("target1").unwrap();
    assert!(lab.target_running("target1"), "started again");
    let out = child.wait_with_output().unwrap();
    let doc = json(&out);
    assert_eq!(doc["verdict"], "indeterminate", "{doc}");
    assert_eq!(doc["reason_code"], "interrupted_needs_approval", "{doc}");
    assert!(
        doc["reason"].as_str().unwrap().contains("process_gone"),
        "told by the recorded pid and start time, not the boot id: {doc}"
    );
    assert_eq!(doc["attempts"][0]["boundary"], "started", "{doc}");
    assert!(m.join("claim").exists(), "the marker survived the crash");
    let probe = env
        .opmark_with_lab(&lab)
        .args(["--json", "probe", "target1", "crash-1"])
        .output()
        .unwrap();
    let probe = json(&probe);
    assert_eq!(probe["marker_state"], "interrupted", "{probe}");
    assert_eq!(probe["why"], "process_gone", "{probe}");

    let (_, again) = run_doc(&env, &lab, &args);
    assert_eq!(
        again["verdict"], "indeterminate",
        "no re-run without approval"
    );
    assert_eq!(lines(&fx_here), 1);

    std::fs::write(&gate_here, "").unwrap();
    let approved: Vec<&str> = [
        &args[..5],
        &["--approve", "checked: the container crashed"],
        &args[5..],
    ]
    .concat();
    let (code, doc) = run_doc(&env, &lab, &approved);
    assert_eq!(doc["verdict"], "completed", "{doc}");
    assert_eq!(code, Some(0));
    assert_eq!(doc["stdout"], "finished\n");
    assert_eq!(lines(&fx_here), 2, "exactly one more execution");
    let (_, after) = run_doc(&env, &lab, &approved);
    assert_eq!(
        after["verdict"], "replayed",
        "approval runs it once: {after}"
    );
    assert_eq!(lines(&fx_here), 2);
}

/// The boot id target1 reads.
fn boot_id_there(lab: &Lab) -> String {
    let out = support::ssh(lab)
        .args(["target1", "cat /proc/sys/kernel/random/boot_id"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn container_reboot_mid_command_is_interrupted_by_the_new_boot_and_a_convergent_command_runs_again_to_its_end(
) {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let (fx, fx_here) = effect(&lab, "rebooted");
    let (gate, gate_here) = effect(&lab, "rebooted.gate");
    let executions = || {
        let dir = fx_here.parent().unwrap();
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                name.starts_with("rebooted.") && name != "rebooted.gate"
            })
            .count()
    };
    // Convergent (`>`): one file per execution; the first sleeps through the reboot.
    let cmd = format!("date > {fx}.$$; test -e {gate} || sleep 60; echo finished");
    let args = ["target1", "--op", "reboot-1", "--", cmd.as_str()];
    let child = spawn_run(&mut env.opmark_with_lab(&lab), &args);
    let m = volume_marker(&lab, "reboot-1");
    wait_for("the command to start", Duration::from_secs(20), || {
        m.join("proc").exists() && executions() == 1
    });
    // The file is named after the command's shell pid, and a rebooted container counts
    // its pids from 1 again: the rerun's shell can get the same pid and overwrite the
    // first execution's file (seen: 1 file for 2 executions). Renamed from here, the
    // first execution's file stays counted (its command wrote it and will not again).
    let dir = fx_here.parent().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("rebooted.").filter(|p| *p != "gate") {
            std::fs::rename(
                dir.join(&name),
                dir.join(format!("rebooted.first-boot-{pid}")),
            )
            .unwrap();
        }
    }
    assert_eq!(executions(), 1, "the first execution's file, renamed");
    let boot_here = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(boot_id_there(&lab), boot_here, "one kernel, one boot id");
    std::fs::write(&gate_here, "").unwrap();

    lab.reboot("target1").unwrap();
    let rebooted = boot_id_there(&lab);
    assert_ne!(
        rebooted, boot_here,
        "the target reads a boot of its own now"
    );
    let out = child.wait_with_output().unwrap();
    let doc = json(&out);
    let stderr = text(&out.stderr);
    assert_eq!(doc["verdict"], "completed", "{doc}\n{stderr}");
    assert_eq!(doc["stdout"], "finished\n", "{doc}");
    assert_eq!(
        executions(),
        2,
        "the execution the reboot ended, and one rerun of it: {doc}"
    );
    assert!(
        stderr.contains("reboot"),
        "the client says why the first execution is over: {stderr}"
    );

    // A crash after it is not a reboot: the boot id stays the rebooted one.
    lab.crash("target1").unwrap();
    assert_eq!(boot_id_there(&lab), rebooted);
    let (_, again) = run_doc(&env, &lab, &args);
    assert_eq!(again["verdict"], "replayed", "{again}");
    assert_eq!(executions(), 2);
}

#[test]
fn reconcile_fences_a_dispatch_that_never_reached_a_container_so_the_late_original_cannot_run() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let (fx, fx_here) = effect(&lab, "late");
    let command = format!("touch {fx}");
    crate::operators::record_lost_dispatch(&env, "target1", "late-1", &command, true);

    let out = env
        .opmark_with_lab(&lab)
        .args(["--json", "reconcile"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = json(&out);
    let row = &doc["operations"][0];
    assert_eq!(row["decision"], "not_applied", "{doc}");
    assert_eq!(row["evidence"], "absent; fenced", "{doc}");
    assert!(volume_marker(&lab, "late-1").join("fenced").exists());

    // The delayed original arrives, from this client and from another with its own ledger.
    let other = Sealed::new(&format!("{}-other", crate::test_name!()));
    for client in [&env, &other] {
        let (code, doc) = run_doc(client, &lab, &["target1", "--op", "late-1", "--", &command]);
        assert_eq!(doc["verdict"], "not_applied", "{doc}");
        assert_eq!(code, Some(241));
    }
    assert!(!fx_here.exists(), "a fenced operation ran");
}

#[test]
fn doctor_passes_on_a_container_target() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark_with_lab(&lab)
        .args(["--json", "doctor", "target1"])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(doc["ok"], true, "{doc}");
    let root = lab.target("target1").unwrap().marker_root();
    assert_eq!(doc["facts"]["root"], root.display().to_string(), "{doc}");
}

fn image_id_and_created(tag: &str) -> String {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}} {{.Created}}", tag])
        .output()
        .unwrap();
    assert!(out.status.success(), "{tag}: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// Docker objects (containers, volumes, networks) labelled with this lab directory.
fn objects_of(dir: &Path) -> String {
    let filter = format!("label=opmark.lab.dir={}", dir.display());
    ["ps -aq", "volume ls -q", "network ls -q"]
        .iter()
        .map(|what| {
            let out = Command::new("docker")
                .args(what.split(' '))
                .args(["--filter", &filter])
                .output()
                .unwrap();
            text(&out.stdout).trim().to_owned()
        })
        .collect::<Vec<_>>()
        .join("")
}

#[test]
fn second_lab_up_uses_the_cached_image_and_lab_down_removes_all_but_the_image() {
    let name = crate::test_name!();
    if !docker_ready(name) {
        return;
    }
    let env = Sealed::new(name);
    let up = |dir: &Path| {
        let out = env
            .opmark()
            .args(["lab", "up", "2", "--placement", "docker", "--dir"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let down = |dir: &Path| {
        let out = env
            .opmark()
            .args(["lab", "down", "--dir"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stderr)
    };
    let tag = recipe_tag();
    let first_dir = env.root.join("lab1");
    up(&first_dir); // builds the image unless an earlier test or run did
    let before = image_id_and_created(&tag);
    assert!(!objects_of(&first_dir).is_empty());
    let said = down(&first_dir);
    assert!(said.contains(&format!("image {tag} kept")), "{said}");
    assert_eq!(
        objects_of(&first_dir),
        "",
        "containers, volumes, network left"
    );
    assert!(!first_dir.exists());

    let second_dir = env.root.join("lab2");
    let printed = up(&second_dir);
    assert!(
        printed.contains(&format!("image {tag} (cached: nothing built)")),
        "{printed}"
    );
    assert_eq!(image_id_and_created(&tag), before, "the image was rebuilt");

    // The fault verbs through the CLI, and status reporting them.
    let lab = Lab::load(&second_dir).unwrap();
    let verb = |args: &[&str]| {
        let out = env
            .opmark()
            .args(["lab"])
            .args(args)
            .arg("--dir")
            .arg(&second_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    };
    let status = || {
        let out = env
            .opmark()
            .args(["--json", "lab", "status", "--dir"])
            .arg(&second_dir)
            .output()
            .unwrap();
        json(&out)
    };
    verb(&["pause", "target2"]);
    assert_eq!(lab.container_state("target2").unwrap(), "paused");
    let timed_out = support::ssh(&lab)
        .args(["-o", "ConnectTimeout=2", "target2", "true"])
        .output()
        .unwrap();
    assert!(!timed_out.status.success(), "a paused target answered");
    verb(&["resume", "target2"]);
    verb(&["cut", "target1"]);
    assert_eq!(status()["targets"][0]["cut"], true);
    verb(&["restore", "target1"]);
    let doc = status();
    assert_eq!(doc["placement"], "docker");
    assert_eq!(doc["targets"][0]["cut"], false, "{doc}");
    assert_eq!(doc["targets"][1]["running"], true, "{doc}");
    let ok = support::ssh(&lab)
        .args(["target2", "echo back"])
        .output()
        .unwrap();
    assert_eq!(text(&ok.stdout), "back\n", "{}", text(&ok.stderr));

    down(&second_dir);
    assert_eq!(objects_of(&second_dir), "");
    assert_eq!(
        image_id_and_created(&tag),
        before,
        "lab down kept the image"
    );
}

#[test]
fn image_option_without_docker_placement_or_unknown_image_is_refused_with_the_fix() {
    let name = crate::test_name!();
    let env = Sealed::new(name);
    let dir = env.root.join("lab");
    let out = env
        .opmark()
        .args(["lab", "up", "--image", "debian:12", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245));
    assert!(
        text(&out.stderr).contains("--placement docker"),
        "{}",
        text(&out.stderr)
    );
    // The docker-only fault verbs on a loopback target: a usage problem with the fix.
    if let Some(lab) = crate::loopback_lab!(1) {
        for verb in ["pause", "resume", "crash", "reboot"] {
            let out = env
                .opmark()
                .args(["lab", verb, "target1", "--dir"])
                .arg(lab.dir())
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(245), "{verb}");
            assert!(
                text(&out.stderr).contains("--placement docker"),
                "{verb}: {}",
                text(&out.stderr)
            );
        }
        assert!(lab.target_running("target1"), "nothing was done to it");
    }
    if !docker_ready(name) {
        return;
    }
    let out = env
        .opmark()
        .args([
            "lab",
            "up",
            "--placement",
            "docker",
            "--image",
            "opmark-no-such-image:0",
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245));
    let err = text(&out.stderr);
    assert!(
        err.contains("no local image") && err.contains("no registry"),
        "{err}"
    );
    assert_eq!(objects_of(&dir), "", "nothing started");
}

/// Removes the named images (test-made tags) when the test ends, even by a panic.
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker").args(["image", "rm", image]).output();
        }
    }
}

fn docker_ok(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout).trim().to_owned()
}

#[test]
fn a_users_own_image_gets_keys_and_config_injected_and_is_never_purged() {
    let name = crate::test_name!();
    // Makes sure the lab's image exists; the user's images are made from it.
    let Some(lab) = docker_lab(name, 1) else {
        return;
    };
    drop(lab);
    let env = Sealed::new(name);
    let own = format!("opmark-test-own-{}:1", std::process::id());
    let no_sshd = format!("opmark-test-no-sshd-{}:1", std::process::id());
    let _cleanup = Images(vec![own.clone(), no_sshd.clone()]);
    docker_ok(&["tag", &recipe_tag(), &own]);
    let maker = format!("opmark-test-no-sshd-{}", std::process::id());
    docker_ok(&[
        "run",
        "--name",
        &maker,
        &recipe_tag(),
        "rm",
        "/usr/sbin/sshd",
    ]);
    docker_ok(&["commit", &maker, &no_sshd]);
    docker_ok(&["rm", &maker]);

    let dir = env.root.join("lab");
    let out = env
        .opmark()
        .args([
            "lab",
            "up",
            "--placement",
            "docker",
            "--image",
            &own,
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("image {own} (given with --image)")),
        "{}",
        text(&out.stdout)
    );
    let lab = Lab::load(&dir).unwrap();
    let (code, doc) = run_doc(&env, &lab, &["target1", "--op", "own-1", "--", "hostname"]);
    assert_eq!(doc["verdict"], "completed", "{doc}");
    assert_eq!(code, Some(0));
    assert_eq!(doc["stdout"], "target1\n");
    let out = env
        .opmark()
        .args(["lab", "down", "--purge-image", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(objects_of(&dir), "");
    docker_ok(&["image", "inspect", &own]); // still there: not the lab's to remove

    // An image without sshd fails at start with the container's own words, and leaves
    // nothing behind.
    let out = env
        .opmark()
        .args([
            "lab",
            "up",
            "--placement",
            "docker",
            "--image",
            &no_sshd,
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("target1 did not start") && err.contains("/usr/sbin/sshd: not found"),
        "{err}"
    );
    assert_eq!(objects_of(&dir), "", "a failed start left docker objects");
}

/// The three wrapped commands that once slipped past the policy (a deny on `rm -rf /`
/// stepped around with `sh -c`, an approval rule with `bash -c` or `eval`) against a real
/// host, run as an agent would. A container is the host: should the policy ever fail,
/// what runs is confined to it. Before each run the classifier is asked first, and the
/// test stops there unless it refuses or holds the command.
#[test]
fn wrapped_denied_and_held_commands_run_nothing_on_a_container() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let cases = [
        (
            "wrapped-rm",
            "sh -c 'rm -rf /'",
            "refused",
            "policy_denied",
            245,
        ),
        (
            "wrapped-mkfs",
            "bash -c 'mkfs.ext4 /dev/sdb'",
            "blocked",
            "approval_required",
            244,
        ),
        (
            "wrapped-reboot",
            "eval reboot",
            "blocked",
            "approval_required",
            244,
        ),
    ];
    for (op, command, verdict, reason, status) in cases {
        let classified = json(
            &env.opmark()
                .args(["--json", "classify", "--", command])
                .output()
                .unwrap(),
        );
        assert!(
            !classified["deny"].is_null() || !classified["approval"].is_null(),
            "{command}: the classifier lets it through, so it is not run: {classified}"
        );
        let (code, answer) = run_doc(&env, &lab, &["target1", "--op", op, "--", command]);
        assert_eq!(answer["verdict"], verdict, "{command}: {answer}");
        assert_eq!(answer["reason_code"], reason, "{command}: {answer}");
        assert_eq!(answer["retryable"], false, "{command}: {answer}");
        assert_eq!(code, Some(status), "{command}: {answer}");
        assert!(
            answer["reason"].as_str().unwrap().contains("inside `"),
            "{command}: the reason names the wrapper it looked through: {answer}"
        );
        assert_eq!(
            answer["attempts"].as_array().map(Vec::len),
            Some(0),
            "{answer}"
        );
        assert!(
            !volume_marker(&lab, op).exists(),
            "{command}: a marker was claimed"
        );
    }
    // And the container is whole: its root still lists, its sshd still answers.
    let (_, alive) = run_doc(
        &env,
        &lab,
        &["target1", "--op", "still-there", "--", "ls /etc/hostname"],
    );
    assert_eq!(alive["verdict"], "completed", "{alive}");
    assert_eq!(alive["stdout"], "/etc/hostname\n");
}

/// `ps -eo args` inside target1's container: every process's arguments.
fn container_processes(lab: &Lab) -> String {
    let out = Command::new("docker")
        .args([
            "exec",
            &lab.container("target1").unwrap(),
            "ps",
            "-eo",
            "args",
        ])
        .output()
        .unwrap();
    text(&out.stdout)
}

/// Every file of the sudo user's marker root inside target1's container, concatenated
/// (read as root: `cat` of each regular file).
fn sudo_user_marker_bytes(lab: &Lab) -> String {
    let out = Command::new("docker")
        .args(["exec", &lab.container("target1").unwrap(), "sh", "-c"])
        .arg(format!(
            "find /home/{}/.local/state/opmark -type f -exec cat {{}} + 2>/dev/null",
            opmark::lab::SUDO_USER
        ))
        .output()
        .unwrap();
    text(&out.stdout)
}

#[test]
fn become_runs_through_sudo_with_a_password_that_appears_nowhere() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let host = format!("{}@target1", opmark::lab::SUDO_USER);
    let password = opmark::lab::SUDO_PASSWORD;
    let token = "tok-5c8a-become";
    let effect = "/var/lib/opmark-lab/become-effect";
    let command = format!(
        "id -u >> {effect}; echo \"uid=$(id -u) t=$TOKEN pw=${{SUDO_PASSWORD:-unset}}\"; sleep 2"
    );
    let run = |op: &str, extra: &[&str], pw: &str| {
        env.opmark_with_lab(&lab)
            .env("PW", pw)
            .env("T", token)
            .args([
                "-vvv",
                "--json",
                "run",
                &host,
                "--op",
                op,
                "--secret",
                "TOKEN=env:T",
            ])
            .args(extra)
            .args(["--", &command])
            .output()
            .unwrap()
    };
    let count = || {
        let out = Command::new("docker")
            .args(["exec", &lab.container("target1").unwrap(), "sh", "-c"])
            .arg(format!("cat {effect} 2>/dev/null | wc -l"))
            .output()
            .unwrap();
        text(&out.stdout).trim().parse::<usize>().unwrap()
    };

    // Refused before the claim: sudo wants a password and none was given, or a wrong one.
    for (op, extra, pw, says) in [
        ("b-none", &["--become"][..], "", "none was given"),
        (
            "b-wrong",
            &["--become", "--secret", "SUDO_PASSWORD=env:PW"],
            "not-the-password",
            "did not accept the password",
        ),
    ] {
        let out = run(op, extra, pw);
        let doc = json(&out);
        assert_eq!(doc["verdict"], "not_applied", "{op}: {doc}");
        assert_eq!(doc["reason_code"], "become_refused", "{op}: {doc}");
        assert!(
            doc["reason"].as_str().unwrap().contains(says),
            "{op}: {doc}"
        );
        assert!(!text(&out.stderr).contains(pw) || pw.is_empty(), "{op}");
    }
    assert_eq!(count(), 0, "nothing ran");
    // sudo's password is for --become only.
    let out = env
        .opmark_with_lab(&lab)
        .env("PW", password)
        .args([
            "--json",
            "run",
            &host,
            "--op",
            "b-nobecome",
            "--secret",
            "SUDO_PASSWORD=env:PW",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("add --become"),
        "{}",
        text(&out.stdout)
    );

    // With the password: it runs once, as root, with the secret and without sudo's
    // password in its environment; the process list never shows either.
    let mut child = env
        .opmark_with_lab(&lab)
        .env("PW", password)
        .env("T", token)
        .args(["-vvv", "--json", "run", &host, "--op", "b-ok", "--become"])
        .args([
            "--secret",
            "SUDO_PASSWORD=env:PW",
            "--secret",
            "TOKEN=env:T",
            "--",
            &command,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut looks = 0;
    while child.try_wait().unwrap().is_none() {
        let ps = container_processes(&lab);
        assert!(!ps.contains(password) && !ps.contains(token), "{ps}");
        looks += 1;
    }
    assert!(looks >= 3, "the process list was looked at {looks} times");
    let out = child.wait_with_output().unwrap();
    let doc = json(&out);
    assert_eq!(doc["verdict"], "completed", "{doc} {}", text(&out.stderr));
    assert_eq!(
        doc["stdout"], "uid=0 t=[REDACTED:TOKEN] pw=unset\n",
        "{doc}"
    );
    assert_eq!(count(), 1);
    let traces = text(&out.stderr);
    assert!(
        !traces.contains(password) && !traces.contains(token),
        "-vvv shows a secret"
    );
    let markers = sudo_user_marker_bytes(&lab);
    assert!(
        markers.contains("become=root"),
        "the claim says who ran it: {markers}"
    );
    assert!(
        !markers.contains(password) && !markers.contains(token),
        "{markers}"
    );
    let mut files = Vec::new();
    crate::redaction::files_under(&env.root, &mut files);
    for file in files {
        let bytes = text(&std::fs::read(&file).unwrap_or_default());
        assert!(
            !bytes.contains(password) && !bytes.contains(token),
            "{}",
            file.display()
        );
    }
    let shown = env.opmark().args(["show", "b-ok"]).output().unwrap();
    assert!(!text(&shown.stdout).contains(password));
    let said = text(&shown.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        said.contains("secrets SUDO_PASSWORD, TOKEN, runs as root (sudo)"),
        "the record says who it ran as: {said}"
    );
    // The same op id replays; it does not run again.
    let again = run(
        "b-ok",
        &["--become", "--secret", "SUDO_PASSWORD=env:PW"],
        password,
    );
    assert_eq!(
        json(&again)["verdict"],
        "replayed",
        "{}",
        text(&again.stdout)
    );
    assert_eq!(count(), 1);
}

#[test]
fn a_put_as_root_through_sudo_writes_root_owned_files_once_and_the_password_appears_nowhere() {
    let Some(lab) = docker_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let host = format!("{}@target1", opmark::lab::SUDO_USER);
    let password = opmark::lab::SUDO_PASSWORD;
    let container = lab.container("target1").unwrap();
    let in_container = |script: &str| {
        let out = Command::new("docker")
            .args(["exec", &container, "sh", "-c", script])
            .output()
            .unwrap();
        text(&out.stdout).trim().to_owned()
    };
    let dir = support::fresh_dir(crate::test_name!());
    let local = dir.join("app.conf");
    std::fs::write(&local, b"listen 8080\n").unwrap();
    let path = "/etc/opmark-become.conf";
    let put = |op: &str, extra: &[&str], pw: &str| {
        env.opmark_with_lab(&lab)
            .env("PW", pw)
            .args(["--json", "put"])
            .arg(&local)
            .arg(format!("{host}:{path}"))
            .args(["--op", op, "--mode", "640"])
            .args(extra)
            .output()
            .unwrap()
    };

    // As the login user, /etc is not writable: the put fails there, nothing is written.
    let doc = json(&put("pb-login", &[], ""));
    assert_eq!(doc["exit_code"], 1, "{doc}");
    assert_eq!(in_container(&format!("test -e {path} && echo there")), "");
    // sudo wants a password: without it, refused before the claim.
    let doc = json(&put("pb-none", &["--become"], ""));
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert_eq!(doc["reason_code"], "become_refused", "{doc}");
    // A put takes no other secret: nothing connects.
    let out = put(
        "pb-other",
        &["--become", "--secret", "TOKEN=env:PW"],
        password,
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("a put runs no command to give it to"),
        "{}",
        text(&out.stderr)
    );

    // With the password, under the op id refused for want of it (as the refusal
    // advises: the password is no part of the intent): written once, by root, with the
    // mode asked for.
    let with_pw = ["--become", "--secret", "SUDO_PASSWORD=env:PW"];
    let doc = json(&put("pb-none", &with_pw, password));
    assert_eq!(doc["verdict"], "completed", "{doc}");
    assert_eq!(doc["file"]["delivered"], "written", "{doc}");
    let owned = |p: &str| in_container(&format!("stat -c '%u %a' {p}"));
    assert_eq!(owned(path), "0 640");
    assert_eq!(in_container(&format!("cat {path}")), "listen 8080");
    let mtime = || in_container(&format!("stat -c %y {path}"));
    let written_at = mtime();
    // The op id replays; a new one finds the content there and writes nothing.
    let again = json(&put("pb-none", &with_pw, password));
    assert_eq!(again["verdict"], "replayed", "{again}");
    let other = json(&put("pb-ok", &with_pw, password));
    assert_eq!(other["file"]["delivered"], "unchanged", "{other}");
    assert_eq!(mtime(), written_at);
    // No temporary file is left beside it.
    assert_eq!(in_container("ls -a /etc | grep -c opmark-pb || true"), "0");

    // A tree: each file its own operation, the directories made by root.
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), b"a\n").unwrap();
    std::fs::write(tree.join("sub/b.txt"), b"b\n").unwrap();
    let out = env
        .opmark_with_lab(&lab)
        .env("PW", password)
        .args(["--json", "put", "-r"])
        .arg(&tree)
        .arg(format!("{host}:/opt/"))
        .args(["--op", "pb-tree"])
        .args(with_pw)
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["summary"]["written_count"], 2, "{doc}");
    assert_eq!(owned("/opt/tree/sub/b.txt").split(' ').next(), Some("0"));
    assert_eq!(owned("/opt/tree/sub").split(' ').next(), Some("0"));

    // sudo's password is nowhere: not here, not in the sudo user's marker root.
    let mut files = Vec::new();
    crate::redaction::files_under(&env.root, &mut files);
    for file in files {
        let bytes = text(&std::fs::read(&file).unwrap_or_default());
        assert!(!bytes.contains(password), "{}", file.display());
    }
    let markers = sudo_user_marker_bytes(&lab);
    assert!(markers.contains("become=root"), "{markers}");
    assert!(!markers.contains(password));
}
