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
