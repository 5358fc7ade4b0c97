//! The command line itself: every subcommand's help describes the surface of
//! docs/guarantees.md#the-command-line-contract, and bad input is refused before anything
//! happens.

use std::collections::BTreeMap;
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

/// The entries of the top-level help's `Commands:` list: each subcommand with its summary.
/// Only that list says which subcommands exist: the rest of the help (the exit-code text
/// names `opmark run`, `opmark list | head` and the audit chain) mentions some of their names too.
fn listed_subcommands(top: &str) -> BTreeMap<String, String> {
    let list = top
        .split("Commands:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no Commands: list in the help:\n{top}"));
    let list = list.split("\n\n").next().unwrap_or_default();
    list.lines()
        .filter_map(|l| {
            let entry = l.strip_prefix("  ")?;
            let (name, summary) = entry.split_once("  ")?;
            (!name.is_empty()).then(|| (name.to_owned(), summary.trim().to_owned()))
        })
        .collect()
}

#[test]
fn help_describes_every_subcommand_and_option_of_the_spec() {
    let top = help(&[]);
    let listed = listed_subcommands(&top);
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
        "cancel",
        "mcp",
        "completions",
        "policy",
    ] {
        let summary = listed.get(sub).map(String::as_str).unwrap_or_default();
        assert!(
            !summary.is_empty(),
            "the top-level help's Commands: list lacks {sub} (listed: {:?})",
            listed.keys()
        );
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
            secrets: Vec::new(),
            become_user: None,
            locks: Vec::new(),
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

#[test]
fn boolean_variables_take_the_usual_spellings_and_a_bad_one_names_the_variable() {
    let env = Sealed::new("bool-env");
    // Quiet for real: a refused command's `opmark:` line is gone, its verdict is not.
    for on in ["1", "true", "yes", "on", "TRUE"] {
        let out = env
            .opmark()
            .env("OPMARK_QUIET", on)
            .args(["run", "nohost.invalid", "--op", "../q", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(245),
            "OPMARK_QUIET={on}: {}",
            text(&out.stderr)
        );
        assert!(
            !text(&out.stderr).contains("opmark:"),
            "OPMARK_QUIET={on}: {}",
            text(&out.stderr)
        );
    }
    for off in ["0", "false", "no", "off"] {
        let out = env
            .opmark()
            .env("OPMARK_QUIET", off)
            .args(["run", "nohost.invalid", "--op", "../q", "--", "true"])
            .output()
            .unwrap();
        assert!(
            text(&out.stderr).contains("opmark:"),
            "OPMARK_QUIET={off}: {}",
            text(&out.stderr)
        );
    }
    for (var, value) in [("OPMARK_QUIET", "maybe"), ("OPMARK_PERSIST", "forever")] {
        let out = env
            .opmark()
            .env(var, value)
            .args(["classify", "--", "ls"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("{var}=\"{value}\"")), "{err}");
        assert!(
            !err.contains("--quiet") && !err.contains("--persist"),
            "names a flag nobody typed: {err}"
        );
    }
    for off in ["off", "0", "no"] {
        let out = env
            .opmark()
            .env("OPMARK_PERSIST", off)
            .args(["classify", "--", "ls"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "OPMARK_PERSIST={off}: {}",
            text(&out.stderr)
        );
    }
    // An MCP server configured with OPMARK_QUIET=1 serves.
    let mut mcp = env
        .opmark()
        .env("OPMARK_QUIET", "1")
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::{BufRead, Write};
        let mut stdin = mcp.stdin.take().unwrap();
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
        )
        .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(mcp.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains(r#""serverInfo""#),
            "OPMARK_QUIET=1 opmark mcp answered: {line:?}"
        );
        drop(stdin);
    }
    let _ = mcp.kill();
    let _ = mcp.wait();
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
    let mut inner = env.opmark();
    inner.env_remove("USER").env_remove("LOGNAME").args([
        "resolve", "uptime-1", "--host", "web1", "--as", "applied", "--note", "checked",
    ]);
    let out = crate::support::runnable_by_any_user(&inner)
        .uid(uid)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(245), "{stderr}");
    assert!(stderr.contains("--operator"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

// --- The client's environment (docs/ledger.md#where-the-ledger-lives) -------------------

/// `operation.state` and `operation.exit_code` of `op` as `show --json` tells them.
fn settled_state(env: &Sealed, op: &str) -> (String, serde_json::Value) {
    let out = env.opmark().args(["--json", "show", op]).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("show {op}: {e}: {}", text(&out.stderr)));
    (
        doc["operation"]["state"].as_str().unwrap_or("").to_owned(),
        doc["operation"]["exit_code"].clone(),
    )
}

fn line_count(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// The directory an opmark without HOME runs in: writable by anyone, so that a ledger
/// or key made "relative to the current directory" would land here.
fn open_cwd(name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let cwd = crate::support::fresh_dir(name).join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o777)).unwrap();
    cwd
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// `env.opmark()` as cron or a systemd unit runs it: no HOME, no XDG_STATE_HOME, no
/// OPMARK_LEDGER, in `cwd`.
fn without_home(env: &Sealed, cwd: &std::path::Path) -> Command {
    let mut cmd = env.opmark();
    cmd.env_remove("HOME")
        .env_remove("XDG_STATE_HOME")
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("OPMARK_LEDGER")
        .current_dir(cwd);
    cmd
}

/// `inner` run through `wrapper` (`setpriv ...`, `unshare ...`), with exactly `inner`'s
/// environment and directory.
fn wrapped(wrapper: &[&str], inner: &Command) -> Command {
    let mut cmd = Command::new(wrapper[0]);
    cmd.args(&wrapper[1..])
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    if let Some(dir) = inner.get_current_dir() {
        cmd.current_dir(dir);
    }
    cmd
}

/// The home directory /etc/passwd gives root.
fn roots_passwd_home() -> Option<std::path::PathBuf> {
    std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 5 && f[2] == "0").then(|| std::path::PathBuf::from(f[5]))
        })
}

#[test]
fn without_home_the_ledger_and_key_go_to_the_passwd_home_never_the_current_directory() {
    let test = crate::test_name!();
    if !crate::support::require_root(test)
        || !crate::support::require_tools(test, &["unshare", "mount"])
    {
        return;
    }
    let Some(lab) = crate::support::loopback_lab(1) else {
        return;
    };
    let Some(passwd_home) = roots_passwd_home() else {
        panic!("{test}: /etc/passwd names no home for root");
    };
    let env = Sealed::new(test);
    let cwd = open_cwd(test);
    // Root's passwd home, replaced (in a mount namespace of its own) by an empty
    // directory: where the ledger lands shows where opmark looked.
    let fake_home = crate::support::fresh_dir(test).join("passwd-home");
    std::fs::create_dir_all(&fake_home).unwrap();
    let count = cwd.parent().unwrap().join("count");
    let mut inner = without_home(&env, &cwd);
    inner
        .arg("-F")
        .arg(lab.ssh_config())
        .args([
            "--json",
            "run",
            &lab.targets()[0].alias,
            "--op",
            "cron-1",
            "--",
        ])
        .arg(format!("echo ran >> {}", count.display()));
    let script = r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#;
    let (fake, real) = (
        fake_home.display().to_string(),
        passwd_home.display().to_string(),
    );
    let mut cmd = wrapped(
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            &fake,
            &real,
        ],
        &inner,
    );
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(line_count(&count), 1);
    let state = fake_home.join(".local/state/opmark");
    assert!(
        state.join("ledger.db").is_file(),
        "the ledger is under the passwd home"
    );
    assert!(state.join("ledger.key").is_file(), "and its key beside it");
    assert!(
        entries(&cwd).is_empty(),
        "nothing in the current directory: {:?}",
        entries(&cwd)
    );
}

#[test]
fn without_any_home_the_ledger_is_refused_naming_the_fix_and_nothing_is_created() {
    let test = crate::test_name!();
    if !crate::support::require_root(test) || !crate::support::require_tools(test, &["setpriv"]) {
        return;
    }
    let env = Sealed::new(test);
    let cwd = open_cwd(test);
    // A uid with no passwd entry (as in a container run with --user 54321).
    let mut inner = without_home(&env, &cwd);
    inner.args(["run", "somewhere", "--op", "nohome-1", "--", "true"]);
    let mut as_nobody = wrapped(
        &[
            "setpriv",
            "--reuid=54321",
            "--regid=54321",
            "--clear-groups",
        ],
        &inner,
    );
    let out = as_nobody.output().unwrap();
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(248), "{said}");
    assert!(
        said.contains("set HOME") && said.contains("--ledger PATH"),
        "the refusal names the fix: {said}"
    );
    assert!(entries(&cwd).is_empty(), "{:?}", entries(&cwd));
    // A relative XDG_STATE_HOME is ignored, as the XDG spec says: not a ledger in ./rel.
    // (The run itself fails: `somewhere` resolves nowhere; the ledger comes first.)
    let out = without_home(&env, &cwd)
        .env("HOME", &env.home)
        .env("XDG_STATE_HOME", "rel")
        .args(["run", "somewhere.invalid", "--op", "rel-1", "--", "true"])
        .output()
        .unwrap();
    assert!(
        env.home.join(".local/state/opmark/ledger.db").is_file(),
        "{}",
        text(&out.stderr)
    );
    assert!(entries(&cwd).is_empty(), "{:?}", entries(&cwd));
}

#[test]
fn a_ledger_key_readable_by_others_is_refused_with_chmod_600_and_nothing_runs() {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(lab) = crate::support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = crate::support::fresh_dir(crate::test_name!());
    let count = dir.join("count");
    let alias = lab.targets()[0].alias.clone();
    // One intent per op id: the same append under a new op id would be held back as a
    // repetition (docs/guarantees.md#repetitions).
    let run = |op: &str| {
        env.opmark_with_lab(&lab)
            .args(["run", &alias, "--op", op, "--"])
            .arg(format!("echo ran >> {}; : {op}", count.display()))
            .output()
            .unwrap()
    };
    let first = run("key-mode-1");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let key = opmark::ledger::key_path_beside(&env.ledger);
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600,
        "made private"
    );
    let secret = hex::encode(std::fs::read(&key).unwrap());
    for mode in [0o644, 0o640, 0o604, 0o620] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = run(&format!("key-mode-{mode:o}"));
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(248), "mode {mode:o}: {said}");
        let fix = format!("chmod 600 {}", key.display());
        assert!(
            said.contains(&fix),
            "mode {mode:o}: names the path and the fix: {said}"
        );
        assert!(
            !said.contains(&secret[..16]),
            "no key material in the message"
        );
        assert_eq!(line_count(&count), 1, "mode {mode:o}: nothing ran");
    }
    // The same refusal for a key named with --ledger-key.
    let out = env
        .opmark()
        .arg("--ledger-key")
        .arg(&key)
        .args(["list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(248), "{}", text(&out.stderr));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(run("key-mode-ok").status.success());
    assert_eq!(line_count(&count), 2);
}

/// `-vvv run … 2>&1 | head -2`, stdout to a closed pipe, stderr to /dev/full: the run goes
/// on, its verdict is recorded, the command ran once, and the exit status is 141 (a
/// reader went away) or the verdict's own code (docs/guarantees.md#the-command-line-contract).
#[test]
fn a_closed_or_full_stdout_or_stderr_never_aborts_a_run_and_the_verdict_is_recorded() {
    use std::io::BufRead as _;
    let Some(lab) = crate::support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = crate::support::fresh_dir(crate::test_name!());
    let alias = lab.targets()[0].alias.clone();
    let run = |op: &str, file: &str, extra: &[&str]| {
        let mut cmd = env.opmark_with_lab(&lab);
        cmd.args(extra)
            .args(["run", &alias, "--op", op, "--"])
            .arg(format!(
                "echo ran >> {}; sleep 0.3; seq 1 2000; seq 1 2000 >&2; exit 3",
                dir.join(file).display()
            ));
        cmd
    };

    // -vvv … 2>&1 | head -2: both streams on one pipe whose reader leaves after 2 lines.
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = run("head-2", "head", &["-vvv"])
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    {
        let mut lines = std::io::BufReader::new(reader).lines();
        for _ in 0..2 {
            lines.next().expect("two lines").unwrap();
        }
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141), "a reader that left: 141");
    assert_eq!(line_count(&dir.join("head")), 1, "the command ran once");
    let (state, exit) = settled_state(&env, "head-2");
    assert_eq!(
        state, "completed",
        "the verdict is recorded, not left dispatched"
    );
    assert_eq!(exit, 3);

    // stdout to a pipe closed before opmark starts, plain and --json.
    for (op, extra) in [("closed-out", &[][..]), ("closed-json", &["--json"][..])] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = run(op, op, extra)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let said = text(&out.stderr);
        assert!(!said.contains("panicked"), "{op}: {said}");
        assert_eq!(out.status.code(), Some(141), "{op}: {said}");
        assert_eq!(line_count(&dir.join(op)), 1, "{op}: ran once");
        assert_eq!(settled_state(&env, op).0, "completed", "{op}");
    }

    // stderr to /dev/full, with tracing on: nothing is closed, the verdict's code stands.
    for (op, extra) in [("full-err", &["-vvv"][..]), ("full-err-v", &["-v"][..])] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = run(op, op, extra)
            .stdout(std::process::Stdio::piped())
            .stderr(full)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{op}: the command's own status");
        assert!(
            text(&out.stdout).ends_with("2000\n"),
            "{op}: stdout unharmed"
        );
        assert_eq!(line_count(&dir.join(op)), 1, "{op}: ran once");
        assert_eq!(
            settled_state(&env, op),
            ("completed".into(), 3.into()),
            "{op}"
        );
    }
}
