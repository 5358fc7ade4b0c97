//! The JSON contract `opmark/2` (docs/guarantees.md#the-command-line-contract) and opmark's manners with machines:
//! one compact line with `schema` from every command, errors as documents, the same field
//! meaning the same thing everywhere, `-q`, and no prompt that could hang an agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{self, fresh_dir, text, Sealed};

/// The one document on stdout: exactly one line, ending in a newline, a JSON object with
/// `"schema": "opmark/2"`. Panics naming the command otherwise.
pub(crate) fn document(what: &str, out: &Output) -> Value {
    let stdout = text(&out.stdout);
    assert!(
        stdout.ends_with('\n') && stdout.matches('\n').count() == 1,
        "{what}: stdout is not exactly one line: {stdout:?}\nstderr: {}",
        text(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {stdout}"));
    assert_eq!(doc["schema"], "opmark/2", "{what}: {doc}");
    doc
}

/// A lab target's `Host` block under another alias, with another identity file and/or
/// known_hosts file: how a test makes a key the host refuses or a host key nobody knows.
pub(crate) fn variant_of_target1(
    lab: &Lab,
    alias: &str,
    identity: Option<&Path>,
    known_hosts: Option<&Path>,
) -> String {
    let t = &lab.targets()[0];
    let cfg = std::fs::read_to_string(lab.ssh_config()).unwrap();
    let line = |key: &str| {
        cfg.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the lab config"))
            .trim()
            .to_owned()
    };
    let identity = identity.map_or_else(|| line("IdentityFile "), |p| p.display().to_string());
    let known =
        known_hosts.map_or_else(|| line("UserKnownHostsFile "), |p| p.display().to_string());
    format!(
        "Host {alias}\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {identity}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n",
        t.addr, t.port, t.user
    )
}

fn run_out(cmd: &mut Command) -> Output {
    cmd.output().expect("opmark runs")
}

#[test]
fn every_subcommand_answers_one_line_with_the_schema() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let om = || env.opmark_with_lab(&lab);
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "run",
            vec!["run", "target1", "--op", "doc-1", "--", "echo", "hi"],
        ),
        (
            "run replay",
            vec!["run", "target1", "--op", "doc-1", "--", "echo", "hi"],
        ),
        ("probe", vec!["probe", "target1", "doc-1"]),
        ("list", vec!["list"]),
        ("list --unresolved", vec!["list", "--unresolved"]),
        ("show", vec!["show", "doc-1"]),
        ("reconcile", vec!["reconcile"]),
        ("stats", vec!["stats"]),
        ("classify", vec!["classify", "--", "rm", "-rf", "/tmp/x"]),
        ("audit verify", vec!["audit", "verify"]),
        ("config", vec!["config", "target1"]),
        ("doctor", vec!["doctor", "target1"]),
        ("locks", vec!["locks", "target1"]),
        ("gc", vec!["gc", "target1", "--older-than", "3650d"]),
        ("cancel", vec!["cancel", "target1", "doc-1"]),
        (
            "resolve",
            vec![
                "resolve", "doc-1", "--host", "target1", "--as", "applied", "--note", "t",
            ],
        ),
    ];
    for (what, args) in cases {
        let out = run_out(om().arg("--json").args(&args));
        document(what, &out);
    }
    let key = env.root.join("other.key");
    let out = run_out(env.opmark().args(["--json", "ledger", "keygen"]).arg(&key));
    document("ledger keygen", &out);
}

#[test]
fn every_error_is_a_document_with_a_reason_code() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let empty_known = dir.join("known_hosts");
    std::fs::write(&empty_known, "").unwrap();
    let stranger = dir.join("ssh_config");
    std::fs::write(
        &stranger,
        variant_of_target1(&lab, "stranger", None, Some(&empty_known)),
    )
    .unwrap();
    let bad_policy = dir.join("policy.toml");
    std::fs::write(&bad_policy, "[[rule]]\nfamily = \"sideways\"\n").unwrap();
    // A directory where the ledger file should be: it cannot be opened.
    let not_a_ledger = dir.join("ledger-dir");
    std::fs::create_dir(&not_a_ledger).unwrap();

    // Commands that read the ledger answer about what is in it only when there is one.
    crate::support::empty_ledger(&env);
    // (what, command, exit code, reason_code, retryable)
    type Case<'a> = (&'a str, Command, i32, &'a str, bool);
    let mut cases: Vec<Case> = Vec::new();
    let mut c = env.opmark();
    c.args(["--json", "show", "nosuchop"]);
    cases.push(("unknown op", c, 245, "unknown_operation", false));
    let mut c = env.opmark();
    c.args(["--json", "list"])
        .env("OPMARK_LEDGER", dir.join("typo/ledger.db"));
    cases.push(("no ledger at the path", c, 248, "local_io", false));
    let mut c = env.opmark();
    c.args(["--json", "-F", "none", "probe", "nohost.invalid", "X"]);
    cases.push(("unresolvable host", c, 247, "name_unresolvable", false));
    let mut c = env.opmark();
    c.args(["--json", "probe", "target1", "bad op id"]);
    cases.push(("bad op id", c, 245, "invalid_input", false));
    let mut c = env.opmark();
    c.arg("--json").arg("-F").arg(&stranger);
    c.args(["probe", "stranger", "op-1"]);
    cases.push(("unknown host key", c, 247, "host_key_rejected", false));
    let mut c = env.opmark_with_lab(&lab);
    c.arg("--json").arg("--policy").arg(&bad_policy);
    c.args(["classify", "--", "ls"]);
    cases.push(("malformed policy", c, 246, "config_invalid", false));
    let mut c = env.opmark_with_lab(&lab);
    c.arg("--json").arg("--ledger").arg(&not_a_ledger);
    c.args(["probe", "target1", "op-1"]);
    cases.push(("ledger failure", c, 248, "local_io", false));
    let mut c = env.opmark();
    c.args(["--json", "run", "target1"]);
    cases.push(("usage error", c, 2, "usage", false));
    let mut c = env.opmark();
    c.arg("--json")
        .args(["lab", "up", "--kind", "busybox", "--dir"]);
    c.arg(dir.join("no-lab"));
    cases.push(("--kind without docker", c, 245, "invalid_input", false));
    let mut c = env.opmark();
    c.args(["--json", "show", "nosuchop", "--limit", "0"]);
    cases.push(("--limit 0", c, 245, "invalid_input", false));

    for (what, mut cmd, code, reason, retryable) in cases {
        let out = run_out(&mut cmd);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{what}: {}",
            text(&out.stderr)
        );
        let doc = document(what, &out);
        assert_eq!(doc["error"]["reason_code"], reason, "{what}: {doc}");
        assert_eq!(doc["error"]["retryable"], retryable, "{what}: {doc}");
        let message = doc["error"]["message"].as_str().unwrap_or("");
        assert!(!message.is_empty(), "{what}: {doc}");
        if what.starts_with("--") {
            // A flag misused names itself and the fix.
            let flag = what.split_whitespace().next().unwrap();
            assert!(
                message.contains(flag) && (message.contains("give") || message.contains("add")),
                "{what}: {message}"
            );
        }
    }
    assert!(
        !dir.join("no-lab").exists(),
        "a refused lab up made nothing"
    );
}

#[test]
fn run_help_lists_every_reason_code_with_its_retryable_flag() {
    let out = run_out(
        Sealed::new(crate::test_name!())
            .opmark()
            .args(["run", "--help"]),
    );
    let help = text(&out.stdout);
    for code in ["240", "241", "242", "243", "244", "245"] {
        assert!(help.contains(code), "exit code {code} missing:\n{help}");
    }
    // The table an agent reads: every reason code, `*` exactly on the retryable ones.
    let table = help
        .split("Reason codes")
        .nth(1)
        .expect("a reason code table in run --help");
    let listed: Vec<(String, bool)> = table
        .split(|c: char| c.is_whitespace() || c == ',')
        .map(|w| {
            let w = w.trim_end_matches(|c: char| !c.is_alphanumeric() && c != '*');
            (w.trim_end_matches('*').to_owned(), w.ends_with('*'))
        })
        .filter(|(w, _)| w.parse::<opmark::vocab::ReasonCode>().is_ok())
        .collect();
    for &code in opmark::vocab::ReasonCode::ALL {
        let rows: Vec<_> = listed.iter().filter(|(w, _)| w == code.as_str()).collect();
        assert!(!rows.is_empty(), "{code} not in run --help:\n{help}");
        for (_, starred) in rows {
            assert_eq!(
                *starred,
                code.retryable(),
                "{code}: run --help says retryable={starred}"
            );
        }
    }
}

#[test]
fn retryable_is_right_for_each_reason_code() {
    use opmark::vocab::ReasonCode as R;
    // docs/guarantees.md#verdicts: true only when a rerun with the same op id may change the outcome without
    // a human; permanent causes are false.
    let table = [
        (R::CommandExited, false),
        (R::ReplayedFromHost, false),
        (R::ReplayedFromLedger, false),
        (R::StillRunning, true),
        (R::ConnectFailed, true),
        (R::NameUnresolvable, false),
        (R::HostKeyRejected, false),
        (R::AuthRefused, false),
        (R::Fenced, false),
        (R::FencedAfterStart, false),
        (R::ShimCannotStart, false),
        (R::ConflictOnHost, false),
        (R::ConflictInLedger, false),
        (R::PolicyDenied, false),
        (R::InvalidInput, false),
        (R::ApprovalRequired, false),
        (R::ApprovalInvalid, false),
        (R::ApprovalExpired, false),
        (R::ApprovalMismatch, false),
        (R::ApprovalUsed, false),
        (R::RepeatsRecentOperation, false),
        (R::InterruptedNeedsApproval, false),
        (R::UnreachableAfterDispatch, true),
        (R::EarlierDispatchUnknown, true),
        (R::AttemptBudgetSpent, true),
        (R::ResolvedApplied, false),
        (R::ResolvedNotApplied, false),
        (R::ResolvedAbandoned, false),
        (R::HostChanged, false),
        (R::ClientInterrupted, true),
        (R::HostDiskFull, false),
        (R::ShimDidNotStart, false),
        (R::HostMissingSetsid, false),
        (R::BecomeRefused, false),
        (R::NotDispatchedMaxFailures, true),
        (R::NotDispatchedBatchFailed, true),
        (R::Detached, true),
        (R::WaitBudgetSpent, true),
        (R::LockBusy, true),
    ];
    for (code, retryable) in table {
        assert_eq!(code.retryable(), retryable, "{code}");
    }
    // A new code must come with its row here (and in run --help and the schema).
    assert_eq!(table.map(|(c, _)| c).as_slice(), R::ALL);
}

#[test]
fn probe_calls_the_hosts_digest_host_fingerprint_and_the_ledgers_fingerprint() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let run = run_out(env.opmark_with_lab(&lab).args([
        "--json", "run", "target1", "--op", "fp-1", "--", "echo", "hi",
    ]));
    let run = document("run", &run);
    let probe = run_out(
        env.opmark_with_lab(&lab)
            .args(["--json", "probe", "target1", "fp-1"]),
    );
    let probe = document("probe", &probe);
    let list = document("list", &run_out(env.opmark().args(["--json", "list"])));
    assert_eq!(probe["fingerprint"], run["fingerprint"], "{probe} {run}");
    assert_eq!(list["operations"][0]["fingerprint"], run["fingerprint"]);
    let host_fp = probe["host_fingerprint"].as_str().unwrap_or_default();
    assert_eq!(host_fp.len(), 64, "{probe}");
    assert_ne!(probe["host_fingerprint"], probe["fingerprint"]);
}

#[test]
fn stats_says_which_conflicts_it_counts() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let run = |word: &str| {
        run_out(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", "same-1", "--", "echo", word,
        ]))
    };
    assert_eq!(document("first", &run("a"))["verdict"], "completed");
    for _ in 0..2 {
        let doc = document("other intent", &run("b"));
        assert_eq!(doc["verdict"], "conflict");
        assert_eq!(doc["reason_code"], "conflict_in_ledger");
    }
    let stats = text(&run_out(env.opmark().arg("stats")).stdout);
    assert!(
        !stats.contains("conflicts refused"),
        "stats claims to count refused conflicts, which are not recorded:\n{stats}"
    );
    assert!(stats.contains("conflicts on host"), "{stats}");
    let doc = document("stats", &run_out(env.opmark().args(["--json", "stats"])));
    assert_eq!(doc["conflicts_on_host"], 0, "{doc}");
}

#[test]
fn run_document_matches_the_published_json_schema() {
    // The schema names every reason code there is, and nothing else.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/run.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut in_schema: Vec<&str> = schema["properties"]["reason_code"]["enum"]
        .as_array()
        .expect("a reason_code enum in the schema")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut all: Vec<&str> = opmark::vocab::ReasonCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    in_schema.sort_unstable();
    all.sort_unstable();
    assert_eq!(in_schema, all);
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    crate::require_tool!("python3");
    let env = Sealed::new(crate::test_name!());
    let mut docs = Vec::new();
    for args in [
        vec![
            "--op", "sch-1", "--", "echo", "out;", "echo", "err", ">&2;", "exit", "3",
        ],
        vec![
            "--op", "sch-1", "--", "echo", "out;", "echo", "err", ">&2;", "exit", "3",
        ],
        vec!["--op", "sch 2", "--", "true"],
        vec!["--op", "sch-3", "--", "mkfs.ext4", "/dev/nothing-here"],
    ] {
        let out = run_out(
            env.opmark_with_lab(&lab)
                .args(["--json", "run", "target1"])
                .args(&args),
        );
        docs.push(document("run", &out));
    }
    let verdicts: Vec<_> = docs.iter().map(|d| d["verdict"].clone()).collect();
    assert_eq!(
        verdicts,
        ["completed", "replayed", "refused", "blocked"],
        "{docs:?}"
    );
    support::schema::validate(crate::test_name!(), &[("run", docs)]);
}

/// The real documents of every `--json` command, by the schema each must match: runs
/// (completed, replayed, conflict, detached, after a cancel), a fleet, cancel, probe,
/// show, list, reconcile, stats, resolve, put (written, unchanged, failed), get (read, replayed, failed), errors (bad input, unknown op, usage) and the
/// `host_changed` answers of run, probe, cancel and resolve. Uses 2 lab targets; leaves
/// target1's marker root replaced.
pub(crate) fn every_document(lab: &Lab, env: &Sealed) -> Vec<(&'static str, Vec<Value>)> {
    let hosts: Vec<String> = lab.targets().iter().map(|t| t.alias.clone()).collect();
    let t1 = hosts[0].as_str();
    // `opmark --json ARGS` with the lab's config: its one document, whatever the status.
    let doc = |what: &str, args: &[&str]| {
        let out = run_out(env.opmark_with_lab(lab).arg("--json").args(args));
        document(what, &out)
    };
    let mut sets: Vec<(&str, Vec<Value>)> = Vec::new();

    let mut runs = vec![
        doc("run", &["run", t1, "--op", "all-1", "--", "echo", "hi"]),
        doc("replay", &["run", t1, "--op", "all-1", "--", "echo", "hi"]),
        doc(
            "conflict",
            &["run", t1, "--op", "all-1", "--", "echo", "ho"],
        ),
        doc(
            "detach",
            &["run", t1, "--op", "all-2", "--detach", "--", "sleep", "30"],
        ),
    ];
    assert_eq!(runs[3]["verdict"], "in_progress", "{}", runs[3]);
    let cancel = doc("cancel", &["cancel", t1, "all-2"]);
    let replay = doc(
        "run after cancel",
        &["run", t1, "--op", "all-2", "--", "sleep", "30"],
    );
    // The 143 is the cancel's SIGTERM, and the document says so.
    assert_eq!(
        (&replay["exit_code"], &replay["cancelled"]),
        (&143.into(), &true.into()),
        "{replay}"
    );
    assert_eq!(runs[0]["cancelled"], false, "{}", runs[0]);
    runs.push(replay);
    let mut fleet_args: Vec<&str> = vec!["run"];
    fleet_args.extend(hosts.iter().map(String::as_str));
    fleet_args.extend(["--op", "all-3", "--", "echo", "fleet"]);
    let fleet = doc("fleet run", &fleet_args);
    assert!(fleet["hosts"].is_array(), "not a fleet document: {fleet}");
    sets.push(("run", runs));
    sets.push(("fleet", vec![fleet]));
    sets.push((
        "cancel",
        vec![cancel, doc("cancel done", &["cancel", t1, "all-1"])],
    ));
    sets.push((
        "probe",
        vec![
            doc("probe", &["probe", t1, "all-1"]),
            doc("probe cancelled", &["probe", t1, "all-2"]),
            doc("probe unknown", &["probe", t1, "never-ran"]),
        ],
    ));
    // --limit keeps the newest events in the timeline and counts them all.
    let limited = doc("show limited", &["show", "all-1", "--limit", "1"]);
    let whole = doc("show", &["show", "all-1"]);
    let count = whole["events"].as_array().unwrap().len();
    assert!(count > 1, "{whole}");
    assert_eq!(
        (
            &limited["event_count"],
            limited["events"].as_array().map(Vec::len)
        ),
        (&count.into(), Some(1)),
        "{limited}"
    );
    assert_eq!(
        limited["events"][0],
        whole["events"][count - 1],
        "the newest"
    );
    assert_eq!(
        limited["attempts"], whole["attempts"],
        "views read every event"
    );
    let page = run_out(
        env.opmark_with_lab(lab)
            .args(["show", "all-1", "--limit", "1"]),
    );
    assert!(
        text(&page.stdout).contains(&format!(
            "({} earlier events not shown; drop --limit for all)",
            count - 1
        )),
        "{}",
        text(&page.stdout)
    );
    sets.push((
        "show",
        vec![whole, limited, doc("show fleet", &["show", "all-3"])],
    ));
    sets.push((
        "list",
        vec![
            doc("list", &["list"]),
            doc("list unresolved", &["list", "--unresolved"]),
        ],
    ));
    sets.push((
        "reconcile",
        vec![
            doc("reconcile", &["reconcile"]),
            doc("reconcile limited", &["reconcile", "--limit", "1"]),
        ],
    ));
    sets.push(("stats", vec![doc("stats", &["stats"])]));
    sets.push(("locks", vec![doc("locks", &["locks", t1])]));
    sets.push((
        "resolve",
        vec![doc(
            "resolve",
            &[
                "resolve", "all-2", "--host", t1, "--as", "applied", "--note", "test",
            ],
        )],
    ));
    let errors = vec![
        doc("unknown op", &["show", "nosuchop"]),
        doc("bad op id", &["probe", t1, "bad op id"]),
        doc("usage", &["run", t1]),
        doc("bad value", &["list", "--limit", "many"]),
        doc("limit 0", &["reconcile", "--limit", "0"]),
        doc(
            "resolve unknown",
            &[
                "resolve", "nosuchop", "--host", t1, "--as", "applied", "--note", "t",
            ],
        ),
    ];
    // One word for an op id nobody recorded, whichever command is asked.
    for i in [0, 5] {
        assert_eq!(
            errors[i]["error"]["reason_code"], "unknown_operation",
            "{}",
            errors[i]
        );
    }
    assert_eq!(
        errors[4]["error"]["reason_code"], "invalid_input",
        "{}",
        errors[4]
    );
    sets.push(("error", errors));
    // A lab of its own, from up to down: each lab document.
    let own = env.root.join("own-lab");
    let own = own.to_str().unwrap();
    let up = doc("lab up", &["lab", "up", "2", "--dir", own]);
    let status = doc("lab status", &["lab", "status", "--dir", own]);
    let limited = doc(
        "lab status limited",
        &["lab", "status", "--dir", own, "--limit", "1"],
    );
    assert_eq!(
        (
            &limited["target_count"],
            limited["targets"].as_array().map(Vec::len)
        ),
        (&2.into(), Some(1)),
        "{limited}"
    );
    sets.push(("lab", vec![up, status, limited]));
    sets.push((
        "lab-env",
        vec![doc("lab env", &["lab", "env", "--dir", own])],
    ));
    sets.push((
        "lab-down",
        vec![doc("lab down", &["lab", "down", "--dir", own])],
    ));
    // A put, written; then its content with another mode (another intent, so no
    // repetition): unchanged; and one into no directory.
    let local = env.root.join("put-content");
    std::fs::write(&local, "content\n").unwrap();
    let local = local.to_str().unwrap();
    let dest = format!("{t1}:{}", env.root.join("put-dest").display());
    let missing = format!("{t1}:{}", env.root.join("no-dir/put-dest").display());
    let puts = vec![
        doc(
            "put",
            &["put", local, &dest, "--op", "all-put-1", "--mode", "600"],
        ),
        doc(
            "put unchanged",
            &["put", local, &dest, "--op", "all-put-2", "--mode", "644"],
        ),
        doc("put failed", &["put", local, &missing, "--op", "all-put-3"]),
    ];
    let delivered: Vec<_> = puts
        .iter()
        .map(|d| d["file"]["delivered"].clone())
        .collect();
    assert_eq!(
        delivered,
        [Value::from("written"), "unchanged".into(), Value::Null],
        "{puts:?}"
    );
    sets.push(("put", puts));
    // A get, its replay, and one of a file that is not there.
    let got = env.root.join("got");
    let got = got.to_str().unwrap();
    let gets = vec![
        doc("get", &["get", &dest, got, "--op", "all-get-1"]),
        doc("get replay", &["get", &dest, got, "--op", "all-get-1"]),
        doc("get failed", &["get", &missing, got, "--op", "all-get-2"]),
    ];
    let saved: Vec<_> = gets.iter().map(|d| d["file"]["saved"].clone()).collect();
    assert_eq!(saved, [true, true, false], "{gets:?}");
    sets.push(("get", gets));
    // Another marker root under the name (a reinstalled host): every command that acts
    // on host evidence answers host_changed, in run's words (docs/guarantees.md#evidence-identity).
    let root_id = lab.target(t1).unwrap().marker_root().join("root_id");
    std::fs::write(&root_id, format!("{}\n", "0".repeat(32))).unwrap();
    let changed = [
        (
            "run",
            doc(
                "run changed",
                &["run", t1, "--op", "all-1", "--", "echo", "hi"],
            ),
        ),
        ("probe", doc("probe changed", &["probe", t1, "all-1"])),
        ("cancel", doc("cancel changed", &["cancel", t1, "all-1"])),
        (
            "resolve",
            doc(
                "resolve changed",
                &[
                    "resolve",
                    "all-1",
                    "--host",
                    t1,
                    "--as",
                    "not-applied",
                    "--note",
                    "t",
                ],
            ),
        ),
    ];
    for (name, d) in changed {
        assert_eq!(d["reason_code"], "host_changed", "{name}: {d}");
        sets.push((name, vec![d]));
    }
    sets
}

#[test]
fn every_json_document_matches_its_published_schema() {
    // An error document may carry any verdict's reason code or one of the error codes.
    let error_schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/error.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let codes = &error_schema["properties"]["error"]["properties"]["reason_code"]["enum"];
    let own = opmark::vocab::ErrorCode::OWN.iter().map(|c| c.as_str());
    for code in opmark::vocab::ReasonCode::ALL
        .iter()
        .map(|c| c.as_str())
        .chain(own)
    {
        assert!(
            codes.as_array().unwrap().contains(&code.into()),
            "{code} missing in error.schema.json"
        );
    }
    // reconcile's decision is one of the ledger's words, every one of them (host_changed,
    // not a word of its own for another key).
    let reconcile_schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/reconcile.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let decisions: Vec<&str> = reconcile_schema["$defs"]["outcome"]["properties"]["decision"]
        ["enum"]
        .as_array()
        .expect("reconcile's decision is an enum")
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let known: Vec<&str> = opmark::ledger::Decision::KNOWN
        .iter()
        .map(|d| d.as_str())
        .collect();
    assert_eq!(decisions, known, "reconcile.schema.json's decisions");
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    crate::require_tool!("python3");
    let env = Sealed::new(crate::test_name!());
    let sets = every_document(&lab, &env);
    support::schema::validate(crate::test_name!(), &sets);
}

#[test]
fn quiet_silences_opmarks_lines_but_not_the_commands_output() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    // No --op: opmark mints one and says so on stderr, unless quiet.
    let cmd = [
        "run", "target1", "--", "echo", "out;", "echo", "err", ">&2;", "exit", "3",
    ];
    let loud = run_out(env.opmark_with_lab(&lab).args(cmd));
    assert!(
        text(&loud.stderr).contains("opmark:"),
        "{}",
        text(&loud.stderr)
    );
    let quiet = run_out(env.opmark_with_lab(&lab).arg("-q").args(cmd));
    assert_eq!(quiet.status.code(), Some(3));
    assert_eq!(text(&quiet.stdout), "out\n");
    assert_eq!(text(&quiet.stderr), "err\n");
}

/// A copy of the lab's setup whose only identity is a passphrase-protected key, and no
/// agent: authentication can only succeed by asking for the passphrase.
fn encrypted_key_config(lab: &Lab, dir: &Path, batch_mode: bool) -> PathBuf {
    let key = dir.join("id_encrypted");
    let made = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "correct horse",
            "-C",
            "enc",
            "-f",
        ])
        .arg(&key)
        .status()
        .unwrap();
    assert!(made.success());
    let cfg = dir.join("ssh_config");
    let mut text = variant_of_target1(lab, "locked", Some(&key), None);
    if batch_mode {
        text.push_str("  BatchMode yes\n");
    }
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// Runs `opmark run locked ...` under `script` (a pty, so /dev/tty is there to prompt
/// on), with script's own stdin an open pipe nobody writes to: a prompt would wait
/// forever. `inner_stdin` is a shell redirection for opmark itself ("" keeps the pty).
/// Returns the transcript, or panics when the watchdog fires.
fn run_locked_under_pty(env: &Sealed, cfg: &Path, inner_stdin: &str) -> String {
    let line = format!(
        "{} -F {} --json run locked --op pty-1 -- true {inner_stdin}",
        env!("CARGO_BIN_EXE_opmark"),
        cfg.display()
    );
    support::under_pty(env, &line, b"")
}

fn assert_auth_refused_without_prompt(transcript: &str) {
    assert!(
        !transcript.contains("Enter passphrase"),
        "prompted:\n{transcript}"
    );
    let doc: Value = transcript
        .lines()
        .find_map(|l| serde_json::from_str(l.trim()).ok())
        .unwrap_or_else(|| panic!("no JSON document:\n{transcript}"));
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert_eq!(doc["reason_code"], "auth_refused", "{doc}");
    assert_eq!(doc["retryable"], false, "{doc}");
}

#[test]
fn encrypted_key_without_agent_fails_fast_when_stdin_is_not_a_terminal() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    crate::require_tool!("script");
    let env = Sealed::new(crate::test_name!());
    let cfg = encrypted_key_config(&lab, &fresh_dir(crate::test_name!()), false);
    // A terminal is attached (the pty), but opmark's stdin is a pipe: an agent's setup.
    let transcript = run_locked_under_pty(&env, &cfg, "< /dev/null");
    assert_auth_refused_without_prompt(&transcript);
}

#[test]
fn encrypted_key_without_agent_fails_fast_under_a_pty_with_batch_mode() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    crate::require_tool!("script");
    let env = Sealed::new(crate::test_name!());
    let cfg = encrypted_key_config(&lab, &fresh_dir(crate::test_name!()), true);
    let transcript = run_locked_under_pty(&env, &cfg, "");
    assert_auth_refused_without_prompt(&transcript);
}

/// The interpreter behind `python3`, by its real path: a pyenv shim would not work
/// under a sealed HOME. None (after a skip, locally) without python3.
pub(crate) fn real_python(test: &str) -> Option<PathBuf> {
    let found = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(text(&o.stdout).trim()));
    if found.is_none() {
        support::skip_or_fail(test, "python3");
    }
    found
}

#[test]
fn agent_loop_example_runs_once_replays_and_recovers_a_lost_op_id() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(python) = real_python(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let count = fresh_dir(crate::test_name!()).join("count");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/agent_loop.py");
    let sealed = env.opmark();
    let agent = |op: &str, command: &str| {
        Command::new(&python)
            .arg(&script)
            .args(["target1", op, "--", command])
            .env_clear()
            .envs(sealed.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .env("OPMARK", env!("CARGO_BIN_EXE_opmark"))
            .env("OPMARK_SSH_CONFIG", lab.ssh_config())
            .output()
            .unwrap()
    };
    let command = format!("echo ran >> {}; echo hello", count.display());

    let first = agent("ex-1", &command);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert_eq!(text(&first.stdout), "hello\n");
    assert!(text(&first.stderr).contains("agent: completed exit 0"));

    // The agent crashed and lost its op id: "-" finds it in `list --json` by host and
    // command, and the rerun replays instead of running again.
    let again = agent("-", &command);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("agent: op ex-1"),
        "{}",
        text(&again.stderr)
    );
    assert!(text(&again.stderr).contains("agent: replayed exit 0"));
    assert_eq!(text(&again.stdout), "hello\n");
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\n");

    let blocked = agent("ex-2", "mkfs.ext4 /dev/nothing-here");
    assert_eq!(blocked.status.code(), Some(3), "{}", text(&blocked.stderr));
    assert!(text(&blocked.stderr).contains("approval_required"));
}

/// Output past the in-memory megabyte goes to a spool and the document streams it back:
/// still exactly what `String::from_utf8_lossy` of the bytes encodes to, with multi-byte
/// characters across every boundary and invalid UTF-8 replaced as before, and the
/// document still one line matching its schema.
#[test]
fn run_document_with_megabytes_of_mixed_utf8_output_is_exact_and_leaves_no_spool() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // ~3 MB on stdout: multi-byte characters, a lone continuation byte, a truncated
    // sequence, an invalid lead byte, quotes and control characters; ~1.5 MB on stderr
    // ending in an incomplete sequence.
    let unit = "é€😀\"\\\t\u{1}a";
    let command = format!(
        "i=0; while [ $i -lt 8 ]; do i=$((i+1)); yes '{unit}' | head -c 393216; printf '\\200\\342\\202x\\377'; done; \
         yes 'ü' | head -c 1500001 >&2; printf '\\360\\237\\230' >&2"
    );
    let out = env
        .opmark_with_lab(&lab)
        .env("TMPDIR", &tmp)
        .args([
            "--json",
            "run",
            &lab.targets()[0].alias,
            "--op",
            "big-utf8",
            "--",
        ])
        .arg(&command)
        .output()
        .unwrap();
    let doc = document("run --json with megabytes", &out);
    assert_eq!(doc["verdict"], "completed", "{}", text(&out.stderr));
    // The same bytes straight from the host, through OpenSSH.
    let raw = support::ssh(&lab)
        .arg(&lab.targets()[0].alias)
        .arg(&command)
        .output()
        .unwrap();
    assert!(raw.stdout.len() > 3_000_000 && raw.stderr.len() > 1_500_000);
    for (field, bytes) in [("stdout", &raw.stdout), ("stderr", &raw.stderr)] {
        let want = serde_json::to_string(&String::from_utf8_lossy(bytes)).unwrap();
        let got = serde_json::to_string(&doc[field]).unwrap();
        assert!(
            got == want,
            "{field}: the document's string differs from the lossy bytes'"
        );
    }
    // The document's text holds the encoding byte for byte (not just an equal value).
    let line = text(&out.stdout);
    let want_out = serde_json::to_string(&String::from_utf8_lossy(&raw.stdout)).unwrap();
    assert!(line.contains(&format!("\"stdout\":{want_out}")));
    assert!(
        std::fs::read_dir(&tmp).unwrap().next().is_none(),
        "the spool has no name left in TMPDIR"
    );
}

#[test]
fn a_replay_from_the_ledger_says_its_output_is_not_available() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let run = || {
        let out = run_out(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", "gone-1", "--", "echo", "hi",
        ]));
        document("run", &out)
    };
    let first = run();
    assert_eq!(first["stdout"], "hi\n", "{first}");
    assert_eq!(first["output_available"], true, "{first}");
    // The marker removed behind the ledger's back: only the ledger's exit status is left.
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/gone-1");
    std::fs::remove_dir_all(&marker).unwrap();
    let again = run();
    assert_eq!(
        (&again["verdict"], &again["reason_code"]),
        (&"replayed".into(), &"replayed_from_ledger".into()),
        "{again}"
    );
    assert_eq!(again["exit_code"], 0, "{again}");
    // "" here is not "it printed nothing": the document must say the output is gone.
    assert_eq!(again["stdout"], "", "{again}");
    assert_eq!(again["output_available"], false, "{again}");
    support::schema::validate(crate::test_name!(), &[("run", vec![first, again])]);
}

#[test]
fn wait_bounds_the_whole_run_connects_included_against_a_cut_host() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    lab.cut("target1").unwrap();
    // Each connect alone may take 10 s (SYNs into a cut link): the budget is 3 s for all.
    let started = Instant::now();
    let out = run_out(env.opmark_with_lab(&lab).args([
        "--json",
        "run",
        "-o",
        "ConnectTimeout=10",
        "target1",
        "--op",
        "budget-1",
        "--wait",
        "3s",
        "--",
        "echo",
        "ran",
    ]));
    let took = started.elapsed();
    lab.restore("target1").unwrap();
    // Reported, not asserted (no timed assertions): the verdict says what bounded it.
    eprintln!("run --wait 3s against a cut host answered after {took:.2?}");
    let doc = document("budget run", &out);
    assert_eq!(doc["verdict"], "not_applied", "{doc}");
    assert_eq!(doc["reason_code"], "wait_budget_spent", "{doc}");
    assert_eq!(doc["retryable"], true, "{doc}");
    assert!(
        doc["reason"]
            .as_str()
            .unwrap()
            .contains("--wait budget (3s)"),
        "{doc}"
    );
    let attempts = doc["attempts"].as_array().unwrap();
    assert!(
        attempts.iter().all(|a| a["boundary"] == "not_sent"),
        "{doc}"
    );
    assert_eq!(out.status.code(), Some(241), "{doc}");
    // Nothing was sent, so the same op id runs once the link is back.
    let again = document(
        "budget rerun",
        &run_out(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", "budget-1", "--", "echo", "ran",
        ])),
    );
    assert_eq!(again["verdict"], "completed", "{again}");
    assert_eq!(again["stdout"], "ran\n", "{again}");
}

#[test]
fn a_conflict_found_on_the_host_says_whether_the_command_or_the_stdin_differs() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    // The claim is made through one ledger; each rerun comes from a ledger of its own,
    // with no record of the op id, so only the host's marker can find the conflict.
    let first = Sealed::new(&format!("{}-first", crate::test_name!()));
    let run = |env: &Sealed, command: &str, input: Option<&[u8]>| {
        let mut cmd = env.opmark_with_lab(&lab);
        cmd.args(["--json", "run", "target1", "--op", "differs-1"]);
        if input.is_some() {
            cmd.arg("--stdin");
        }
        let mut child = cmd
            .args(["--", command])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(input) = input {
            use std::io::Write as _;
            stdin.write_all(input).unwrap();
        }
        drop(stdin);
        document(command, &child.wait_with_output().unwrap())
    };
    let done = run(&first, "cat", Some(b"one"));
    assert_eq!(done["verdict"], "completed", "{done}");
    assert!(done["conflict_differs"].is_null(), "{done}");
    for (command, input, differs, words) in [
        (
            "cat",
            Some(&b"two"[..]),
            "stdin",
            "the same command with a different stdin",
        ),
        (
            "cat -u",
            Some(&b"one"[..]),
            "command",
            "a different command (the stdin is the same)",
        ),
        (
            "cat -u",
            None,
            "command_and_stdin",
            "a different command and a different stdin",
        ),
    ] {
        let other = Sealed::new(&format!("{}-{differs}", crate::test_name!()));
        let d = run(&other, command, input);
        assert_eq!(
            (&d["verdict"], &d["reason_code"]),
            (&"conflict".into(), &"conflict_on_host".into()),
            "{d}"
        );
        assert_eq!(d["conflict_differs"], differs, "{command} {input:?}: {d}");
        let reason = d["reason"].as_str().unwrap();
        assert!(reason.contains(words), "{reason}");
    }
    // Nothing ran again: the host still holds the first run's output.
    let again = run(&first, "cat", Some(b"one"));
    assert_eq!(
        (&again["verdict"], &again["stdout"]),
        (&"replayed".into(), &"one".into()),
        "{again}"
    );
}

/// Where the documents of `every_document` are kept, masked (see `masked`), for
/// `every_json_document_is_the_same_as_its_recorded_copy`.
fn recorded_documents() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/json/documents.json")
}

/// Keys whose values differ between two runs of the same inputs: times and durations,
/// process ids and ports, the host keys and marker root ids a lab makes anew, this
/// installation's fingerprints (keyed by its own key) and the hash chain over all of
/// these, and event seqs (a fleet's hosts append to one ledger at once: their events
/// interleave as they come); and what `doctor` reads of the machine under the lab (its
/// boot, free space and file system).
const VOLATILE_KEYS: &[&str] = &[
    "at",
    "created_at",
    "dispatched_at",
    "updated_at",
    "last_seen_at",
    "duration_ms",
    "pid",
    "port",
    "host_key",
    "root_id",
    "fingerprint",
    "hash",
    "prev_hash",
    "seq",
    "first_seq",
    "last_seq",
    "boot_id",
    "avail_kib",
    "fstype",
];

/// `doc` with what differs between two runs of the same inputs replaced by a placeholder
/// of the same type: the values of [`VOLATILE_KEYS`], and in every string `places` (this
/// run's paths and host aliases) and the patterns of minted ids, times, host keys,
/// marker root ids, loopback ports, the free space and file system `doctor` reports, and
/// the aliases of another lab's targets.
fn masked(doc: &Value, places: &[(String, String)]) -> Value {
    static PATTERNS: std::sync::OnceLock<Vec<(regex::Regex, &str)>> = std::sync::OnceLock::new();
    let patterns = PATTERNS.get_or_init(|| {
        [
            (r"\bat-[0-9a-f]{16}\b", "at-<attempt>"),
            (r"\bs-[0-9a-f]{16}\b", "s-<session>"),
            (
                r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}(\.\d+)?Z| \d{2}:\d{2}:\d{2} UTC)",
                "<time>",
            ),
            (r"SHA256:[A-Za-z0-9+/]{43}", "SHA256:<host-key>"),
            // A marker root id: exactly 32 digits (the 12 of a shortened one, which may
            // begin with a 0, are the next pattern's).
            (r"\b[0-9a-f]{32}\b", "<root-id>"),
            (
                r"marker root [0-9a-f]{12}\b",
                "marker root <root-id-prefix>",
            ),
            (r"(\[?127\.0\.0\.1\]?):\d+", "$1:<port>"),
            (r"^\d+ MiB free$", "<n> MiB free"),
            // doctor's file system, and whether it is volatile (a checkout under /tmp).
            (
                r" is on \S+( and would not survive a reboot;.*)?$",
                " is on <fstype>",
            ),
            // The targets of a lab other than the test's (`lab up` of a new one).
            (r"\b[a-z0-9]{5}-(target\d+)\b", "<prefix>-$1"),
        ]
        .into_iter()
        .map(|(p, with)| (regex::Regex::new(p).unwrap(), with))
        .collect()
    });
    match doc {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::Null => Value::Null,
                        _ if !VOLATILE_KEYS.contains(&k.as_str()) => masked(v, places),
                        Value::Number(_) => 0.into(),
                        _ => format!("<{k}>").into(),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => {
            let mut items: Vec<Value> = items.iter().map(|v| masked(v, places)).collect();
            // One operation's hosts (a fleet's) end at about the same time: which of
            // them was active last is the race of the day, so they stand in host order.
            for run in items.chunk_by_mut(|a, b| a["op_id"].is_string() && a["op_id"] == b["op_id"])
            {
                run.sort_by(|a, b| a["host"].as_str().cmp(&b["host"].as_str()));
            }
            Value::Array(items)
        }
        Value::String(s) => {
            let mut s = s.clone();
            for (place, name) in places {
                s = s.replace(place.as_str(), name);
            }
            for (pattern, with) in patterns {
                s = pattern.replace_all(&s, *with).into_owned();
            }
            s.into()
        }
        other => other.clone(),
    }
}

#[test]
fn every_json_document_is_the_same_as_its_recorded_copy() {
    // The documents are the contract agents parse: a refactor must leave every one of them
    // as it was, byte for byte once this run's times, paths and identities are masked.
    // After a change of a document that is meant (and said in docs/ and the schemas):
    //   OPMARK_RECORD_JSON=1 cargo test --test it -- json::every_json_document_is_the_same
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let mut sets = every_document(&lab, &env);
    // The commands every_document leaves out, on target2 (target1's marker root was
    // replaced at its end) and the fleet's op id.
    let t2 = lab.targets()[1].alias.clone();
    let doc = |what: &str, args: &[&str]| {
        let out = run_out(env.opmark_with_lab(&lab).arg("--json").args(args));
        document(what, &out)
    };
    let others: Vec<(&str, Vec<&str>)> = vec![
        ("classify", vec!["classify", "--", "rm", "-rf", "/srv/x"]),
        ("audit verify", vec!["audit", "verify"]),
        ("audit verify --full", vec!["audit", "verify", "--full"]),
        ("config", vec!["config", &t2]),
        ("doctor", vec!["doctor", &t2]),
        ("output", vec!["output", "all-3", &t2]),
        (
            "plan replay",
            vec![
                "run",
                &t2,
                "--op",
                "all-3",
                "--dry-run",
                "--",
                "echo",
                "fleet",
            ],
        ),
        (
            "plan new",
            vec![
                "run",
                &t2,
                "--op",
                "plan-1",
                "--dry-run",
                "--",
                "rm",
                "-rf",
                "/srv/x",
            ],
        ),
        ("gc", vec!["gc", &t2, "--older-than", "3650d"]),
        ("policy show", vec!["policy", "show"]),
    ];
    for (what, args) in others {
        sets.push((what, vec![doc(what, &args)]));
    }
    let mut places: Vec<(String, String)> = vec![
        (env.root.display().to_string(), "<env>".into()),
        (lab.dir().display().to_string(), "<lab>".into()),
    ];
    for (i, t) in lab.targets().iter().enumerate() {
        places.push((t.alias.clone(), format!("<target{}>", i + 1)));
    }
    places.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    let now: Value = sets
        .iter()
        .map(|(name, docs)| {
            let docs: Vec<Value> = docs.iter().map(|d| masked(d, &places)).collect();
            serde_json::json!({ "set": name, "documents": docs })
        })
        .collect();
    let text = serde_json::to_string_pretty(&now).unwrap() + "\n";
    let file = recorded_documents();
    if std::env::var_os("OPMARK_RECORD_JSON").is_some() {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &text).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (OPMARK_RECORD_JSON=1 records it)", file.display()));
    if recorded != text {
        let now_file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("documents.now.json");
        std::fs::write(&now_file, &text).unwrap();
        let first = recorded
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(recorded.lines().count().min(text.lines().count()));
        panic!(
            "a JSON document changed: line {} of {} was {:?}, is {:?}; all of them: diff {} {}",
            first + 1,
            file.display(),
            recorded.lines().nth(first),
            text.lines().nth(first),
            file.display(),
            now_file.display(),
        );
    }
}
