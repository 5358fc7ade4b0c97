//! Evidence identity (docs/guarantees.md#evidence-identity, issue 24 rows 2 and 8) against real sshd targets: an
//! operation is bound to the machine (host key), the user and the marker root its
//! attempts reached. Another user on the same machine, a wiped or rebuilt marker root, or
//! another lab's target under the same name is `conflict`/`host_changed`: nothing is
//! sent or concluded there, and nothing runs twice.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use opmark::lab::Target;

use crate::support::{self, answer, json, lines, output, text, wait_for, Lab, Sealed};

/// An ssh config in which `alias` names the lab target `to`, logging in as `user`.
fn config(lab: &Lab, dir: &Path, alias: &str, to: &Target, user: &str) -> PathBuf {
    let path = dir.join(format!("ssh_config-{alias}-{}-{user}", to.alias));
    std::fs::write(
        &path,
        format!(
            "Host {alias}\n  HostName {}\n  Port {}\n  User {user}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            to.addr,
            to.port,
            lab.client_key().display(),
            lab.known_hosts().display()
        ),
    )
    .unwrap();
    path
}

/// A second login on the same machine with its own marker root: a user with the lab
/// user's uid (so the lab's authorized key and files serve it too) whose login shell
/// points `XDG_STATE_HOME` elsewhere, as another account's own state directory would be.
/// Removed on drop.
struct OtherUser {
    name: String,
    state: PathBuf,
}

impl OtherUser {
    fn create(dir: &Path) -> Option<OtherUser> {
        let name = format!("opmk-id-{}", std::process::id());
        let state = dir.join("other-state");
        std::fs::create_dir_all(&state).unwrap();
        let shell = dir.join("other-login-shell");
        std::fs::write(
            &shell,
            format!(
                "#!/bin/sh\nXDG_STATE_HOME={}\nexport XDG_STATE_HOME\nexec /bin/sh \"$@\"\n",
                state.display()
            ),
        )
        .unwrap();
        let made = Command::new("chmod")
            .arg("755")
            .arg(&shell)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new("useradd")
                .args(["-o", "-u", "0", "-g", "0", "-M", "-p", "*", "-d"])
                .arg(dir)
                .arg("-s")
                .arg(&shell)
                .arg(&name)
                .status()
                .is_ok_and(|s| s.success());
        if !made {
            let _ = Command::new("userdel")
                .arg("-f")
                .arg(&name)
                .stderr(std::process::Stdio::null())
                .status();
            support::skip_or_fail(
                &support::current_test(),
                "useradd could not create a second login user",
            );
            return None;
        }
        Some(OtherUser { name, state })
    }

    fn marker_root(&self) -> PathBuf {
        self.state.join("opmark")
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel")
            .arg("-f")
            .arg(&self.name)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[test]
fn a_user_switch_under_the_alias_is_host_changed_and_the_command_runs_once() {
    if !support::require_root(crate::test_name!()) || !support::require_tool("useradd") {
        return;
    }
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = env.root.join("identity");
    std::fs::create_dir_all(&dir).unwrap();
    let Some(other) = OtherUser::create(&dir) else {
        return;
    };
    let t = lab.target("target1").unwrap().clone();
    let as_lab_user = config(&lab, &dir, "target1", &t, &t.user);
    let as_other = config(&lab, &dir, "target1", &t, &other.name);
    let effect = dir.join("runs");
    let command = format!("echo ran >> {}; sleep 2", effect.display());

    // Unsettled: the command runs on, its outcome not in the ledger.
    let first = answer(output(env.opmark().arg("-F").arg(&as_lab_user).args([
        "--json", "run", "target1", "--op", "user-1", "--detach", "--", &command,
    ])));
    assert_eq!(first.verdict(), "in_progress", "{first:?}");

    // The alias's User changes: same machine, same host key, another marker root.
    let moved =
        answer(output(env.opmark().arg("-F").arg(&as_other).args([
            "--json", "run", "target1", "--op", "user-1", "--", &command,
        ])));
    assert_eq!(
        (moved.verdict(), moved.code()),
        ("conflict", ("host_changed", false)),
        "{moved:?}"
    );
    let reason = moved.json["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "host changed: target1 is now reached as user {} but operation user-1 ran as user {}",
            other.name, t.user
        )),
        "{reason}"
    );
    assert!(
        reason.contains(&format!(
            "reached before as {}@{}:{}",
            t.user, t.addr, t.port
        )),
        "the route it was reached by before: {reason}"
    );
    // The earlier attempt reached the host, so the rerun looked first (an observation)
    // and made no attempt: nothing was sent.
    assert_eq!(moved.json["attempts"], serde_json::json!([]), "{moved:?}");
    assert_eq!(moved.json["observations"][0]["kind"], "probe", "{moved:?}");
    assert!(
        !other.marker_root().join("ops/user-1").exists(),
        "claimed in the other user's marker root"
    );
    // Still unresolved: nothing was concluded.
    let list = json(&output(env.opmark().args([
        "--json",
        "list",
        "--unresolved",
    ])));
    assert_eq!(list["operations"].as_array().unwrap().len(), 1, "{list}");
    // The operator commands go no further as the other user, and say so as run does.
    let ran_as = format!("ran as user {}", t.user);
    let before = format!("reached before as {}@{}:{}", t.user, t.addr, t.port);
    for command in operator_commands("user-1") {
        let out = output(
            env.opmark()
                .arg("-F")
                .arg(&as_other)
                .arg("--json")
                .args(&command),
        );
        assert_host_changed(&out, &command, "user-1", &[&ran_as, &before]);
    }
    let out = output(
        env.opmark()
            .arg("-F")
            .arg(&as_other)
            .args(["probe", "target1", "user-1"]),
    );
    assert_eq!(out.status.code(), Some(243), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with(&format!(
            "opmark: conflict: host changed: target1 is now reached as user {}",
            other.name
        )),
        "{}",
        text(&out.stderr)
    );
    let doc = json(&output(
        env.opmark()
            .arg("-F")
            .arg(&as_other)
            .args(["--json", "reconcile"]),
    ));
    let row = &doc["operations"][0];
    assert_eq!(row["decision"], "host_changed", "{doc}");
    assert_eq!(row["settled"], false, "{doc}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("ran as user {}", t.user)),
        "{doc}"
    );
    assert!(!other.marker_root().join("ops/user-1").exists());

    // The way it ran before follows it to its end, in the root it claimed.
    let back = answer(output(env.opmark().arg("-F").arg(&as_lab_user).args([
        "--json", "run", "target1", "--op", "user-1", "--wait", "20s", "--", &command,
    ])));
    assert!(
        matches!(back.verdict(), "replayed" | "completed"),
        "{back:?}"
    );
    assert_eq!(back.exit_code(), Some(0), "{back:?}");
    assert_eq!(lines(&effect), 1, "the command ran once");
}

#[test]
fn a_wiped_marker_root_is_host_changed_for_an_operation_with_attempts_and_nothing_runs_twice() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let t = lab.target("target1").unwrap().clone();
    let effect = env.root.join("runs");
    let command = format!("echo ran >> {}; sleep 1", effect.display());
    let first = answer(output(env.opmark_with_lab(&lab).args([
        "--json", "run", "target1", "--op", "root-1", "--detach", "--", &command,
    ])));
    assert_eq!(first.verdict(), "in_progress", "{first:?}");
    let root_id = std::fs::read_to_string(t.marker_root().join("root_id")).unwrap();
    let root_id = root_id.trim().to_owned();
    assert_eq!(root_id.len(), 32, "{root_id}");
    assert!(root_id.chars().all(|c| c.is_ascii_hexdigit()), "{root_id}");

    // show names the root each attempt reached, whole (JSON and text).
    let shown = json(&output(env.opmark().args(["--json", "show", "root-1"])));
    assert_eq!(shown["attempts"][0]["root_id"], root_id.as_str(), "{shown}");
    let shown = output(env.opmark().args(["show", "root-1"]));
    assert!(
        text(&shown.stdout).contains(&format!("marker root {root_id}")),
        "{}",
        text(&shown.stdout)
    );

    // The command finishes; then the marker root is wiped (a rebuilt host or container).
    let exit = t.marker_root().join("ops/root-1/exit");
    wait_for("the exit record", Duration::from_secs(20), || exit.exists());
    std::fs::remove_dir_all(t.marker_root()).unwrap();
    let again =
        answer(output(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", "root-1", "--", &command,
        ])));
    assert_eq!(
        (again.verdict(), again.code()),
        ("conflict", ("host_changed", false)),
        "{again:?}"
    );
    let reason = again.json["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("host changed: the marker root on target1")
            && reason.contains("a root with no id")
            && reason.contains(&format!("reached marker root {root_id}")),
        "{reason}"
    );
    assert!(
        !t.marker_root().join("ops/root-1").exists(),
        "claimed in the new root"
    );
    // The operator commands refuse the same way before acting, and make no root id.
    let expected = format!("reached marker root {root_id}");
    for command in operator_commands("root-1") {
        let out = output(env.opmark_with_lab(&lab).arg("--json").args(&command));
        assert_host_changed(&out, &command, "root-1", &[&expected, "a root with no id"]);
    }
    assert!(
        !t.marker_root().join("ops/root-1").exists(),
        "fenced in the new root"
    );
    assert!(
        !t.marker_root().join("root_id").exists(),
        "a new root id was made"
    );

    // Another operation makes the new root's id; the old operation is still held to its own.
    let other =
        answer(output(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", "root-2", "--", "true",
        ])));
    assert_eq!(other.verdict(), "completed", "{other:?}");
    let new_id = std::fs::read_to_string(t.marker_root().join("root_id")).unwrap();
    let new_id = new_id.trim().to_owned();
    assert_ne!(new_id, root_id);
    let again =
        answer(output(env.opmark_with_lab(&lab).args([
            "--json", "run", "target1", "--op", "root-1", "--", &command,
        ])));
    assert_eq!(again.code(), ("host_changed", false), "{again:?}");
    let reason = again.json["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "is marker root {new_id} but operation root-1 reached marker root {root_id}"
        )),
        "{reason}"
    );
    assert!(!t.marker_root().join("ops/root-1").exists());

    // reconcile refuses the same way and shows the root the attempts reached.
    let out = output(env.opmark_with_lab(&lab).args(["--json", "reconcile"]));
    let doc = json(&out);
    let row = doc["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["op_id"] == "root-1")
        .unwrap_or_else(|| panic!("{doc}"))
        .clone();
    assert_eq!(row["decision"], "host_changed", "{doc}");
    assert_eq!(row["settled"], false, "{doc}");
    assert_eq!(row["root_id"], root_id.as_str(), "{doc}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("reached marker root {root_id}")),
        "{doc}"
    );
    let out = output(env.opmark_with_lab(&lab).arg("reconcile"));
    assert!(
        text(&out.stdout).contains(&format!("[marker root {}]", &root_id[..12])),
        "{}",
        text(&out.stdout)
    );
    assert!(
        !t.marker_root().join("ops/root-1").exists(),
        "reconcile fenced in the new root"
    );
    assert_eq!(lines(&effect), 1, "the command ran once");
}

#[test]
fn a_ledger_exit_under_a_reused_name_is_not_replayed_from_another_machine() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = env.root.join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let a = lab.target("target1").unwrap().clone();
    let b = lab.target("target2").unwrap().clone();
    // Two labs that both call their target `target1`: one ledger, one name.
    let lab_one = config(&lab, &dir, "target1", &a, &a.user);
    let lab_two = config(&lab, &dir, "target1", &b, &b.user);
    let effect = env.root.join("runs");
    let command = format!("echo ran >> {}", effect.display());
    let done =
        answer(output(env.opmark().arg("-F").arg(&lab_one).args([
            "--json", "run", "target1", "--op", "name-1", "--", &command,
        ])));
    assert_eq!(done.verdict(), "completed", "{done:?}");
    // Even with the marker gone from the first machine the ledger's exit is about it,
    // not about the second.
    std::fs::remove_dir_all(a.marker_root().join("ops/name-1")).unwrap();

    let there =
        answer(output(env.opmark().arg("-F").arg(&lab_two).args([
            "--json", "run", "target1", "--op", "name-1", "--", &command,
        ])));
    assert_eq!(
        (there.verdict(), there.code()),
        ("conflict", ("host_changed", false)),
        "{there:?}"
    );
    assert_eq!(there.exit_code(), None, "{there:?}");
    let reason = there.json["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("host changed: host key for target1 is now SHA256:")
            && reason.contains(&format!(
                "reached before as {}@{}:{}",
                a.user, a.addr, a.port
            )),
        "{reason}"
    );
    assert!(
        !b.marker_root().join("ops/name-1").exists(),
        "the second machine was claimed on"
    );
    assert_eq!(lines(&effect), 1, "ran once, on the first machine");

    // On the first machine the ledger's memory still answers (its marker is gone).
    let here =
        answer(output(env.opmark().arg("-F").arg(&lab_one).args([
            "--json", "run", "target1", "--op", "name-1", "--", &command,
        ])));
    assert_eq!(
        (here.verdict(), here.reason_code()),
        ("replayed", "replayed_from_ledger"),
        "{here:?}"
    );
    assert_eq!(here.exit_code(), Some(0));
    assert_eq!(lines(&effect), 1);
}

/// `probe`, `cancel`, `resolve` (both host-checked decisions) and `gc` of operation `op`
/// on target1: every operator command that acts on host evidence.
fn operator_commands(op: &str) -> Vec<Vec<String>> {
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    vec![
        words(&["probe", "target1", op]),
        words(&["cancel", "target1", op]),
        words(&[
            "resolve",
            op,
            "--host",
            "target1",
            "--as",
            "not-applied",
            "--note",
            "chaos",
        ]),
        words(&[
            "resolve",
            op,
            "--host",
            "target1",
            "--as",
            "abandoned",
            "--note",
            "chaos",
        ]),
        words(&["gc", "target1", "--older-than", "3650d"]),
    ]
}

/// `out` (a `--json` operator command) answered as `run` answers a host change: exit
/// 243, `conflict`/`host_changed`, not retryable, a reason that holds every `needle`.
fn assert_host_changed(out: &Output, command: &[String], op: &str, needles: &[&str]) {
    let doc = json(out);
    assert_eq!(
        out.status.code(),
        Some(243),
        "{command:?}: {doc} {}",
        text(&out.stderr)
    );
    assert_eq!(doc["verdict"], "conflict", "{command:?}: {doc}");
    assert_eq!(doc["reason_code"], "host_changed", "{command:?}: {doc}");
    assert_eq!(doc["retryable"], false, "{command:?}: {doc}");
    assert_eq!(doc["op_id"], op, "{command:?}: {doc}");
    // The command's own document, not a run's: it names itself and has no run fields.
    assert_eq!(doc["subcommand"], command[0].as_str(), "{command:?}: {doc}");
    assert!(
        doc.get("exit_code").is_none() && doc.get("attempt_id").is_none(),
        "{command:?}: {doc}"
    );
    let reason = doc["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("host changed: "),
        "{command:?}: {reason}"
    );
    for needle in needles {
        assert!(
            reason.contains(needle),
            "{command:?}: no {needle:?} in {reason}"
        );
    }
}
