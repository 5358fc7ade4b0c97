//! `opmark run` end to end against real sshd targets: each guarantee of docs/guarantees.md#the-guarantees.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{
    self, answer, effects, fast_loss_config, fresh_dir, lines, run_json, spawn, text, wait_for,
    Answer, Sealed,
};

/// Every attempt `run --json` reports says what the ledger (`show --json`) says about it:
/// the same attempts, the same boundaries.
fn assert_attempts_agree_with_the_ledger(env: &Sealed, a: &Answer) {
    let op = a.json["op_id"].as_str().unwrap();
    let show = env.opmark().args(["--json", "show", op]).output().unwrap();
    let doc: Value = serde_json::from_slice(&show.stdout)
        .unwrap_or_else(|e| panic!("show --json: {e}: {}", text(&show.stderr)));
    let in_ledger = |id: &str| {
        doc["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["attempt_id"] == id)
            .unwrap_or_else(|| panic!("attempt {id} is not in the ledger: {doc}"))
            .clone()
    };
    let reported = a.json["attempts"].as_array().unwrap();
    assert!(!reported.is_empty(), "{a:?}");
    for r in reported {
        let l = in_ledger(r["attempt_id"].as_str().unwrap());
        for field in ["boundary", "number", "parent", "reason"] {
            assert_eq!(
                r[field], l[field],
                "attempt {}: run --json says {field} {} but the ledger says {}",
                r["attempt_id"], r[field], l[field]
            );
        }
    }
}

#[test]
fn same_op_id_twice_completes_then_replays_with_the_same_result() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("replay");
    let fx = effects("replay");
    let cmd = format!(
        "echo ran >> {}; echo out; echo err >&2; exit 3",
        fx.display()
    );
    let first = run_json(&env, &lab, &["target1", "--op", "deploy-1", "--", &cmd]);
    assert_eq!(first.verdict(), "completed", "{first:?}");
    assert_eq!(first.exit_code(), Some(3));
    assert_eq!(first.status, 3, "the command's own status");
    assert_eq!(first.stdout(), "out\n");
    assert_eq!(first.json["stderr"], "err\n");
    assert_eq!(first.json["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(first.json["attempts"][0]["boundary"], "exit_received");
    assert_attempts_agree_with_the_ledger(&env, &first);

    let second = run_json(&env, &lab, &["target1", "--op", "deploy-1", "--", &cmd]);
    assert_eq!(second.verdict(), "replayed", "{second:?}");
    // Answered from evidence: an observation, no attempt (docs/ledger.md#observations).
    assert_eq!(second.json["attempts"], serde_json::json!([]), "{second:?}");
    assert_eq!(second.json["observations"][0]["kind"], "replay_from_ledger");
    assert_eq!(second.exit_code(), Some(3));
    assert_eq!(second.status, 3);
    assert_eq!(second.stdout(), "out\n");
    assert_eq!(lines(&fx), 1, "ran once");

    // Plain mode: output streamed like ssh, opmark's own line prefixed on stderr.
    let plain = env
        .opmark_with_lab(&lab)
        .args(["run", "target1", "--op", "deploy-1", "--", &cmd])
        .output()
        .unwrap();
    assert_eq!(text(&plain.stdout), "out\n");
    assert!(
        text(&plain.stderr).contains("opmark: replayed:"),
        "{}",
        text(&plain.stderr)
    );
    assert_eq!(plain.status.code(), Some(3));
    assert_eq!(lines(&fx), 1);
}

#[test]
fn a_command_exiting_255_is_completed_not_a_transport_failure() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("exit255");
    let a = run_json(
        &env,
        &lab,
        &["target1", "--op", "two-five-five", "--", "exit 255"],
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.exit_code(), Some(255));
    assert_eq!(a.status, 255);
}

#[test]
fn output_beyond_the_cap_is_dropped_on_the_host_and_reported() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("cap");
    let a = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "big",
            "--output-cap",
            "1k",
            "--",
            "head -c 5000 /dev/zero | tr '\\0' a",
        ],
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    // The live stream is whole; the host kept 1 KiB for replays.
    assert_eq!(a.stdout().len(), 5000);
    assert_eq!(a.json["dropped"][0], 5000 - 1024);
}

#[test]
fn a_completed_op_whose_marker_was_removed_is_not_run_again() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("marker-gone");
    let fx = effects("marker-gone");
    let cmd = format!("echo ran >> {}; exit 4", fx.display());
    let first = run_json(&env, &lab, &["target1", "--op", "gone", "--", &cmd]);
    assert_eq!(first.verdict(), "completed");
    // As a gc (or a wiped host) would leave it.
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/gone");
    std::fs::remove_dir_all(&marker).unwrap();
    let again = run_json(&env, &lab, &["target1", "--op", "gone", "--", &cmd]);
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!(again.exit_code(), Some(4));
    assert!(again.json["reason"]
        .as_str()
        .unwrap()
        .contains("marker is gone"));
    assert_eq!(
        lines(&fx),
        1,
        "the ledger's memory prevented a second execution"
    );
}

#[test]
fn a_minted_op_id_is_printed_before_dispatch() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("minted");
    let out = env
        .opmark_with_lab(&lab)
        .args(["run", "target1", "--", "true"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    let op = stderr
        .lines()
        .find_map(|l| l.strip_prefix("opmark: op "))
        .unwrap_or_else(|| panic!("no op line: {stderr}"));
    let again = run_json(&env, &lab, &["target1", "--op", op, "--", "true"]);
    assert_eq!(again.verdict(), "replayed", "{again:?}");
}

#[test]
fn thirty_two_concurrent_runs_of_one_op_execute_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("concurrent");
    let fx = effects("concurrent");
    let cmd = format!("echo ran >> {}; sleep 0.3; echo done", fx.display());
    let children: Vec<Child> = (0..32)
        .map(|_| {
            env.opmark_with_lab(&lab)
                .args([
                    "--json",
                    "run",
                    "target1",
                    "--op",
                    "contended",
                    "--wait",
                    "60s",
                    "--",
                    &cmd,
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let answers: Vec<Answer> = children
        .into_iter()
        .map(|c| answer(c.wait_with_output().unwrap()))
        .collect();
    let completed = answers
        .iter()
        .filter(|a| a.verdict() == "completed")
        .count();
    let replayed = answers.iter().filter(|a| a.verdict() == "replayed").count();
    assert_eq!(completed, 1, "{answers:#?}");
    assert_eq!(completed + replayed, 32, "{answers:#?}");
    for a in &answers {
        assert_eq!(a.exit_code(), Some(0), "{a:?}");
        assert_eq!(a.stdout(), "done\n", "{a:?}");
    }
    assert_eq!(lines(&fx), 1);
}

#[test]
fn a_client_killed_at_any_boundary_then_rerun_executes_once_with_the_true_status() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    for point in [
        "before_dispatch",
        "after_dispatch",
        "after_started",
        "after_exit",
    ] {
        let env = Sealed::new(&format!("kill-{point}"));
        let fx = effects(&format!("kill-{point}"));
        let cmd = format!("echo ran >> {}; sleep 0.5; echo out; exit 7", fx.display());
        let op = format!("crash-{point}");
        let crashed = env
            .opmark_with_lab(&lab)
            .env("OPMARK_FAULT", point)
            .args(["--json", "run", "target1", "--op", &op, "--", &cmd])
            .output()
            .unwrap();
        assert_eq!(crashed.status.code(), None, "{point}: killed by a signal");
        let rerun = run_json(&env, &lab, &["target1", "--op", &op, "--", &cmd]);
        assert!(
            matches!(rerun.verdict(), "completed" | "replayed"),
            "{point}: {rerun:?}"
        );
        assert_eq!(rerun.exit_code(), Some(7), "{point}: {rerun:?}");
        assert_eq!(rerun.stdout(), "out\n", "{point}");
        assert_eq!(lines(&fx), 1, "{point}: exactly one execution");
        match point {
            "before_dispatch" => {
                assert_eq!(
                    rerun.verdict(),
                    "completed",
                    "nothing had left: the rerun ran it"
                )
            }
            // The request left, but the shim may have died with the connection before
            // claiming: either way, one execution.
            "after_dispatch" => {}
            _ => assert_eq!(
                rerun.verdict(),
                "replayed",
                "{point}: the crashed client's attempt ran it"
            ),
        }
        let reasons: Vec<&str> = rerun.json["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["reason"].as_str().unwrap())
            .collect();
        match point {
            // The ledger cannot tell whether the crashed request reached the host: the
            // rerun's claim is an attempt, and it names the crashed one.
            "before_dispatch" | "after_dispatch" => assert_eq!(
                reasons,
                ["caller_rerun"],
                "{point}: the rerun names the crashed attempt"
            ),
            // The ledger saw the claim: the rerun looks first, and a replay or a follow
            // is an observation, not an attempt (docs/ledger.md#observations).
            _ => {
                assert!(reasons.is_empty(), "{point}: {rerun:?}");
                let kind = rerun.json["observations"][0]["kind"].as_str();
                assert!(
                    matches!(
                        kind,
                        Some("follow" | "replay_from_host" | "replay_from_ledger")
                    ),
                    "{point}: {rerun:?}"
                );
            }
        }
    }
}

#[test]
fn a_link_cut_mid_command_and_restored_reattaches_without_losing_or_repeating_output() {
    let Some(lab) = support::netns_lab(1) else {
        return;
    };
    let env = Sealed::new("cut-restore");
    let dir = fresh_dir("cut-restore");
    let cfg = fast_loss_config(&lab, &dir);
    let target = lab.target("target1").unwrap();
    let marker = target.marker_root().join("ops").join("cut-1");
    // Events, not durations, order this test: the command waits for a gate the test opens
    // only once a probe after the restore has found it running, and the link stays cut
    // until the client itself has reported the loss, however late its keepalives fire.
    let gate = dir.join("gate");
    let cmd = format!(
        "echo first; while [ ! -e {} ]; do sleep 0.05; done; echo second; exit 6",
        gate.display()
    );
    let mut child = spawn(
        env.opmark().arg("-F").arg(&cfg),
        &[
            "--json", "run", "target1", "--op", "cut-1", "--wait", "60s", "--", &cmd,
        ],
    );
    let mut progress = support::StderrLines::of(&mut child);
    wait_for("the command to start", Duration::from_secs(20), || {
        std::fs::read(marker.join("out")).is_ok_and(|o| o == b"first\n")
    });
    lab.cut("target1").unwrap();
    progress.wait_for("lost after dispatch", Duration::from_secs(60));
    lab.restore("target1").unwrap();
    wait_for(
        "a probe that finds it running",
        Duration::from_secs(60),
        || observed(&env, "cut-1", "marker running"),
    );
    std::fs::write(&gate, "").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = progress.all();
    let a = answer(Output {
        stderr: stderr.into_bytes(),
        ..out
    });
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.exit_code(), Some(6), "{a:?}");
    assert_eq!(a.stdout(), "first\nsecond\n", "every byte once: {a:?}");
}

/// True when the ledger holds an observation of `op` that found `what`.
fn observed(env: &Sealed, op: &str, what: &str) -> bool {
    let out = env.opmark().args(["--json", "show", op]).output().unwrap();
    serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|doc| {
        doc["observations"].as_array().is_some_and(|obs| {
            obs.iter()
                .any(|o| o["found"].as_str().is_some_and(|f| f.contains(what)))
        })
    })
}

#[test]
fn a_link_cut_and_not_restored_is_indeterminate_while_the_command_completes_on_the_host() {
    let Some(lab) = support::netns_lab(1) else {
        return;
    };
    let env = Sealed::new("cut-stays");
    let dir = fresh_dir("cut-stays");
    let cfg = fast_loss_config(&lab, &dir);
    let target = lab.target("target1").unwrap();
    let marker = target.marker_root().join("ops").join("cut-2");
    // The command ends only when the test says so, after the client has answered: a
    // cut that comes late on a busy machine cannot let its exit status through.
    let gate = dir.join("gate");
    let cmd = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 4",
        gate.display()
    );
    let child = spawn(
        env.opmark().arg("-F").arg(&cfg),
        &[
            "--json", "run", "target1", "--op", "cut-2", "--wait", "3s", "--", &cmd,
        ],
    );
    wait_for("the command to start", Duration::from_secs(20), || {
        marker.join("started").exists()
    });
    lab.cut("target1").unwrap();
    let a = answer(child.wait_with_output().unwrap());
    assert_eq!(a.verdict(), "indeterminate", "{a:?}");
    assert_eq!(a.exit_code(), None, "unknown is not zero");
    assert_eq!(a.status, 242);
    std::fs::write(&gate, "").unwrap();
    wait_for(
        "the exit record on the host",
        Duration::from_secs(20),
        || marker.join("exit").exists(),
    );
    let record = std::fs::read_to_string(marker.join("exit")).unwrap();
    assert!(record.contains("code=4"), "{record}");
    lab.restore("target1").unwrap();
}

/// Kills the detached supervisor's process group of `op` on a loopback target.
fn kill_supervisor(lab: &Lab, op: &str) {
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops")
        .join(op);
    wait_for("the supervisor record", Duration::from_secs(20), || {
        marker.join("started").exists() && marker.join("proc").exists()
    });
    let proc = std::fs::read_to_string(marker.join("proc")).unwrap();
    let pid = proc
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .unwrap()
        .to_owned();
    let status = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn an_interrupted_append_only_op_is_indeterminate_until_approved_then_runs_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("interrupted-append");
    let fx = effects("interrupted-append");
    let gate = fx.with_extension("gate");
    // The first execution sleeps until killed; the approved re-run finds the gate open.
    let cmd = format!(
        "echo ran >> {fx}; test -e {gate} || sleep 60; echo finished",
        fx = fx.display(),
        gate = gate.display()
    );
    let child = spawn(
        &mut env.opmark_with_lab(&lab),
        &[
            "--json",
            "run",
            "target1",
            "--op",
            "append-1",
            "--class",
            "append-only",
            "--",
            &cmd,
        ],
    );
    wait_for("the first execution", Duration::from_secs(20), || {
        lines(&fx) == 1
    });
    kill_supervisor(&lab, "append-1");
    let a = answer(child.wait_with_output().unwrap());
    assert_eq!(a.verdict(), "indeterminate", "{a:?}");
    assert!(
        a.json["reason"].as_str().unwrap().contains("--approve"),
        "{a:?}"
    );
    assert_eq!(lines(&fx), 1);
    // It started, then was interrupted: never "not_sent".
    assert_eq!(a.json["attempts"][0]["boundary"], "started", "{a:?}");
    assert_attempts_agree_with_the_ledger(&env, &a);

    let again = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "append-1",
            "--class",
            "append-only",
            "--",
            &cmd,
        ],
    );
    assert_eq!(
        again.verdict(),
        "indeterminate",
        "no re-run without approval: {again:?}"
    );
    assert_eq!(lines(&fx), 1);
    // The ledger saw the claim: the rerun probed first and sent no claim, so it made no
    // attempt; what it found is an observation.
    assert_eq!(again.json["attempts"], serde_json::json!([]), "{again:?}");
    assert_eq!(again.json["observations"][0]["kind"], "probe", "{again:?}");

    std::fs::write(&gate, "").unwrap();
    let approved = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "append-1",
            "--class",
            "append-only",
            "--approve",
            "checked: the first run died",
            "--",
            &cmd,
        ],
    );
    assert_eq!(approved.verdict(), "completed", "{approved:?}");
    assert_eq!(approved.stdout(), "finished\n");
    assert_eq!(lines(&fx), 2, "exactly one more execution");
    assert_attempts_agree_with_the_ledger(&env, &approved);
    let reasons: Vec<&str> = approved.json["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["reason"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"operator_approved"), "{reasons:?}");

    let after = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "append-1",
            "--class",
            "append-only",
            "--",
            &cmd,
        ],
    );
    assert_eq!(after.verdict(), "replayed", "{after:?}");
    assert_eq!(lines(&fx), 2);
}

#[test]
fn an_interrupted_convergent_op_is_rerun_automatically_and_recorded() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("interrupted-convergent");
    let fx = effects("interrupted-convergent");
    let gate = fx.parent().unwrap().join("gate");
    // One file per execution (`touch` is convergent; `>>` would be append-only).
    let cmd = format!(
        "touch {fx}.$$; test -e {gate} || sleep 60",
        fx = fx.display(),
        gate = gate.display()
    );
    let executions = || {
        std::fs::read_dir(fx.parent().unwrap())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("effects.")
            })
            .count()
    };
    let child = spawn(
        &mut env.opmark_with_lab(&lab),
        &[
            "--json",
            "run",
            "target1",
            "--op",
            "conv-1",
            "--class",
            "convergent",
            "--",
            &cmd,
        ],
    );
    wait_for("the first execution", Duration::from_secs(20), || {
        executions() == 1
    });
    // Open the gate so the automatic re-run ends quickly, then kill the first one.
    std::fs::write(&gate, "").unwrap();
    kill_supervisor(&lab, "conv-1");
    let a = answer(child.wait_with_output().unwrap());
    assert_eq!(
        executions(),
        2,
        "the interrupted run and exactly one re-run"
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    let attempts = a.json["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{a:?}");
    assert_eq!(attempts[1]["reason"], "interrupted_rerun");
    assert_eq!(attempts[1]["parent"], attempts[0]["attempt_id"]);
    // The superseded attempt had started the command before it was interrupted.
    assert_eq!(attempts[0]["boundary"], "started", "{a:?}");
    assert_eq!(attempts[1]["boundary"], "exit_received", "{a:?}");
    assert_attempts_agree_with_the_ledger(&env, &a);
    let show = env.opmark().args(["show", "conv-1"]).output().unwrap();
    assert!(
        text(&show.stdout).contains("interrupted_rerun"),
        "{}",
        text(&show.stdout)
    );
}

#[test]
fn conflicts_denied_commands_and_unknown_host_keys_run_nothing() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("nothing-runs");
    let fx = effects("nothing-runs");
    let first = run_json(&env, &lab, &["target1", "--op", "bound", "--", "true"]);
    assert_eq!(first.verdict(), "completed");
    assert_eq!(first.code(), ("command_exited", false));

    // The ledger knows the op id means `true`: another command under it is a conflict.
    let touch = format!("echo ran >> {}", fx.display());
    let ledger_conflict = run_json(&env, &lab, &["target1", "--op", "bound", "--", &touch]);
    assert_eq!(ledger_conflict.verdict(), "conflict", "{ledger_conflict:?}");
    assert_eq!(ledger_conflict.status, 243);
    assert_eq!(ledger_conflict.code(), ("conflict_in_ledger", false));

    // A fresh ledger (another client) only learns it from the host marker.
    let other = Sealed::new("nothing-runs-other");
    let host_conflict = run_json(&other, &lab, &["target1", "--op", "bound", "--", &touch]);
    assert_eq!(host_conflict.verdict(), "conflict", "{host_conflict:?}");
    assert_eq!(host_conflict.code(), ("conflict_on_host", false));

    let denied = run_json(&env, &lab, &["target1", "--op", "wipe", "--", "rm -rf /"]);
    assert_eq!(denied.verdict(), "refused", "{denied:?}");
    assert_eq!(denied.status, 245);
    assert_eq!(denied.code(), ("policy_denied", false));

    let blocked = run_json(
        &env,
        &lab,
        &["target1", "--op", "format", "--", "mkfs.ext4 /dev/vdz"],
    );
    assert_eq!(blocked.verdict(), "blocked", "{blocked:?}");
    assert_eq!(blocked.status, 244);
    assert_eq!(blocked.code(), ("approval_required", false));

    // A known_hosts that does not know the target: not_applied, nothing sent.
    let dir = fresh_dir("nothing-runs-keys");
    let empty_known = dir.join("known_hosts");
    std::fs::write(&empty_known, "").unwrap();
    let cfg = dir.join("ssh_config");
    std::fs::write(
        &cfg,
        format!(
            "UserKnownHostsFile {}\nInclude {}\n",
            empty_known.display(),
            lab.ssh_config().display()
        ),
    )
    .unwrap();
    let unknown_key = answer(
        env.opmark()
            .arg("-F")
            .arg(&cfg)
            .args([
                "--json",
                "run",
                "target1",
                "--op",
                "unknown-key",
                "--",
                &touch,
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(unknown_key.verdict(), "not_applied", "{unknown_key:?}");
    assert!(
        unknown_key.json["reason"]
            .as_str()
            .unwrap()
            .contains("host key"),
        "{unknown_key:?}"
    );
    assert_eq!(unknown_key.json["attempts"][0]["boundary"], "not_sent");
    // An unknown host key will not change by retrying: an agent must not loop on it.
    assert_eq!(unknown_key.code(), ("host_key_rejected", false));

    let bad_id = run_json(&env, &lab, &["target1", "--op", "../etc", "--", &touch]);
    assert_eq!(bad_id.verdict(), "refused");
    assert_eq!(bad_id.code(), ("invalid_input", false));
    assert_eq!(lines(&fx), 0, "nothing ran anywhere");
    assert!(!lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/unknown-key")
        .exists());
}

#[test]
fn stdin_is_forwarded_only_when_asked_and_is_part_of_the_intent() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("stdin");
    let run_with_input = |op: &str, input: &[u8]| {
        let mut child = env
            .opmark_with_lab(&lab)
            .args([
                "--json", "run", "target1", "--op", op, "--stdin", "--", "wc -c",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input).unwrap();
        answer(child.wait_with_output().unwrap())
    };
    let a = run_with_input("in-1", &vec![b'x'; 100_000]);
    assert_eq!(a.stdout().trim(), "100000", "{a:?}");
    let conflict = run_with_input("in-1", b"different input");
    assert_eq!(conflict.verdict(), "conflict", "{conflict:?}");
    let without = run_json(&env, &lab, &["target1", "--op", "in-2", "--", "wc -c"]);
    assert_eq!(without.stdout().trim(), "0");
}

/// Two callers of one op id on one ledger at once: the first cannot reach the host (a
/// server that accepts and never speaks, until its ConnectTimeout), the second runs the
/// command meanwhile. The first must not answer `not_applied`: the ledger it answers from
/// holds the second's attempt by then (found by the fault-history checker, seed 2 on
/// busybox + dropbear).
#[test]
fn a_caller_that_cannot_connect_while_another_runs_the_op_is_not_told_nothing_ran() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = dir.join("ssh_config-silent");
    std::fs::write(
        &cfg,
        format!(
            "Host target1\n  HostName 127.0.0.1\n  Port {}\n  ConnectTimeout 3\nHost *\n  Include {}\n",
            silent.local_addr().unwrap().port(),
            lab.ssh_config().display()
        ),
    )
    .unwrap();
    let ran = effects(crate::test_name!());
    let cmd = format!("echo ran >> {}; exit 4", ran.display());
    let stalled = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            "two-callers",
            "--wait",
            "3s",
            "--",
        ])
        .arg(&cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The stalled caller has recorded its intent and attempt before it connects.
    wait_for(
        "the first caller's attempt",
        Duration::from_secs(10),
        || {
            let out = env
                .opmark()
                .args(["--json", "show", "two-callers"])
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout)
                .is_ok_and(|d| d["events"].as_array().is_some_and(|e| e.len() >= 3))
        },
    );
    let other = run_json(&env, &lab, &["target1", "--op", "two-callers", "--", &cmd]);
    assert_eq!(
        (other.verdict(), other.exit_code()),
        ("completed", Some(4)),
        "{other:?}"
    );
    let first = answer(stalled.wait_with_output().unwrap());
    assert_eq!(lines(&ran), 1, "the command ran once");
    assert_ne!(
        first.verdict(),
        "not_applied",
        "the other caller's attempt ran the command: {first:?}"
    );
    assert_eq!(first.exit_code(), None, "{first:?}");
    drop(silent);
}
