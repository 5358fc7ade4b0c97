//! Observations and approvals end to end against real sshd targets (docs/ledger.md#observations,
//! docs/decisions.md#approvals): a rerun answered from evidence (a replay from the ledger or
//! the host, a follow of a running command) is an observation, never an attempt, and an
//! approval is asked for only when something may run.

use std::path::Path;

use serde_json::Value;

use crate::support::{
    self, answer, effects, fresh_dir, json, lines, listed, run_json, show_json, text, Sealed,
};

fn show_text(env: &Sealed, op: &str) -> String {
    let out = env.opmark().args(["show", op]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

fn stats(env: &Sealed) -> Value {
    json(&env.opmark().args(["--json", "stats"]).output().unwrap())
}

/// Attempts that retried an earlier one (a parent, or a number past 1).
fn retries(attempts: &Value) -> usize {
    attempts
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !a["parent"].is_null() || a["number"].as_u64() != Some(1))
        .count()
}

/// The operation as `show --json` and `list --json` count it: (attempts, observations).
fn counts(env: &Sealed, op: &str) -> (u64, u64) {
    let shown = show_json(env, op);
    let l = listed(env, op);
    let pair = |o: &Value| {
        (
            o["attempt_count"].as_u64().unwrap(),
            o["observation_count"].as_u64().unwrap(),
        )
    };
    assert_eq!(
        pair(&shown["operation"]),
        pair(&l),
        "show and list agree: {shown}"
    );
    assert_eq!(
        shown["attempts"].as_array().unwrap().len() as u64,
        pair(&l).0,
        "{shown}"
    );
    assert_eq!(retries(&shown["attempts"]), 0, "{shown}");
    pair(&l)
}

fn assert_no_retries_counted(env: &Sealed) {
    let s = stats(env);
    let by_family = s["retries_by_family"].as_object().unwrap();
    assert!(
        by_family.values().all(|n| n == 0),
        "stats counts a replay or a follow as a retry: {s}"
    );
}

/// The page for people: observations counted apart and said in words, and nothing that
/// was not sent said to be dispatched.
fn assert_show_says_it_in_words(page: &str, observations: u64) {
    let flat = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!("observations {observations} (replays and follows")),
        "{page}"
    );
    assert!(!flat.contains("[left open]"), "{page}");
    assert!(!flat.contains("dispatched"), "{page}");
}

#[test]
fn a_replayed_operation_has_one_attempt_no_retry_and_its_observation_in_show() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("observe-replay");
    let fx = effects("observe-replay");
    let cmd = format!("echo ran >> {}; echo out; exit 3", fx.display());
    let first = run_json(&env, &lab, &["target1", "--op", "obs-1", "--", &cmd]);
    assert_eq!(first.verdict(), "completed", "{first:?}");

    // The same ledger replays: no attempt, one observation saying what it read.
    let again = run_json(&env, &lab, &["target1", "--op", "obs-1", "--", &cmd]);
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!((again.exit_code(), again.status), (Some(3), 3));
    assert_eq!(again.stdout(), "out\n");
    assert_eq!(lines(&fx), 1, "ran once");
    assert_eq!(again.json["attempts"], serde_json::json!([]), "{again:?}");
    let seen = &again.json["observations"];
    assert_eq!(seen.as_array().unwrap().len(), 1, "{again:?}");
    assert_eq!(seen[0]["kind"], "replay_from_ledger", "{again:?}");
    assert!(
        seen[0]["effect"]
            .as_str()
            .unwrap()
            .contains("nothing ran again"),
        "{again:?}"
    );
    assert_eq!(counts(&env, "obs-1"), (1, 1));
    let shown = show_json(&env, "obs-1");
    let observed = shown["observations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["what"] == "replay from ledger")
        .unwrap_or_else(|| panic!("{shown}"))
        .clone();
    assert!(
        observed["found"].as_str().unwrap().contains("exit 3"),
        "{observed}"
    );
    assert_show_says_it_in_words(&show_text(&env, "obs-1"), 1);
    assert_no_retries_counted(&env);

    // A second ledger (another client home) learns it from the host: its claim request
    // is its one attempt, refused by the existing claim; the replay is an observation.
    let other = Sealed::new("observe-replay-other");
    let from_host = run_json(&other, &lab, &["target1", "--op", "obs-1", "--", &cmd]);
    assert_eq!(from_host.verdict(), "replayed", "{from_host:?}");
    assert_eq!(from_host.reason_code(), "replayed_from_host");
    assert_eq!((from_host.exit_code(), from_host.status), (Some(3), 3));
    assert_eq!(lines(&fx), 1, "ran once");
    let tries = &from_host.json["attempts"];
    assert_eq!(tries.as_array().unwrap().len(), 1, "{from_host:?}");
    assert_eq!(retries(tries), 0, "{from_host:?}");
    assert_eq!(
        from_host.json["observations"][0]["kind"], "replay_from_host",
        "{from_host:?}"
    );
    assert_eq!(counts(&other, "obs-1"), (1, 1));
    let page = show_text(&other, "obs-1");
    let flat = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("replay from host"), "{page}");
    assert!(flat.contains("ran nothing"), "{page}");
    assert!(!flat.contains("[left open]"), "{page}");
    assert_no_retries_counted(&other);

    // And the second ledger's own rerun replays from its ledger, still one attempt.
    let third = run_json(&other, &lab, &["target1", "--op", "obs-1", "--", &cmd]);
    assert_eq!(third.verdict(), "replayed", "{third:?}");
    assert_eq!(counts(&other, "obs-1"), (1, 2));
    assert_no_retries_counted(&other);
}

#[test]
fn following_a_running_command_is_an_observation_not_an_attempt() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("observe-follow");
    let dir = fresh_dir("observe-follow");
    let fx = dir.join("effects");
    let gate = dir.join("gate");
    let cmd = format!(
        "echo ran >> {}; while [ ! -e {} ]; do sleep 0.1; done; echo finished",
        fx.display(),
        gate.display()
    );
    let first = run_json(
        &env,
        &lab,
        &["target1", "--op", "follow-1", "--detach", "--", &cmd],
    );
    assert_eq!(first.verdict(), "in_progress", "{first:?}");

    // Still running: followed for --wait, then in_progress, as an observation.
    let follow = run_json(
        &env,
        &lab,
        &["target1", "--op", "follow-1", "--wait", "1s", "--", &cmd],
    );
    assert_eq!(follow.verdict(), "in_progress", "{follow:?}");
    assert_eq!(follow.reason_code(), "still_running");
    assert_eq!(follow.json["attempts"], serde_json::json!([]), "{follow:?}");
    assert_eq!(
        follow.json["observations"][0]["kind"], "follow",
        "{follow:?}"
    );
    assert!(
        follow.json["observations"][0]["effect"]
            .as_str()
            .unwrap()
            .starts_with("left unsettled: still running"),
        "{follow:?}"
    );
    assert_eq!(counts(&env, "follow-1"), (1, 1));

    // Once it may finish, a rerun follows (or replays) it to its exit.
    std::fs::write(&gate, "").unwrap();
    let done = run_json(&env, &lab, &["target1", "--op", "follow-1", "--", &cmd]);
    assert_eq!(done.verdict(), "replayed", "{done:?}");
    assert_eq!(done.stdout(), "finished\n");
    assert_eq!(done.json["attempts"], serde_json::json!([]), "{done:?}");
    let kind = done.json["observations"][0]["kind"].as_str().unwrap();
    assert!(["follow", "replay_from_host"].contains(&kind), "{done:?}");
    assert_eq!(lines(&fx), 1, "ran once");
    assert_eq!(counts(&env, "follow-1"), (1, 2));
    assert_show_says_it_in_words(&show_text(&env, "follow-1"), 2);
    assert_no_retries_counted(&env);
}

/// A destructive command the shipped policy asks approval for (`make-filesystem`), whose
/// `mkfs` finds no device: what it leaves is the line in `fx`.
fn needs_approval(fx: &Path) -> String {
    format!(
        "mkfs.ext4 /dev/opmark-no-such-device 2>/dev/null; echo ran >> {}; exit 4",
        fx.display()
    )
}

#[test]
fn after_an_approved_destructive_run_the_same_rerun_replays_without_approve() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("observe-approve");
    let fx = effects("observe-approve");
    let cmd = needs_approval(&fx);

    let blocked = run_json(&env, &lab, &["target1", "--op", "wipe-1", "--", &cmd]);
    assert_eq!(blocked.verdict(), "blocked", "{blocked:?}");
    assert_eq!(lines(&fx), 0, "nothing ran");
    let need = &blocked.json["approval_needed"];
    assert_eq!(need["family"], "destructive", "{blocked:?}");
    assert!(
        need["intent"].as_str().unwrap().contains("mkfs.ext4"),
        "{need}"
    );
    assert!(
        need["rule"].as_str().unwrap().contains("make-filesystem"),
        "{need}"
    );
    assert_eq!(need["earlier_attempts"], serde_json::json!([]), "{need}");
    assert_eq!(need["approving_would"], "run", "{need}");

    let note = "ticket 42: the scratch disk is empty";
    let approved = run_json(
        &env,
        &lab,
        &["target1", "--op", "wipe-1", "--approve", note, "--", &cmd],
    );
    assert_eq!(approved.verdict(), "completed", "{approved:?}");
    assert_eq!(approved.exit_code(), Some(4));
    assert_eq!(lines(&fx), 1);

    // Nothing can run again under this op id: no approval is asked for a replay.
    let rerun = run_json(&env, &lab, &["target1", "--op", "wipe-1", "--", &cmd]);
    assert_eq!(rerun.verdict(), "replayed", "{rerun:?}");
    assert_eq!((rerun.exit_code(), rerun.status), (Some(4), 4));
    assert_eq!(rerun.json["approval_needed"], Value::Null, "{rerun:?}");
    assert_eq!(rerun.json["attempts"], serde_json::json!([]), "{rerun:?}");
    assert_eq!(lines(&fx), 1, "ran once");

    let shown = show_json(&env, "wipe-1");
    let approvals = shown["approvals"].as_array().unwrap();
    assert_eq!(approvals.len(), 1, "{shown}");
    assert_eq!(approvals[0]["note"], note);
    let user = std::env::var("USER").unwrap_or_else(|_| "opmark-test".into());
    let by = approvals[0]["by"].as_str().unwrap();
    assert!(by.contains(&user) && by.contains("session"), "{by}");
    let page = show_text(&env, "wipe-1");
    let flat = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&format!("approved by {user}")), "{page}");
    assert!(flat.contains(note), "{page}");
    assert_eq!(counts(&env, "wipe-1"), (1, 1));
}

#[test]
fn a_blocked_rerun_says_the_intent_the_rule_earlier_boundaries_and_what_approving_does() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("observe-blocked");
    let dir = fresh_dir("observe-blocked");
    let fx = dir.join("effects");
    let cmd = needs_approval(&fx);
    // `gone` is a host that refuses connections: the approved attempt is never sent.
    let cfg = dir.join("ssh_config");
    std::fs::write(
        &cfg,
        format!(
            "Host gone\n  HostName 127.0.0.1\n  Port 1\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n  ConnectTimeout 5\n",
            lab.client_key().display(),
            lab.known_hosts().display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        answer(
            env.opmark()
                .arg("-F")
                .arg(&cfg)
                .args(["--json", "run", "gone", "--op", "wipe-2", "--attempts", "1"])
                .args(args)
                .args(["--", &cmd])
                .output()
                .unwrap(),
        )
    };
    let approved = run(&["--approve", "checked"]);
    assert_eq!(approved.verdict(), "not_applied", "{approved:?}");
    assert_eq!(approved.json["attempts"][0]["boundary"], "not_sent");

    let blocked = run(&[]);
    assert_eq!(blocked.verdict(), "blocked", "{blocked:?}");
    assert_eq!(blocked.status, 244);
    let need = &blocked.json["approval_needed"];
    assert_eq!(need["family"], "destructive", "{need}");
    assert_eq!(need["approving_would"], "run", "{need}");
    let earlier = need["earlier_attempts"].as_array().unwrap();
    assert_eq!(earlier.len(), 1, "{need}");
    assert_eq!(earlier[0]["number"], 1);
    assert_eq!(earlier[0]["boundary"], "not_sent");
    assert_eq!(
        earlier[0]["attempt_id"],
        approved.json["attempts"][0]["attempt_id"]
    );
    let reason = blocked.json["reason"].as_str().unwrap();
    for words in [
        "mkfs.ext4",
        "destructive",
        "make-filesystem",
        "not_sent",
        "--approve",
        "would run the command",
        "nothing was sent",
    ] {
        assert!(reason.contains(words), "{words}: {reason}");
    }
    // Plain mode prints the same on stderr.
    let plain = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args(["run", "gone", "--op", "wipe-2", "--", &cmd])
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(244));
    let stderr = text(&plain.stderr);
    assert!(
        stderr.contains("make-filesystem") && stderr.contains("not_sent"),
        "{stderr}"
    );
    assert_eq!(lines(&fx), 0, "nothing ran");
}
