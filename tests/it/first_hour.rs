//! The first hour with opmark (issue 48 item 10): what a new user meets around the core
//! tells the truth. Usage lines do not show options the environment supplied as
//! required; every misplaced `--` gets a hint; a host change says which ssh config
//! (`-F` or `OPMARK_SSH_CONFIG`) reaches the machine again; `lab down` names only its
//! own targets' operations; `doctor` gives each check one verdict; `--help` wraps at the
//! terminal's width; `stats` refuses two formats; and the man page is one page with
//! examples and no references to pages that do not exist.

use std::process::Output;

use crate::support::{answer, json, text, Sealed};

/// `opmark ARGS` in `env` with `OPMARK_SSH_CONFIG` set too (and `OPMARK_LEDGER`, as
/// every sealed run has): both options come from the environment.
fn with_env_options(env: &Sealed, args: &[&str]) -> Output {
    let config = env.root.join("ssh_config");
    std::fs::write(&config, "").unwrap();
    env.opmark()
        .env("OPMARK_SSH_CONFIG", &config)
        .args(args)
        .output()
        .unwrap()
}

/// The `Usage:` line of a usage error.
fn usage_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("Usage: "))
        .unwrap_or_else(|| panic!("no usage line in {stderr}"))
}

#[test]
fn usage_lines_do_not_show_options_the_environment_supplied_as_required() {
    let env = Sealed::new(crate::test_name!());
    for args in [
        &["run", "web1", "--op", "x"][..],
        &["run", "--stdin", "-n", "web1", "--", "true"][..],
    ] {
        let out = with_env_options(&env, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        let usage = usage_line(&stderr);
        assert!(usage.starts_with("Usage: opmark run "), "{usage}");
        for option in ["--ssh-config", "--ledger", "--persist", "--quiet"] {
            assert!(
                !usage.contains(option),
                "{args:?}: {option} came from the environment, not a required part: {usage}"
            );
        }
        // The JSON error document's message carries the same usage.
        let mut json_args = vec!["--json"];
        json_args.extend_from_slice(args);
        let doc = json(&with_env_options(&env, &json_args));
        let message = doc["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains("--ssh-config") && !message.contains("--ledger"),
            "{message}"
        );
    }
    // An option typed on the command line is what the user wrote: it stays.
    let out = with_env_options(
        &env,
        &["run", "--ledger", "/nonexistent/l.db", "web1", "--op", "x"],
    );
    let stderr = text(&out.stderr);
    assert!(usage_line(&stderr).contains("--ledger"), "{stderr}");
}

#[test]
fn every_misplaced_dashes_gets_a_hint_that_names_the_fix() {
    let env = Sealed::new(crate::test_name!());
    let fix = "opmark run HOST [--op ID] -- CMD";
    // (the words, what the hint says about them)
    let cases: [(&[&str], &str); 3] = [
        (&["run", "web1", "uptime"], "the command goes after `--`"),
        (&["run", "web1", "uptime", "--"], "nothing follows `--`"),
        (&["run", "--", "web1", "uptime"], "no host before `--`"),
    ];
    for (args, what) in cases {
        let out = env.opmark().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        let hint = stderr
            .lines()
            .find(|l| l.starts_with("opmark: hint: "))
            .unwrap_or_else(|| panic!("{args:?}: no hint:\n{stderr}"));
        assert!(
            hint.contains(what) && hint.contains(fix),
            "{args:?}: {hint}"
        );
        // An agent reads it in the error document.
        let out = env.opmark().arg("--json").args(args).output().unwrap();
        let message = json(&out)["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(what), "{args:?}: {message}");
    }
}

#[test]
fn a_host_change_says_which_ssh_config_reaches_the_machine_again_naming_opmark_ssh_config() {
    let Some(first) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(second) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    // Two labs, both with a `target1`, one ledger: the environment names the lab, as
    // `eval "$(opmark lab env)"` leaves it.
    let ran = answer(
        env.opmark()
            .env("OPMARK_SSH_CONFIG", first.ssh_config())
            .args(["--json", "run", "target1", "--op", "moved-1", "--", "true"])
            .output()
            .unwrap(),
    );
    assert_eq!(ran.verdict(), "completed", "{ran:?}");
    let way_back = format!(
        "point -F or OPMARK_SSH_CONFIG at the ssh config it was reached with, {}",
        first.ssh_config().display()
    );
    // A later shell still points OPMARK_SSH_CONFIG at the other lab.
    let again = answer(
        env.opmark()
            .env("OPMARK_SSH_CONFIG", second.ssh_config())
            .args(["--json", "run", "target1", "--op", "moved-1", "--", "true"])
            .output()
            .unwrap(),
    );
    assert_eq!(
        (again.verdict(), again.reason_code()),
        ("conflict", "host_changed"),
        "{again:?}"
    );
    let reason = again.json["reason"].as_str().unwrap();
    assert!(reason.contains(&way_back), "{reason}");
    let probed = env
        .opmark()
        .env("OPMARK_SSH_CONFIG", second.ssh_config())
        .args(["--json", "probe", "target1", "moved-1"])
        .output()
        .unwrap();
    assert_eq!(probed.status.code(), Some(243), "{}", text(&probed.stderr));
    let reason = json(&probed)["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains(&way_back), "{reason}");
    // The fix works as said.
    let back = answer(
        env.opmark()
            .env("OPMARK_SSH_CONFIG", first.ssh_config())
            .args(["--json", "run", "target1", "--op", "moved-1", "--", "true"])
            .output()
            .unwrap(),
    );
    assert_eq!(back.verdict(), "replayed", "{back:?}");
}

#[test]
fn lab_down_names_only_the_operations_of_its_own_targets() {
    let Some(mine) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(other) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    // Left unresolved on the other lab's target1, under the short name both labs answer to.
    let crashed = env
        .opmark_with_lab(&other)
        .env("OPMARK_FAULT", "after_dispatch")
        .args(["run", "target1", "--op", "other-lab-op", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), None, "killed at its fault point");

    let down = env
        .opmark()
        .args(["--json", "lab", "down", "--dir"])
        .arg(mine.dir())
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
    let doc = json(&down);
    assert_eq!(
        doc["unresolved_operations"],
        serde_json::json!([]),
        "another lab's target1 is not this lab's: {doc}"
    );
    // Its own lab's `down` names it, in text as in JSON.
    let down = env
        .opmark()
        .args(["lab", "down", "--dir"])
        .arg(other.dir())
        .output()
        .unwrap();
    let said = text(&down.stderr);
    assert!(down.status.success(), "{said}");
    assert!(
        said.contains("1 unresolved operation") && said.contains("other-lab-op on target1"),
        "{said}"
    );
}

#[test]
fn doctor_gives_a_name_that_does_not_resolve_one_resolve_verdict() {
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark()
        .args(["-F", "none", "doctor", "nosuchhost.invalid"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let verdicts: Vec<&str> = said
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("resolve"))
        .collect();
    assert_eq!(verdicts.len(), 1, "one verdict for resolve:\n{said}");
    assert!(verdicts[0].trim_start().starts_with("FAIL"), "{said}");
    assert!(said.contains("skip connect"), "{said}");
    let doc = json(
        &env.opmark()
            .args(["-F", "none", "--json", "doctor", "nosuchhost.invalid"])
            .output()
            .unwrap(),
    );
    let checks = doc["checks"].as_array().unwrap();
    let named = |name: &str| -> Vec<&serde_json::Value> {
        checks.iter().filter(|c| c["name"] == name).collect()
    };
    let resolve = named("resolve");
    assert_eq!(resolve.len(), 1, "{doc}");
    assert_eq!(resolve[0]["status"], "fail", "{doc}");
    let fix = resolve[0]["fix"].as_str().unwrap();
    assert!(
        fix.contains("nosuchhost.invalid") && fix.contains("OPMARK_SSH_CONFIG"),
        "{fix}"
    );
    assert_eq!(named("connect")[0]["status"], "skipped", "{doc}");
}

#[test]
fn run_help_wraps_its_tables_under_their_columns_at_the_terminals_width() {
    let env = Sealed::new(crate::test_name!());
    for columns in ["80", "60"] {
        let out = env
            .opmark()
            .env("COLUMNS", columns)
            // `[env: OPMARK_LEDGER=<its value>]`: a long path is one word.
            .env_remove("OPMARK_LEDGER")
            .args(["run", "-h"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let help = text(&out.stdout);
        let width: usize = columns.parse().unwrap();
        // At 80 every line fits; narrower, clap's own descriptions hold a word longer
        // than their column (the default ledger path), so only the tables are held to it.
        let checked = if width == 80 {
            help.as_str()
        } else {
            help.split("\nExit status:").nth(1).unwrap()
        };
        for line in checked.lines() {
            assert!(
                opmark::text::width(line) <= width,
                "{columns} columns: {line:?}\n{help}"
            );
        }
        let table = help.split("Reason codes").nth(1).unwrap();
        let table = table.split("Errors outside").next().unwrap();
        let verdicts = [
            "completed",
            "replayed",
            "in_progress",
            "not_applied",
            "indeterminate",
            "conflict",
            "blocked",
            "refused",
        ];
        for line in table.lines().skip(1) {
            let row = verdicts
                .iter()
                .any(|v| line.starts_with(&format!("  {v} ")));
            assert!(
                row || line.starts_with(&" ".repeat(17)),
                "{columns} columns: a ragged line in the reason codes: {line:?}\n{help}"
            );
        }
    }
}

#[test]
fn stats_refuses_json_with_another_format_naming_both() {
    let env = Sealed::new(crate::test_name!());
    for format in ["text", "prometheus"] {
        let out = env
            .opmark()
            .args(["stats", "--format", format, "--json"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(245), "{format}");
        let message = json(&out)["error"]["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains("--json") && message.contains(&format!("--format {format}")),
            "{message}"
        );
    }
}

#[test]
fn the_man_page_has_examples_no_extra_section_and_no_reference_to_a_page_that_does_not_exist() {
    let env = Sealed::new(crate::test_name!());
    let out = env.opmark().arg("man").output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    let headings: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix(".SH "))
        .map(|h| h.trim_matches('"'))
        .collect();
    assert!(headings.contains(&"EXAMPLES"), "{headings:?}");
    assert!(!headings.contains(&"EXTRA"), "{headings:?}");
    assert!(headings.contains(&"EXIT STATUS"), "{headings:?}");
    // The examples are commands of this opmark, among them the ones a user needs first.
    let examples = page.split(".SH EXAMPLES").nth(1).unwrap();
    let examples = examples.split(".SH ").next().unwrap().replace("\\-", "-");
    for needle in [
        "$ opmark run web1 --op ",
        "$ opmark probe ",
        "$ opmark reconcile",
        "$ opmark resolve ",
        "$ opmark mcp",
    ] {
        assert!(examples.contains(needle), "no {needle:?} in\n{examples}");
    }
    // Every `name(N)` reference names opmark(1) or a page the system has.
    let plain = page
        .replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fR", "");
    let refs = regex::Regex::new(r"([A-Za-z][A-Za-z0-9_.-]*)\(([1-9])\)").unwrap();
    let known = [
        "opmark(1)",
        "ssh(1)",
        "ssh_config(5)",
        "ssh-keygen(1)",
        "sshd(8)",
    ];
    let named: Vec<String> = refs
        .captures_iter(&plain)
        .map(|c| format!("{}({})", &c[1], &c[2]))
        .collect();
    assert!(named.iter().any(|r| r == "ssh_config(5)"), "{named:?}");
    for r in &named {
        assert!(
            known.contains(&r.as_str()),
            "the page names {r}, which does not exist"
        );
    }
}
