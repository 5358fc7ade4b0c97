//! The command line itself: every subcommand's help describes SPEC section 6's surface,
//! and bad input is refused before anything happens.

use std::process::Command;

use crate::support::{text, Sealed};

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_opmark"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed");
    text(&out.stdout)
}

#[test]
fn help_describes_every_subcommand_and_option_of_the_spec() {
    let top = help(&[]);
    for sub in [
        "run",
        "probe",
        "list",
        "show",
        "reconcile",
        "resolve",
        "classify",
        "audit",
        "gc",
        "stats",
        "doctor",
        "lab",
    ] {
        assert!(top.contains(sub), "top-level help lacks {sub}");
    }
    for global in [
        "--ssh-config",
        "--ledger",
        "--policy",
        "--json",
        "--verbose",
        "OPMARK_LEDGER",
    ] {
        assert!(top.contains(global), "top-level help lacks {global}");
    }
    assert!(
        top.contains("240 in_progress") && top.contains("245 refused"),
        "exit codes"
    );
    let expectations: &[(&[&str], &[&str])] = &[
        (
            &["run"],
            &[
                "--op",
                "--class",
                "--stdin",
                "--timeout",
                "--attempts",
                "--wait",
                "--approve",
                "-p",
                "-i",
                "-J",
            ],
        ),
        (&["probe"], &["<HOST>", "<OP>"]),
        (&["list"], &["--unresolved", "--host"]),
        (&["show"], &["<OP>", "--host"]),
        (&["reconcile"], &["[OPS]", "--host"]),
        (
            &["resolve"],
            &[
                "--host",
                "--as",
                "applied",
                "not-applied",
                "abandoned",
                "--note",
                "--by",
            ],
        ),
        (&["classify"], &["<CMD>"]),
        (&["audit", "verify"], &["hash chain"]),
        (&["gc"], &["--older-than", "--dry-run"]),
        (&["doctor"], &["<HOST>"]),
        (&["lab"], &["up", "down", "status", "cut", "restore"]),
    ];
    for (args, needles) in expectations {
        let h = help(args);
        for n in *needles {
            assert!(
                h.contains(n),
                "`opmark {} --help` lacks {n}:\n{h}",
                args.join(" ")
            );
        }
    }
}

#[test]
fn bad_durations_and_usage_errors_are_refused_with_a_fix() {
    let env = Sealed::new("cli-bad-input");
    let out = env
        .opmark()
        .args(["run", "h", "--wait", "30", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no unit"),
        "{}",
        text(&out.stderr)
    );
    let out = env
        .opmark()
        .args(["run", "h", "--attempts", "0", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245));
    assert!(text(&out.stderr).contains("--attempts must be at least 1"));
    assert!(!env.ledger.exists(), "nothing recorded for refused input");
}

/// A ledger with one operation in it, for commands that print one.
fn sealed_with_one_operation(name: &str) -> Sealed {
    use opmark::family::Family;
    use opmark::ledger::{Durability, Event, Ledger, OpKey};
    use opmark::vocab::RetryReason;
    let env = Sealed::new(name);
    std::fs::create_dir_all(env.ledger.parent().unwrap()).unwrap();
    let mut ledger = Ledger::open(&env.ledger).unwrap();
    let events = [
        Event::Intended {
            session: "s".into(),
            family: Family::ReadOnly,
            display: "uptime".into(),
            fingerprint: "fp".into(),
            rule: "rule".into(),
        },
        Event::AttemptDispatched {
            attempt_id: "a1".into(),
            number: 1,
            parent: None,
            reason: RetryReason::FirstAttempt,
        },
    ];
    ledger
        .append_many(&OpKey::new("uptime-1", "web1"), &events, Durability::Full)
        .unwrap();
    env
}

#[test]
fn a_reader_that_closes_early_ends_every_command_quietly_without_a_panic() {
    let env = sealed_with_one_operation("broken-pipe");
    for args in [
        &["list"][..],
        &["--json", "list"],
        &["show", "uptime-1"],
        &["--json", "show", "uptime-1"],
        &["classify", "--", "ls", "&&", "rm", "-rf", "/tmp/x"],
        &["--json", "classify", "--", "ls"],
        &["stats"],
        &["policy", "show"],
        &["--json", "policy", "show"],
        &["man"],
        &["completions", "bash"],
        &["list", "--since", "1h", "--limit", "1"],
        &["show", "uptime"],
        &["policy-is-not-a-command"],
    ] {
        // The read end is closed before opmark starts: its first write meets EPIPE, as
        // `opmark show X | head` does once head has had enough.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = env
            .opmark()
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
        if args[0] != "policy-is-not-a-command" {
            assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
            assert!(stderr.is_empty(), "{args:?} says something: {stderr}");
        }
    }
}

#[test]
fn a_host_with_a_space_or_a_shell_character_is_invalid_input_and_nothing_is_recorded() {
    let env = Sealed::new("bad-host");
    for host in ["bad host", "web1;reboot", "h$(id)", "a|b", "tab\there"] {
        for args in [
            &["run", "--op", "x1", host, "--", "true"][..],
            &["--json", "run", "--op", "x1", host, "--", "true"],
            &["probe", "--", host, "x1"],
        ] {
            let out = env.opmark().args(args).output().unwrap();
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert_eq!(out.status.code(), Some(245), "{args:?}: {stdout}{stderr}");
            assert!(
                (stdout + &stderr).contains("invalid host"),
                "{args:?} names the problem: {}",
                text(&out.stderr)
            );
            assert!(
                text(&out.stdout).contains("nothing was sent")
                    || text(&out.stderr).contains("nothing was sent")
            );
        }
    }
    // After `--`, a host that looks like an option reaches opmark (ssh's injection shape).
    let out = env
        .opmark()
        .args(["probe", "--", "-oProxyCommand=x", "x1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("starts with `-`"),
        "{}",
        text(&out.stderr)
    );
    let list = env.opmark().args(["--json", "list"]).output().unwrap();
    assert!(
        !text(&list.stdout).contains("x1"),
        "nothing recorded: {}",
        text(&list.stdout)
    );
}

#[test]
fn an_empty_opmark_variable_means_unset() {
    let env = sealed_with_one_operation("empty-env");
    // The default ledger is the one under XDG_STATE_HOME, which is where Sealed puts it.
    for var in [
        "OPMARK_LEDGER",
        "OPMARK_POLICY",
        "OPMARK_SSH_CONFIG",
        "OPMARK_SESSION",
    ] {
        let out = env.opmark().env(var, "").args(["list"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{var}=: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("uptime-1"),
            "{var}=: {}",
            text(&out.stdout)
        );
    }
    let out = env
        .opmark()
        .env("OPMARK_POLICY", "")
        .args(["classify", "--", "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// `resolve --as applied` of the one operation in `env`, without $USER and $LOGNAME
/// unless `configure` sets them (or adds arguments).
fn resolve_as(env: &Sealed, configure: impl FnOnce(&mut Command)) -> std::process::Output {
    let mut cmd = env.opmark();
    cmd.env_remove("USER").env_remove("LOGNAME");
    cmd.args([
        "resolve", "uptime-1", "--host", "web1", "--as", "applied", "--note", "checked",
    ]);
    configure(&mut cmd);
    cmd.output().unwrap()
}

#[test]
fn resolve_records_the_named_operator_never_an_unknown_one() {
    // --operator wins over everything.
    let env = sealed_with_one_operation("operator-flag");
    let out = resolve_as(&env, |c| {
        c.env("USER", "bob").args(["--operator", "alice"]);
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(
        &env.opmark()
            .args(["show", "uptime-1"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(shown.contains("alice") && !shown.contains("bob"), "{shown}");

    // No $USER: $LOGNAME.
    let env = sealed_with_one_operation("operator-logname");
    let out = resolve_as(&env, |c| {
        c.env("LOGNAME", "carol");
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(
        &env.opmark()
            .args(["show", "uptime-1"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(shown.contains("carol"), "{shown}");

    // Neither: the passwd name of the uid, as `id -un` says.
    let me = Command::new("id").arg("-un").output().unwrap();
    let me = text(&me.stdout).trim().to_owned();
    let env = sealed_with_one_operation("operator-passwd");
    let out = resolve_as(&env, |_| {});
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(
        &env.opmark()
            .args(["show", "uptime-1"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        shown.contains(&format!("operator {me}:")) && !shown.contains("unknown-operator"),
        "{shown}"
    );
}

#[test]
fn resolve_refuses_when_nobody_can_be_named() {
    use std::os::unix::process::CommandExt;
    if !crate::support::require_root(crate::test_name!()) {
        return;
    }
    // A uid with no passwd entry, no $USER and no $LOGNAME: there is no name to record.
    let uid = 54_321;
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(!passwd.lines().any(|l| l.split(':').nth(2) == Some("54321")));
    let env = sealed_with_one_operation("operator-nobody");
    let out = resolve_as(&env, |c| {
        c.uid(uid);
    });
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(245), "{stderr}");
    assert!(stderr.contains("--operator"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
