//! The host's cached shim (issue 14): the first call to a host leaves the shim in its
//! marker root, later calls send only its hash, and a copy that does not hash to its name
//! is replaced, never run. A client that has not seen the host run its shim sends the
//! script in the first exchange (issue 31), so the first call costs no extra one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{self, log_len, text, Sealed};

fn cached_shim(lab: &Lab) -> PathBuf {
    lab.target("target1")
        .unwrap()
        .marker_root()
        .join("shim")
        .join(format!("{}.sh", opmark::shim::script_sha256()))
}

fn run_true(env: &Sealed, lab: &Lab, op: &str) -> Value {
    let out = env
        .opmark_with_lab(lab)
        .args(["--json", "run", "target1", "--op", op, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("run --json: {e}: {}", text(&out.stderr)));
    assert_eq!(doc["verdict"], "completed", "{doc}");
    doc
}

fn assert_is_the_shipped_shim(path: &Path) {
    let content = std::fs::read_to_string(path).expect("the cached shim");
    assert!(
        content == opmark::shim::SCRIPT,
        "{} is not the shipped shim",
        path.display()
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(path), 0o600, "{}", path.display());
    assert_eq!(mode(path.parent().unwrap()), 0o700);
}

#[test]
fn a_missing_cached_shim_is_filled_by_the_first_call_and_used_by_the_next() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let cache = cached_shim(&lab);
    let _ = std::fs::remove_file(&cache);
    run_true(&env, &lab, "fill-1");
    assert_is_the_shipped_shim(&cache);
    // Proof that the next call runs the file: its supervisor is started from it, and a
    // copy that stays byte-identical keeps its inode (nothing was rewritten).
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = ino(&cache);
    run_true(&env, &lab, "fill-2");
    assert_eq!(ino(&cache), before, "a good copy is used as is");
}

#[test]
fn a_tampered_cached_shim_is_never_run_and_is_replaced() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let cache = cached_shim(&lab);
    run_true(&env, &lab, "warm");
    assert_is_the_shipped_shim(&cache);

    let evidence = env.root.join("the-tampered-shim-ran");
    // A copy that would leave evidence if it ran at all.
    let tampered = format!("touch '{}'\n{}", evidence.display(), opmark::shim::SCRIPT);
    std::fs::write(&cache, tampered).unwrap();
    run_true(&env, &lab, "after-tamper");
    assert!(!evidence.exists(), "the tampered shim ran");
    assert_is_the_shipped_shim(&cache);

    // One byte is enough: a comment's letter, which would change nothing if it ran.
    let mut bytes = opmark::shim::SCRIPT.as_bytes().to_vec();
    let at = opmark::shim::SCRIPT.find("opmark host shim").unwrap();
    bytes[at] = b'O';
    std::fs::write(&cache, &bytes).unwrap();
    run_true(&env, &lab, "after-one-byte");
    assert_is_the_shipped_shim(&cache);
}

#[test]
fn a_run_ends_at_its_exit_frame_while_the_channel_is_still_held_open() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    // A process the login shell leaves behind with the session's stdout and stderr: sshd
    // sends the exit status when the session's shell exits, but closes the channel only
    // once every holder of its pipes is gone.
    // Only the session's shell leaves one (its stdin is the channel): the command's own
    // bash reads ~/.bashrc too, as under ssh, and a process left there holds the
    // command's output, which opmark waits for as ssh does.
    let holder = lab.targets()[0].dir.join("holders");
    std::fs::write(
        lab.targets()[0].home.join(".bashrc"),
        format!(
            "[ \"$(readlink /proc/$$/fd/0)\" = /dev/null ] || {{ sleep 120 & echo $! >> '{}'; }}\n",
            holder.display()
        ),
    )
    .unwrap();
    let env = Sealed::new(crate::test_name!());
    // The first call to this host carries the shim: one session, one holder.
    let doc = run_true(&env, &lab, "held-open");
    assert_eq!(doc["exit_code"], 0, "{doc}");
    let pids = std::fs::read_to_string(&holder).expect("the login shell ran .bashrc");
    let pids: Vec<&str> = pids.split_whitespace().collect();
    let alive: Vec<bool> = pids
        .iter()
        .map(|pid| Path::new("/proc").join(pid).exists())
        .collect();
    for pid in &pids {
        let _ = std::process::Command::new("kill").arg(pid).status();
    }
    assert!(!pids.is_empty());
    assert!(
        alive.iter().all(|&a| a),
        "the run waited for a channel to close, i.e. for its holder to end: {pids:?} {alive:?}"
    );
}

/// The sessions sshd started since `from` in the target's log (LogLevel VERBOSE says
/// "Starting session: command for ..." once per exec).
fn sessions_since(lab: &Lab, from: u64) -> usize {
    let log = std::fs::read(&lab.target("target1").unwrap().log).unwrap();
    String::from_utf8_lossy(&log[from as usize..])
        .matches("Starting session: command")
        .count()
}

#[test]
fn the_first_call_to_a_host_carries_the_shim_in_one_session_and_a_lost_copy_costs_one_more() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let cache = cached_shim(&lab);
    let _ = std::fs::remove_file(&cache);

    // A host this client never called: one exec, which leaves the copy.
    let from = log_len(&lab);
    run_true(&env, &lab, "first");
    assert_eq!(
        sessions_since(&lab, from),
        1,
        "the first call asked for the shim"
    );
    assert_is_the_shipped_shim(&cache);

    // Known now: one exec that sends only the hash (the copy is used as is).
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = ino(&cache);
    let from = log_len(&lab);
    run_true(&env, &lab, "second");
    assert_eq!(sessions_since(&lab, from), 1);
    assert_eq!(ino(&cache), before, "the second call sent the script again");

    // The host lost its copy behind this client's back: it asks, and gets it.
    std::fs::remove_file(&cache).unwrap();
    let from = log_len(&lab);
    run_true(&env, &lab, "after-loss");
    assert_eq!(sessions_since(&lab, from), 2);
    assert_is_the_shipped_shim(&cache);

    // Another client (its own state) meets the host for the first time: one exec again.
    let other = Sealed::new(&format!("{}-other", crate::test_name!()));
    let from = log_len(&lab);
    run_true(&other, &lab, "other-client");
    assert_eq!(sessions_since(&lab, from), 1);
}
