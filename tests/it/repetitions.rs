//! Repetitions (docs/guarantees.md#repetitions) against real sshd targets: the same command
//! on the same host under a new op id, held back or warned about per family, declared with
//! `--repeats` (MCP `repeats`), amendments with `--amends`, the host's fingerprint index
//! seen from a second ledger, and two ledgers racing two op ids of one destructive intent.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::support::mcp::McpClient;
use crate::support::{
    answer, fresh_dir, json, lines, run_json, show, show_json, text, Answer, Sealed,
};

/// A destructive command (`rm`) that leaves one line in `count` each time it runs.
fn destructive(count: &Path) -> String {
    format!("echo ran >> {c}; rm -f {c}.nothing", c = count.display())
}

/// The shipped policy with `edit` applied to its text, written to a file.
fn policy_file(dir: &Path, edit: impl FnOnce(String) -> String) -> PathBuf {
    let path = dir.join("command-classes.toml");
    std::fs::write(&path, edit(opmark::policy::BUILTIN_TEXT.to_owned())).unwrap();
    path
}

#[test]
fn a_destructive_command_under_a_new_op_id_is_blocked_naming_the_earlier_one() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = fresh_dir(crate::test_name!()).join("count");
    let cmd = destructive(&count);
    let first = run_json(&env, &lab, &["target1", "--op", "wipe-1", "--", &cmd]);
    assert_eq!(first.verdict(), "completed", "{first:?}");
    assert_eq!(first.json["repeats"], Value::Null);

    let second = run_json(&env, &lab, &["target1", "--op", "wipe-2", "--", &cmd]);
    assert_eq!(second.verdict(), "blocked", "{second:?}");
    assert_eq!(second.code(), ("repeats_recent_operation", false));
    assert_eq!(second.status, 244);
    // It says which setting held it back and where to change it.
    let reason = second.json["reason"].as_str().unwrap();
    for names in [
        "it is destructive by",
        "[families.destructive]",
        "on_repeat",
        "command-classes.toml",
    ] {
        assert!(
            reason.contains(names),
            "the reason lacks {names:?}: {reason}"
        );
    }
    let r = &second.json["repeats"];
    assert_eq!(r["op_id"], "wipe-1", "{second:?}");
    assert_eq!(r["action"], "block");
    assert_eq!(r["seen_in"], "ledger");
    assert!(r["state"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
    assert!(r["at"].as_str().is_some_and(|s| s.contains('T')), "{r}");
    assert!(r["route"].as_str().unwrap().contains("127.0.0.1"), "{r}");
    let reason = second.json["reason"].as_str().unwrap();
    for way in ["--op wipe-1", "--repeats wipe-1"] {
        assert!(reason.contains(way), "the reason names `{way}`: {reason}");
    }
    assert_eq!(
        second.json["attempts"].as_array().unwrap().len(),
        0,
        "nothing sent"
    );
    assert_eq!(lines(&count), 1, "ran once");
    assert!(
        show(&env, "wipe-2").contains("held back as a repetition of op wipe-1"),
        "{}",
        show(&env, "wipe-2")
    );

    // Rerun under the earlier op id: the same effect, replayed, nothing runs again.
    let replay = run_json(&env, &lab, &["target1", "--op", "wipe-1", "--", &cmd]);
    assert_eq!(replay.verdict(), "replayed", "{replay:?}");
    assert_eq!(lines(&count), 1);

    // Declared: it runs, and both operations show the link.
    let meant = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "wipe-2",
            "--repeats",
            "wipe-1",
            "--",
            &cmd,
        ],
    );
    assert_eq!(meant.verdict(), "completed", "{meant:?}");
    assert_eq!(
        meant.json["repeats"],
        Value::Null,
        "declared, so no surprise"
    );
    assert_eq!(lines(&count), 2, "the declared repetition ran");
    let later = show(&env, "wipe-2");
    assert!(later.contains("repeats op wipe-1 on target1"), "{later}");
    let earlier = show(&env, "wipe-1");
    assert!(
        earlier.contains("repeated by op wipe-2 on target1"),
        "{earlier}"
    );
    let earlier_doc = show_json(&env, "wipe-1");
    assert_eq!(earlier_doc["operation"]["exit_code"], 0, "{earlier_doc}");
    assert!(
        earlier_doc["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"]["kind"] == "linked"
                && e["event"]["relation"] == "repeated_by"
                && e["event"]["other_op"] == "wipe-2"),
        "{earlier_doc}"
    );
}

#[test]
fn an_append_only_command_under_a_new_op_id_is_blocked() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let log = fresh_dir(crate::test_name!()).join("log");
    let cmd = format!("echo line >> {}", log.display());
    let class = env
        .opmark()
        .args(["--json", "classify", "--", &cmd])
        .output()
        .unwrap();
    assert_eq!(
        json(&class)["family"],
        "append-only",
        "{}",
        text(&class.stdout)
    );
    let first = run_json(&env, &lab, &["target1", "--op", "log-1", "--", &cmd]);
    assert_eq!(first.verdict(), "completed", "{first:?}");
    let second = run_json(&env, &lab, &["target1", "--op", "log-2", "--", &cmd]);
    assert_eq!(second.verdict(), "blocked", "{second:?}");
    assert_eq!(second.code(), ("repeats_recent_operation", false));
    assert_eq!(second.json["repeats"]["op_id"], "log-1");
    assert_eq!(lines(&log), 1);
}

#[test]
fn a_convergent_repetition_runs_and_says_so() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let file = fresh_dir(crate::test_name!()).join("setting");
    let cmd = format!("echo on > {}", file.display());
    let class = env
        .opmark()
        .args(["--json", "classify", "--", &cmd])
        .output()
        .unwrap();
    assert_eq!(
        json(&class)["family"],
        "convergent",
        "{}",
        text(&class.stdout)
    );
    let first = run_json(&env, &lab, &["target1", "--op", "set-1", "--", &cmd]);
    assert_eq!(first.verdict(), "completed", "{first:?}");
    assert!(!first.stderr.contains("repeats"), "{}", first.stderr);
    let second = run_json(&env, &lab, &["target1", "--op", "set-2", "--", &cmd]);
    assert_eq!(second.verdict(), "completed", "it ran: {second:?}");
    assert_eq!(second.json["attempts"][0]["boundary"], "exit_received");
    assert_eq!(second.json["repeats"]["op_id"], "set-1", "{second:?}");
    assert_eq!(second.json["repeats"]["action"], "warn");
    assert!(
        second
            .stderr
            .contains("opmark: warning: op set-2 repeats op set-1"),
        "{}",
        second.stderr
    );
    assert!(show(&env, "set-2").contains("warned: repeats op set-1"));
}

#[test]
fn a_read_only_repetition_is_allowed_silently() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    for op in ["look-1", "look-2"] {
        let a = run_json(
            &env,
            &lab,
            &["target1", "--op", op, "--", "cat /etc/hostname"],
        );
        assert_eq!(a.verdict(), "completed", "{a:?}");
        assert_eq!(a.json["family"], "read-only");
        assert_eq!(a.json["repeats"], Value::Null, "{a:?}");
        assert!(!a.stderr.contains("repeat"), "{}", a.stderr);
    }
}

#[test]
fn a_repetition_outside_the_window_is_allowed() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let policy = policy_file(&dir, |text| {
        let at = text.find("[families.destructive]").unwrap();
        let (head, tail) = text.split_at(at);
        format!(
            "{head}{}",
            tail.replacen("\nrepeat_window = \"24h\"", "\nrepeat_window = \"1s\"", 1)
        )
    });
    let count = dir.join("count");
    let cmd = destructive(&count);
    let run = |op: &str| {
        answer(
            env.opmark_with_lab(&lab)
                .arg("--policy")
                .arg(&policy)
                .args(["--json", "run", "target1", "--op", op, "--", &cmd])
                .output()
                .unwrap(),
        )
    };
    assert_eq!(run("old-1").verdict(), "completed");
    // Past the window (the host counts whole seconds): no repetition any more.
    std::thread::sleep(std::time::Duration::from_millis(3_100));
    let later = run("old-2");
    assert_eq!(later.verdict(), "completed", "{later:?}");
    assert_eq!(later.json["repeats"], Value::Null);
    assert_eq!(lines(&count), 2);
}

/// Two agents, each with its own home and ledger, send one destructive intent under two
/// op ids at once: the host's fingerprint index lets exactly one run.
#[test]
fn two_ledgers_racing_two_op_ids_of_one_destructive_intent_run_it_once() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let count = dir.join("count");
    let cmd = format!("{}; sleep 1", destructive(&count));
    for round in 0..3 {
        let envs = [
            Sealed::new(&format!("{}-a{round}", crate::test_name!())),
            Sealed::new(&format!("{}-b{round}", crate::test_name!())),
        ];
        let cmd = format!("{cmd}; : round {round}");
        let children: Vec<_> = envs
            .iter()
            .enumerate()
            .map(|(i, env)| {
                env.opmark_with_lab(&lab)
                    .args(["--json", "run", "target1", "--op"])
                    .arg(format!("race-{round}-{i}"))
                    .args(["--", &cmd])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut verdicts: Vec<Answer> = children
            .into_iter()
            .map(|c| answer(c.wait_with_output().unwrap()))
            .collect();
        verdicts.sort_by(|a, b| a.verdict().cmp(b.verdict()));
        assert_eq!(
            verdicts.iter().map(Answer::verdict).collect::<Vec<_>>(),
            ["blocked", "completed"],
            "round {round}: {verdicts:?}"
        );
        let held = &verdicts[0];
        assert_eq!(held.code(), ("repeats_recent_operation", false));
        assert_eq!(held.json["repeats"]["seen_in"], "host", "{held:?}");
        assert_eq!(held.json["repeats"]["op_id"], verdicts[1].json["op_id"]);
        assert_eq!(lines(&count), round + 1, "round {round}: ran once");
    }
}

#[test]
fn a_second_ledger_is_held_back_by_the_hosts_fingerprint_index() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let count = fresh_dir(crate::test_name!()).join("count");
    let cmd = destructive(&count);
    let one = Sealed::new(&format!("{}-one", crate::test_name!()));
    let two = Sealed::new(&format!("{}-two", crate::test_name!()));
    assert_eq!(
        run_json(&one, &lab, &["target1", "--op", "far-1", "--", &cmd]).verdict(),
        "completed"
    );
    let held = run_json(&two, &lab, &["target1", "--op", "far-2", "--", &cmd]);
    assert_eq!(held.verdict(), "blocked", "{held:?}");
    assert_eq!(held.json["repeats"]["op_id"], "far-1");
    assert_eq!(held.json["repeats"]["state"], "completed");
    assert_eq!(held.json["repeats"]["seen_in"], "host");
    assert_eq!(held.json["attempts"][0]["boundary"], "refused", "{held:?}");
    assert_eq!(lines(&count), 1);
    // Declared in the second ledger too: the host lets it run.
    let meant = run_json(
        &two,
        &lab,
        &["target1", "--op", "far-2", "--repeats", "far-1", "--", &cmd],
    );
    assert_eq!(meant.verdict(), "completed", "{meant:?}");
    assert_eq!(lines(&count), 2);
}

#[test]
fn an_amendment_links_both_operations_and_the_earlier_keeps_its_outcome() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = fresh_dir(crate::test_name!()).join("count");
    let old = format!("{}; exit 3", destructive(&count));
    let new = destructive(&count);
    let first = run_json(&env, &lab, &["target1", "--op", "fix-1", "--", &old]);
    assert_eq!((first.verdict(), first.exit_code()), ("completed", Some(3)));
    let changed = run_json(&env, &lab, &["target1", "--op", "fix-1", "--", &new]);
    assert_eq!(changed.verdict(), "conflict", "{changed:?}");

    let amended = run_json(
        &env,
        &lab,
        &["target1", "--op", "fix-2", "--amends", "fix-1", "--", &new],
    );
    assert_eq!(amended.verdict(), "completed", "{amended:?}");
    assert_eq!(lines(&count), 2);
    let later = show(&env, "fix-2");
    assert!(later.contains("amends op fix-1 on target1"), "{later}");
    let earlier = show(&env, "fix-1");
    assert!(
        earlier.contains("amended by op fix-2 on target1"),
        "{earlier}"
    );
    let doc = show_json(&env, "fix-1");
    assert_eq!(
        doc["operation"]["exit_code"], 3,
        "the earlier keeps its outcome: {doc}"
    );
    assert_eq!(doc["operation"]["verdict"], "completed", "{doc}");

    // --amends of an operation of the same intent declares the repetition too.
    let again = run_json(
        &env,
        &lab,
        &["target1", "--op", "fix-3", "--amends", "fix-2", "--", &new],
    );
    assert_eq!(again.verdict(), "completed", "{again:?}");
    assert_eq!(lines(&count), 3);

    // A bad op id is named with the fix; nothing is recorded or sent.
    for flag in ["--amends", "--repeats"] {
        let bad = run_json(
            &env,
            &lab,
            &["target1", "--op", "fix-4", flag, "not an id", "--", &new],
        );
        assert_eq!(bad.verdict(), "refused", "{bad:?}");
        assert_eq!(bad.code(), ("invalid_input", false));
        assert_eq!(bad.status, 245);
        assert!(
            bad.json["reason"].as_str().unwrap().contains(flag),
            "{bad:?}"
        );
    }
    let own = run_json(
        &env,
        &lab,
        &["target1", "--op", "fix-4", "--repeats", "fix-4", "--", &new],
    );
    assert_eq!(own.code(), ("invalid_input", false), "{own:?}");
    assert_eq!(lines(&count), 3, "nothing ran");
    let unknown = env.opmark().args(["show", "fix-4"]).output().unwrap();
    assert!(!unknown.status.success(), "fix-4 was never recorded");
}

#[test]
fn repeats_of_another_command_is_refused_before_anything() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = fresh_dir(crate::test_name!()).join("count");
    let cmd = destructive(&count);
    assert_eq!(
        run_json(&env, &lab, &["target1", "--op", "one", "--", &cmd]).verdict(),
        "completed"
    );
    let other = format!("{cmd}; true");
    let wrong = run_json(
        &env,
        &lab,
        &["target1", "--op", "two", "--repeats", "one", "--", &other],
    );
    assert_eq!(wrong.code(), ("invalid_input", false), "{wrong:?}");
    assert!(wrong.json["reason"]
        .as_str()
        .unwrap()
        .contains("--amends one"));
    assert_eq!(lines(&count), 1);
}

#[test]
fn mcp_run_holds_back_a_repetition_and_takes_the_repeats_argument() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = fresh_dir(crate::test_name!()).join("count");
    let cmd = destructive(&count);
    let mut server = env.opmark_with_lab(&lab);
    server.arg("mcp");
    let mut client = McpClient::start(server);
    let mut call = |arguments: Value| client.structured("run", arguments);
    let first = call(serde_json::json!({"host": "target1", "op_id": "mcp-1", "command": cmd}));
    assert_eq!(first["verdict"], "completed", "{first}");
    // The agent lost its op id and minted another: held back, naming the first.
    let retry =
        call(serde_json::json!({"host": "target1", "op_id": "mcp-1-retry", "command": cmd}));
    assert_eq!(retry["verdict"], "blocked", "{retry}");
    assert_eq!(retry["reason_code"], "repeats_recent_operation");
    assert_eq!(retry["retryable"], false);
    assert_eq!(retry["repeats"]["op_id"], "mcp-1", "{retry}");
    assert_eq!(lines(&count), 1, "ran once");
    let meant = call(
        serde_json::json!({"host": "target1", "op_id": "mcp-1-retry", "command": cmd,
            "repeats": "mcp-1"}),
    );
    assert_eq!(meant["verdict"], "completed", "{meant}");
    assert_eq!(lines(&count), 2);
    client.close();
    assert!(show(&env, "mcp-1").contains("repeated by op mcp-1-retry"));
}

#[test]
fn an_old_policy_without_the_repetition_keys_still_works_with_the_defaults() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let policy = policy_file(&dir, |text| {
        text.lines()
            .filter(|l| !l.starts_with("repeat_window") && !l.starts_with("on_repeat"))
            .map(|l| format!("{l}\n"))
            .collect()
    });
    assert!(!std::fs::read_to_string(&policy)
        .unwrap()
        .contains("\non_repeat"));
    let shown = env
        .opmark()
        .arg("--policy")
        .arg(&policy)
        .args(["policy", "show"])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    assert!(shown.contains("on_repeat = \"block\""), "{shown}");
    assert!(shown.contains("repeat_window = \"1d\""), "{shown}");
    let count = dir.join("count");
    let cmd = destructive(&count);
    let run = |op: &str| {
        answer(
            env.opmark_with_lab(&lab)
                .arg("--policy")
                .arg(&policy)
                .args(["--json", "run", "target1", "--op", op, "--", &cmd])
                .output()
                .unwrap(),
        )
    };
    assert_eq!(run("legacy-1").verdict(), "completed");
    let held = run("legacy-2");
    assert_eq!(held.code(), ("repeats_recent_operation", false), "{held:?}");
    assert_eq!(lines(&count), 1);
}

#[test]
fn a_bad_on_repeat_value_is_refused_with_a_clear_error_and_nothing_runs() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let policy = policy_file(&dir, |text| {
        let at = text.find("[families.destructive]").unwrap();
        let (head, tail) = text.split_at(at);
        format!(
            "{head}{}",
            tail.replacen("\non_repeat = \"block\"", "\non_repeat = \"sometimes\"", 1)
        )
    });
    let count = dir.join("count");
    let out = env
        .opmark_with_lab(&lab)
        .arg("--policy")
        .arg(&policy)
        .args([
            "run",
            "target1",
            "--op",
            "bad-1",
            "--",
            &destructive(&count),
        ])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(246), "{stderr}");
    for needle in [
        "families.destructive.on_repeat",
        "sometimes",
        "\"allow\", \"warn\" or \"block\"",
        policy.to_str().unwrap(),
    ] {
        assert!(stderr.contains(needle), "`{needle}` in: {stderr}");
    }
    assert_eq!(lines(&count), 0, "nothing ran");
}
