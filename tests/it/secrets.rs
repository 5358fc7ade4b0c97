//! Secrets (docs/trust.md#secrets) through a real sshd: `run --secret NAME=env:VAR|file:PATH`
//! gives the command the environment variable NAME and nothing else sees the value: not
//! the host's process list while the command runs, not the marker directory, not the
//! ledger's bytes, `show`, `-vvv` traces, a replay, `opmark output` or an MCP result.
//! A command that prints it shows `[REDACTED:NAME]`. Bad input sends and records nothing.
//! (The loopback lab's host is this machine, so its process list is /proc here.)

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;

use crate::redaction::files_under;
use crate::support::mcp::McpClient;
use crate::support::{answer, fresh_dir, text, Sealed};

/// The secret every test here gives; nothing else a test writes holds it.
const VALUE: &str = "Zq7-sekr1t-Wv3";

/// A value typed where its source belongs (in argv by the test's own doing, so never
/// [`VALUE`], which the process list is searched for).
const TYPED: &str = "Typed-v4lue-Qx9";

/// Whether `bytes` hold the value or its base64 (the redactor's main forms).
fn shows_secret(bytes: &[u8]) -> bool {
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(VALUE);
    [VALUE.as_bytes(), b64.as_bytes()]
        .iter()
        .any(|form| bytes.windows(form.len()).any(|w| w == *form))
}

/// Whether the ledger holds any event of `op` (no ledger at all: none).
fn recorded(env: &Sealed, op: &str) -> bool {
    if !env.ledger.exists() {
        return false;
    }
    let db = rusqlite::Connection::open(&env.ledger).unwrap();
    let n: i64 = db
        .query_row(
            "SELECT count(*) FROM events JOIN op_keys ON op_keys.id = events.op WHERE op_keys.op_id = ?1",
            [op],
            |r| r.get(0),
        )
        .unwrap();
    n > 0
}

/// Every file under `dir` that holds the secret.
fn files_leaking(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    files_under(dir, &mut files);
    files
        .into_iter()
        .filter(|f| shows_secret(&std::fs::read(f).unwrap_or_default()))
        .map(|f| f.display().to_string())
        .collect()
}

/// Any process whose arguments hold the secret, as `ps -eo args` would show them.
fn processes_leaking() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(args) = std::fs::read(entry.path().join("cmdline")) {
            if shows_secret(&args) {
                found.push(format!(
                    "{:?}: {}",
                    entry.file_name(),
                    text(&args).replace('\0', " ")
                ));
            }
        }
    }
    found
}

#[test]
fn a_secret_reaches_the_command_and_nothing_else_shows_it() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ran = fresh_dir(crate::test_name!()).join("ran");
    // It checks the value by its digest, prints it raw and in base64, and runs for a
    // while so that the process list is looked at throughout.
    let command = format!(
        "[ \"$(printf %s \"$TOKEN\" | sha256sum)\" = '{}  -' ] && echo same; \
         echo \"token=$TOKEN\"; printf '%s\\n' \"$TOKEN\" | base64; echo x >> {}; sleep 2; echo done",
        crate::support::sha(VALUE.as_bytes()),
        ran.display()
    );
    let mut child = env
        .opmark_with_lab(&lab)
        .env("DEPLOY_TOKEN", VALUE)
        .args(["-vvv", "run", "target1", "--op", "sec-1"])
        .args(["--secret", "TOKEN=env:DEPLOY_TOKEN", "--", &command])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = (
        std::thread::spawn(move || {
            let mut b = Vec::new();
            stdout.read_to_end(&mut b).unwrap();
            b
        }),
        std::thread::spawn(move || {
            let mut b = Vec::new();
            stderr.read_to_end(&mut b).unwrap();
            b
        }),
    );
    // Looks made while the command ran (it wrote `ran`, then sleeps 2 s): a count of
    // looks, not of time, so a busy machine's slower walks of /proc still count.
    let mut looks_while_running = 0;
    while child.try_wait().unwrap().is_none() {
        let running = ran.exists();
        let seen = processes_leaking();
        assert!(
            seen.is_empty(),
            "the process list shows the secret: {seen:?}"
        );
        if running {
            looks_while_running += 1;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(
        looks_while_running >= 3,
        "the process list was looked at {looks_while_running} times only while the command ran"
    );
    let status = child.wait().unwrap();
    let (out, err) = (readers.0.join().unwrap(), readers.1.join().unwrap());
    assert!(status.success(), "{}", text(&err));
    let shown = text(&out);
    assert!(
        shown.starts_with("same\ntoken=[REDACTED:TOKEN]\n[REDACTED:TOKEN]"),
        "the command had the value; what it printed of it is the mark: {shown}"
    );
    assert!(shown.ends_with("done\n"), "{shown}");
    assert!(!shows_secret(&out), "stdout: {shown}");
    assert!(
        !shows_secret(&err),
        "the -vvv traces show the secret: {}",
        text(&err)
    );
    assert_eq!(crate::support::lines(&ran), 1);

    // The host's marker root, and everything opmark keeps here (the ledger and its WAL,
    // the keeper's files).
    let root = lab.target("target1").unwrap().marker_root();
    assert_eq!(
        files_leaking(&root),
        Vec::<String>::new(),
        "the marker root"
    );
    let ledger = opmark::ledger::Ledger::open(&env.ledger).unwrap();
    assert_eq!(
        files_leaking(&env.root),
        Vec::<String>::new(),
        "opmark's files"
    );
    drop(ledger);

    // What a person or an agent reads back.
    for args in [
        &["show", "sec-1"][..],
        &["--json", "show", "sec-1"],
        &["output", "sec-1"],
        &["--json", "list"],
    ] {
        let read = env.opmark_with_lab(&lab).args(args).output().unwrap();
        assert!(
            !shows_secret(&read.stdout) && !shows_secret(&read.stderr),
            "opmark {args:?}: {}{}",
            text(&read.stdout),
            text(&read.stderr)
        );
    }
    // The record names the secret (never its value).
    let shown = env.opmark().args(["show", "sec-1"]).output().unwrap();
    assert!(
        text(&shown.stdout).contains("secrets TOKEN"),
        "{}",
        text(&shown.stdout)
    );
    let doc = crate::support::json(
        &env.opmark()
            .args(["--json", "show", "sec-1"])
            .output()
            .unwrap(),
    );
    let intended = doc["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["kind"] == "intended")
        .unwrap();
    assert_eq!(
        intended["event"]["secrets"],
        serde_json::json!(["TOKEN"]),
        "{intended}"
    );
    let kept = env
        .opmark_with_lab(&lab)
        .args(["output", "sec-1"])
        .output()
        .unwrap();
    assert!(text(&kept.stdout).contains("token=[REDACTED:TOKEN]"));

    // The same op id with the same secret replays the kept, redacted output.
    let again = answer(
        env.opmark_with_lab(&lab)
            .env("DEPLOY_TOKEN", VALUE)
            .args(["--json", "run", "target1", "--op", "sec-1"])
            .args(["--secret", "TOKEN=env:DEPLOY_TOKEN", "--", &command])
            .output()
            .unwrap(),
    );
    assert_eq!(again.verdict(), "replayed", "{}", again.stderr);
    let replayed = again.json["stdout"].as_str().unwrap_or_default();
    assert!(
        replayed.contains("token=[REDACTED:TOKEN]"),
        "{}",
        again.json
    );
    assert!(!shows_secret(again.json.to_string().as_bytes()));
    // The intent binds the secret's name: without it, the same op id is another intent.
    let without = answer(
        env.opmark_with_lab(&lab)
            .args(["--json", "run", "target1", "--op", "sec-1", "--", &command])
            .output()
            .unwrap(),
    );
    assert_eq!(without.verdict(), "conflict", "{}", without.json);
    assert_eq!(crate::support::lines(&ran), 1, "nothing ran again");

    // A later run goes through the keeper's resident session, whose requests carry the
    // secrets block the same way: the value arrives, only the mark comes back.
    let later = answer(
        env.opmark_with_lab(&lab)
            .env("DEPLOY_TOKEN", VALUE)
            .args(["--json", "run", "target1", "--op", "sec-2"])
            .args(["--secret", "TOKEN=env:DEPLOY_TOKEN", "--"])
            .arg("echo \"${#TOKEN} t=$TOKEN\"")
            .output()
            .unwrap(),
    );
    assert_eq!(later.verdict(), "completed", "{}", later.stderr);
    assert_eq!(
        later.json["stdout"],
        format!("{} t=[REDACTED:TOKEN]\n", VALUE.len()),
        "{}",
        later.json
    );
    assert_eq!(
        files_leaking(&root),
        Vec::<String>::new(),
        "the marker root"
    );
}

#[test]
fn a_secret_that_cannot_be_given_sends_and_records_nothing_and_never_echoes_a_value() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let unreadable = dir.join("no-such-file");
    let ran = dir.join("ran");
    let cases: Vec<(String, &str)> = vec![
        ("TOKEN=vault:x".into(), "unknown source \"vault\""),
        (
            format!("TOKEN=file:{}", unreadable.display()),
            "cannot read",
        ),
        (
            "2FA=env:DEPLOY_TOKEN".into(),
            "must be an upper-case environment variable name",
        ),
        (
            "MY-TOKEN=env:DEPLOY_TOKEN".into(),
            "must be an upper-case environment variable name",
        ),
        (
            "sv_shell=env:DEPLOY_TOKEN".into(),
            "must be an upper-case environment variable name",
        ),
        ("PATH=env:DEPLOY_TOKEN".into(), "cannot carry a secret"),
        ("TOKEN=env:OPMARK_TEST_UNSET_VAR".into(), "is not set"),
        // A value typed where the option's argument belongs is never repeated.
        (TYPED.into(), "has no `=`"),
        (format!("TOKEN={TYPED}"), "no env: or file: prefix"),
    ];
    for (i, (given, says)) in cases.iter().enumerate() {
        let op = format!("bad-secret-{i}");
        for json in [false, true] {
            let mut cmd = env.opmark_with_lab(&lab);
            if json {
                cmd.arg("--json");
            }
            let out = cmd
                .env("DEPLOY_TOKEN", VALUE)
                .args(["run", "target1", "--op", &op, "--secret", given])
                .args(["--", &format!("echo x >> {}", ran.display())])
                .output()
                .unwrap();
            let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
            assert!(!out.status.success(), "{given}: {said}");
            assert!(said.contains(says), "{given}: {said}");
            assert!(said.contains("nothing was sent"), "{given}: {said}");
            assert!(
                !shows_secret(said.as_bytes()),
                "{given}: the value came back: {said}"
            );
        }
        assert!(!recorded(&env, &op), "{given}: recorded");
    }
    assert!(!ran.exists(), "a command ran");
    let root = lab.target("target1").unwrap().marker_root();
    let ops: Vec<_> = std::fs::read_dir(root.join("ops"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(ops.is_empty(), "claimed on the host: {ops:?}");
}

#[test]
fn over_mcp_a_call_names_a_secret_the_server_offers_and_never_sees_its_value() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let mut cmd = env.opmark_with_lab(&lab);
    cmd.env("DEPLOY_TOKEN", VALUE)
        .args(["mcp", "--secret", "TOKEN=env:DEPLOY_TOKEN"]);
    let mut client = McpClient::start(cmd);
    let result = client.structured(
        "run",
        serde_json::json!({
            "host": "target1",
            "op_id": "mcp-sec-1",
            "command": "echo \"token=$TOKEN\"; printf %s \"$TOKEN\" | base64 >&2",
            "secrets": ["TOKEN"],
        }),
    );
    assert_eq!(result["verdict"], "completed", "{result}");
    assert_eq!(result["stdout"], "token=[REDACTED:TOKEN]\n", "{result}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .starts_with("[REDACTED:TOKEN]"),
        "{result}"
    );
    let output = client.call(
        "output",
        serde_json::json!({"op_id": "mcp-sec-1", "host": "target1"}),
    );
    assert!(!shows_secret(output.to_string().as_bytes()), "{output}");

    // A name the server does not offer: refused, naming the field and what it offers.
    let unknown = client.call(
        "run",
        serde_json::json!({
            "host": "target1",
            "op_id": "mcp-sec-2",
            "command": "echo \"$OTHER\"",
            "secrets": ["OTHER"],
        }),
    );
    let said = unknown.to_string();
    assert!(said.contains("it offers TOKEN"), "{said}");
    assert!(said.contains("\"secrets\""), "{said}");
    assert!(!shows_secret(said.as_bytes()), "{said}");
    assert!(client.close().success());
    assert!(!recorded(&env, "mcp-sec-2"));
    assert!(recorded(&env, "mcp-sec-1"));
    assert_eq!(files_leaking(&env.root), Vec::<String>::new());
}

#[test]
fn the_official_mcp_client_names_a_secret_and_gets_only_the_mark_back() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(python) = crate::mcp::python_with_mcp(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    // Its own value, in a file only: never in any process's arguments, as the other
    // tests here search the process list for theirs.
    let value = "Py-sekr1t-4d2e";
    let file = dir.join("token");
    std::fs::write(&file, format!("{value}\n")).unwrap();
    let (r, stderr) = crate::support::mcp::python_client(
        &python,
        &env,
        "secret_values.py",
        &[lab.ssh_config().as_os_str(), file.as_os_str()],
    );
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(value);
    let all = r.to_string();
    assert!(
        !all.contains(value) && !all.contains(&b64) && !stderr.contains(value),
        "a result shows the secret: {all}"
    );
    let run = &r["run"]["structured"];
    assert_eq!(run["verdict"], "completed", "{r}");
    // Base64 padding says nothing of the value and stays.
    assert_eq!(
        run["stdout"], "t=[REDACTED:TOKEN]\n[REDACTED:TOKEN]=\n",
        "{r}"
    );
    assert!(
        r["output"]["text"][0]
            .as_str()
            .unwrap()
            .contains("t=[REDACTED:TOKEN]"),
        "{r}"
    );
    assert_eq!(r["unknown"]["is_error"], true, "{r}");
    assert_eq!(
        r["unknown"]["structured"]["error"]["field"], "secrets",
        "{r}"
    );
    assert!(
        r["run_schema_secrets"]["description"]
            .as_str()
            .unwrap_or_default()
            .contains("never passes through MCP"),
        "the tool tells the model: {}",
        r["run_schema_secrets"]
    );
    assert!(!recorded(&env, "py-sec-2"));
}
