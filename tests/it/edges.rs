//! The edges around the core that used to mislead: a mistyped ledger path read as "all
//! clear", a ledger this user may only read, and reconcile's advice for a host it cannot
//! reach (which used to plant a decision that later read as tampering).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::{self, json, text, Sealed};

/// Every command that reads the ledger (or adds to an existing one) but never starts one.
const READERS: &[&[&str]] = &[
    &["reconcile"],
    &["audit", "verify"],
    &["list"],
    &["stats"],
    &["show", "push-conf-1"],
    &["probe", "web1", "push-conf-1"],
    &["resolve", "push-conf-1", "--as", "applied", "--note", "x"],
    &["cancel", "web1", "push-conf-1"],
];

#[test]
fn reading_commands_on_a_mistyped_ledger_path_fail_naming_it_and_create_nothing() {
    let env = Sealed::new(crate::test_name!());
    let typo = env.root.join("typo").join("ledger.db");
    for args in READERS {
        // Both: the flag wins over the variable, and the message names the flag.
        for (how, named_by) in [
            ("env", "OPMARK_LEDGER"),
            ("flag", "--ledger"),
            ("both", "--ledger"),
        ] {
            let mut cmd = env.opmark();
            match how {
                "env" => cmd.env("OPMARK_LEDGER", &typo),
                "flag" => cmd.arg("--ledger").arg(&typo),
                _ => cmd
                    .env("OPMARK_LEDGER", env.root.join("elsewhere.db"))
                    .arg("--ledger")
                    .arg(&typo),
            };
            let out = cmd.args(*args).output().unwrap();
            let said = text(&out.stderr);
            assert_eq!(out.status.code(), Some(248), "{args:?} ({how}): {said}");
            assert!(
                said.contains(&format!(
                    "no ledger at {} (from {named_by})",
                    typo.display()
                )),
                "{args:?} ({how}) names the path and where it came from: {said}"
            );
            assert!(
                !typo.parent().unwrap().exists(),
                "{args:?} ({how}) created {}",
                typo.display()
            );
        }
    }
    // The same as a document, for agents.
    let out = env
        .opmark()
        .env("OPMARK_LEDGER", &typo)
        .args(["--json", "reconcile"])
        .output()
        .unwrap();
    let doc = json(&out);
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("no ledger at"),
        "{doc}"
    );
    // The default path too: a fresh install has nothing to list, and says so.
    let out = env
        .opmark()
        .env_remove("OPMARK_LEDGER")
        .arg("list")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(248), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("(from the default path)"),
        "{}",
        text(&out.stderr)
    );
}

/// A directory any user may enter, outside the (possibly 0700) checkout.
fn open_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("opmark-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

const NOBODY: u32 = 65534;

/// `opmark ARGS` as `nobody`, with this ledger and key.
fn as_nobody(env: &Sealed, ledger: &Path, key: &Path, args: &[&str]) -> std::process::Output {
    let mut inner = env.opmark();
    inner
        .env("OPMARK_LEDGER", ledger)
        .env("OPMARK_LEDGER_KEY", key)
        .env("HOME", ledger.parent().unwrap())
        .env("XDG_STATE_HOME", ledger.parent().unwrap())
        .args(args);
    let mut cmd = support::runnable_by_any_user(&inner);
    cmd.uid(NOBODY).gid(NOBODY).current_dir("/");
    cmd.stdin(std::process::Stdio::null());
    cmd.output().unwrap()
}

#[test]
fn a_ledger_this_user_may_only_read_answers_reads_and_names_the_fix_for_writes() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    if !support::require_root(crate::test_name!()) {
        return;
    }
    let env = Sealed::new(crate::test_name!());
    let ran = env
        .opmark_with_lab(&lab)
        .args(["run", "target1", "--op", "push-conf-1", "--", "true"])
        .output()
        .unwrap();
    assert!(ran.status.success(), "{}", text(&ran.stderr));

    // A copy owned by root, readable by all: another user's ledger, or a backup.
    let dir = open_dir("read-only-ledger");
    let ledger = dir.join("ledger.db");
    let backup = env
        .opmark()
        .args(["ledger", "backup"])
        .arg(&ledger)
        .output()
        .unwrap();
    assert!(backup.status.success(), "{}", text(&backup.stderr));
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Its key is handed to the reader (0600, theirs): keys are never world-readable.
    let key = dir.join("reader.key");
    std::fs::copy(env.ledger.with_file_name("ledger.key"), &key).unwrap();
    std::os::unix::fs::chown(&key, Some(NOBODY), Some(NOBODY)).unwrap();

    for args in [
        &["list"][..],
        &["show", "push-conf-1"],
        &["stats"],
        &["audit", "verify"],
    ] {
        let out = as_nobody(&env, &ledger, &key, args);
        assert!(
            out.status.success(),
            "{args:?} on a read-only ledger: {}",
            text(&out.stderr)
        );
    }
    let listed = text(&as_nobody(&env, &ledger, &key, &["list"]).stdout);
    assert!(listed.contains("push-conf-1"), "{listed}");

    // A command that records, or archives, says which file, why, and what to do.
    let archive = dir.join("archive.jsonl");
    let archive = archive.to_str().unwrap();
    for args in [
        &["reconcile"][..],
        &["ledger", "archive", "--before", "1s", archive],
    ] {
        let out = as_nobody(&env, &ledger, &key, args);
        let said = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {said}");
        assert!(
            said.contains(&ledger.display().to_string()),
            "{args:?}: {said}"
        );
        assert!(said.contains("write access"), "{args:?}: {said}");
        assert!(
            !said.contains("readonly database") && !said.contains("unable to open database file")
                || said.contains("cannot open the ledger"),
            "{args:?}: {said}"
        );
    }

    // Unreadable (0600, root's): the path, the cause and the fix, not SQLite's words alone.
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = as_nobody(&env, &ledger, &key, &["list"]);
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(248), "{said}");
    assert!(
        said.contains(&format!("cannot read the ledger {}", ledger.display()))
            && said.contains("read access"),
        "{said}"
    );

    // Not a ledger at all.
    std::fs::write(
        &ledger,
        "this is not a database, just a text file that is long enough to have a header\n"
            .repeat(10),
    )
    .unwrap();
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = env
        .opmark()
        .env("OPMARK_LEDGER", &ledger)
        .arg("list")
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert!(
        said.contains(&format!("{} is not an opmark ledger", ledger.display())),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `opmark -F CFG ARGS` in `env`: exit code, stdout, stderr.
fn say(env: &Sealed, cfg: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = env.opmark().arg("-F").arg(cfg).args(args).output().unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn reconcile_on_a_cut_host_advises_waiting_an_abandon_needs_force_and_is_never_called_tampering() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = support::fresh_dir(crate::test_name!());
    let cfg = support::fast_loss_config(&lab, &dir);
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops/slow-1");
    // The command ends when the test says so: still running while the link is cut.
    let gate = dir.join("gate");
    let command = format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display());
    let child = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args([
            "--json", "run", "target1", "--op", "slow-1", "--wait", "3s", "--", &command,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for("the command to start", Duration::from_secs(20), || {
        marker.join("started").exists()
    });
    lab.cut("target1").unwrap();
    let out = support::finish_within(child, Duration::from_secs(120), "run over a cut link");
    assert_eq!(
        json(&out)["verdict"],
        "indeterminate",
        "{}",
        text(&out.stdout)
    );

    // reconcile: waiting and looking first, no decision ready to paste.
    let (_, said, err) = say(&env, &cfg, &["reconcile"]);
    // As a shell reads it: lines ending in `\` go on.
    let said = said.replace(" \\\n      ", " ");
    assert!(said.contains("may still be running"), "{said}{err}");
    assert!(said.contains("show slow-1 --host target1"), "{said}");
    assert!(
        !said.contains("checked by hand"),
        "no note claiming a check: {said}"
    );
    assert!(!said.contains("decide: "), "nothing ready to paste: {said}");

    // Abandon while the host cannot be reached: what it risks, and --force.
    let abandon = [
        "resolve",
        "slow-1",
        "--as",
        "abandoned",
        "--note",
        "gave up",
    ];
    let (code, _, err) = say(&env, &cfg, &abandon);
    assert_eq!(code, Some(247), "unreachable: {err}");
    assert!(
        err.contains("--force") && err.contains("may still be running"),
        "{err}"
    );
    let shown = json(
        &env.opmark()
            .args(["--json", "show", "slow-1"])
            .output()
            .unwrap(),
    );
    assert_eq!(
        shown["operation"]["unresolved"], true,
        "nothing recorded: {shown}"
    );

    // Forced; then the command finishes and the host comes back: the contradiction is
    // told as a decision taken blind, not as edited evidence.
    let (code, _, err) = say(&env, &cfg, &[&abandon[..], &["--force"]].concat());
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(&gate, "").unwrap();
    support::wait_for(
        "the exit record on the host",
        Duration::from_secs(20),
        || marker.join("exit").exists(),
    );
    lab.restore("target1").unwrap();
    let (_, _, err) = say(&env, &cfg, &["probe", "target1", "slow-1"]);
    let shown = json(
        &env.opmark()
            .args(["--json", "show", "slow-1"])
            .output()
            .unwrap(),
    );
    let contradictions = shown["contradictions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !contradictions.is_empty(),
        "the host's exit contradicts the decision: {shown} {err}"
    );
    for c in &contradictions {
        let why = c["why"].as_str().unwrap_or_default();
        assert!(why.contains("while the host could not be reached"), "{c}");
        assert!(!why.contains("edited"), "{c}");
    }
    let (_, page, _) = say(&env, &cfg, &["show", "slow-1"]);
    assert!(page.contains("CONTRADICTED"), "{page}");
    assert!(!page.contains("was edited"), "{page}");
}

#[test]
fn a_fleet_with_a_bad_or_repeated_host_answers_in_the_fleet_shape_and_runs_the_others() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "--json",
            "run",
            "target1",
            "nohost.invalid",
            "--op",
            "fleet-x",
            "--",
            "echo ran",
        ])
        .output()
        .unwrap();
    let doc = json(&out);
    let mut docs = vec![doc.clone()];
    let hosts = doc["hosts"].as_array().expect("the fleet shape");
    assert_eq!(hosts.len(), 2, "an entry per host: {doc}");
    assert_eq!(hosts[0]["host"], "target1", "{doc}");
    assert_eq!(hosts[0]["verdict"], "completed", "the good host ran: {doc}");
    assert_eq!(hosts[0]["stdout"], "ran\n", "{doc}");
    assert_eq!(hosts[1]["host"], "nohost.invalid", "{doc}");
    assert_eq!(
        hosts[1]["error"]["reason_code"], "name_unresolvable",
        "{doc}"
    );
    assert_eq!(doc["summary"]["host_count"], 2, "{doc}");
    assert_eq!(doc["summary"]["failed"], 1, "{doc}");

    // Named twice: one operation, one entry, and a word on stderr.
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "--json",
            "run",
            "target1",
            "target1",
            "--op",
            "fleet-y",
            "--",
            "echo once",
        ])
        .output()
        .unwrap();
    let doc = json(&out);
    docs.push(doc.clone());
    let hosts = doc["hosts"].as_array().expect("the fleet shape");
    assert_eq!(hosts.len(), 1, "{doc}");
    assert_eq!(hosts[0]["stdout"], "once\n", "{doc}");
    assert!(
        text(&out.stderr).contains("named more than once"),
        "{}",
        text(&out.stderr)
    );

    // --max-failures 1: the bad host is the one failure, nothing else is dispatched.
    let out = env
        .opmark_with_lab(&lab)
        .args([
            "--json",
            "run",
            "nohost.invalid",
            "target1",
            "--op",
            "fleet-z",
            "--max-failures",
            "1",
            "--",
            "echo no",
        ])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(
        doc["hosts"][1]["reason_code"], "not_dispatched_max_failures",
        "{doc}"
    );
    docs.push(doc);
    // Each one a fleet document as its schema says, bad host and repeated host included.
    support::schema::validate(crate::test_name!(), &[("fleet", docs)]);
}

#[test]
fn list_json_says_whether_the_page_left_operations_out_and_how_many() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    for op in ["page-1", "page-2", "page-3"] {
        let a = support::run_json(&env, &lab, &["target1", "--op", op, "--", "true"]);
        assert_eq!(a.verdict(), "completed", "{a:?}");
    }
    let list = |args: &[&str]| {
        let out = env
            .opmark()
            .arg("--json")
            .arg("list")
            .args(args)
            .output()
            .unwrap();
        (json(&out), text(&out.stderr))
    };
    let (paged, said) = list(&["--limit", "2"]);
    assert_eq!(
        paged["operations"].as_array().map(Vec::len),
        Some(2),
        "{paged}"
    );
    assert_eq!(paged["truncated"], true, "{paged}");
    assert_eq!(paged["more_count"], 1, "{paged}");
    assert!(said.contains("1 more not shown"), "{said}");
    let (whole, said) = list(&[]);
    assert_eq!(
        whole["operations"].as_array().map(Vec::len),
        Some(3),
        "{whole}"
    );
    assert_eq!(whole["truncated"], false, "{whole}");
    assert!(whole["more_count"].is_null(), "{whole}");
    assert!(!said.contains("not shown"), "{said}");
    support::schema::validate(crate::test_name!(), &[("list", vec![paged, whole])]);
}
