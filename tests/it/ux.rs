//! opmark as a tool people install and read: shell completions and the man page
//! generated from the CLI, `policy show`, rule names, and `list`/`show` output that can
//! be copied from (whole op ids, prefixes, local time, no colour codes in pipes).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use clap::CommandFactory as _;
use opmark::policy::Policy;

use crate::support::{text, Sealed};

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\n{}{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Feeds `script` to `tool args...` on stdin; the tool's status says whether it parses.
fn parses_with(tool: &str, args: &[&str], script: &str) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {tool}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn completions_for_bash_zsh_and_fish_are_scripts_their_shell_parses() {
    let env = Sealed::new(crate::test_name!());
    for (shell, check) in [
        ("bash", &["-n"][..]),
        ("zsh", &["-n"][..]),
        ("fish", &["--no-execute"][..]),
    ] {
        let script = ok(
            env.opmark().args(["completions", shell]).output().unwrap(),
            shell,
        );
        // The script asks the binary itself (dynamic completion), which answers from
        // the real CLI: below.
        assert!(
            script.contains("COMPLETE") && script.contains("opmark"),
            "{shell}: not a registration of opmark's completion: {script}"
        );
        if !crate::support::require_tool(shell) {
            continue;
        }
        let out = parses_with(shell, check, &script);
        assert!(
            out.status.success(),
            "{shell} {check:?} rejects the script: {}",
            text(&out.stderr)
        );
    }
    // What the scripts ask: the subcommands, from the real CLI.
    let asked = ok(
        env.opmark()
            .env("COMPLETE", "bash")
            .env("_CLAP_COMPLETE_INDEX", "1")
            .env("_CLAP_COMPLETE_COMP_TYPE", "9")
            .env("_CLAP_COMPLETE_SPACE", "true")
            .env("_CLAP_IFS", "\n")
            .args(["--", "opmark", ""])
            .output()
            .unwrap(),
        "COMPLETE=bash",
    );
    for sub in ["run", "reconcile", "completions"] {
        assert!(asked.lines().any(|l| l == sub), "no {sub} in:\n{asked}");
    }
    // The JSON contract holds here too: one document with the same script.
    let doc = ok(
        env.opmark()
            .args(["--json", "completions", "fish"])
            .output()
            .unwrap(),
        "--json completions",
    );
    assert_eq!(doc.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(v["schema"], "opmark/2");
    assert_eq!(v["shell"], "fish");
    let fish = env.opmark().args(["completions", "fish"]).output().unwrap();
    assert_eq!(v["script"], text(&fish.stdout));
    let out = env.opmark().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    assert!(text(&out.stderr).contains("bash"), "{}", text(&out.stderr));
}

#[test]
fn the_man_page_has_every_subcommand_and_renders() {
    let env = Sealed::new(crate::test_name!());
    let page = ok(env.opmark().arg("man").output().unwrap(), "man");
    assert!(
        page.starts_with(".ie") || page.starts_with(".TH"),
        "not roff"
    );
    assert!(page.contains(".TH opmark 1"), "no title line");
    let cli = opmark::cli::Cli::command();
    let subs: Vec<String> = cli
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    assert!(subs.len() >= 19, "{subs:?}");
    for sub in &subs {
        let heading = format!(".SH \"OPMARK {}\"", sub.to_uppercase());
        assert!(page.contains(&heading), "man page lacks {heading}");
    }
    let doc = ok(
        env.opmark().args(["--json", "man"]).output().unwrap(),
        "--json man",
    );
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(
        (&v["schema"], &v["format"]),
        (&"opmark/2".into(), &"roff".into())
    );
    assert_eq!(v["page"], page.as_str());
    if !crate::support::require_tool("groff") {
        return;
    }
    let out = parses_with("groff", &["-man", "-Tutf8", "-ww", "-P-cbou"], &page);
    let rendered = text(&out.stdout);
    assert!(out.status.success(), "groff: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).trim().is_empty(),
        "groff warns: {}",
        text(&out.stderr)
    );
    for needle in ["OPMARK RUN", "OPMARK POLICY", "--since", "--utc"] {
        assert!(rendered.contains(needle), "rendered page lacks {needle}");
    }
}

/// A small user policy with one named and one unnamed rule.
const USER_POLICY: &str = r#"
default_family = "destructive"
[families.read-only]
attempts = 2
after_interrupted = "rerun"
[families.convergent]
attempts = 3
after_interrupted = "rerun"
[families.append-only]
attempts = 1
after_interrupted = "block"
[families.destructive]
attempts = 1
after_interrupted = "block"
[[rule]]
name = "listing"
family = "read-only"
programs = ["ls"]
[[rule]]
family = "read-only"
programs = ["uptime"]
"#;

#[test]
fn policy_show_prints_the_policy_in_effect_with_its_source_and_it_loads_back_equal() {
    let env = Sealed::new(crate::test_name!());
    // Built-in: the TOML names its source and loads back to the built-in policy.
    let printed = ok(
        env.opmark().args(["policy", "show"]).output().unwrap(),
        "policy show",
    );
    assert!(printed.starts_with("# "), "{printed}");
    assert!(
        printed.lines().next().unwrap().contains("built-in"),
        "{printed}"
    );
    let copy = env.root.join("printed.toml");
    std::fs::write(&copy, &printed).unwrap();
    let loaded = Policy::load(Some(&copy)).unwrap();
    assert!(
        loaded == Policy::builtin(),
        "printed policy differs from the built-in one"
    );
    assert!(printed.contains("name = \"shell-builtins\""), "{printed}");

    let json = ok(
        env.opmark()
            .args(["--json", "policy", "show"])
            .output()
            .unwrap(),
        "--json policy show",
    );
    assert_eq!(json.lines().count(), 1, "one compact line");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["schema"], "opmark/2");
    assert_eq!(v["source"], "built-in");
    assert!(v["path"].is_null());
    assert_eq!(v["policy"]["default_family"], "destructive");
    assert_eq!(v["policy"]["families"]["read-only"]["attempts"], 3);
    assert!(v["policy"]["rule"].as_array().unwrap().len() > 100);

    // The user's file (found in XDG_CONFIG_HOME as `run` finds it): its path is the source.
    let user = env.config.join("opmark").join("command-classes.toml");
    std::fs::create_dir_all(user.parent().unwrap()).unwrap();
    std::fs::write(&user, USER_POLICY).unwrap();
    let printed = ok(
        env.opmark().args(["policy", "show"]).output().unwrap(),
        "user policy show",
    );
    assert!(
        printed
            .lines()
            .next()
            .unwrap()
            .contains(&*user.to_string_lossy()),
        "{printed}"
    );
    std::fs::write(&copy, &printed).unwrap();
    assert!(Policy::load(Some(&copy)).unwrap() == Policy::load(Some(&user)).unwrap());
    let v: serde_json::Value = serde_json::from_slice(
        &env.opmark()
            .args(["--json", "policy", "show"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(v["source"], "file");
    assert_eq!(v["path"], user.to_string_lossy().as_ref());
    assert_eq!(v["policy"]["rule"][0]["name"], "listing");
    assert!(v["policy"]["rule"][1].get("name").is_none());
}

#[test]
fn rules_are_shown_by_name_and_an_unnamed_user_rule_by_number() {
    let env = Sealed::new(crate::test_name!());
    let user = env.root.join("mine.toml");
    std::fs::write(&user, USER_POLICY).unwrap();
    let policy = user.to_str().unwrap();
    let out = ok(
        env.opmark()
            .args(["--policy", policy, "classify", "--", "ls", "&&", "uptime"])
            .output()
            .unwrap(),
        "classify",
    );
    assert!(out.contains("mine.toml rule #1 (listing)"), "{out}");
    assert!(out.contains("mine.toml rule #2]"), "{out}");

    let out = ok(
        env.opmark()
            .args(["--json", "classify", "--", "rm", "-rf", "/"])
            .output()
            .unwrap(),
        "classify built-in",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let deny = v["deny"].as_str().unwrap();
    assert!(
        deny.starts_with("built-in command-classes.toml rule #") && deny.ends_with(')'),
        "a built-in rule is shown with its name: {deny}"
    );
}

#[test]
fn a_rule_name_used_twice_is_an_error_naming_both_rules() {
    let env = Sealed::new(crate::test_name!());
    let user = env.root.join("dup.toml");
    std::fs::write(
        &user,
        USER_POLICY.replace(
            "programs = [\"uptime\"]",
            "name = \"listing\"\nprograms = [\"uptime\"]",
        ),
    )
    .unwrap();
    let out = env
        .opmark()
        .args(["--policy", user.to_str().unwrap(), "policy", "show"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(246), "{stderr}");
    assert!(
        stderr.contains("rule[1]") && stderr.contains("rule[2]") && stderr.contains("`listing`"),
        "{stderr}"
    );
    assert!(stderr.contains("give each rule its own name"), "{stderr}");

    std::fs::write(&user, USER_POLICY.replace("\"listing\"", "\"#1\"")).unwrap();
    let out = env
        .opmark()
        .args(["--policy", user.to_str().unwrap(), "policy", "show"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(246));
    assert!(
        text(&out.stderr).contains("rule[1].name"),
        "{}",
        text(&out.stderr)
    );

    std::fs::write(&user, USER_POLICY.replace("name = ", "nmae = ")).unwrap();
    let out = env
        .opmark()
        .args(["--policy", user.to_str().unwrap(), "policy", "show"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(246),
        "unknown keys are still errors"
    );
    assert!(text(&out.stderr).contains("nmae"), "{}", text(&out.stderr));
}

/// Records one intended operation per (op id, host), oldest first.
fn seed(ledger: &Path, ops: &[(&str, &str)]) {
    use opmark::family::Family;
    use opmark::ledger::{Durability, Event, Ledger, OpKey};
    std::fs::create_dir_all(ledger.parent().unwrap()).unwrap();
    let mut l = Ledger::open(ledger).unwrap();
    for (op, host) in ops {
        let intended = Event::Intended {
            session: "s".into(),
            family: Family::ReadOnly,
            display: "uptime".into(),
            fingerprint: format!("fp-{op}"),
            rule: "rule".into(),
            secrets: Vec::new(),
            become_user: None,
            locks: Vec::new(),
        };
        l.append_many(&OpKey::new(*op, *host), &[intended], Durability::Full)
            .unwrap();
    }
}

/// Moves an operation's last activity back in time, as if it had happened then.
/// Moves an operation's last change back to `at`, stored as the ledger stores a stamp
/// (micros since the epoch).
fn backdate(ledger: &Path, op: &str, at: &str) {
    let micros = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap()
        .unix_timestamp_nanos()
        / 1000;
    let micros = i64::try_from(micros).unwrap();
    let db = rusqlite::Connection::open(ledger).unwrap();
    let n = db
        .execute(
            "UPDATE operations SET updated_at = ?1 WHERE op_id = ?2",
            rusqlite::params![micros, op],
        )
        .unwrap();
    assert_eq!(n, 1);
}

fn json_ops(env: &Sealed, args: &[&str]) -> Vec<String> {
    let out = ok(
        env.opmark()
            .arg("--json")
            .arg("list")
            .args(args)
            .output()
            .unwrap(),
        "list",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn list_shows_whole_minted_op_ids_that_show_accepts() {
    let env = Sealed::new(crate::test_name!());
    let minted = opmark::op_id::OpId::mint().to_string();
    let long = format!("deploy.{}", "x".repeat(60));
    seed(
        &env.ledger,
        &[
            (&minted, "web1"),
            (&long, "a-host-with-a-long-name.example.org"),
        ],
    );
    let table = ok(env.opmark().arg("list").output().unwrap(), "list");
    assert!(!table.contains('…'), "nothing is cut:\n{table}");
    for whole in [
        minted.as_str(),
        long.as_str(),
        "a-host-with-a-long-name.example.org",
    ] {
        assert!(table.contains(whole), "{whole} is cut:\n{table}");
    }
    // What a person copies from the table is what `show` takes.
    let copied = table
        .lines()
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with("op-")))
        .unwrap();
    let page = ok(
        env.opmark().args(["show", copied]).output().unwrap(),
        "show copied id",
    );
    assert!(
        page.starts_with(&format!("operation {minted} on web1")),
        "{page}"
    );
}

#[test]
fn show_takes_a_unique_prefix_and_lists_the_candidates_of_an_ambiguous_one() {
    let env = Sealed::new(crate::test_name!());
    seed(
        &env.ledger,
        &[
            ("deploy-1041", "web1"),
            ("deploy-1042", "web2"),
            ("backup-7", "db1"),
            ("backup", "db2"),
        ],
    );
    let show = |args: &[&str]| env.opmark().arg("show").args(args).output().unwrap();
    let first_line = |out: Output| ok(out, "show").lines().next().unwrap().to_owned();

    assert_eq!(first_line(show(&["backup-"])), "operation backup-7 on db1");
    assert_eq!(
        first_line(show(&["backup"])),
        "operation backup on db2",
        "an exact id wins over the longer ids it is a prefix of"
    );
    assert_eq!(
        first_line(show(&["deploy-10", "--host", "web2"])),
        "operation deploy-1042 on web2",
        "--host narrows the candidates"
    );

    let out = show(&["deploy-10"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(245), "{stderr}");
    assert!(
        stderr.contains("deploy-1041") && stderr.contains("deploy-1042"),
        "the candidates are listed: {stderr}"
    );
    assert!(!stderr.contains("backup"), "{stderr}");
    let out = env
        .opmark()
        .args(["--json", "show", "deploy-10"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["reason_code"], "ambiguous_operation");

    let out = show(&["nothing"]);
    assert_eq!(out.status.code(), Some(245));
    assert!(text(&out.stderr).contains("no operation `nothing`"));
}

#[test]
fn list_since_and_limit_keep_the_recent_operations() {
    let env = Sealed::new(crate::test_name!());
    seed(
        &env.ledger,
        &[("old-1", "web1"), ("mid-1", "web1"), ("new-1", "web1")],
    );
    backdate(&env.ledger, "old-1", "2020-01-01T00:00:00.000000Z");
    let three_hours_ago = (time::OffsetDateTime::now_utc() - time::Duration::hours(3))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    backdate(&env.ledger, "mid-1", &three_hours_ago);

    assert_eq!(json_ops(&env, &[]), ["new-1", "mid-1", "old-1"]);
    assert_eq!(json_ops(&env, &["--since", "2h"]), ["new-1"]);
    assert_eq!(json_ops(&env, &["--since", "4h"]), ["new-1", "mid-1"]);
    assert_eq!(json_ops(&env, &["--since", "3650d"]).len(), 3);
    assert_eq!(json_ops(&env, &["--limit", "2"]), ["new-1", "mid-1"]);
    assert_eq!(
        json_ops(&env, &["--since", "4h", "--limit", "1"]),
        ["new-1"]
    );
    let table = ok(
        env.opmark()
            .args(["list", "--since", "2h"])
            .output()
            .unwrap(),
        "table",
    );
    assert!(
        table.contains("new-1") && !table.contains("mid-1"),
        "{table}"
    );

    // Bad values are refused with the fix, before anything is read.
    let out = env
        .opmark()
        .args(["list", "--since", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("2h"), "{}", text(&out.stderr));
    let out = env
        .opmark()
        .args(["list", "--limit", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245));
    assert!(
        text(&out.stderr).contains("at least 1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn list_shows_local_time_by_default_and_utc_with_the_flag() {
    let env = Sealed::new(crate::test_name!());
    seed(&env.ledger, &[("tz-1", "web1")]);
    backdate(&env.ledger, "tz-1", "2026-03-04T22:30:00.000000Z");
    // A POSIX TZ string needs no tz database: "XYZ-3" is three hours east of UTC.
    let list = |args: &[&str]| {
        ok(
            env.opmark()
                .env("TZ", "XYZ-3")
                .arg("list")
                .args(args)
                .output()
                .unwrap(),
            "list",
        )
    };
    let local = list(&[]);
    // The zone is said under the table (the header stays narrow); times carry the year
    // and the seconds.
    assert!(local.contains("times: local, UTC+03:00"), "{local}");
    assert!(local.contains("2026-03-05 01:30:00"), "{local}");
    let utc = list(&["--utc"]);
    assert!(utc.contains("times: UTC"), "{utc}");
    assert!(utc.contains("2026-03-04 22:30:00"), "{utc}");
}

/// Every byte an ESC would start: any colour or cursor code.
fn has_escape(bytes: &[u8]) -> bool {
    bytes.contains(&0x1b)
}

#[test]
fn nothing_written_to_a_pipe_carries_colour_codes() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let runs: &[&[&str]] = &[
        &[
            "-vvv", "run", "target1", "--op", "ansi-1", "--", "echo", "hi",
        ],
        &[
            "-vvv", "--json", "run", "target1", "--op", "ansi-1", "--", "echo", "hi",
        ],
        &["-vvv", "probe", "target1", "ansi-1"],
        &["-vvv", "list"],
        &["-vvv", "show", "ansi-1"],
        &["-vvv", "classify", "--", "ls"],
        &["-vvv", "policy", "show"],
        &["-vvv", "show", "no-such-op"],
        &["-vvv", "list", "--bogus-flag"],
    ];
    let mut traced = false;
    for args in runs {
        let out = env.opmark_with_lab(&lab).args(*args).output().unwrap();
        let stderr = text(&out.stderr);
        traced |= stderr.contains("DEBUG");
        let start = |t: &str| t.chars().take(300).collect::<String>();
        assert!(
            !has_escape(&out.stdout),
            "{args:?} stdout: {:?}",
            start(&text(&out.stdout))
        );
        assert!(
            !has_escape(&out.stderr),
            "{args:?} stderr: {:?}",
            start(&stderr)
        );
    }
    assert!(
        traced,
        "-vvv printed no trace lines, so nothing was checked"
    );
}

#[test]
fn a_run_records_the_rule_that_classified_it_by_name() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let out = ok(
        env.opmark_with_lab(&lab)
            .args([
                "--json", "run", "target1", "--op", "named-1", "--", "echo", "hi",
            ])
            .output()
            .unwrap(),
        "run",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"], "completed");
    let rule = "built-in command-classes.toml rule #10 (shell-builtins)";
    assert_eq!(v["rule"], rule);
    let page = ok(
        env.opmark().args(["show", "named"]).output().unwrap(),
        "show",
    );
    // The page wraps at 80 columns: compare with the line breaks taken out.
    let unwrapped = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        unwrapped.contains(&format!("family read-only, by {rule}")),
        "{page}"
    );
}

/// `opmark --json ARGS`: exit 2, the usage error document on stdout, clap's text on stderr.
fn usage_error(env: &Sealed, args: &[&str]) -> (String, String) {
    let out = env.opmark().arg("--json").args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: {}",
        text(&out.stderr)
    );
    let doc = crate::json::document(&format!("{args:?}"), &out);
    assert_eq!(doc["error"]["reason_code"], "usage", "{doc}");
    assert_eq!(doc["error"]["retryable"], false, "{doc}");
    let message = doc["error"]["message"].as_str().unwrap().to_owned();
    (message, text(&out.stderr))
}

#[test]
fn a_usage_error_under_json_names_the_argument_and_what_was_wrong() {
    let env = Sealed::new(crate::test_name!());
    // (args, what the message must say)
    let cases: [(&[&str], &[&str]); 4] = [
        (&["list", "--limit", "many"], &["'many'", "--limit"]),
        (
            &["resolve", "op-1", "--as", "maybe", "--note", "n"],
            &["'maybe'", "--as", "applied, not-applied, abandoned"],
        ),
        (&["run", "--bogus", "target1", "--", "true"], &["'--bogus'"]),
        (&["show"], &["<OP>", "usage: opmark show"]),
    ];
    for (args, needles) in cases {
        let (message, _) = usage_error(&env, args);
        assert!(
            !message.contains("for one of the arguments"),
            "{args:?}: clap's kind, not its detail: {message}"
        );
        for needle in needles {
            assert!(
                message.contains(needle),
                "{args:?}: no {needle} in {message}"
            );
        }
        assert!(!message.contains('\n'), "{args:?}: {message:?}");
    }
}

#[test]
fn run_without_dashes_hints_that_the_command_goes_after_them() {
    let env = Sealed::new(crate::test_name!());
    let fix = "opmark run HOST [--op ID] -- CMD";
    for args in [
        &["run", "target1", "echo", "hi"][..],
        &["run", "target1"][..],
    ] {
        let (message, stderr) = usage_error(&env, args);
        assert!(message.contains("<CMD>"), "{args:?}: {message}");
        assert!(message.contains(fix), "{args:?}: no hint in {message}");
        assert!(
            stderr.contains(fix),
            "{args:?}: no hint on stderr: {stderr}"
        );
        // The person's screen has the hint too.
        let out = env.opmark().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains(fix), "{}", text(&out.stderr));
    }
    // With a command after `--`, what is missing is a host: the hint says that instead.
    let (message, _) = usage_error(&env, &["run", "--op", "x", "--", "true"]);
    assert!(message.contains("no host before `--`"), "{message}");
    assert!(!message.contains("the command goes after"), "{message}");
}
