//! Host locks (docs/host-protocol.md#host-locks) against real sshd targets: commands of
//! clients with ledgers of their own, holding one lock, never run at once (the commands
//! record their own intervals); a lock of two slots runs exactly two at once; a lock not
//! free in time answers `lock_busy` naming its holder, ran nothing, and a rerun under the
//! same op id runs once; a client killed keeps its command's lock until the command ends;
//! a holder whose session is killed (a crash) frees it.

use std::path::Path;
use std::time::Duration;

use crate::support::{
    self, fresh_dir, lines, most_at_once, probe_state, run_json, spawn_run, uptime_intervals,
    Answer, Sealed,
};

/// A command that records, from the host's `/proc/uptime`, when it started and ended
/// ("START END" in hundredths of a second, appended to `log`), holding for `hold`.
fn timed(log: &Path, hold: &str, tag: &str) -> String {
    format!(
        "read a _ </proc/uptime; sleep {hold}; read b _ </proc/uptime; echo \"$a $b\" >>{}; : {tag}",
        log.display()
    )
}

/// `clients` ledgers at once, each running `runs` [`timed`] commands one after another
/// under `--lock LOCK --lock-wait 120s`; every verdict must be `completed`.
fn contend(
    lab: &opmark::lab::Lab,
    lock: &str,
    clients: usize,
    runs: usize,
    hold: &str,
) -> Vec<(u64, u64)> {
    let tag = lock.replace(':', "-");
    let log = fresh_dir(&format!("{}-{tag}", crate::test_name!())).join("held");
    std::thread::scope(|s| {
        for c in 0..clients {
            let (log, tag) = (&log, &tag);
            s.spawn(move || {
                let env = Sealed::new(&format!("locks-{tag}-{c}"));
                for r in 0..runs {
                    let op = format!("lk-{c}-{r}");
                    let cmd = timed(log, hold, &op);
                    let done = run_json(
                        &env,
                        lab,
                        &[
                            "target1",
                            "--op",
                            &op,
                            "--lock",
                            lock,
                            "--lock-wait",
                            "120s",
                            "--",
                            &cmd,
                        ],
                    );
                    assert_eq!(done.verdict(), "completed", "{op}: {done:?}");
                }
            });
        }
    });
    let held = uptime_intervals(&log);
    assert_eq!(held.len(), clients * runs, "every command ran once");
    held
}

#[test]
fn two_clients_with_ledgers_of_their_own_never_run_commands_holding_one_lock_at_once() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let held = contend(&lab, "apt", 2, 10, "0.2");
    assert_eq!(most_at_once(&held), 1, "{held:?}");
}

#[test]
fn a_lock_of_two_slots_runs_exactly_two_commands_at_once() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let held = contend(&lab, "pool:2", 3, 4, "0.6");
    assert_eq!(most_at_once(&held), 2, "{held:?}");
}

#[test]
fn a_lock_not_free_in_time_is_lock_busy_naming_its_holder_and_the_rerun_runs_once() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (started, done, count) = (dir.join("started"), dir.join("done"), dir.join("count"));
    let holder_env = Sealed::new(&format!("{}-holder", crate::test_name!()));
    let holder_cmd = format!(
        "touch {}; sleep 8; touch {}",
        started.display(),
        done.display()
    );
    let holder = spawn_run(
        &mut holder_env.opmark_with_lab(&lab),
        &[
            "target1",
            "--op",
            "lb-hold",
            "--lock",
            "apt",
            "--",
            &holder_cmd,
        ],
    );
    support::wait_for("the holder's command", Duration::from_secs(30), || {
        started.exists()
    });

    let env = Sealed::new(crate::test_name!());
    // Any client sees who holds it, whatever ledger ran the holder.
    let listed = support::json(
        &env.opmark_with_lab(&lab)
            .args(["--json", "locks", "target1"])
            .output()
            .unwrap(),
    );
    let held = &listed["held"][0];
    assert_eq!(
        (&held["lock"], &held["op_id"], &held["alive"], &held["slot"]),
        (&"apt".into(), &"lb-hold".into(), &true.into(), &1.into()),
        "{listed}"
    );
    assert_eq!(listed["waiting"], serde_json::json!([]), "{listed}");
    let cmd = format!("echo ran >>{}", count.display());
    let args = [
        "target1",
        "--op",
        "lb-wait",
        "--lock",
        "apt",
        "--lock-wait",
        "1s",
        "--",
        &cmd,
    ];
    let busy = run_json(&env, &lab, &args);
    assert_eq!(busy.verdict(), "not_applied", "{busy:?}");
    assert_eq!(busy.code(), ("lock_busy", true), "{busy:?}");
    let reason = busy.json["reason"].as_str().unwrap();
    // The holder by op id, command (its first 160 bytes: the path may cut it) and since when.
    assert!(
        reason.contains("`apt`")
            && reason.contains("op lb-hold (`touch ")
            && reason.contains("`) since"),
        "{reason}"
    );
    // Answered while the holder still ran, and nothing of it ran.
    assert!(!done.exists(), "waited for the holder's end: {busy:?}");
    assert_eq!(lines(&count), 0);
    assert_eq!(
        probe_state(&env, &lab, "lb-wait"),
        "absent",
        "the claim was taken back"
    );

    let rerun = run_json(
        &env,
        &lab,
        &[&args[..5], &["--lock-wait", "60s", "--", cmd.as_str()]].concat(),
    );
    assert_eq!(rerun.verdict(), "completed", "{rerun:?}");
    assert!(done.exists(), "ran only once the holder had ended");
    assert_eq!(lines(&count), 1);
    // The locks are kept with the intent, and are not part of it: the same command
    // without them is the same operation, replayed.
    let shown = support::show(&env, "lb-wait");
    let words = shown.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("holds host locks apt"), "{shown}");
    let again = run_json(&env, &lab, &["target1", "--op", "lb-wait", "--", &cmd]);
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!(lines(&count), 1);
    let held = support::answer(holder.wait_with_output().unwrap());
    assert_eq!(held.verdict(), "completed", "{held:?}");
}

#[test]
fn a_lock_holders_command_holding_a_secret_is_named_redacted_in_the_answer_json_show_and_ledger() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (started, done) = (dir.join("started"), dir.join("done"));
    // Another agent's command, holding a GitHub token the shipped policy's `redact` masks.
    let token = format!("ghp_CanaryLockHolder{}", "a".repeat(24));
    let holder_env = Sealed::new(&format!("{}-holder", crate::test_name!()));
    let holder_cmd = format!(
        ": {token}; touch {}; sleep 8; touch {}",
        started.display(),
        done.display()
    );
    let holder = spawn_run(
        &mut holder_env.opmark_with_lab(&lab),
        &[
            "target1",
            "--op",
            "lbs-hold",
            "--lock",
            "apt",
            "--",
            &holder_cmd,
        ],
    );
    support::wait_for("the holder's command", Duration::from_secs(30), || {
        started.exists()
    });

    let env = Sealed::new(crate::test_name!());
    let busy = run_json(
        &env,
        &lab,
        &["target1", "--op", "lbs-wait", "--lock", "apt", "--", "true"],
    );
    assert_eq!(busy.code(), ("lock_busy", true), "{busy:?}");
    let reason = busy.json["reason"].as_str().unwrap();
    assert!(
        reason.contains("held by op lbs-hold (`: ghp_***; touch "),
        "the holder's command, redacted: {reason}"
    );
    assert!(!done.exists(), "answered while the holder ran");
    let json = busy.json.to_string();
    assert!(!support::contains_canary(json.as_bytes()), "{json}");
    let shown = support::show(&env, "lbs-wait");
    assert!(shown.contains("ghp_***"), "{shown}");
    assert!(!support::contains_canary(shown.as_bytes()), "{shown}");
    let shown = support::show_json(&env, "lbs-wait").to_string();
    assert!(!support::contains_canary(shown.as_bytes()), "{shown}");
    // `opmark locks` names the holder's command the same way, in text and in JSON.
    let listed = env
        .opmark_with_lab(&lab)
        .args(["--json", "locks", "target1"])
        .output()
        .unwrap();
    let listed_json = support::json(&listed);
    let command = listed_json["held"][0]["command"]
        .as_str()
        .unwrap_or_default();
    assert!(
        command.starts_with(": ghp_***; touch "),
        "the holder's command, redacted: {listed_json}"
    );
    assert!(!support::contains_canary(&listed.stdout), "{listed_json}");
    let text = env
        .opmark_with_lab(&lab)
        .args(["locks", "target1"])
        .output()
        .unwrap();
    let text_out = String::from_utf8_lossy(&text.stdout);
    assert!(
        text_out.contains("held by lbs-hold (`: ghp_***; touch "),
        "{text_out}"
    );
    assert!(!support::contains_canary(&text.stdout), "{text_out}");
    let mut files = Vec::new();
    crate::redaction::files_under(&env.root, &mut files);
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !support::contains_canary(&bytes),
            "{} holds the token",
            file.display()
        );
    }
    let held = support::answer(holder.wait_with_output().unwrap());
    assert_eq!(held.verdict(), "completed", "{held:?}");
}

#[test]
fn a_killed_client_keeps_its_commands_lock_until_the_command_ends() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (log, started) = (dir.join("held"), dir.join("started"));
    let first = Sealed::new(&format!("{}-first", crate::test_name!()));
    let cmd = format!("touch {}; {}", started.display(), timed(&log, "6", "first"));
    let mut client = spawn_run(
        &mut first.opmark_with_lab(&lab),
        &["target1", "--op", "kc-1", "--lock", "apt", "--", &cmd],
    );
    support::wait_for("the first command", Duration::from_secs(30), || {
        started.exists()
    });
    client.kill().unwrap();
    client.wait().unwrap();

    let second = Sealed::new(crate::test_name!());
    // A run waiting for the lock is listed as waiting while the first still holds it.
    let waiter = second
        .opmark_with_lab(&lab)
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            "kc-2",
            "--lock",
            "apt",
            "--lock-wait",
            "60s",
            "--",
        ])
        .arg(timed(&log, "0", "second"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for("kc-2 listed as waiting", Duration::from_secs(20), || {
        let listed = support::json(
            &second
                .opmark_with_lab(&lab)
                .args(["--json", "locks", "target1"])
                .output()
                .unwrap(),
        );
        listed["waiting"][0]["op_id"] == "kc-2"
            && listed["waiting"][0]["locks"] == serde_json::json!(["apt"])
            && listed["held"][0]["op_id"] == "kc-1"
    });
    let after = support::answer(waiter.wait_with_output().unwrap());
    assert_eq!(after.verdict(), "completed", "{after:?}");
    let held = uptime_intervals(&log);
    assert_eq!(held.len(), 2, "{held:?}");
    assert_eq!(
        most_at_once(&held),
        1,
        "the second ran while the first held: {held:?}"
    );
}

#[test]
fn a_holder_whose_session_is_killed_frees_the_lock_for_the_next_claim() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (started, count) = (dir.join("started"), dir.join("count"));
    let first = Sealed::new(&format!("{}-first", crate::test_name!()));
    let cmd = format!("touch {}; sleep 120", started.display());
    let mut client = spawn_run(
        &mut first.opmark_with_lab(&lab),
        &["target1", "--op", "crash-1", "--lock", "apt", "--", &cmd],
    );
    support::wait_for("the first command", Duration::from_secs(30), || {
        started.exists()
    });
    // Its client goes first: left alone, it would see its command vanish and, its family
    // allowing, claim the op id again, lock and all.
    client.kill().unwrap();
    client.wait().unwrap();
    // A host crash, as far as the lock can tell: the supervisor's whole session dies.
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/crash-1/proc");
    let sid = std::fs::read_to_string(&marker)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("pid=").map(str::to_owned))
        .unwrap();
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-s", &sid])
        .status()
        .unwrap();
    assert!(killed.success(), "no process in session {sid}");

    let second = Sealed::new(crate::test_name!());
    let next = run_json(
        &second,
        &lab,
        &[
            "target1",
            "--op",
            "crash-2",
            "--lock",
            "apt",
            "--lock-wait",
            "30s",
            "--",
            &format!("echo ran >>{}", count.display()),
        ],
    );
    assert_eq!(next.verdict(), "completed", "{next:?}");
    assert_eq!(lines(&count), 1);
}

#[test]
fn a_lock_named_with_another_capacity_than_the_hosts_is_refused_naming_it() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = fresh_dir(crate::test_name!()).join("count");
    let cmd = |tag: &str| format!("echo {tag} >>{}", count.display());
    let first = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "cap-1",
            "--lock",
            "db",
            "--",
            &cmd("one"),
        ],
    );
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let other = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "cap-2",
            "--lock",
            "db:3",
            "--",
            &cmd("two"),
        ],
    );
    assert_eq!(other.verdict(), "refused", "{other:?}");
    assert_eq!(other.code(), ("invalid_input", false));
    assert!(
        other.json["reason"]
            .as_str()
            .unwrap()
            .contains("--lock db:1"),
        "{other:?}"
    );
    assert_eq!(lines(&count), 1, "the second never ran");
}

#[test]
fn bad_locks_are_refused_before_anything_is_sent() {
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark()
        .args(["run", "nowhere.invalid", "--lock", "a/b", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = support::text(&out.stderr);
    assert!(
        said.contains("lock `a/b`") && said.contains("e.g. `apt`"),
        "{said}"
    );
    let twice: Answer = support::answer(
        env.opmark()
            .args([
                "--json",
                "run",
                "nowhere.invalid",
                "--op",
                "tw-1",
                "--lock",
                "apt",
                "--lock",
                "apt:2",
                "--",
                "true",
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(twice.verdict(), "refused", "{twice:?}");
    assert!(
        twice.json["reason"]
            .as_str()
            .unwrap()
            .contains("`apt` is named twice"),
        "{twice:?}"
    );
}

#[test]
fn a_lock_the_policy_names_for_a_command_is_taken_without_any_flag() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (started, marker) = (dir.join("started"), dir.join("deploy-marker"));
    // The shipped policy, with a rule (pattern rules are tried first) that gives this
    // command the lock `web`.
    let policy = dir.join("command-classes.toml");
    std::fs::write(
        &policy,
        format!(
            "{}\n[[rule]]\nname = \"web-deploy\"\nfamily = \"convergent\"\npattern = '^touch \\S*deploy-marker'\nlocks = [\"web\"]\n",
            opmark::policy::BUILTIN_TEXT
        ),
    )
    .unwrap();
    let holder_env = Sealed::new(&format!("{}-holder", crate::test_name!()));
    let holder_cmd = format!("touch {}; sleep 8", started.display());
    let holder = spawn_run(
        &mut holder_env.opmark_with_lab(&lab),
        &[
            "target1",
            "--op",
            "web-hold",
            "--lock",
            "web",
            "--",
            &holder_cmd,
        ],
    );
    support::wait_for("the holder's command", Duration::from_secs(30), || {
        started.exists()
    });
    let env = Sealed::new(crate::test_name!());
    let deploy = format!("touch {}", marker.display());
    let busy = support::answer(
        env.opmark_with_lab(&lab)
            .arg("--policy")
            .arg(&policy)
            .args(["--json", "run", "target1", "--op", "web-1", "--", &deploy])
            .output()
            .unwrap(),
    );
    assert_eq!(busy.code(), ("lock_busy", true), "{busy:?}");
    assert!(!marker.exists(), "nothing ran");
    // Words, not lines: `show` wraps to the terminal's width.
    let shown = support::show(&env, "web-1");
    let words = shown.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("holds host locks web"), "{shown}");
    let held = support::answer(holder.wait_with_output().unwrap());
    assert_eq!(held.verdict(), "completed", "{held:?}");
}

#[test]
fn mcp_run_takes_locks_and_lock_wait_and_names_a_bad_lock() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (started, count) = (dir.join("started"), dir.join("count"));
    let holder_env = Sealed::new(&format!("{}-holder", crate::test_name!()));
    let holder = spawn_run(
        &mut holder_env.opmark_with_lab(&lab),
        &[
            "target1",
            "--op",
            "mcp-hold",
            "--lock",
            "apt",
            "--",
            &format!("touch {}; sleep 8", started.display()),
        ],
    );
    support::wait_for("the holder's command", Duration::from_secs(30), || {
        started.exists()
    });
    let env = Sealed::new(crate::test_name!());
    let mut server = env.opmark_with_lab(&lab);
    server.arg("mcp");
    let mut client = crate::support::mcp::McpClient::start(server);
    let cmd = format!("echo ran >>{}", count.display());
    let bad = client.structured(
        "run",
        serde_json::json!({"host": "target1", "op_id": "mcp-bad", "command": cmd, "locks": ["a/b"]}),
    );
    assert_eq!(bad["error"]["field"], "locks", "{bad}");
    let busy = client.structured(
        "run",
        serde_json::json!({"host": "target1", "op_id": "mcp-1", "command": cmd,
            "locks": ["apt"], "lock_wait": "1s"}),
    );
    assert_eq!(
        (&busy["verdict"], &busy["reason_code"], &busy["retryable"]),
        (&"not_applied".into(), &"lock_busy".into(), &true.into()),
        "{busy}"
    );
    assert!(
        busy["reason"].as_str().unwrap().contains("op mcp-hold"),
        "{busy}"
    );
    assert_eq!(lines(&count), 0, "nothing ran");
    client.close();
    let held = support::answer(holder.wait_with_output().unwrap());
    assert_eq!(held.verdict(), "completed", "{held:?}");
}

/// The wait for a lock happens on the host, inside the claim: a link cut while a run
/// waits is settled by the probe like any other loss, and the command runs once.
#[test]
fn a_link_cut_while_a_run_waits_for_its_lock_is_settled_by_the_probe_and_it_runs_once() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let (gate, count) = (dir.join("gate"), dir.join("count"));
    let ops = lab.target("target1").unwrap().marker_root().join("ops");
    let holder_env = Sealed::new(&format!("{}-holder", crate::test_name!()));
    let holder = spawn_run(
        &mut holder_env.opmark_with_lab(&lab),
        &[
            "target1",
            "--op",
            "cw-hold",
            "--lock",
            "apt",
            "--",
            &format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display()),
        ],
    );
    support::wait_for("the holder's start", Duration::from_secs(30), || {
        ops.join("cw-hold/started").exists()
    });
    let env = Sealed::new(crate::test_name!());
    let cfg = support::fast_loss_config(&lab, &dir);
    let mut waiter = spawn_run(
        env.opmark().arg("-F").arg(&cfg),
        &[
            "target1",
            "--op",
            "cw-1",
            "--lock",
            "apt",
            "--lock-wait",
            "120s",
            "--",
            &format!("echo ran >>{}", count.display()),
        ],
    );
    let mut said = support::StderrLines::of(&mut waiter);
    // Claimed, its supervisor up and waiting for the lock.
    support::wait_for("cw-1 to wait on the host", Duration::from_secs(30), || {
        ops.join("cw-1/proc").exists()
    });
    lab.cut("target1").unwrap();
    // The client notices the silence and probes; meanwhile the holder ends and the
    // waiter's command runs on the host.
    said.wait_for("lost after dispatch", Duration::from_secs(30));
    std::fs::write(&gate, "").unwrap();
    support::wait_for(
        "cw-1's command on the host",
        Duration::from_secs(30),
        || lines(&count) == 1,
    );
    lab.restore("target1").unwrap();
    let out = support::finish_within(waiter, Duration::from_secs(90), "run after the restore");
    let after = support::answer(std::process::Output {
        stderr: said.all().into_bytes(),
        ..out
    });
    assert_eq!(after.verdict(), "completed", "{after:?}");
    assert_eq!(after.exit_code(), Some(0), "{after:?}");
    assert_eq!(lines(&count), 1, "ran once");
    // The holder's own client lost the link too; whatever it said, its command ended.
    let _ = holder.wait_with_output();
    assert!(ops.join("cw-hold/exit").exists());
}
