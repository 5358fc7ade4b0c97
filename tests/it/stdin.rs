//! Standard input as a user of `ssh HOST CMD` expects it (docs/guarantees.md#standard-input):
//! a file or a fed pipe reaches the command without `--stdin`, a pipe that stays silent is
//! refused before anything is sent, and nothing is ever dropped without a word.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{self, answer, finish_within, Sealed, StderrLines};

/// `opmark run target1 ARGS` in `env`, stdin as given.
fn run_with(env: &Sealed, lab: &support::Lab, args: &[&str], stdin: Stdio) -> Command {
    let mut cmd = env.opmark_with_lab(lab);
    cmd.args(["--json", "run", "target1"])
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn a_file_on_stdin_reaches_the_command_without_the_flag_as_with_ssh() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let conf = support::fresh_dir(crate::test_name!()).join("app.conf");
    std::fs::write(&conf, "listen 8080\nworkers 4").unwrap();
    let file = || Stdio::from(std::fs::File::open(&conf).unwrap());

    let push = answer(
        run_with(
            &env,
            &lab,
            &[
                "--op",
                "push-conf-1",
                "--",
                "cat > app.conf; wc -c < app.conf",
            ],
            file(),
        )
        .output()
        .unwrap(),
    );
    assert_eq!(push.verdict(), "completed", "{push:?}");
    assert_eq!(push.stdout().trim(), "21", "the file's 21 bytes: {push:?}");

    // The same intent as --stdin spells it: a rerun with the flag replays, runs nothing.
    let again = answer(
        run_with(
            &env,
            &lab,
            &[
                "--op",
                "push-conf-1",
                "--stdin",
                "--",
                "cat > app.conf; wc -c < app.conf",
            ],
            file(),
        )
        .output()
        .unwrap(),
    );
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!(again.stdout().trim(), "21", "{again:?}");

    // -n (ssh -n) reads nothing, whatever stdin is.
    let without = answer(
        run_with(
            &env,
            &lab,
            &["--op", "no-input-1", "-n", "--", "wc -c"],
            file(),
        )
        .output()
        .unwrap(),
    );
    assert_eq!(without.stdout().trim(), "0", "{without:?}");
}

#[test]
fn a_pipe_fed_by_the_pipeline_is_forwarded_and_one_closed_empty_forwards_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let mut child = run_with(&env, &lab, &["--", "cat | wc -l"], Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"a\nb\n").unwrap();
    let fed = answer(finish_within(child, Duration::from_secs(60), "a fed pipe"));
    assert_eq!(fed.stdout().trim(), "2", "printf 'a\\nb\\n' | ...: {fed:?}");

    let mut child = run_with(&env, &lab, &["--", "wc -c"], Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let closed = answer(finish_within(
        child,
        Duration::from_secs(60),
        "a closed pipe",
    ));
    assert_eq!(closed.verdict(), "completed", "{closed:?}");
    assert_eq!(closed.stdout().trim(), "0", "{closed:?}");
}

#[test]
fn a_pipe_left_open_and_silent_is_refused_at_once_with_nothing_sent() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    // An agent harness's stdin: a pipe nobody writes to and nobody closes.
    let mut child = run_with(
        &env,
        &lab,
        &["--op", "push-conf-2", "--", "cat > app.conf"],
        Stdio::piped(),
    )
    .spawn()
    .unwrap();
    let keep_open = child.stdin.take();
    // Bounded by completion: a hang fails here (the watchdog is not a timing claim).
    let out = finish_within(child, Duration::from_secs(60), "a silent open pipe");
    drop(keep_open);
    let refused = answer(out);
    assert_eq!(refused.status, 245, "refused, exit 245: {refused:?}");
    assert_eq!(
        refused.json["error"]["reason_code"], "invalid_input",
        "{refused:?}"
    );
    let message = refused.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    for hint in ["--stdin", "</dev/null", "nothing was sent"] {
        assert!(message.contains(hint), "names {hint}: {message}");
    }
    // Nothing recorded, nothing claimed: the op id is still free.
    assert!(!env.ledger.exists(), "a refused run created the ledger");
    let later = answer(
        run_with(
            &env,
            &lab,
            &["--op", "push-conf-2", "-n", "--", "cat > app.conf"],
            Stdio::null(),
        )
        .output()
        .unwrap(),
    );
    assert_eq!(
        later.verdict(),
        "completed",
        "ran now, not replayed: {later:?}"
    );
    assert_eq!(later.reason_code(), "command_exited", "{later:?}");
}

#[test]
fn a_fed_pipe_that_stays_open_is_waited_for_with_a_word_then_forwarded() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let mut child = run_with(&env, &lab, &["--", "wc -c"], Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(b"first part\n").unwrap();
    let mut stderr = StderrLines::of(&mut child);
    let said = stderr.wait_for("still reading stdin", Duration::from_secs(60));
    assert!(said.contains("-n"), "names the way out: {said}");
    input.write_all(b"second part\n").unwrap();
    drop(input);
    let out = finish_within(child, Duration::from_secs(60), "a pipe closed late");
    let late = answer(out);
    assert_eq!(late.stdout().trim(), "23", "both parts: {late:?}");
}

#[test]
fn stdin_on_a_terminal_is_read_only_with_the_flag_and_then_says_so() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    crate::require_tool!("script");
    let env = Sealed::new(crate::test_name!());
    let transcript = |flag: &str| {
        let line = format!(
            "{} -F {} run target1 {flag} -- 'wc -c'",
            env!("CARGO_BIN_EXE_opmark"),
            lab.ssh_config().display()
        );
        // Typed at the terminal: one line, then Ctrl-D.
        support::under_pty(&env, &line, b"hello\n\x04")
    };
    let with_flag = transcript("--stdin");
    assert!(
        with_flag.contains("reading the input to forward from the terminal until end of file"),
        "{with_flag}"
    );
    assert!(
        with_flag.lines().any(|l| l.trim() == "6"),
        "the typed line: {with_flag}"
    );
    // Without the flag the terminal is the person, not input: nothing read, no wait.
    let without = transcript("");
    assert!(
        without.lines().any(|l| l.trim() == "0"),
        "nothing read: {without}"
    );
}
