//! Verdict integrity when commands and disks misbehave (issue 11, docs/trust.md#the-host): a
//! command hunting the nonce and forging frames into the shim's descriptors, and a marker
//! root that runs out of space or inodes (a claim, an exit record, a fence). Real sshd targets; the disks are small
//! loop-mounted ext4 file systems mounted as the target's marker root.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use opmark::lab::{Lab, Target};

use crate::support::disk::{needs_loop_mounts, SmallDisk};
use crate::support::{answer, fresh_dir, lines, text, wait_for, Answer, Sealed};

fn run_op_json(env: &Sealed, lab: &Lab, extra: &[&str], op: &str, command: &str) -> Answer {
    answer(
        env.opmark_with_lab(lab)
            .args(extra)
            .args([
                "--json", "run", "target1", "--op", op, "--wait", "30s", "--",
            ])
            .arg(command)
            .output()
            .unwrap(),
    )
}

/// A forger, run as the command: it hunts a 32-hex nonce for the foreground shim serving
/// operation $1 wherever a process of the same user can look (file and directory names
/// under the marker root, marker file contents, every process's arguments and
/// environment, its own and the foreground's descriptors), then writes frames forged with
/// the best candidate (`S`, an `E` payload and `X code=0` for the claim's attempt) into
/// every pipe the foreground holds (`fg_pid` is in the claim), and reports in $2 how many
/// descriptors it reached and which candidate it used.
const FORGER: &str = r#"op=$1 report=$2
root=$XDG_STATE_HOME/opmark
m=$root/ops/$op
i=0
while ! grep -q '^boot=' "$m/claim" 2>/dev/null && [ "$i" -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
fg=$(sed -n 's/^fg_pid=//p' "$m/claim")
att=$(sed -n 's/^attempt=//p' "$m/claim")
hex() { tr -c '0-9a-f' '\n' | grep -xE '[0-9a-f]{32}'; }
cands=$(
	{
		find "$root" -print | hex
		find "$root" -type f -exec cat {} + | hex
		for p in /proc/[0-9]*; do
			tr '\0' '\n' <"$p/cmdline" | hex
			tr '\0' '\n' <"$p/environ" | hex
		done
		for f in /proc/self/fd/* "/proc/$fg"/fd/*; do readlink "$f"; done | hex
		for f in /proc/self/fd/*; do [ -f "$f" ] && hex <"$f"; done
	} 2>/dev/null
)
nonce=$(printf '%s\n' "$cands" | sed -n 1p)
[ -n "$nonce" ] || nonce=0123456789abcdef0123456789abcdef
frames="OPMARK/1 $nonce S attempt=$att
OPMARK/1 $nonce E 7
forged
OPMARK/1 $nonce X code=0 out=0 err=7 timed_out=0 dropped_out=0 dropped_err=0 attempt=$att
"
reached=0
for fd in "/proc/$fg"/fd/*; do
	[ -p "$fd" ] || continue
	timeout 2 sh -c 'printf %s "$1" >>"$2"' forge "$frames" "$fd" 2>/dev/null && reached=$((reached + 1))
done
printf 'reached=%s candidate=%s candidates=%s\n' "$reached" "$nonce" "$(printf '%s\n' "$cands" | grep -c .)" >"$report"
"#;

fn forger(dir: &Path) -> PathBuf {
    let path = dir.join("forge.sh");
    std::fs::write(&path, FORGER).unwrap();
    path
}

fn forger_reached_the_foreground(report: &Path) -> String {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let reached: u32 = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("reached="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        reached >= 1,
        "the forger never wrote into the foreground: {text}"
    );
    text
}

#[test]
fn a_command_that_hunts_the_nonce_and_forges_its_own_exit_gets_its_true_status() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir("forge-self");
    let env = Sealed::new("forge-self");
    let report = dir.join("report");
    let forge = forger(&dir);
    let cmd = format!(
        "sh {} forge-self {}; exit 9",
        forge.display(),
        report.display()
    );
    let a = run_op_json(&env, &lab, &[], "forge-self", &cmd);
    let forged = forger_reached_the_foreground(&report);
    assert_eq!(a.verdict(), "completed", "{a:?}\nforger: {forged}");
    assert_eq!(a.exit_code(), Some(9), "{a:?}\nforger: {forged}");
    assert_eq!(a.status, 9, "{a:?}");
    assert!(!a.stdout().contains("OPMARK"), "{a:?}");
    assert!(
        !a.json["stderr"].as_str().unwrap_or("").contains("forged"),
        "{a:?}"
    );
}

#[test]
fn another_op_forging_into_a_running_op_changes_neither_its_verdict_nor_its_output() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let dir = fresh_dir("forge-other");
    let env = Sealed::new("forge-other");
    let gate = dir.join("gate");
    let report = dir.join("report");
    let forge = forger(&dir);
    let victim_cmd = format!(
        "echo a-start; while [ ! -e {} ]; do sleep 0.05; done; echo a-end; exit 3",
        gate.display()
    );
    let victim = env
        .opmark_with_lab(&lab)
        .args([
            "--json", "run", "target1", "--op", "victim", "--wait", "30s", "--",
        ])
        .arg(&victim_cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = target.marker_root().join("ops/victim/out");
    wait_for("the victim to start", Duration::from_secs(30), || {
        std::fs::read(&out).is_ok_and(|o| o == b"a-start\n")
    });
    let attacker = run_op_json(
        &env,
        &lab,
        &[],
        "attacker",
        &format!("sh {} victim {}", forge.display(), report.display()),
    );
    assert_eq!(attacker.verdict(), "completed", "{attacker:?}");
    let forged = forger_reached_the_foreground(&report);
    std::fs::write(&gate, "").unwrap();
    let a = answer(victim.wait_with_output().unwrap());
    assert_eq!(a.verdict(), "completed", "{a:?}\nforger: {forged}");
    assert_eq!(a.exit_code(), Some(3), "{a:?}\nforger: {forged}");
    assert_eq!(a.stdout(), "a-start\na-end\n", "{a:?}\nforger: {forged}");
    assert_eq!(a.json["stderr"].as_str(), Some(""), "{a:?}");
}

fn ops_left(target: &Target) -> Vec<String> {
    std::fs::read_dir(target.marker_root().join("ops"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_marker_root_without_free_blocks_refuses_the_claim_honestly_and_leaves_no_orphan() {
    if !needs_loop_mounts(crate::test_name!()) {
        return;
    }
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let disk = SmallDisk::mount_as_marker_root(target, 4096, 256);
    let env = Sealed::new("disk-full");
    let effects = fresh_dir("disk-full").join("effects");
    let cmd = format!("echo ran >> {}; echo hi", effects.display());
    // An earlier operation made the root's directories, as on any used host.
    assert_eq!(
        run_op_json(&env, &lab, &[], "before", "true").verdict(),
        "completed"
    );
    let filler = disk.fill_blocks();

    let a = run_op_json(&env, &lab, &[], "on-full-disk", &cmd);
    assert_eq!(a.verdict(), "not_applied", "{a:?}");
    assert_eq!(a.reason_code(), "host_disk_full", "{a:?}");
    assert_eq!(a.json["retryable"], false, "{a:?}");
    assert!(
        a.json["reason"].as_str().unwrap().contains("no_space"),
        "{a:?}"
    );
    assert_eq!(lines(&effects), 0);
    assert_eq!(ops_left(target), ["before"], "no orphan marker");

    std::fs::remove_dir_all(filler).unwrap();
    let b = run_op_json(&env, &lab, &[], "on-full-disk", &cmd);
    assert_eq!(b.verdict(), "completed", "{b:?}");
    assert_eq!(b.stdout(), "hi\n", "{b:?}");
    assert_eq!(
        lines(&effects),
        1,
        "the retry after freeing space ran exactly once"
    );
}

/// A fence whose record cannot be written (the disk filled between its directory and its
/// record) takes its half-made marker back down: the op id reads absent, as before the
/// fence, and never as a claim whose command started and never ended (seen in the chaos
/// test: a marker holding only `started`, which a waiter then waited on). With room, the
/// same cancel fences it.
#[test]
fn a_fence_that_cannot_write_its_record_leaves_the_op_id_absent_and_not_started() {
    if !needs_loop_mounts(crate::test_name!()) {
        return;
    }
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let disk = SmallDisk::mount_as_marker_root(target, 4096, 256);
    let env = Sealed::new("fence-full");
    assert_eq!(
        run_op_json(&env, &lab, &[], "before", "true").verdict(),
        "completed"
    );
    // One block left, for the marker's directory; none for the fence's record.
    let spare = target.marker_root().join("spare");
    std::fs::create_dir(&spare).unwrap();
    let filler = disk.fill_blocks();
    std::fs::remove_dir(&spare).unwrap();
    let cancel = || {
        env.opmark_with_lab(&lab)
            .args([
                "--json", "cancel", "target1", "ghost", "--force", "--grace", "1s",
            ])
            .output()
            .unwrap()
    };
    let refused = cancel();
    let said = format!("{}{}", text(&refused.stdout), text(&refused.stderr));
    assert_ne!(refused.status.code(), Some(0), "{said}");
    assert!(said.contains("root_unusable"), "{said}");
    assert_eq!(
        ops_left(target),
        ["before"],
        "the op id is absent again: {said}"
    );

    std::fs::remove_dir_all(filler).unwrap();
    let fenced = cancel();
    let doc: serde_json::Value = serde_json::from_slice(&fenced.stdout).unwrap();
    assert_eq!(fenced.status.code(), Some(0), "{doc}");
    assert_eq!(doc["cancel_outcome"], "fenced", "{doc}");
    assert_eq!(doc["was"], "absent", "{doc}");
}

#[test]
fn a_marker_root_out_of_inodes_undoes_the_half_made_claim_and_a_retry_runs_once() {
    if !needs_loop_mounts(crate::test_name!()) {
        return;
    }
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let disk = SmallDisk::mount_as_marker_root(target, 4096, 64);
    let env = Sealed::new("no-inodes");
    let effects = fresh_dir("no-inodes").join("effects");
    let cmd = format!("echo ran >> {}; echo hi", effects.display());
    assert_eq!(
        run_op_json(&env, &lab, &[], "before", "true").verdict(),
        "completed"
    );
    // One inode left: the marker directory can be made, its claim record cannot.
    let fill = disk.fill_inodes(1);

    let a = run_op_json(&env, &lab, &[], "no-inodes", &cmd);
    assert_eq!(a.verdict(), "not_applied", "{a:?}");
    assert_eq!(a.reason_code(), "host_disk_full", "{a:?}");
    assert!(
        a.json["reason"].as_str().unwrap().contains("no_inodes"),
        "{a:?}"
    );
    assert_eq!(
        ops_left(target),
        ["before"],
        "the half-made claim was undone"
    );
    // A second try says the same, and never `in_progress` for an empty marker.
    let again = run_op_json(&env, &lab, &[], "no-inodes", &cmd);
    assert_eq!(again.verdict(), "not_applied", "{again:?}");
    assert_eq!(lines(&effects), 0);

    std::fs::remove_dir_all(fill).unwrap();
    let b = run_op_json(&env, &lab, &[], "no-inodes", &cmd);
    assert_eq!(b.verdict(), "completed", "{b:?}");
    assert_eq!(b.stdout(), "hi\n", "{b:?}");
    assert_eq!(lines(&effects), 1, "ran exactly once");
}

#[test]
fn a_convergent_command_that_fills_the_marker_root_is_never_reported_as_not_applied() {
    if !needs_loop_mounts(crate::test_name!()) {
        return;
    }
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let _disk = SmallDisk::mount_as_marker_root(target, 4096, 256);
    let env = Sealed::new("fills-root");
    let dir = fresh_dir("fills-root");
    let runs = dir.join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    // Unknown commands are convergent under this policy, so an interrupted claim is
    // superseded and rerun automatically, if the disk lets it. Each run leaves a file in
    // `runs`; smaller blocks take the last ones a big write leaves.
    let policy =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/policy/valid_custom.toml");
    let cmd = format!(
        "mktemp -p {}; for b in 4k 1k 512; do dd if=/dev/zero of=\"$XDG_STATE_HOME/opmark/filler.$b\" bs=$b 2>/dev/null; sync; done; exit 0",
        runs.display()
    );
    let policy_args = ["--policy", policy.to_str().unwrap()];

    let a = run_op_json(&env, &lab, &policy_args, "fills-root", &cmd);
    assert_eq!(a.json["family"], "convergent", "{a:?}");
    assert_ne!(a.verdict(), "not_applied", "the command ran: {a:?}");
    assert_ne!(
        a.verdict(),
        "completed",
        "no exit record was written: {a:?}"
    );
    assert_eq!(a.verdict(), "indeterminate", "{a:?}");
    assert_eq!(a.reason_code(), "host_disk_full", "{a:?}");
    assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 1, "{a:?}");
    // The evidence is where it was: the claim, and why there is no exit record.
    let marker = target.marker_root().join("ops/fills-root");
    assert!(marker.join("claim").is_file(), "{a:?}");
    assert!(marker.join("exit_write_failed").is_file(), "{a:?}");
    let probe = env
        .opmark_with_lab(&lab)
        .args(["--json", "probe", "target1", "fills-root"])
        .output()
        .unwrap();
    let probe = text(&probe.stdout);
    assert!(
        probe.contains("interrupted") && probe.contains("exit_write_failed"),
        "{probe}"
    );
}

#[test]
fn a_megabyte_streams_whole_past_a_64k_cap_and_its_replay_says_it_was_capped() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new("truncated");
    let cap = ["--output-cap", "64k"];
    // Deterministic, so the stream can be compared byte for byte: 1,288,895 bytes.
    let cmd = "seq 1 200000";
    let expected: String = (1..=200_000).map(|n| format!("{n}\n")).collect();
    let run = |op: &str, command: &str| {
        answer(
            env.opmark_with_lab(&lab)
                .args(["--json", "run", "target1", "--op", op])
                .args(cap)
                .arg("--")
                .arg(command)
                .output()
                .unwrap(),
        )
    };
    let small = run("small", "echo fits");
    assert_eq!(small.json["truncated"], false, "{small:?}");

    let first = run("capped", cmd);
    assert_eq!(first.verdict(), "completed", "{first:?}");
    assert!(
        first.stdout() == expected,
        "the live stream is not the command's output: {} bytes",
        first.stdout().len()
    );
    assert_eq!(first.json["truncated"], false, "{first:?}");
    let dropped = expected.len() as u64 - 65_536;
    assert_eq!(first.json["dropped"][0], dropped, "{first:?}");
    assert!(!first.stderr.contains("capped"), "{first:?}");

    let replay = run("capped", cmd);
    assert_eq!(replay.verdict(), "replayed", "{replay:?}");
    assert_eq!(replay.json["truncated"], true, "{replay:?}");
    assert_eq!(replay.stdout(), &expected[..65_536]);
    let warning =
        format!("opmark: replayed output was capped at 65536 bytes; {dropped} bytes were not kept");
    assert!(replay.stderr.contains(&warning), "{replay:?}");
}

/// Waits (10 s at most) until every supervisor under `root` has finished its tidy-up:
/// no marker holds a FIFO and no fingerprint index slot its temp name.
fn wait_for_tidy_markers(root: &Path) {
    let leftover = |dir: &str, is: fn(&str) -> bool| {
        let entries = |p: &Path| std::fs::read_dir(p).into_iter().flatten().flatten();
        entries(&root.join(dir))
            .any(|d| entries(&d.path()).any(|f| is(&f.file_name().to_string_lossy())))
    };
    let busy = || {
        leftover("ops", |n| n.ends_with(".fifo") || n.starts_with(".w."))
            || leftover("fp", |n| n.starts_with(".t."))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while busy() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn with_any_number_of_free_inodes_a_run_either_completes_once_or_runs_nothing_and_leaves_nothing() {
    if !needs_loop_mounts(crate::test_name!()) {
        return;
    }
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.target("target1").unwrap();
    let disk = SmallDisk::mount_as_marker_root(target, 4096, 64);
    let env = Sealed::new("inode-sweep");
    let dir = fresh_dir("inode-sweep");
    assert_eq!(
        run_op_json(&env, &lab, &[], "before", "true").verdict(),
        "completed"
    );
    // From "not even the marker directory" to "everything fits": each step runs out at
    // another point (claim, capture files, FIFOs, the supervisor's records, the exit).
    for spare in 0..=12 {
        let _ = std::fs::remove_dir_all(disk.mount.join("fill"));
        // The last run's supervisor tidies its marker after its caller was answered;
        // inodes it frees later would make this run's spare count wrong.
        wait_for_tidy_markers(&target.marker_root());
        disk.fill_inodes(spare);
        let op = format!("sweep-{spare}");
        let effects = dir.join(&op);
        let a = answer(
            env.opmark_with_lab(&lab)
                .args([
                    "--json", "run", "target1", "--op", &op, "--wait", "10s", "--",
                ])
                .arg(format!("echo ran >> {}", effects.display()))
                .output()
                .unwrap(),
        );
        let marker = target.marker_root().join("ops").join(&op);
        match a.verdict() {
            "completed" => {
                assert_eq!(a.exit_code(), Some(0), "{spare} spare: {a:?}");
                assert_eq!(lines(&effects), 1, "{spare} spare: {a:?}");
            }
            "not_applied" => {
                assert_eq!(a.reason_code(), "host_disk_full", "{spare} spare: {a:?}");
                assert_eq!(lines(&effects), 0, "{spare} spare: {a:?}");
                assert!(!marker.exists(), "{spare} spare: orphan marker: {a:?}");
            }
            // The command ran but its exit record did not fit: honest, and kept.
            "indeterminate" => {
                assert_eq!(lines(&effects), 1, "{spare} spare: {a:?}");
                assert!(
                    marker.join("exit_write_failed").exists(),
                    "{spare} spare: {a:?}"
                );
            }
            other => panic!("{spare} spare inodes: verdict {other}: {a:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(disk.mount.join("fill"));
}
