//! Files (docs/commands.md#put-files-delivered-once, #get-files-read-back-whole) against
//! real sshd targets. `opmark put`: the file arrives whole with its mode; a rerun under
//! the op id replays and writes nothing; other content under it is a `conflict`; the same
//! content under a new op id is `completed` with nothing written (mtime unchanged); a
//! reader of the path during a put never sees part of a file; a large file is linked into
//! place from the checked spool (one link) but copied into a setgid directory; a file name
//! too long to take `.opmark-OP` on its temporary copy is put and got all the same; a link cut after the content
//! is on the host is settled by the probe and the file written once; a 200 MB put cut at
//! 30%, 60% and 90% resumes each time; bad input sends nothing. `opmark get`: the file
//! read whole and checked, a rerun replays the host's copy (even after the file changed),
//! a rerun goes on from the partial copy an earlier invocation left (a wrong one is read
//! again whole), a 200 MB get killed twice is finished reading only the rest, a missing
//! file leaves LOCAL as it was. Several files and `-r`: one operation each,
//! the tree made on the host, a rerun replaying each file and an edited one a conflict;
//! `get -r` reads a tree the same way after a listing that its rerun replays.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{self, fresh_dir, Answer, Sealed};
use opmark::lab::Lab;

/// `opmark --json put LOCAL target1:DEST ARGS...`.
fn put(env: &Sealed, lab: &Lab, local: &Path, dest: &Path, args: &[&str]) -> Answer {
    support::answer(
        env.opmark_with_lab(lab)
            .arg("--json")
            .arg("put")
            .arg(local)
            .arg(format!("target1:{}", dest.display()))
            .args(args)
            .output()
            .unwrap(),
    )
}

/// A local file of `len` bytes of a pattern seeded by `seed`.
fn content(dir: &Path, name: &str, len: usize, seed: u8) -> PathBuf {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u64 * 2654435761 % 251) as u8 ^ seed)
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn sha256(path: &Path) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `opmark VERB ARGS...` fails, saying `says` on stderr.
fn refused_naming(env: &Sealed, lab: &Lab, verb: &str, args: &[String], says: &str) {
    let out = env
        .opmark_with_lab(lab)
        .arg(verb)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{verb} {args:?}");
    assert!(stderr.contains(says), "{verb} {args:?}: {stderr}");
}

/// The target's sshd accepted no login since its log was `from` bytes long.
fn assert_nothing_connected_since(lab: &Lab, from: u64) {
    let log_text = std::fs::read(&lab.targets()[0].log).unwrap_or_default();
    let new = String::from_utf8_lossy(&log_text[from as usize..]);
    assert!(
        !new.contains("Accepted publickey"),
        "nothing connected: {new}"
    );
}

/// No temporary file of a delivery is left beside `dest`.
fn no_leftovers(dest: &Path) -> bool {
    let name = format!(".{}.opmark-", dest.file_name().unwrap().to_str().unwrap());
    std::fs::read_dir(dest.parent().unwrap())
        .unwrap()
        .all(|e| !e.unwrap().file_name().to_string_lossy().starts_with(&name))
}

#[test]
fn a_file_arrives_whole_with_its_mode_and_a_rerun_replays_without_writing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "app.conf", 300_000, 1);
    let dest = dir.join("remote").join("app.conf");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let env = Sealed::new(crate::test_name!());

    let a = put(
        &env,
        &lab,
        &local,
        &dest,
        &["--op", "put-1", "--mode", "640"],
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.json["file"]["delivered"], "written", "{a:?}");
    assert_eq!(a.json["file"]["sha256"], sha256(&local));
    assert_eq!(a.json["file"]["bytes"], 300_000);
    assert_eq!(a.json["family"], "convergent", "{a:?}");
    assert_eq!(sha256(&dest), sha256(&local));
    let meta = std::fs::metadata(&dest).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    assert!(no_leftovers(&dest));

    // The same op id again: the host's record answers, nothing is written.
    std::thread::sleep(Duration::from_millis(1100));
    let again = put(
        &env,
        &lab,
        &local,
        &dest,
        &["--op", "put-1", "--mode", "640"],
    );
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!(
        again.json["file"]["delivered"], "written",
        "the first answer, replayed"
    );
    assert_eq!(std::fs::metadata(&dest).unwrap().mtime(), meta.mtime());
    assert_eq!(std::fs::metadata(&dest).unwrap().ino(), meta.ino());
}

#[test]
fn a_large_file_is_linked_into_place_and_copied_where_a_link_would_not_be_what_a_copy_is() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "image.bin", 3 << 20, 7);
    let env = Sealed::new(crate::test_name!());
    let ops = lab.target("target1").unwrap().marker_root().join("ops");

    // A plain directory on the marker root's file system: the content checked on arrival
    // becomes the file, and the claim keeps no second name for it.
    let plain = dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let dest = plain.join("image.bin");
    let a = put(
        &env,
        &lab,
        &local,
        &dest,
        &["--op", "big-1", "--mode", "600"],
    );
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.json["file"]["delivered"], "written", "{a:?}");
    assert_eq!(sha256(&dest), sha256(&local));
    let meta = std::fs::metadata(&dest).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!(meta.nlink(), 1, "PATH is one link, as a copy would be");
    assert!(no_leftovers(&dest));
    assert!(ops.join("big-1").join("claim").exists());
    assert!(
        !ops.join("big-1").join("stdin").exists(),
        "linked, not copied: the claim's content became the file"
    );

    // A setgid directory gives a new file its group: a link would keep the spool's, so
    // the content is copied there.
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        std::os::unix::fs::chown(&shared, None, Some(1)).unwrap();
    }
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o2775)).unwrap();
    let dest = shared.join("image.bin");
    let b = put(&env, &lab, &local, &dest, &["--op", "big-2"]);
    assert_eq!(b.verdict(), "completed", "{b:?}");
    assert_eq!(sha256(&dest), sha256(&local));
    let meta = std::fs::metadata(&dest).unwrap();
    assert_eq!(meta.nlink(), 1);
    assert_eq!(meta.gid(), std::fs::metadata(&shared).unwrap().gid());
    assert!(
        ops.join("big-2").join("stdin").exists(),
        "copied: the claim keeps its content"
    );
    assert!(no_leftovers(&dest));
}

#[test]
fn a_long_file_name_with_a_long_op_id_is_put_and_got_back_as_scp_would() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let env = Sealed::new(crate::test_name!());
    // `.NAME.opmark-OP` would be 311 bytes: more than a file name may have.
    let name = "n".repeat(200);
    let op = "o".repeat(100);
    let local = content(&dir, &name, 5000, 3);
    let remote = dir.join("remote");
    std::fs::create_dir_all(&remote).unwrap();
    let dest = remote.join(&name);
    let a = put(&env, &lab, &local, &dest, &["--op", &op]);
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.json["file"]["delivered"], "written", "{a:?}");
    assert_eq!(sha256(&dest), sha256(&local));
    // And two-byte characters whose count fits where their bytes do not.
    let wide = "\u{e9}".repeat(120);
    let wide_dest = remote.join(&wide);
    let w = put(&env, &lab, &local, &wide_dest, &[]);
    assert_eq!(w.verdict(), "completed", "{w:?}");
    assert_eq!(sha256(&wide_dest), sha256(&local));

    let back = dir.join("back");
    std::fs::create_dir_all(&back).unwrap();
    let local_back = back.join(&name);
    let g = get(&env, &lab, &dest, &local_back, &["--op", &format!("g{op}")]);
    assert_eq!(g.verdict(), "completed", "{g:?}");
    assert_eq!(g.json["file"]["saved"], true, "{g:?}");
    assert_eq!(sha256(&local_back), sha256(&local));
    for d in [&remote, &back] {
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(
            left.is_empty(),
            "no temporary or partial copy is left: {left:?}"
        );
    }
}

#[test]
fn other_content_under_the_op_id_is_a_conflict_and_changes_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let first = content(&dir, "one", 4096, 1);
    let second = content(&dir, "two", 4096, 2);
    let dest = dir.join("dest");
    let env = Sealed::new(crate::test_name!());
    assert_eq!(
        put(&env, &lab, &first, &dest, &["--op", "pc-1"]).verdict(),
        "completed"
    );
    let other = put(&env, &lab, &second, &dest, &["--op", "pc-1"]);
    assert_eq!(other.verdict(), "conflict", "{other:?}");
    assert!(other.json["file"]["delivered"].is_null(), "{other:?}");
    assert_ne!(other.status, 0);
    assert_eq!(sha256(&dest), sha256(&first), "the first content stays");
}

#[test]
fn the_same_content_already_there_is_completed_with_nothing_written() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "same", 100_000, 3);
    let dest = dir.join("same-dest");
    let env = Sealed::new(crate::test_name!());
    assert_eq!(
        put(&env, &lab, &local, &dest, &["--op", "ps-1"]).json["file"]["delivered"],
        "written"
    );
    let before = std::fs::metadata(&dest).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let second = put(&env, &lab, &local, &dest, &["--op", "ps-2"]);
    assert_eq!(second.verdict(), "completed", "{second:?}");
    assert_eq!(second.json["file"]["delivered"], "unchanged", "{second:?}");
    let after = std::fs::metadata(&dest).unwrap();
    assert_eq!(
        (after.mtime(), after.mtime_nsec(), after.ino()),
        (before.mtime(), before.mtime_nsec(), before.ino()),
        "not written again"
    );
}

#[test]
fn a_reader_of_the_path_during_puts_sees_one_whole_file_or_the_other() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let a = content(&dir, "a", 8 << 20, 4);
    let b = content(&dir, "b", 8 << 20, 5);
    let sums = [sha256(&a), sha256(&b)];
    let dest = dir.join("swapped");
    std::fs::copy(&a, &dest).unwrap();
    let env = Sealed::new(crate::test_name!());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let seen = std::thread::scope(|s| {
        let _stop_reader = support::SetOnDrop(&stop);
        let reader = s.spawn(|| {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let sum = sha256(&dest);
                assert!(sums.contains(&sum), "a reader saw a partial file");
                reads += 1;
            }
            reads
        });
        for (i, local) in [&b, &a, &b, &a].into_iter().enumerate() {
            let op = format!("pr-{i}");
            let done = put(&env, &lab, local, &dest, &["--op", &op]);
            assert_eq!(done.json["file"]["delivered"], "written", "{done:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap()
    });
    assert!(seen > 0, "the reader read during the puts");
    assert_eq!(sha256(&dest), sums[0]);
}

#[test]
fn a_link_cut_after_the_content_is_on_the_host_is_settled_by_the_probe_and_written_once() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "big", 32 << 20, 6);
    let ops = lab.target("target1").unwrap().marker_root().join("ops");
    let env = Sealed::new(crate::test_name!());
    let cfg = support::fast_loss_config(&lab, &dir);
    // The supervisor is held (SIGSTOP) once its record names it, so that its exit record
    // cannot reach the client before the link is cut. A delivery can end before the
    // test has read that record and stopped it (32 MB linked into place and synced takes
    // well under the 50 ms between looks): then the cut would come after the answer, and
    // the scenario is tried again under a new op id, up to five times.
    for attempt in 1..=5 {
        let op = format!("pcut-{attempt}");
        let dest = dir.join(format!("big-dest-{attempt}"));
        let mut child = support::spawn(
            env.opmark().arg("-F").arg(&cfg).arg("--json").arg("put"),
            &[
                local.to_str().unwrap(),
                &format!("target1:{}", dest.display()),
                "--op",
                &op,
            ],
        );
        let mut said = support::StderrLines::of(&mut child);
        support::wait_for("the claim", Duration::from_secs(60), || {
            ops.join(&op).join("proc").exists()
        });
        let proc = std::fs::read_to_string(ops.join(&op).join("proc")).unwrap();
        let pid = proc
            .lines()
            .find_map(|l| l.strip_prefix("pid="))
            .unwrap()
            .to_owned();
        let signal = |sig: &str| {
            // The supervisor may be gone already (the delivery over): checked below.
            let _ = std::process::Command::new("kill")
                .args([sig, &pid])
                .status();
        };
        signal("-STOP");
        if ops.join(&op).join("exit").exists() {
            eprintln!("{op}: the delivery ended before its supervisor was held; again");
            signal("-CONT");
            let out =
                support::finish_within(child, Duration::from_secs(120), "a put that ended first");
            assert!(out.status.success(), "{out:?}");
            continue;
        }
        lab.cut("target1").unwrap();
        said.wait_for("lost after dispatch", Duration::from_secs(30));
        signal("-CONT");
        support::wait_for(
            "the delivery's end on the host",
            Duration::from_secs(60),
            || ops.join(&op).join("exit").exists(),
        );
        lab.restore("target1").unwrap();
        let out = support::finish_within(child, Duration::from_secs(120), "put after the restore");
        let after = support::answer(std::process::Output {
            stderr: said.all().into_bytes(),
            ..out
        });
        assert_eq!(after.verdict(), "completed", "{after:?}");
        assert_eq!(after.json["file"]["delivered"], "written", "{after:?}");
        assert_eq!(sha256(&dest), sha256(&local));
        assert!(no_leftovers(&dest));
        // Once: a rerun replays the record.
        let again = put(&env, &lab, &local, &dest, &["--op", &op]);
        assert_eq!(again.verdict(), "replayed", "{again:?}");
        assert_eq!(again.json["file"]["delivered"], "written", "{again:?}");
        return;
    }
    panic!("five deliveries in a row ended before the test could hold their supervisor");
}

#[test]
fn bad_input_is_refused_naming_the_fix_and_sends_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "f", 10, 7);
    let env = Sealed::new(crate::test_name!());
    let log = std::fs::metadata(&lab.targets()[0].log).map_or(0, |m| m.len());
    let cases: [(Vec<String>, &str); 5] = [
        (
            vec![local.display().to_string(), "target1".into()],
            "HOST:PATH",
        ),
        (
            vec![
                dir.join("missing").display().to_string(),
                "target1:/tmp/x".into(),
            ],
            "cannot read",
        ),
        (
            vec![dir.display().to_string(), "target1:/tmp/x".into()],
            "is a directory",
        ),
        (
            vec![
                local.display().to_string(),
                "target1:/tmp/x".into(),
                "--mode".into(),
                "999".into(),
            ],
            "octal",
        ),
        (
            vec![
                local.display().to_string(),
                "target1:/tmp/x".into(),
                "--op".into(),
                "bad op".into(),
            ],
            "op",
        ),
    ];
    for (args, says) in cases {
        refused_naming(&env, &lab, "put", &args, says);
    }
    // And `run` will not pass a command off as a put.
    let run = support::run_json(
        &env,
        &lab,
        &["target1", "--", "opmark-put --mode 0644 -- 'x'"],
    );
    assert_eq!(run.verdict(), "refused", "{run:?}");
    assert!(
        run.json["reason"].as_str().unwrap().contains("opmark put"),
        "{run:?}"
    );
    assert_nothing_connected_since(&lab, log);
}

#[test]
fn a_put_into_a_missing_directory_fails_on_the_host_and_leaves_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "f", 10, 8);
    let dest = dir.join("no-such-dir").join("f");
    let env = Sealed::new(crate::test_name!());
    let a = put(&env, &lab, &local, &dest, &["--op", "pm-1"]);
    assert_eq!(a.verdict(), "completed", "the delivery ran: {a:?}");
    assert_eq!(a.exit_code(), Some(1), "{a:?}");
    assert!(a.json["file"]["delivered"].is_null());
    assert!(a.stderr.contains("no directory"), "{}", a.stderr);
    assert!(!dest.parent().unwrap().exists());
}

/// `opmark --json put ARGS...` (several files: the document with `files`).
fn put_files(env: &Sealed, lab: &Lab, args: &[String]) -> Answer {
    support::answer(
        env.opmark_with_lab(lab)
            .arg("--json")
            .arg("put")
            .args(args)
            .output()
            .unwrap(),
    )
}

/// Each file's `delivered` (its verdict when it was not delivered), by its path.
fn outcomes(a: &Answer) -> Vec<(String, String)> {
    a.json["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {a:?}"))
        .iter()
        .map(|f| {
            let word = match f["file"]["delivered"].as_str() {
                Some(d) => d.to_owned(),
                None => f["verdict"].as_str().unwrap_or("error").to_owned(),
            };
            (f["file"]["path"].as_str().unwrap().to_owned(), word)
        })
        .collect()
}

#[test]
fn a_directory_is_put_one_operation_per_file_and_its_rerun_replays_each() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    crate::require_tool!("python3");
    let dir = fresh_dir(crate::test_name!());
    let site = dir.join("site");
    std::fs::create_dir_all(site.join("css")).unwrap();
    std::fs::create_dir_all(site.join("img/deep")).unwrap();
    let index = content(&site, "index.html", 2_000, 1);
    let css = content(&site.join("css"), "a.css", 300, 2);
    let img = content(&site.join("img/deep"), "x.bin", 70_000, 3);
    let loose = content(&dir, "robots.txt", 40, 4);
    let remote = dir.join("remote");
    std::fs::create_dir(&remote).unwrap();
    let env = Sealed::new(crate::test_name!());
    let args = |op: &str| -> Vec<String> {
        vec![
            "-r".into(),
            site.display().to_string(),
            loose.display().to_string(),
            format!("target1:{}/", remote.display()),
            "--op".into(),
            op.into(),
        ]
    };

    // Each file its own operation; the tree made on the host under the directory's name.
    let a = put_files(&env, &lab, &args("site-1"));
    assert_eq!(a.status, 0, "{a:?}");
    let at = |rel: &str| remote.join(rel).display().to_string();
    let written: Vec<(String, String)> = [
        "robots.txt",
        "site/css/a.css",
        "site/img/deep/x.bin",
        "site/index.html",
    ]
    .iter()
    .map(|rel| (at(rel), "written".to_owned()))
    .collect();
    let mut got = outcomes(&a);
    got.sort();
    assert_eq!(got, written, "{a:?}");
    assert_eq!(a.json["summary"]["written_count"], 4, "{a:?}");
    for (local, rel) in [
        (&index, "site/index.html"),
        (&css, "site/css/a.css"),
        (&img, "site/img/deep/x.bin"),
        (&loose, "robots.txt"),
    ] {
        assert_eq!(sha256(&remote.join(rel)), sha256(local), "{rel}");
        assert!(no_leftovers(&remote.join(rel)), "{rel}");
    }
    let ops: std::collections::BTreeSet<&str> = a.json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["op_id"].as_str().unwrap())
        .collect();
    assert_eq!(ops.len(), 4, "one operation per file: {ops:?}");
    assert!(ops.iter().all(|o| o.starts_with("site-1:")), "{ops:?}");
    support::schema::validate(crate::test_name!(), &[("files", vec![a.json.clone()])]);

    // The same op id again: every file's record answers; nothing is written again.
    let mtime = std::fs::metadata(remote.join("site/index.html"))
        .unwrap()
        .mtime();
    std::thread::sleep(Duration::from_millis(1100));
    let again = put_files(&env, &lab, &args("site-1"));
    assert_eq!(again.status, 0, "{again:?}");
    let verdicts: Vec<&str> = again.json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["replayed"; 4], "{again:?}");
    let again_ops: std::collections::BTreeSet<&str> = again.json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["op_id"].as_str().unwrap())
        .collect();
    assert_eq!(again_ops, ops, "the same files map to the same operations");
    assert_eq!(
        std::fs::metadata(remote.join("site/index.html"))
            .unwrap()
            .mtime(),
        mtime
    );

    // One file edited and one added, under a new op id: only they are written.
    content(&site, "index.html", 2_000, 9);
    content(&site.join("css"), "b.css", 10, 5);
    // Each file's word, in the order of its path on the host.
    let words = |a: &Answer| -> Vec<String> {
        let mut got = outcomes(a);
        got.sort();
        got.into_iter().map(|(_, word)| word).collect()
    };
    let next = put_files(&env, &lab, &args("site-2"));
    assert_eq!(next.status, 0, "{next:?}");
    // robots.txt, site/css/a.css, site/css/b.css, site/img/deep/x.bin, site/index.html
    assert_eq!(
        words(&next),
        ["unchanged", "unchanged", "written", "unchanged", "written"],
        "{next:?}"
    );
    assert_eq!(sha256(&remote.join("site/index.html")), sha256(&index));

    // The first op id with the edited file: that file is a conflict and stays as it is;
    // the others replay, and the new file is delivered under its own new operation.
    let old = put_files(&env, &lab, &args("site-1"));
    assert_eq!(
        words(&old),
        ["written", "written", "unchanged", "written", "conflict"],
        "{old:?}"
    );
    assert_ne!(old.status, 0, "a conflict is no success: {old:?}");
    assert_eq!(old.json["summary"]["failed_count"], 1, "{old:?}");
    assert_eq!(sha256(&remote.join("site/index.html")), sha256(&index));
}

#[test]
fn several_files_without_their_directory_on_the_host_fail_there_and_bad_sets_send_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let a = content(&dir, "a", 10, 1);
    std::fs::create_dir(dir.join("other")).unwrap();
    let a_again = content(&dir.join("other"), "a", 10, 2);
    let b = content(&dir, "b", 10, 3);
    let env = Sealed::new(crate::test_name!());
    let log = std::fs::metadata(&lab.targets()[0].log).map_or(0, |m| m.len());
    let s = |p: &Path| p.display().to_string();
    let to = format!("target1:{}/", dir.join("remote").display());
    for (args, says) in [
        (vec![s(&a), s(&dir), to.clone()], "give -r"),
        (vec![s(&a), s(&a_again), to.clone()], "would both be"),
        (vec![s(&a), s(&b), "target1".into()], "HOST:PATH"),
        (
            vec![
                "-r".into(),
                s(&dir.join("other")),
                s(&a),
                to.clone(),
                "--op".into(),
                "x".repeat(120),
            ],
            "at most 115",
        ),
    ] {
        refused_naming(&env, &lab, "put", &args, says);
    }
    assert_nothing_connected_since(&lab, log);

    // Without -r no directory is made: each file's delivery fails on the host, saying so.
    let missing = put_files(
        &env,
        &lab,
        &[s(&a), s(&b), to, "--op".into(), "pd-1".into()],
    );
    assert_eq!(missing.status, 1, "{missing:?}");
    assert_eq!(missing.json["summary"]["failed_count"], 2, "{missing:?}");
    assert!(
        missing.stderr.contains("no directory"),
        "{}",
        missing.stderr
    );
    assert!(!dir.join("remote").exists());
}

#[test]
fn several_files_are_read_each_as_its_own_operation_and_a_missing_one_is_its_own_answer() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    crate::require_tool!("python3");
    let dir = fresh_dir(crate::test_name!());
    let remote = dir.join("remote");
    std::fs::create_dir(&remote).unwrap();
    let a = content(&remote, "a.log", 5_000, 1);
    let b = content(&remote, "b.log", 70, 2);
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let env = Sealed::new(crate::test_name!());
    let on_host = |p: &Path| format!("target1:{}", p.display());
    let args = vec![
        on_host(&a),
        on_host(&remote.join("gone.log")),
        on_host(&b),
        out.display().to_string(),
        "--op".into(),
        "logs-1".into(),
    ];
    let got = support::answer(
        env.opmark_with_lab(&lab)
            .args(["--json", "get"])
            .args(&args)
            .output()
            .unwrap(),
    );
    assert_eq!(
        got.status, 1,
        "a file that is not there fails the run: {got:?}"
    );
    let saved: Vec<bool> = got.json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"]["saved"].as_bool().unwrap())
        .collect();
    assert_eq!(saved, [true, false, true], "{got:?}");
    assert_eq!(got.json["summary"]["read_count"], 2, "{got:?}");
    assert_eq!(sha256(&out.join("a.log")), sha256(&a));
    assert_eq!(sha256(&out.join("b.log")), sha256(&b));
    assert!(!out.join("gone.log").exists());
    assert!(got.stderr.contains("no file"), "{}", got.stderr);
    support::schema::validate(crate::test_name!(), &[("files", vec![got.json.clone()])]);

    // Rerun under the op id: each read replays the host's copy, even of a changed file.
    content(&remote, "a.log", 10, 9);
    let again = support::answer(
        env.opmark_with_lab(&lab)
            .args(["--json", "get"])
            .args(&args)
            .output()
            .unwrap(),
    );
    let verdicts: Vec<&str> = again.json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["replayed"; 3], "{again:?}");
    assert_eq!(std::fs::metadata(out.join("a.log")).unwrap().len(), 5_000);

    // Sets that cannot be read as one are refused before anything is sent.
    let log = std::fs::metadata(&lab.targets()[0].log).map_or(0, |m| m.len());
    let s = |p: &Path| p.display().to_string();
    for (args, says) in [
        (
            vec![on_host(&a), format!("other:{}", b.display()), s(&out)],
            "one host",
        ),
        (
            vec![on_host(&a), on_host(&dir.join("x/a.log")), s(&out)],
            "would both be",
        ),
        (
            vec![on_host(&a), on_host(&b), s(&out.join("a.log"))],
            "no directory",
        ),
    ] {
        refused_naming(&env, &lab, "get", &args, says);
    }
    assert_nothing_connected_since(&lab, log);
}

/// Each file's `saved` and verdict, by where it went (relative to `root`).
fn read_into(a: &Answer, root: &Path) -> Vec<(String, bool, String)> {
    a.json["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {a:?}"))
        .iter()
        .map(|f| {
            let local = f["file"]["local"].as_str().unwrap();
            let rel = Path::new(local).strip_prefix(root).unwrap();
            (
                rel.display().to_string(),
                f["file"]["saved"].as_bool().unwrap(),
                f["verdict"].as_str().unwrap_or("error").to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_directory_is_read_with_get_r_one_operation_per_file_and_its_rerun_reads_the_same_set() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let remote = dir.join("site");
    std::fs::create_dir_all(remote.join("css/print")).unwrap();
    std::fs::create_dir_all(remote.join("empty")).unwrap();
    let files = [
        content(&remote, "index.html", 3_000, 1),
        content(&remote.join("css"), "it's main.css", 40, 2),
        content(&remote.join("css/print"), "a.css", 0, 3),
    ];
    std::os::unix::fs::symlink(&files[0], remote.join("link.html")).unwrap();
    let env = Sealed::new(crate::test_name!());
    let get_r = |args: &[String]| {
        support::answer(
            env.opmark_with_lab(&lab)
                .args(["--json", "get", "-r"])
                .args(args)
                .output()
                .unwrap(),
        )
    };
    let s = |p: &Path| p.display().to_string();
    // The directory under its name in LOCAL, made with the subdirectories it needs.
    let copy = dir.join("copy");
    std::fs::create_dir(&copy).unwrap();
    let out = copy.join("site");
    let args = vec![
        format!("target1:{}", remote.display()),
        s(&copy),
        "--op".into(),
        "site-1".into(),
    ];
    let got = get_r(&args);
    assert_eq!(got.status, 0, "{got:?}");
    let want = [
        ("css/it's main.css", true, "completed"),
        ("css/print/a.css", true, "completed"),
        ("index.html", true, "completed"),
    ];
    let as_owned = |w: &[(&str, bool, &str)]| -> Vec<(String, bool, String)> {
        w.iter()
            .map(|(p, saved, v)| (p.to_string(), *saved, v.to_string()))
            .collect()
    };
    assert_eq!(read_into(&got, &out), as_owned(&want), "{got:?}");
    assert_eq!(got.json["summary"]["read_count"], 3, "{got:?}");
    for (f, rel) in files
        .iter()
        .zip(["index.html", "css/it's main.css", "css/print/a.css"])
    {
        assert_eq!(sha256(&out.join(rel)), sha256(f), "{rel}");
    }
    // A link is not followed and an empty directory has no file to read.
    assert!(!out.join("link.html").exists());
    assert!(!out.join("empty").exists());
    support::schema::validate(crate::test_name!(), &[("files", vec![got.json.clone()])]);

    // The rerun replays the listing, so it reads the same set: a file added since is not
    // part of this get, and each file listed replays the host's copy.
    content(&remote, "new.html", 10, 4);
    let again = get_r(&args);
    assert_eq!(again.status, 0, "{again:?}");
    let replayed: Vec<_> = want
        .iter()
        .map(|(p, _, _)| (*p, true, "replayed"))
        .collect();
    assert_eq!(read_into(&again, &out), as_owned(&replayed), "{again:?}");
    assert!(!out.join("new.html").exists());

    // A new op id reads what is there now; `DIR/.` puts the files in LOCAL directly.
    let into = dir.join("into");
    std::fs::create_dir(&into).unwrap();
    let under = get_r(&[format!("target1:{}", remote.display()), s(&into)]);
    assert_eq!(under.status, 0, "{under:?}");
    assert_eq!(
        sha256(&into.join("site/new.html")),
        sha256(&remote.join("new.html"))
    );
    let direct = dir.join("direct");
    std::fs::create_dir(&direct).unwrap();
    let flat = get_r(&[format!("target1:{}/.", remote.display()), s(&direct)]);
    assert_eq!(flat.status, 0, "{flat:?}");
    assert!(direct.join("css/print/a.css").is_file(), "{flat:?}");

    // A directory that is not there: the listing fails, nothing is made here.
    let missing = env
        .opmark_with_lab(&lab)
        .args(["get", "-r"])
        .arg(format!("target1:{}", dir.join("gone").display()))
        .arg(&into)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&missing.stderr);
    assert_ne!(missing.status.code(), Some(0), "{said}");
    assert!(said.contains("not listed"), "{said}");
    assert!(!into.join("gone").exists());

    // One directory a run, and a LOCAL whose directory is missing: nothing is sent.
    let log = std::fs::metadata(&lab.targets()[0].log).map_or(0, |m| m.len());
    for (args, says) in [
        (
            vec![
                format!("target1:{}", remote.display()),
                format!("target1:{}", dir.display()),
                s(&direct),
            ],
            "one directory a run",
        ),
        (
            vec![
                format!("target1:{}", remote.display()),
                s(&dir.join("no-such-place")),
            ],
            "no directory",
        ),
    ] {
        let mut with_r = vec!["-r".to_owned()];
        with_r.extend(args);
        refused_naming(&env, &lab, "get", &with_r, says);
    }
    assert_nothing_connected_since(&lab, log);
}

/// Bytes the target's namespace received on its links (`/proc/net/dev`, all but `lo`),
/// counted before any filter: every byte the client sent, however many times.
fn received_by(lab: &Lab) -> u64 {
    link_bytes(lab, 0)
}

/// Bytes the target's namespace sent on its links: every byte a get read, however
/// many times.
fn sent_by(lab: &Lab) -> u64 {
    link_bytes(lab, 8)
}

/// One column of the target namespace's `/proc/net/dev` (0 received, 8 sent), summed
/// over its links but `lo`.
fn link_bytes(lab: &Lab, column: usize) -> u64 {
    let ns = lab.targets()[0].netns.clone().expect("a netns target");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "cat", "/proc/net/dev"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.trim() != "lo")
        .filter_map(|(_, counters)| counters.split_whitespace().nth(column)?.parse::<u64>().ok())
        .sum()
}

/// The size of the largest partial content a put of `op` holds in the host's spool.
fn spooled(lab: &Lab, op: &str) -> u64 {
    let spool = lab.target("target1").unwrap().marker_root().join("spool");
    std::fs::read_dir(spool)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("put-{op}."))
                })
                .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

#[test]
fn a_200_mb_put_cut_at_30_60_and_90_percent_resumes_each_time_and_never_leaves_a_partial_file() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    const SIZE: usize = 200 << 20;
    let dir = fresh_dir(crate::test_name!());
    let local = content(&dir, "huge", SIZE, 9);
    let dest = dir.join("huge-dest");
    let env = Sealed::new(crate::test_name!());
    let cfg = support::fast_loss_config(&lab, &dir);
    let before = received_by(&lab);
    let mut child = support::spawn(
        env.opmark().arg("-F").arg(&cfg).arg("--json").arg("put"),
        &[
            local.to_str().unwrap(),
            &format!("target1:{}", dest.display()),
            "--op",
            "pres-1",
            "--attempts",
            "6",
            "--wait",
            "10m",
        ],
    );
    let mut said = support::StderrLines::of(&mut child);
    let want = sha256(&local);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // A failed step below stops the reader too, so the test fails instead of the
        // scope waiting for the reader for good.
        let _stop_reader = support::SetOnDrop(&stop);
        // A reader of PATH all along: nothing there, or the whole file.
        let reader = s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if dest.exists() {
                    assert_eq!(sha256(&dest), want, "a reader saw a partial file");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        for percent in [30u64, 60, 90] {
            let at = SIZE as u64 * percent / 100;
            support::wait_for(
                &format!("{percent}% of the content on the host"),
                Duration::from_secs(180),
                || spooled(&lab, "pres-1") >= at,
            );
            lab.cut("target1").unwrap();
            said.wait_for("lost after dispatch", Duration::from_secs(60));
            lab.restore("target1").unwrap();
        }
        let out = support::finish_within(child, Duration::from_secs(300), "the put");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap();
        let done = support::answer(std::process::Output {
            stderr: said.all().into_bytes(),
            ..out
        });
        assert_eq!(done.verdict(), "completed", "{done:?}");
        assert_eq!(done.json["file"]["delivered"], "written", "{done:?}");
        // Each cut was noticed and answered by a probe; an attempt after it sent only what
        // the host lacked. (How many attempts that took varies: a cut connection's
        // session may still deliver what it had buffered once the link is back.)
        assert!(
            done.stderr
                .contains("resuming the put of op pres-1: the host holds"),
            "{}",
            done.stderr
        );
    });
    assert_eq!(sha256(&dest), want);
    assert!(no_leftovers(&dest));
    let sent = received_by(&lab) - before;
    eprintln!(
        "{sent} bytes crossed the link for a {SIZE}-byte file: {:.3}x",
        sent as f64 / SIZE as f64
    );
    assert!(
        sent < SIZE as u64 * 12 / 10,
        "{sent} bytes crossed the link for a {SIZE}-byte file (resumed, not resent)"
    );
}

#[test]
fn a_directory_put_cut_midway_is_finished_by_its_rerun_and_no_file_is_written_twice() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    let names: Vec<String> = (0..80).map(|i| format!("f{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        content(&tree, name, 256 * 1024, i as u8);
    }
    let remote = dir.join("remote");
    let env = Sealed::new(crate::test_name!());
    let cfg = support::fast_loss_config(&lab, &dir);
    let args = [
        "-r",
        &format!("{}/.", tree.display()),
        &format!("target1:{}", remote.display()),
        "--op",
        "tree-1",
        "--forks",
        "2",
        "--wait",
        "5s",
    ]
    .map(|a| a.to_owned());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    // Its output is read as it comes (a document of 80 files is more than a pipe holds).
    let mut first_put = env.opmark();
    first_put
        .arg("-F")
        .arg(&cfg)
        .arg("--json")
        .arg("put")
        .args(&argv);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(first_put.output().unwrap());
    });
    let delivered = || {
        std::fs::read_dir(&remote)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    };
    support::wait_for("five files on the host", Duration::from_secs(120), || {
        delivered() >= 5
    });
    // Longer than --wait: the files in flight are lost, the rest cannot connect.
    lab.cut("target1").unwrap();
    let out = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the cut put answers within its --wait budgets");
    lab.restore("target1").unwrap();
    let first = support::answer(out);
    assert_ne!(first.status, 0, "the cut left files undelivered: {first:?}");
    let first_verdicts: Vec<String> = first.json["files"]
        .as_array()
        .unwrap_or_else(|| panic!("{first:?}"))
        .iter()
        .map(|f| f["verdict"].as_str().unwrap_or("error").to_owned())
        .collect();
    // What the first run left on the host, by file: written once, never again.
    let inode = |name: &str| std::fs::metadata(remote.join(name)).ok().map(|m| m.ino());
    let left: Vec<(String, Option<u64>)> = names.iter().map(|n| (n.clone(), inode(n))).collect();

    let again = support::answer(
        env.opmark()
            .arg("-F")
            .arg(&cfg)
            .arg("--json")
            .arg("put")
            .args(&argv)
            .output()
            .unwrap(),
    );
    assert_eq!(
        again.status, 0,
        "the rerun delivers the rest: {again:?} (first: {first_verdicts:?})"
    );
    for (i, (name, before)) in left.iter().enumerate() {
        assert_eq!(
            sha256(&remote.join(name)),
            sha256(&tree.join(name)),
            "{name}"
        );
        if before.is_some() {
            assert_eq!(
                inode(name),
                *before,
                "{name} was on the host after the first run and was written again ({})",
                again.json["files"][i]["verdict"]
            );
        }
        assert!(no_leftovers(&remote.join(name)), "{name}");
    }
    let verdicts: Vec<&str> = again.json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["verdict"].as_str().unwrap())
        .collect();
    assert!(
        verdicts
            .iter()
            .all(|v| matches!(*v, "replayed" | "completed")),
        "{verdicts:?}"
    );
    eprintln!("first run: {first_verdicts:?}; rerun: {verdicts:?}");
}

/// `opmark --json get target1:REMOTE LOCAL ARGS...`.
fn get(env: &Sealed, lab: &Lab, remote: &Path, local: &Path, args: &[&str]) -> Answer {
    support::answer(
        env.opmark_with_lab(lab)
            .arg("--json")
            .arg("get")
            .arg(format!("target1:{}", remote.display()))
            .arg(local)
            .args(args)
            .output()
            .unwrap(),
    )
}

#[test]
fn a_get_reads_the_file_whole_and_a_rerun_replays_the_hosts_copy() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let remote = content(&dir, "remote.log", 3 << 20, 10);
    let want = sha256(&remote);
    let local = dir.join("here").join("copy.log");
    std::fs::create_dir_all(local.parent().unwrap()).unwrap();
    let env = Sealed::new(crate::test_name!());
    let a = get(&env, &lab, &remote, &local, &["--op", "get-1"]);
    assert_eq!(a.verdict(), "completed", "{a:?}");
    assert_eq!(a.json["family"], "read-only", "{a:?}");
    assert_eq!(a.json["file"]["saved"], true, "{a:?}");
    assert_eq!(a.json["file"]["sha256"], want.as_str());
    assert_eq!(
        a.json["stdout"], "",
        "the content is in LOCAL, not the document"
    );
    assert_eq!(sha256(&local), want);
    assert!(no_leftovers(&local));
    // The file changes on the host; the same op id replays what that read saw.
    std::fs::write(&remote, "changed\n").unwrap();
    std::fs::remove_file(&local).unwrap();
    let again = get(&env, &lab, &remote, &local, &["--op", "get-1"]);
    assert_eq!(again.verdict(), "replayed", "{again:?}");
    assert_eq!(sha256(&local), want, "the first read's bytes");
    // A new op id reads it anew; a directory as LOCAL takes the file's name.
    let fresh = get(&env, &lab, &remote, &dir.join("here"), &["--op", "get-2"]);
    assert_eq!(fresh.json["file"]["saved"], true, "{fresh:?}");
    assert_eq!(
        std::fs::read(dir.join("here").join("remote.log")).unwrap(),
        b"changed\n"
    );
}

#[test]
fn a_get_of_a_missing_file_leaves_local_as_it_was_and_bad_input_sends_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let local = dir.join("keep");
    std::fs::write(&local, "mine\n").unwrap();
    let env = Sealed::new(crate::test_name!());
    let a = get(&env, &lab, &dir.join("absent"), &local, &["--op", "gm-1"]);
    assert_eq!(a.exit_code(), Some(1), "{a:?}");
    assert_eq!(a.json["file"]["saved"], false, "{a:?}");
    assert!(a.stderr.contains("no file"), "{}", a.stderr);
    assert_eq!(std::fs::read(&local).unwrap(), b"mine\n");
    assert!(
        no_leftovers(&local),
        "nothing read, nothing kept beside LOCAL"
    );
    for (args, says) in [
        (
            vec!["target1".to_owned(), local.display().to_string()],
            "HOST:PATH",
        ),
        (
            vec!["target1:/etc/".to_owned(), local.display().to_string()],
            "names a directory",
        ),
        (
            vec![
                "target1:/etc/hostname".to_owned(),
                dir.join("no/such/dir/f").display().to_string(),
            ],
            "no directory",
        ),
    ] {
        refused_naming(&env, &lab, "get", &args, says);
    }
    let run = support::run_json(
        &env,
        &lab,
        &["target1", "--", "opmark-get -- '/etc/hostname'"],
    );
    assert_eq!(run.verdict(), "refused", "{run:?}");
}

#[test]
fn a_get_of_a_private_key_waits_for_a_humans_approval() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let env = Sealed::new(crate::test_name!());
    let a = get(
        &env,
        &lab,
        Path::new("/etc/shadow"),
        &dir.join("s"),
        &["--op", "gs-1"],
    );
    assert_eq!(a.verdict(), "blocked", "{a:?}");
    assert!(!dir.join("s").exists());
}

#[test]
fn a_put_the_policy_holds_waits_for_an_approval_and_then_writes_once() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    // The shipped policy, and a rule that holds puts to files named `held`.
    let policy = dir.join("policy.toml");
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/command-classes.toml"))
            .unwrap();
    std::fs::write(
        &policy,
        format!(
            "{shipped}\n[[rule]]\nname = \"hold-puts\"\nfamily = \"convergent\"\npattern = '^opmark-put .*/held$'\napproval = \"always\"\n"
        ),
    )
    .unwrap();
    let local = content(&dir, "f", 1000, 11);
    let dest = dir.join("held");
    let env = Sealed::new(crate::test_name!());
    let with_policy = |args: &[&str]| {
        support::answer(
            env.opmark_with_lab(&lab)
                .arg("--policy")
                .arg(&policy)
                .arg("--json")
                .arg("put")
                .arg(&local)
                .arg(format!("target1:{}", dest.display()))
                .args(args)
                .output()
                .unwrap(),
        )
    };
    let held = with_policy(&["--op", "ph-1"]);
    assert_eq!(held.verdict(), "blocked", "{held:?}");
    assert!(!dest.exists(), "nothing written");
    let approved = with_policy(&["--op", "ph-1", "--approve", "checked the file"]);
    assert_eq!(approved.verdict(), "completed", "{approved:?}");
    assert_eq!(
        approved.json["file"]["delivered"], "written",
        "{approved:?}"
    );
    assert_eq!(sha256(&dest), sha256(&local));
}

/// The partial copy a get under `op` keeps beside `local` while it reads.
fn partial_of(local: &Path, op: &str) -> PathBuf {
    let name = local.file_name().unwrap().to_str().unwrap();
    local.with_file_name(format!(".{name}.opmark-{op}"))
}

#[test]
fn a_get_goes_on_from_the_partial_copy_here_and_a_copy_that_is_not_the_hosts_is_read_again() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = fresh_dir(crate::test_name!());
    let remote = content(&dir, "remote.bin", 3 << 20, 12);
    let want = sha256(&remote);
    let local = dir.join("here").join("copy.bin");
    std::fs::create_dir_all(local.parent().unwrap()).unwrap();
    let env = Sealed::new(crate::test_name!());
    let first = get(&env, &lab, &remote, &local, &["--op", "gres-1"]);
    assert_eq!(first.verdict(), "completed", "{first:?}");
    assert_eq!(sha256(&local), want);
    let partial = partial_of(&local, "gres-1");
    assert!(
        !partial.exists(),
        "a read kept whole leaves no partial copy"
    );

    // An earlier invocation was cut after 1 MiB: its partial copy holds the host's first
    // bytes, and the rerun asks the host's copy for the rest only.
    let bytes = std::fs::read(&remote).unwrap();
    std::fs::remove_file(&local).unwrap();
    std::fs::write(&partial, &bytes[..1 << 20]).unwrap();
    let resumed = get(&env, &lab, &remote, &local, &["--op", "gres-1"]);
    assert_eq!(resumed.verdict(), "replayed", "{resumed:?}");
    assert!(
        resumed
            .stderr
            .contains("resuming the read of op gres-1: the first 1048576 bytes of its output are here already"),
        "{}",
        resumed.stderr
    );
    assert_eq!(sha256(&local), want, "the partial copy and the rest, whole");
    assert!(no_leftovers(&local));

    // A partial copy that is not the host's bytes (edited here), or longer than its copy:
    // the digest over the whole refuses it, LOCAL is not written, and the copy is gone,
    // so the next rerun reads the file whole.
    let wrong: Vec<u8> = vec![0xAA; 1 << 20];
    let longer: Vec<u8> = [&bytes[..], b"and more"].concat();
    for held in [wrong, longer] {
        let _ = std::fs::remove_file(&local);
        std::fs::write(&partial, &held).unwrap();
        let out = env
            .opmark_with_lab(&lab)
            .args(["get", &format!("target1:{}", remote.display())])
            .arg(&local)
            .args(["--op", "gres-1", "--wait", "20s"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains("cannot keep"), "{stderr}");
        assert!(stderr.contains("rerun with the same op id"), "{stderr}");
        assert!(
            !local.exists(),
            "nothing but the host's bytes is renamed into place"
        );
        assert!(!partial.exists(), "the wrong copy is removed");
        let again = get(&env, &lab, &remote, &local, &["--op", "gres-1"]);
        assert_eq!(again.verdict(), "replayed", "{again:?}");
        assert!(!again.stderr.contains("resuming"), "{}", again.stderr);
        assert_eq!(sha256(&local), want);
    }
}

#[test]
fn a_200_mb_get_killed_at_30_and_60_percent_is_finished_by_reruns_that_read_only_the_rest() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    const SIZE: usize = 200 << 20;
    let dir = fresh_dir(crate::test_name!());
    let remote = content(&dir, "huge", SIZE, 13);
    let want = sha256(&remote);
    let env = Sealed::new(crate::test_name!());
    // Each client its own connection; then through one keeper, a call a channel (the
    // resident shim off) and through the resident: a killed caller's channel is closed
    // by the keeper, so the host stops sending what nobody reads (read to its end, the
    // rest of the file crossed the link: 2.09x in all).
    for (op, persist, resident) in [
        ("gbig-1", "0", "1"),
        ("gbig-2", "5m", "0"),
        ("gbig-3", "5m", "1"),
    ] {
        let local = dir.join(op).join("huge");
        std::fs::create_dir_all(local.parent().unwrap()).unwrap();
        let partial = partial_of(&local, op);
        let get_cmd = || {
            let mut cmd = env.opmark_with_lab(&lab);
            cmd.env("OPMARK_PERSIST", persist)
                .env("OPMARK_RESIDENT", resident)
                .arg("get");
            cmd
        };
        let before = sent_by(&lab);
        for percent in [30u64, 60] {
            let at = SIZE as u64 * percent / 100;
            let mut child = support::spawn(
                &mut get_cmd(),
                &[
                    &format!("target1:{}", remote.display()),
                    local.to_str().unwrap(),
                    "--op",
                    op,
                ],
            );
            support::wait_for(
                &format!("{percent}% of the file here"),
                Duration::from_secs(180),
                || std::fs::metadata(&partial).is_ok_and(|m| m.len() >= at),
            );
            // SIGKILL: nothing of the client's own runs after it.
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            eprintln!(
                "{op}: killed at {} bytes here; it said: {}",
                std::fs::metadata(&partial).map_or(0, |m| m.len()),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!local.exists(), "LOCAL is never a partial file");
        }
        let kept = std::fs::metadata(&partial).unwrap().len();
        assert!(kept >= SIZE as u64 * 6 / 10, "{kept}");
        let done = support::answer(
            get_cmd()
                .arg("--json")
                .arg(format!("target1:{}", remote.display()))
                .arg(&local)
                .args(["--op", op])
                .output()
                .unwrap(),
        );
        assert_eq!(done.verdict(), "replayed", "{done:?}");
        assert!(
            done.stderr
                .contains(&format!("resuming the read of op {op}: the first")),
            "{}",
            done.stderr
        );
        assert_eq!(sha256(&local), want);
        assert!(no_leftovers(&local));
        let sent = sent_by(&lab) - before;
        eprintln!(
            "{op} (persist {persist}, resident {resident}): {sent} bytes crossed the link for a {SIZE}-byte file read in three invocations: {:.3}x",
            sent as f64 / SIZE as f64
        );
        assert!(
            sent < SIZE as u64 * 12 / 10,
            "{op}: {sent} bytes crossed the link for a {SIZE}-byte file (resumed, not read again)"
        );
    }
}
