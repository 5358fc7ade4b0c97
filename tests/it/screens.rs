//! What a person sees, drawn in a real 80-column terminal (tmux): fleet progress that is
//! cleared and never glued to output, `list`, `reconcile`, `lab status`, `doctor` (of a
//! sound and of an unreachable host) and `run -h` lines that fit, ids kept whole, wrapped
//! text aligned under its column and never cut again raggedly; and the first steps
//! around them: did-you-mean for a
//! host typo (which records nothing), `resolve` without `--host`, reconcile's printed
//! command that runs as printed, `lab env`, `lab down` naming unresolved operations, and
//! shell completion of hosts and op ids.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{self, json, text, wait_for, Lab, LabSpec, Placement, Sealed};

/// Where the opmark binary lives, for a PATH that makes printed `opmark ...` commands run.
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_opmark"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `PATH` with the opmark binary first.
fn path_with_opmark() -> std::ffi::OsString {
    let mut dirs = vec![bin_dir()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// The screen (scrollback included, wrapped lines joined back: a line wider than the
/// terminal shows as one long line) after `script` ran in an 80x40 tmux terminal with
/// `env`, opmark on PATH.
fn screen(name: &str, script: &str, env: &[(&str, &Path)]) -> Vec<String> {
    recorded_screen(name, script, env, None, Duration::from_secs(60))
}

/// [`screen`], and when `raw` is given every byte the terminal received is appended to
/// that file (tmux pipe-pane, attached before the script starts): what was drawn and
/// then erased, which the final screen no longer shows. Waits up to `limit`.
fn recorded_screen(
    name: &str,
    script: &str,
    env: &[(&str, &Path)],
    raw: Option<&Path>,
    limit: Duration,
) -> Vec<String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let socket = format!(
        "opmark-{name}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let tmux = |args: &[&str]| {
        let mut c = Command::new("tmux");
        c.arg("-L").arg(&socket).args(args);
        c
    };
    let marker = "::screen-done::";
    // With a recording, the script waits for this file, made once pipe-pane is attached.
    let go = std::env::temp_dir().join(format!("{socket}.go"));
    let _ = std::fs::remove_file(&go);
    let script = match raw {
        Some(_) => format!(
            "while [ ! -e {} ]; do sleep 0.05; done; {script}",
            go.display()
        ),
        None => script.to_owned(),
    };
    let mut start = tmux(&[
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-x",
        "80",
        "-y",
        "40",
        "-s",
        "s",
        &format!("{script}; echo {marker}; exec sleep 600"),
    ]);
    start
        .env_clear()
        .env("PATH", path_with_opmark())
        .env("TERM", "xterm")
        .env("LANG", "C.UTF-8")
        .env("OPMARK_PERSIST", "0");
    for (k, v) in env {
        start.env(k, v);
    }
    let started = start.output().expect("tmux runs");
    assert!(
        started.status.success(),
        "tmux new-session failed: {}",
        text(&started.stderr)
    );
    if let Some(raw) = raw {
        let piped = tmux(&[
            "pipe-pane",
            "-t",
            "s",
            "-o",
            &format!("cat >> {}", raw.display()),
        ])
        .output()
        .expect("tmux pipe-pane");
        assert!(piped.status.success(), "{}", text(&piped.stderr));
        std::fs::write(&go, "").unwrap();
    }
    let capture = || {
        let out = tmux(&["capture-pane", "-p", "-J", "-t", "s", "-S", "-", "-E", "-"])
            .output()
            .expect("tmux capture-pane");
        text(&out.stdout)
    };
    let mut shown = String::new();
    wait_for("the script to finish in tmux", limit, || {
        shown = capture();
        shown.lines().any(|l| l.trim() == marker)
    });
    let _ = tmux(&["kill-server"]).status();
    let _ = std::fs::remove_file(&go);
    let lines: Vec<String> = shown
        .lines()
        .take_while(|l| l.trim() != marker)
        .map(|l| l.trim_end().to_owned())
        .collect();
    lines
}

/// The table row of `op`, whole: its line, and the line under it when the op id stands
/// alone on its line (a long op id leaves no room for the columns beside it).
fn row_of(lines: &[String], op: &str) -> String {
    let at = lines
        .iter()
        .position(|l| l.contains(&format!(" {op}")))
        .unwrap_or_else(|| panic!("the op id {op} is whole:\n{}", lines.join("\n")));
    if lines[at].trim_end().ends_with(op) {
        format!("{} {}", lines[at], lines[at + 1].trim_start())
    } else {
        lines[at].clone()
    }
}

/// Every line fits in 80 terminal columns.
fn assert_fits(what: &str, lines: &[String]) {
    for l in lines {
        let w = opmark::text::width(l);
        assert!(
            w <= 80,
            "{what}: a line of {w} columns:\n{l}\n--- screen ---\n{}",
            lines.join("\n")
        );
    }
}

/// Every line that `goes_on` from the line before it is there because its first word
/// did not fit on that line: no ragged wrap, as when a text wrapped for a wider screen is
/// cut again and leaves short lines behind. A line ending in `\` (a pasted command
/// going on) is a deliberate break.
fn assert_wrapped_cleanly(what: &str, lines: &[String], goes_on: impl Fn(&str, &str) -> bool) {
    for pair in lines.windows(2) {
        let (before, line) = (&pair[0], &pair[1]);
        if before.ends_with('\\') || !goes_on(before, line) {
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        let room = 80usize.saturating_sub(opmark::text::width(before));
        assert!(
            opmark::text::width(first) + 1 > room,
            "{what}: {line:?} goes on from {before:?}, where its first word would have fit:\n{}",
            lines.join("\n")
        );
    }
}

/// `doctor`'s screen: each line is its title, a check's verdict (`ok`, `FAIL`, `skip`),
/// a line under the check's detail column (18), or its last line; detail and fix lines
/// wrap there cleanly.
fn assert_doctor_layout(lines: &[String]) {
    let verdict = regex::Regex::new(r"^  (ok  |FAIL|skip) [a-z_]+ +\S").unwrap();
    let under = " ".repeat(18);
    for l in lines {
        assert!(
            l.starts_with("doctor ")
                || l == "all checks passed"
                || l == "some checks failed (see fix:)"
                || verdict.is_match(l)
                || l.starts_with(&under),
            "doctor: a line out of its column: {l:?}\n{}",
            lines.join("\n")
        );
    }
    assert_wrapped_cleanly("doctor", lines, |_, line| {
        line.starts_with(&under) && !line.trim_start().starts_with("fix:")
    });
}

fn env_of<'a>(env: &'a Sealed, lab: &'a Lab) -> Vec<(&'a str, &'a Path)> {
    vec![
        ("HOME", env.home.as_path()),
        ("XDG_STATE_HOME", env.state.as_path()),
        ("XDG_CONFIG_HOME", env.config.as_path()),
        ("OPMARK_LEDGER", env.ledger.as_path()),
        ("OPMARK_SSH_CONFIG", lab.ssh_config()),
    ]
}

/// A lab in a short directory, so that its paths leave room on an 80-column line.
fn short_lab(name: &str, count: usize) -> Option<Lab> {
    if !support::require_tools(name, &["sshd", "ssh", "ssh-keygen", "tmux"]) {
        return None;
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(format!(
        "/tmp/oms-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = LabSpec {
        count,
        placement: Placement::Loopback,
        dir,
    };
    Some(Lab::start(&spec).unwrap_or_else(|e| panic!("{name}: lab did not start: {e}")))
}

#[test]
fn the_fleet_progress_line_is_never_glued_to_output_and_is_gone_after_the_run() {
    let Some(lab) = short_lab(crate::test_name!(), 3) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let lines = screen(
        "fleet",
        "opmark run target1 target2 target3 --op fleet-screen -- 'for i in 1 2 3; do echo step $i; sleep 0.2; done'",
        &env_of(&env, &lab),
    );
    assert_fits("fleet run", &lines);
    let steps = lines.iter().filter(|l| l.contains(": step ")).count();
    assert_eq!(
        steps,
        9,
        "every output line on its own line:\n{}",
        lines.join("\n")
    );
    assert!(
        !lines.iter().any(|l| l.contains(" running, ")),
        "the progress line is gone after the run:\n{}",
        lines.join("\n")
    );
    for host in ["target1", "target2", "target3"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("opmark: {host}: completed"))),
            "{}",
            lines.join("\n")
        );
    }
}

#[test]
fn list_rows_fit_80_columns_with_whole_op_ids_a_command_column_and_full_dates() {
    let Some(lab) = short_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let long_op = "release-2026-12-01-frontend-and-backend-canary-wave-3";
    let long_cmd = format!("echo {}", "deploying everything everywhere ".repeat(4));
    for (op, cmd) in [(long_op, long_cmd.as_str()), ("short-1", "true")] {
        let out = env
            .opmark_with_lab(&lab)
            .args(["run", "target1", "--op", op, "--", cmd])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let lines = screen("list", "opmark list", &env_of(&env, &lab));
    assert_fits("list", &lines);
    let header = lines
        .iter()
        .find(|l| l.contains("HOST"))
        .unwrap_or_else(|| panic!("{}", lines.join("\n")));
    assert!(
        header.contains("COMMAND") && header.contains("UPDATED"),
        "{header}"
    );
    let row = row_of(&lines, long_op);
    // A local time with the year and the seconds.
    let date = regex::Regex::new(r"\b20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\b").unwrap();
    assert!(date.is_match(&row), "{row}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("$ echo deploying") || l.contains(" echo deploying")),
        "{}",
        lines.join("\n")
    );
    let short = row_of(&lines, "short-1");
    assert!(short.ends_with("true"), "{short}");

    // --wide (and -o wide): the whole command on the row, the family too.
    for wide in ["--wide", "-o wide"] {
        let lines = screen(
            "list-wide",
            &format!("opmark list {wide}"),
            &env_of(&env, &lab),
        );
        let row = lines.iter().find(|l| l.contains(long_op)).unwrap();
        assert!(row.contains(long_cmd.trim_end()), "{wide}: {row}");
        assert!(lines[0].contains("FAMILY"), "{wide}: {}", lines.join("\n"));
    }
}

/// An operation whose client died right after its request left: unresolved.
fn crashed_after_dispatch(env: &Sealed, lab: &Lab, op: &str) {
    let crashed = env
        .opmark_with_lab(lab)
        .env("OPMARK_FAULT", "after_dispatch")
        .args(["run", "target1", "--op", op, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), None, "killed at its fault point");
}

/// The command after `label`, with the lines it goes on over (ending in `\`), as a
/// person would paste it.
fn printed_command(lines: &[String], label: &str) -> String {
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` command:\n{}", lines.join("\n")));
    let mut command = lines[at].trim_start()[label.len()..].to_owned();
    let mut next = at + 1;
    while command.ends_with('\\') {
        command.push('\n');
        command.push_str(&lines[next]);
        next += 1;
    }
    command
}

#[test]
fn reconcile_keeps_ids_whole_in_80_columns_and_its_printed_commands_run_as_printed() {
    let Some(lab) = short_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let op = "maintenance-window-2026-12-01-database-failover-step-7";
    crashed_after_dispatch(&env, &lab, op);
    let env2 = Sealed::new("reconcile-flags");
    crashed_after_dispatch(&env2, &lab, "op-flags-1");
    // The host is gone: reconcile cannot settle them.
    lab.stop_sshd(&lab.targets()[0].alias).unwrap();
    let lines = screen("reconcile", "opmark reconcile", &env_of(&env, &lab));
    assert_fits("reconcile", &lines);
    let row = row_of(&lines, op);
    assert!(row.starts_with('!') && row.contains("target1"), "{row}");
    // The host cannot be reached: looking comes first, and runs as printed.
    let look = printed_command(&lines, "look: ");
    assert!(look.starts_with("opmark show"), "{look}");
    let out = Command::new("sh")
        .arg("-c")
        .arg(&look)
        .env_clear()
        .env("PATH", path_with_opmark())
        .envs(env_of(&env, &lab))
        .env("OPMARK_PERSIST", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{look}: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains(op), "{}", text(&out.stdout));
    // The decision is offered with its choices open and no note: a person fills them
    // in with what they found (and --force, as the host is still unreachable).
    let decide = printed_command(&lines, "then: ");
    assert!(decide.starts_with("opmark resolve"), "{decide}");
    assert!(decide.contains("--note '<what you found>'"), "{decide}");
    let decide = decide
        .replace("applied|not-applied|abandoned", "abandoned")
        .replace("<what you found>", "host retired, checked in the console")
        + " --force";
    let out = Command::new("sh")
        .arg("-c")
        .arg(&decide)
        .env_clear()
        .env("PATH", path_with_opmark())
        .envs(env_of(&env, &lab))
        .env("USER", "operator")
        .env("OPMARK_PERSIST", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{decide}: {}", text(&out.stderr));
    let shown = json(&env.opmark().args(["--json", "show", op]).output().unwrap());
    assert_eq!(shown["operation"]["unresolved"], false, "{shown}");

    // The same hint with -F given on the command line carries -F.
    let out = env2
        .opmark_with_lab(&lab)
        .arg("reconcile")
        .output()
        .unwrap();
    let said: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    let decide = printed_command(&said, "look: ");
    assert!(
        decide.contains(&format!("-F {}", lab.ssh_config().display())),
        "{decide}"
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&decide)
        .env_clear()
        .env("PATH", path_with_opmark())
        .env("HOME", &env2.home)
        .env("OPMARK_LEDGER", &env2.ledger)
        .env("USER", "operator")
        .env("OPMARK_PERSIST", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{decide}: {}", text(&out.stderr));
}

#[test]
fn lab_status_and_doctor_lines_fit_80_columns() {
    let Some(lab) = short_lab(crate::test_name!(), 2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = lab.dir().display().to_string();
    let lines = screen(
        "status",
        &format!("opmark lab status --dir {dir}"),
        &env_of(&env, &lab),
    );
    assert_fits("lab status", &lines);
    assert!(
        lines.iter().any(|l| l.contains("markers in")),
        "{}",
        lines.join("\n")
    );
    let lines = screen("doctor", "opmark doctor target1", &env_of(&env, &lab));
    assert_fits("doctor", &lines);
    assert!(
        lines.iter().any(|l| l.contains("all checks passed")),
        "{}",
        lines.join("\n")
    );
    assert_doctor_layout(&lines);
}

#[test]
fn run_help_fits_80_columns_with_its_descriptions_and_tables_under_their_columns() {
    if !support::require_tools(crate::test_name!(), &["tmux"]) {
        return;
    }
    let env = Sealed::new(crate::test_name!());
    let lines = screen("run-help", "opmark run -h", &[("HOME", env.home.as_path())]);
    assert_fits("run -h", &lines);
    let section = |from: &str, to: &str| -> Vec<String> {
        lines
            .iter()
            .skip_while(|l| !l.starts_with(from))
            .skip(1)
            .take_while(|l| !l.starts_with(to))
            .cloned()
            .collect()
    };
    // Each option, then its description under column 10.
    let options = section("Options:", "Exit status:");
    assert!(options.len() > 40, "{}", lines.join("\n"));
    let description = " ".repeat(10);
    for l in options.iter().filter(|l| !l.is_empty()) {
        assert!(
            l.starts_with("  -") || l.starts_with("      --") || l.starts_with(&description),
            "run -h: an option line out of its column: {l:?}\n{}",
            lines.join("\n")
        );
    }
    // Each verdict's reason codes, going on under column 17.
    let codes = section("Reason codes", "Errors outside");
    let row = regex::Regex::new(r"^  [a-z_]+ +[a-z]").unwrap();
    let under = " ".repeat(17);
    for l in &codes {
        assert!(
            row.is_match(l) || l.starts_with(&under),
            "run -h: a ragged reason code line: {l:?}\n{}",
            lines.join("\n")
        );
    }
    assert_wrapped_cleanly("run -h", &lines, |before, line| {
        before.starts_with(&description) && line.starts_with(&description)
    });
}

#[test]
fn doctor_and_reconcile_of_an_unreachable_host_fit_80_columns_without_ragged_lines() {
    let Some(lab) = short_lab(crate::test_name!(), 1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let op = "maintenance-window-2026-12-01-database-failover-step-7";
    crashed_after_dispatch(&env, &lab, op);
    lab.stop_sshd(&lab.targets()[0].alias).unwrap();

    let lines = screen("doctor-down", "opmark doctor target1", &env_of(&env, &lab));
    assert_fits("doctor", &lines);
    assert_doctor_layout(&lines);
    let failed: Vec<&String> = lines.iter().filter(|l| l.starts_with("  FAIL")).collect();
    assert!(
        failed.len() == 1 && failed[0].contains(" connect "),
        "one failing check, the connect:\n{}",
        lines.join("\n")
    );
    assert!(
        lines
            .iter()
            .any(|l| l.trim_start().starts_with("fix: check that")),
        "{}",
        lines.join("\n")
    );

    let lines = screen("reconcile-down", "opmark reconcile", &env_of(&env, &lab));
    assert_fits("reconcile", &lines);
    // The op id is never cut, wherever it stands.
    for l in lines.iter().filter(|l| l.contains("maintenance-window")) {
        assert!(l.contains(op), "a cut op id: {l:?}\n{}", lines.join("\n"));
    }
    // The advice for a host that cannot be reached is whole, and what it prints to
    // paste goes on with `\` only.
    for label in ["wait, and when the host is back: ", "look: ", "then: "] {
        printed_command(&lines, label);
    }
    for (i, l) in lines.iter().enumerate() {
        if l.ends_with('\\') {
            assert!(
                lines[i + 1].starts_with("      "),
                "a pasted command goes on under its column:\n{}",
                lines.join("\n")
            );
        }
    }
}

#[test]
fn a_host_typo_gets_did_you_mean_and_records_nothing() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark_with_lab(&lab)
        .args(["run", "targte1", "--op", "typo-1", "--", "true"])
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(241), "not_applied's code: {said}");
    assert!(said.contains("did you mean `target1`?"), "{said}");
    let listed = json(&env.opmark().args(["--json", "list"]).output().unwrap());
    assert_eq!(listed["operations"], serde_json::json!([]), "{listed}");

    // JSON says the same for that host's entry of a fleet; the typo records nothing,
    // and the other host runs (the fleet shape: an entry per host).
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "--json", "run", "target1", "targte1", "--op", "typo-2", "--", "true",
        ])
        .output()
        .unwrap();
    let doc = json(&out);
    let typo = &doc["hosts"][1];
    assert_eq!(typo["host"], "targte1", "{doc}");
    assert_eq!(typo["error"]["reason_code"], "name_unresolvable", "{doc}");
    assert!(typo["error"]["message"]
        .as_str()
        .unwrap()
        .contains("did you mean `target1`"));
    assert_eq!(doc["hosts"][0]["verdict"], "completed", "{doc}");
    let listed = json(&env.opmark().args(["--json", "list"]).output().unwrap());
    let hosts: Vec<&str> = listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["host"].as_str())
        .collect();
    assert_eq!(
        hosts,
        ["target1"],
        "nothing recorded for the typo: {listed}"
    );

    // A denied command is no operation either.
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "--json", "run", "target1", "--op", "wipe-1", "--", "rm -rf /",
        ])
        .output()
        .unwrap();
    assert_eq!(json(&out)["reason_code"], "policy_denied");
    let listed = json(&env.opmark().args(["--json", "list"]).output().unwrap());
    let ops: Vec<&str> = listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["op_id"].as_str())
        .collect();
    assert_eq!(
        ops,
        ["typo-2"],
        "the denied command is not among them: {listed}"
    );
}

#[test]
fn resolve_finds_the_host_when_the_op_id_is_unique_and_asks_when_it_is_not() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    for host in ["target1", "target2"] {
        let out = env
            .opmark_with_lab(&lab)
            .env("OPMARK_FAULT", "after_dispatch")
            .args(["run", host, "--op", "twice", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), None);
    }
    let out = env
        .opmark_with_lab(&lab)
        .env("OPMARK_FAULT", "after_dispatch")
        .args(["run", "target1", "--op", "once", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None);

    let resolve = |op: &str| {
        env.opmark_with_lab(&lab)
            .args([
                "resolve",
                op,
                "--as",
                "applied",
                "--note",
                "seen in the app log",
            ])
            .output()
            .unwrap()
    };
    let out = resolve("once");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("for once on target1"),
        "{}",
        text(&out.stdout)
    );
    let out = resolve("twice");
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(245), "{said}");
    assert!(
        said.contains("target1, target2") && said.contains("--host"),
        "{said}"
    );
}

#[test]
fn lab_env_prints_the_export_that_reaches_the_lab_without_f() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark()
        .args(["lab", "env", "--dir"])
        .arg(lab.dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let export = said.lines().next().unwrap();
    assert!(export.starts_with("export OPMARK_SSH_CONFIG="), "{said}");
    // Evaluated by a shell, it is all a later run needs.
    let script = format!(
        "eval \"$(opmark lab env --dir '{}')\" && opmark run target1 --op env-1 -- echo via-env",
        lab.dir().display()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .env("PATH", path_with_opmark())
        .env("HOME", &env.home)
        .env("XDG_STATE_HOME", &env.state)
        .env("OPMARK_LEDGER", &env.ledger)
        .env("OPMARK_PERSIST", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "via-env\n");
}

#[test]
fn lab_down_names_the_unresolved_operations_on_the_targets_it_removes() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark_with_lab(&lab)
        .env("OPMARK_FAULT", "after_dispatch")
        .args(["run", "target1", "--op", "left-behind", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None);
    let out = env
        .opmark()
        .args(["lab", "down", "--dir"])
        .arg(lab.dir())
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("1 unresolved operation") && said.contains("left-behind on target1"),
        "{said}"
    );
    assert!(said.contains("opmark resolve"), "{said}");
}

/// What bash completes for `words` (the last one being completed), through the script
/// `opmark completions bash` prints.
fn bash_completes(env: &Sealed, lab: &Lab, words: &[&str]) -> Vec<String> {
    let script = env.root.join("completion.bash");
    let out = env.opmark().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(&script, &out.stdout).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let run = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_TYPE=9; _clap_complete_opmark opmark '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&run)
        .env_clear()
        .env("PATH", path_with_opmark())
        .env("HOME", &env.home)
        .env("OPMARK_LEDGER", &env.ledger)
        .env("OPMARK_SSH_CONFIG", lab.ssh_config())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or(l).trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn completion_offers_the_ssh_config_hosts_and_the_ledger_op_ids() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    if !support::require_tools(crate::test_name!(), &["bash"]) {
        return;
    }
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark_with_lab(&lab)
        .args(["run", "target2", "--op", "completed-op-1", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));

    let hosts = bash_completes(&env, &lab, &["opmark", "probe", "tar"]);
    assert!(
        hosts.iter().any(|h| h == "target1") && hosts.iter().any(|h| h == "target2"),
        "{hosts:?}"
    );
    assert!(
        !hosts.iter().any(|h| h.contains('*')),
        "no patterns: {hosts:?}"
    );
    let ops = bash_completes(&env, &lab, &["opmark", "show", "comp"]);
    assert_eq!(ops, vec!["completed-op-1".to_owned()], "{ops:?}");
    let ops = bash_completes(&env, &lab, &["opmark", "probe", "target2", ""]);
    assert!(ops.contains(&"completed-op-1".to_owned()), "{ops:?}");
}

/// Lab image tags of repository `repo` that docker holds.
fn images_of(repo: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo])
        .output()
        .expect("docker image ls");
    text(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn a_cold_image_build_shows_its_phases_in_one_status_line_that_fits_and_is_gone_after() {
    let name = crate::test_name!();
    if !support::require_tools(
        name,
        &["docker", "tmux", "ssh", "ssh-keygen", "nsenter", "nft"],
    ) || !support::require_root(name)
    {
        return;
    }
    let engine = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output();
    if !engine.is_ok_and(|o| o.status.success()) {
        support::skip_or_fail(name, "the Docker engine does not answer `docker version`");
        return;
    }
    let env = Sealed::new(name);
    // A repository nobody else uses is a cache of its own: the build is cold, and
    // removing it afterwards leaves the images other tests reuse alone.
    let repo = format!("oms{}", std::process::id());
    let dir = PathBuf::from(format!("/tmp/omi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let raw = support::fresh_dir(name).join("terminal.raw");
    let lines = recorded_screen(
        "image",
        &format!(
            "opmark lab up 1 --placement docker --kind busybox --dir {d}; opmark lab down --purge-image --dir {d}",
            d = dir.display()
        ),
        &[
            ("HOME", env.home.as_path()),
            ("XDG_STATE_HOME", env.state.as_path()),
            ("OPMARK_LEDGER", env.ledger.as_path()),
            ("OPMARK_LAB_IMAGE_REPO", Path::new(&repo)),
        ],
        Some(&raw),
        Duration::from_secs(300),
    );
    for left in images_of(&repo) {
        let _ = Command::new("docker").args(["image", "rm", &left]).status();
    }
    let screen = lines.join("\n");
    assert_fits("cold image build", &lines);
    // One start line, one line per finished phase, one for the whole: in that order.
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no line starting {needle:?}:\n{screen}"))
    };
    let order = [
        at(&format!("opmark: building image {repo}:")),
        at("opmark: image 1/2 copy files done in "),
        at("opmark: image 2/2 docker import done in "),
        at("opmark: lab image built in "),
        at("opmark lab: 1 target(s) running"),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "{order:?}:\n{screen}"
    );
    // The status line was drawn for each phase (the terminal received it) ...
    let drawn = String::from_utf8_lossy(&std::fs::read(&raw).unwrap()).into_owned();
    for phase in [
        "image 1/2 copy files 0 s (usually",
        "image 2/2 docker import ",
    ] {
        assert!(
            drawn.contains(phase),
            "the terminal never showed {phase:?}:\n{drawn:?}"
        );
    }
    // ... and is gone from the screen after the build.
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(" s (usually") || l.contains("than the usual")),
        "a status line was left on the screen:\n{screen}"
    );
}
