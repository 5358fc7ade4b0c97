//! Signed approvals (docs/trust.md#the-approval-flow) against a real sshd: where the
//! policy names `approvers`, an agent without an approver's key cannot get a held run to
//! run by anything `run` accepts, and a token a human signed with `opmark approve` lets
//! exactly one attempt run. What "nothing ran" means here: the held command would have
//! created a file on the host, and it does not exist.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use opmark::lab::Lab;

use crate::support::{self, answer, fresh_dir, json, lines, Answer, Sealed};

/// A policy that holds `touch` for approval, and the approvers it names.
struct Approvals {
    dir: PathBuf,
    policy: PathBuf,
    /// The same rules without `approvers`: what an agent would pass with `--policy`.
    self_service: PathBuf,
    approver_key: PathBuf,
    stranger_key: PathBuf,
    signers: PathBuf,
}

const RULES: &str = r#"default_family = "destructive"
[families.read-only]
attempts = 3
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
name = "held-touch"
family = "destructive"
pattern = '^touch '
approval = "always"
"#;

fn keygen_with_comment(path: &Path, comment: &str) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh-keygen failed for {}", path.display());
}

impl Approvals {
    fn new(name: &str) -> Approvals {
        let dir = fresh_dir(name);
        let approver_key = dir.join("approver");
        let stranger_key = dir.join("stranger");
        keygen_with_comment(&approver_key, "approver");
        keygen_with_comment(&stranger_key, "stranger");
        let public = std::fs::read_to_string(approver_key.with_extension("pub")).unwrap();
        let signers = dir.join("allowed_signers");
        std::fs::write(
            &signers,
            format!("approver@example.com {}\n", public.trim()),
        )
        .unwrap();
        let policy = dir.join("policy.toml");
        std::fs::write(&policy, format!("approvers = \"allowed_signers\"\n{RULES}")).unwrap();
        let self_service = dir.join("self-service.toml");
        std::fs::write(&self_service, RULES).unwrap();
        Approvals {
            dir,
            policy,
            self_service,
            approver_key,
            stranger_key,
            signers,
        }
    }

    /// `opmark --policy POLICY --json run target ARGS`.
    fn run(&self, env: &Sealed, lab: &Lab, policy: &Path, args: &[&str]) -> Answer {
        answer(
            env.opmark_with_lab(lab)
                .arg("--policy")
                .arg(policy)
                .args(["--json", "run"])
                .args(args)
                .output()
                .unwrap(),
        )
    }

    /// `opmark approve OP HOST --note ... -i KEY -o FILE` under `policy`.
    #[allow(clippy::too_many_arguments)]
    fn approve(
        &self,
        env: &Sealed,
        policy: &Path,
        key: &Path,
        op: &str,
        host: &str,
        extra: &[&str],
        file: &str,
    ) -> (Output, PathBuf) {
        let out = self.dir.join(file);
        let output = env
            .opmark()
            .arg("--policy")
            .arg(policy)
            .args([
                "approve",
                op,
                host,
                "--note",
                "checked the rollback plan",
                "-i",
            ])
            .arg(key)
            .arg("-o")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap();
        (output, out)
    }
}

fn held(a: &Answer, code: &str) {
    assert_eq!(a.verdict(), "blocked", "{a:?}");
    assert_eq!(a.code(), (code, false), "{a:?}");
    assert_eq!(a.status, 244, "{a:?}");
}

#[test]
fn no_means_an_agent_has_lifts_a_signed_hold_and_a_signed_token_runs_it_once() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ap = Approvals::new(crate::test_name!());
    let target = |n: &str| lab.target(n).unwrap();
    let effect = ap.dir.join("effect");
    let touch = format!("touch {}", effect.display());
    let args = |op: &'static str, cmd: &str| -> Vec<String> {
        ["target1", "--op", op, "--", cmd]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let run = |policy: &Path, op: &'static str, cmd: &str, extra: &[&str]| {
        let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        a.extend(args(op, cmd));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        ap.run(&env, &lab, policy, &a)
    };

    // Held, and the answer carries the exact command for the human.
    let first = run(&ap.policy, "held-1", &touch, &[]);
    held(&first, "approval_required");
    let command = first.json["approval_needed"]["approve_command"]
        .as_str()
        .unwrap_or_else(|| panic!("no approve_command: {first:?}"))
        .to_owned();
    assert!(
        command.starts_with("opmark approve held-1 target1 --intent "),
        "{command}"
    );
    assert!(first.json["reason"]
        .as_str()
        .unwrap()
        .contains("--approve NOTE does not count"));

    // Self-approval, whatever the agent passes with it.
    let selfish = run(&ap.policy, "held-1", &touch, &["--approve", "trust me"]);
    held(&selfish, "approval_required");

    // A token signed by a key that is not an approver (made under a policy that checks
    // nothing, as an agent could): refused by the signature check.
    let intent = command
        .split("--intent ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let (made, stranger) = ap.approve(
        &env,
        &ap.self_service,
        &ap.stranger_key,
        "held-1",
        "target1",
        &["--intent", intent],
        "stranger.tok",
    );
    assert!(made.status.success(), "{}", support::text(&made.stderr));
    let a = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", stranger.to_str().unwrap()],
    );
    held(&a, "approval_invalid");
    assert!(
        a.json["reason"]
            .as_str()
            .unwrap()
            .contains("not an approver"),
        "{a:?}"
    );

    // The approver's own token, for the next checks.
    let (made, good) = ap.approve(
        &env,
        &ap.policy,
        &ap.approver_key,
        "held-1",
        "target1",
        &["--intent", intent],
        "good.tok",
    );
    assert!(made.status.success(), "{}", support::text(&made.stderr));
    let token = std::fs::read_to_string(&good).unwrap();

    // OpenSSH checks it with no opmark code.
    let at = token.find("-----BEGIN SSH SIGNATURE-----").unwrap();
    std::fs::write(ap.dir.join("good.msg"), &token[..at]).unwrap();
    std::fs::write(ap.dir.join("good.sig"), &token[at..]).unwrap();
    let verified = Command::new("ssh-keygen")
        .args([
            "-Y",
            "verify",
            "-n",
            "opmark-approval",
            "-I",
            "approver@example.com",
            "-f",
        ])
        .arg(&ap.signers)
        .arg("-s")
        .arg(ap.dir.join("good.sig"))
        .stdin(std::fs::File::open(ap.dir.join("good.msg")).unwrap())
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "ssh-keygen -Y verify: {}",
        support::text(&verified.stderr)
    );

    // One byte changed in the statement: the signature no longer covers it.
    let edited = ap.dir.join("edited.tok");
    std::fs::write(
        &edited,
        token.replacen("checked the rollback plan", "checked the rollback plam", 1),
    )
    .unwrap();
    let a = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", edited.to_str().unwrap()],
    );
    held(&a, "approval_invalid");

    // The same token for another op id, host or intent.
    let other_op = run(
        &ap.policy,
        "held-2",
        &touch,
        &["--approval", good.to_str().unwrap()],
    );
    assert_eq!(other_op.verdict(), "blocked", "{other_op:?}");
    assert_eq!(other_op.reason_code(), "approval_mismatch", "{other_op:?}");
    let mut on_target2: Vec<String> = vec!["--approval".into(), good.display().to_string()];
    on_target2.extend(["target2", "--op", "held-1", "--", &touch].map(String::from));
    let on_target2: Vec<&str> = on_target2.iter().map(String::as_str).collect();
    let other_host = ap.run(&env, &lab, &ap.policy, &on_target2);
    held(&other_host, "approval_mismatch");
    assert!(
        other_host.json["reason"]
            .as_str()
            .unwrap()
            .contains("another host"),
        "{other_host:?}"
    );
    let other_intent = run(
        &ap.policy,
        "held-1",
        &format!("{touch}-too"),
        &["--approval", good.to_str().unwrap()],
    );
    held(&other_intent, "approval_mismatch");

    // Expired.
    let (made, brief) = ap.approve(
        &env,
        &ap.policy,
        &ap.approver_key,
        "held-1",
        "target1",
        &["--for", "1s"],
        "brief.tok",
    );
    assert!(made.status.success(), "{}", support::text(&made.stderr));
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let a = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", brief.to_str().unwrap()],
    );
    held(&a, "approval_expired");

    // The agent's own policy file, without `approvers`: where the machine's approvers
    // file is set, it holds whatever policy the caller names.
    let mut own = env.opmark_with_lab(&lab);
    own.env("OPMARK_TEST_SYSTEM_APPROVERS", &ap.signers)
        .arg("--policy")
        .arg(&ap.self_service)
        .args([
            "--json",
            "run",
            "target1",
            "--op",
            "held-1",
            "--approve",
            "mine",
            "--",
            &touch,
        ]);
    let a = answer(own.output().unwrap());
    held(&a, "approval_required");

    assert!(
        !effect.exists(),
        "nothing may have run before a valid approval"
    );
    assert!(!target("target1").marker_root().join("ops/held-1").exists());

    // A valid token, first used while the host is down: the attempt it let start was
    // not sent, and the token is spent.
    lab.stop_sshd("target1").unwrap();
    let down = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", good.to_str().unwrap(), "--wait", "3s"],
    );
    assert_eq!(down.verdict(), "not_applied", "{down:?}");
    lab.start_sshd("target1").unwrap();
    let again = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", good.to_str().unwrap()],
    );
    held(&again, "approval_used");
    assert!(
        again.json["reason"]
            .as_str()
            .unwrap()
            .contains("used already"),
        "{again:?}"
    );
    assert!(!effect.exists());

    // A fresh token runs it, once; the same token again replays (nothing runs twice).
    let (made, fresh) = ap.approve(
        &env,
        &ap.policy,
        &ap.approver_key,
        "held-1",
        "target1",
        &["--intent", intent],
        "fresh.tok",
    );
    assert!(made.status.success(), "{}", support::text(&made.stderr));
    let ran = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", fresh.to_str().unwrap()],
    );
    assert_eq!(ran.verdict(), "completed", "{ran:?}");
    assert!(effect.exists());
    let replay = run(
        &ap.policy,
        "held-1",
        &touch,
        &["--approval", fresh.to_str().unwrap()],
    );
    assert_eq!(replay.verdict(), "replayed", "{replay:?}");

    // show names the signer and the key.
    let shown = json(
        &env.opmark()
            .args(["--json", "show", "held-1", "--host", "target1"])
            .output()
            .unwrap(),
    );
    let approvals = shown["approvals"]
        .as_array()
        .unwrap_or_else(|| panic!("{shown}"));
    let signed: Vec<_> = approvals.iter().filter(|a| a["key"].is_string()).collect();
    assert_eq!(
        signed.len(),
        2,
        "the not-sent use and the one that ran: {shown}"
    );
    assert_eq!(signed[1]["by"], "approver@example.com");
    assert!(signed[1]["key"].as_str().unwrap().starts_with("SHA256:"));
    let _ = lines(&effect);
}

#[test]
fn bad_approval_input_is_refused_before_anything_is_recorded_or_sent() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ap = Approvals::new(crate::test_name!());
    let effect = ap.dir.join("effect");
    let garbage = ap.dir.join("garbage.tok");
    std::fs::write(&garbage, "opmark-approval v1\nop: x\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        // A token for a run that needs none (no rule holds `true`).
        (
            vec![
                "--approval".into(),
                garbage.display().to_string(),
                "target1".into(),
                "--op".into(),
                "free".into(),
                "--".into(),
                "true".into(),
            ],
            "malformed",
        ),
        (
            vec![
                "--approval".into(),
                ap.dir.join("missing.tok").display().to_string(),
                "target1".into(),
                "--op".into(),
                "missing".into(),
                "--".into(),
                format!("touch {}", effect.display()),
            ],
            "missing.tok",
        ),
    ];
    for (args, says) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = env
            .opmark_with_lab(&lab)
            .arg("--policy")
            .arg(&ap.policy)
            .args(["run"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(245),
            "{}",
            support::text(&out.stderr)
        );
        assert!(
            support::text(&out.stderr).contains(says),
            "{}",
            support::text(&out.stderr)
        );
    }
    // A well-formed token where no approval is needed, or no approvers are configured.
    let held_first = ap.run(
        &env,
        &lab,
        &ap.policy,
        &[
            "target1",
            "--op",
            "needs",
            "--",
            &format!("touch {}", effect.display()),
        ],
    );
    held(&held_first, "approval_required");
    let (made, tok) = ap.approve(
        &env,
        &ap.policy,
        &ap.approver_key,
        "needs",
        "target1",
        &[],
        "needs.tok",
    );
    assert!(made.status.success(), "{}", support::text(&made.stderr));
    let needless = ap.run(
        &env,
        &lab,
        &ap.policy,
        &[
            "--approval",
            tok.to_str().unwrap(),
            "target1",
            "--op",
            "free",
            "--",
            "true",
        ],
    );
    assert_eq!(needless.verdict(), "refused", "{needless:?}");
    assert!(needless.json["reason"]
        .as_str()
        .unwrap()
        .contains("needs no approval"));
    let unconfigured = ap.run(
        &env,
        &lab,
        &ap.self_service,
        &[
            "--approval",
            tok.to_str().unwrap(),
            "target1",
            "--op",
            "needs",
            "--",
            &format!("touch {}", effect.display()),
        ],
    );
    assert_eq!(unconfigured.verdict(), "refused", "{unconfigured:?}");
    assert!(unconfigured.json["reason"]
        .as_str()
        .unwrap()
        .contains("no approvers are configured"));
    // Nothing recorded for the refused ones, nothing ran.
    let listed = json(&env.opmark().args(["--json", "list"]).output().unwrap());
    let ops: Vec<&str> = listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["op_id"].as_str())
        .collect();
    assert_eq!(ops, vec!["needs"], "{listed}");
    assert!(!effect.exists());
    // approve of an op the ledger does not hold.
    let out = env
        .opmark()
        .arg("--policy")
        .arg(&ap.policy)
        .args(["approve", "nosuch", "target1", "--note", "x", "-i"])
        .arg(&ap.approver_key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245));
    assert!(
        support::text(&out.stderr).contains("no operation nosuch"),
        "{}",
        support::text(&out.stderr)
    );
    // A mistyped ledger is named, and no ledger is made there.
    let typo = ap.dir.join("typo").join("ledger.db");
    let out = env
        .opmark()
        .arg("--ledger")
        .arg(&typo)
        .args(["approve", "needs", "target1", "--note", "x", "-i"])
        .arg(&ap.approver_key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245));
    assert!(
        support::text(&out.stderr).contains("no ledger at"),
        "{}",
        support::text(&out.stderr)
    );
    assert!(!typo.exists() && !typo.parent().unwrap().exists());
}

#[test]
fn over_mcp_an_agent_can_only_present_a_token_a_human_signed_and_it_runs_once() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let Some(python) = crate::mcp::python_with_mcp(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ap = Approvals::new(crate::test_name!());
    let effect = ap.dir.join("effect");
    let touch = format!(
        "touch {}; echo touched >> {}.log",
        effect.display(),
        effect.display()
    );
    let config = lab.ssh_config();
    let (r, _) = crate::support::mcp::python_client(
        &python,
        &env,
        "approval.py",
        &[
            config.as_os_str(),
            ap.policy.as_os_str(),
            ap.self_service.as_os_str(),
            ap.approver_key.as_os_str(),
            ap.stranger_key.as_os_str(),
            ap.dir.as_os_str(),
            std::ffi::OsStr::new(&touch),
        ],
    );
    let is = |step: &str, verdict: &str, code: &str| {
        let d = &r[step];
        assert_eq!(d["verdict"], verdict, "{step}: {d}");
        assert_eq!(d["reason_code"], code, "{step}: {d}");
    };
    is("first", "blocked", "approval_required");
    // MCP has no `approve`: the argument itself is refused, nothing is run.
    assert_eq!(
        r["self_approved"]["_is_error"], true,
        "{}",
        r["self_approved"]
    );
    is("stranger", "blocked", "approval_invalid");
    is("garbage", "refused", "invalid_input");
    assert!(
        r["garbage"]["reason"]
            .as_str()
            .is_some_and(|m| m.contains("malformed")),
        "{}",
        r["garbage"]
    );
    assert_eq!(
        r["ran_before_approval"], false,
        "nothing ran before the human's token: {r}"
    );

    is("approved", "completed", "command_exited");
    assert_eq!(r["approved"]["exit_code"], 0, "{}", r["approved"]);
    is("again", "replayed", "replayed_from_host");
    // A token counts for its own op id only.
    is("other_op", "blocked", "approval_mismatch");
    assert_eq!(
        lines(&ap.dir.join("effect.log")),
        1,
        "the approved command ran exactly once: {r}"
    );
}
