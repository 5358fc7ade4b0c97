//! `opmark output`: any part of an operation's output read back from the copy its host
//! keeps, byte-exact, without running or recording anything; and the MCP side, where a
//! result carries head and tail within a budget and the `output` tool reads the rest.

use crate::support::mcp::python_client;
use crate::support::{self, answer, event_count, fresh_dir, json, run_json, sha, text, Sealed};
use serde_json::Value;

/// What `seq 1 N` prints: the command's stdout, known here byte for byte.
fn seq(n: u32) -> Vec<u8> {
    (1..=n)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes()
}

#[test]
fn output_reads_back_exact_ranges_tails_and_matching_lines_and_records_nothing() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ran = run_json(
        &env,
        &lab,
        &[
            "target1",
            "--op",
            "out-1",
            "--",
            "seq 1 20000; echo err-line >&2",
        ],
    );
    assert_eq!(ran.verdict(), "completed", "{}", ran.stderr);
    let whole = seq(20000);
    let before = event_count(&env, "out-1");
    let read = |args: &[&str]| {
        env.opmark_with_lab(&lab)
            .args(["output", "out-1"])
            .args(args)
            .output()
            .unwrap()
    };

    // No host: the ledger ran out-1 on one, so that is where it reads.
    let all = read(&[]);
    assert!(all.status.success(), "{}", text(&all.stderr));
    assert_eq!(all.stdout, whole, "the whole stdout, byte for byte");

    let range = read(&["target1", "--range", "100-200"]);
    assert_eq!(range.stdout, &whole[100..200]);
    let tail = read(&["--tail", "50"]);
    assert_eq!(tail.stdout, &whole[whole.len() - 50..]);
    let err = read(&["--stream", "stderr"]);
    assert_eq!(text(&err.stdout), "err-line\n");

    // Matching lines after their byte offsets, as `grep -b` prints them.
    let grep = read(&["--grep", "^1999[0-9]$"]);
    let want: String = (19990..=19999)
        .map(|i| {
            let line = format!("{i}\n");
            let at = whole
                .windows(line.len() + 1)
                .position(|w| w == format!("\n{line}").as_bytes())
                .unwrap()
                + 1;
            format!("{at}:{i}\n")
        })
        .collect();
    assert_eq!(text(&grep.stdout), want);

    // As documents: the range, its digest, what the host keeps.
    let docs: Vec<Value> = [
        &["--range", "1000-"][..],
        &["--tail", "10"],
        &["--grep", "^77$"],
    ]
    .iter()
    .map(|args| {
        let out = env
            .opmark_with_lab(&lab)
            .args(["--json", "output", "out-1", "target1"])
            .args(*args)
            .output()
            .unwrap();
        answer(out).json
    })
    .collect();
    let from_1000 = &docs[0];
    assert_eq!(from_1000["from"], 1000, "{from_1000}");
    assert_eq!(from_1000["to"], whole.len(), "{from_1000}");
    assert_eq!(from_1000["kept_bytes"], whole.len());
    assert_eq!(from_1000["dropped_bytes"], 0);
    assert_eq!(from_1000["marker_state"], "completed");
    assert_eq!(from_1000["sha256"], sha(&whole[1000..]));
    assert_eq!(
        from_1000["text"].as_str().unwrap().as_bytes(),
        &whole[1000..]
    );
    assert_eq!(docs[1]["from"], whole.len() - 10, "{}", docs[1]);
    // 1-9 take 18 bytes, 10-76 take 201: line 77 starts at byte 219.
    assert_eq!(
        docs[2]["matches"],
        serde_json::json!([{"offset": 219, "line": "77"}])
    );
    assert!(docs[2].get("text").is_none(), "{}", docs[2]);
    support::schema::validate(crate::test_name!(), &[("output", docs)]);

    assert_eq!(
        event_count(&env, "out-1"),
        before,
        "reading output recorded something"
    );
}

#[test]
fn output_refuses_bad_ranges_patterns_and_unknown_operations_naming_the_fix() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let ran = run_json(&env, &lab, &["target1", "--op", "out-2", "--", "echo hi"]);
    assert_eq!(ran.verdict(), "completed", "{}", ran.stderr);
    let said = |args: &[&str]| {
        let out = env
            .opmark_with_lab(&lab)
            .arg("output")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        text(&out.stderr)
    };
    // Ranges and patterns are checked before anything is sent.
    let empty = said(&["out-2", "--range", "5-3"]);
    assert!(empty.contains("must be above A"), "{empty}");
    let garbled = said(&["out-2", "--range", "five-six"]);
    assert!(garbled.contains("write it as A-B"), "{garbled}");
    let pattern = said(&["out-2", "--grep", "(unclosed"]);
    assert!(
        pattern.contains("not a regular expression") && pattern.contains("nothing was sent"),
        "{pattern}"
    );
    let both = said(&["out-2", "--tail", "5", "--grep", "x"]);
    assert!(both.contains("cannot be used with"), "{both}");
    // An op id the ledger does not know needs its host named.
    let unknown = said(&["never-ran"]);
    assert!(
        unknown.contains("opmark output never-ran HOST"),
        "{unknown}"
    );
    // Named, the host has no marker for it: nothing to read, and the way to look.
    let out = env
        .opmark_with_lab(&lab)
        .args(["--json", "output", "never-ran", "target1"])
        .output()
        .unwrap();
    let doc = json(&out);
    assert_eq!(doc["error"]["reason_code"], "unknown_operation", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("absent") && message.contains("opmark probe target1 never-ran"),
        "{message}"
    );
}

#[test]
fn an_mcp_result_of_50_mb_stays_within_its_budget_and_the_output_tool_reads_exact_bytes() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(python) = crate::mcp::python_with_mcp(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let (r, _) = python_client(
        &python,
        &env,
        "output.py",
        &[lab.ssh_config().as_os_str(), dir.as_os_str()],
    );
    // `seq 1 7000000`: 54,888,896 bytes on stdout.
    let whole = seq(7_000_000);
    let run = &r["run"];
    assert_eq!(run["verdict"], "completed", "{run}");
    assert_eq!(run["stdout_bytes"], whole.len(), "{run}");
    assert_eq!(run["stdout_sha256"], sha(&whole));
    // Within the 16 KiB default: 12 KiB of head, 4 KiB of tail, one line between.
    let stdout = run["stdout"].as_str().unwrap();
    let (head, rest) = stdout.split_at(12288);
    assert_eq!(head.as_bytes(), &whole[..12288]);
    assert!(rest.ends_with(std::str::from_utf8(&whole[whole.len() - 4096..]).unwrap()));
    let note = &rest[..rest.len() - 4096];
    assert!(
        note.len() < 400,
        "the left-out line is {} bytes: {note}",
        note.len()
    );
    let left_out = whole.len() - 16384;
    assert!(
        note.contains(&format!("{left_out} bytes of stdout left out here"))
            && note.contains(&format!("range \"12288-{}\"", whole.len() - 4096))
            && note.contains("the host kept only bytes 0-8388608"),
        "{note}"
    );
    let handed = r["result_text_bytes"].as_u64().unwrap();
    assert!(handed < 24 << 10, "the text content is {handed} bytes");

    // The output tool: an exact byte range of the host's kept copy.
    let range = &r["range"];
    assert_eq!(range["from"], 4_000_000, "{range}");
    assert_eq!(range["to"], 4_065_536, "{range}");
    assert_eq!(
        range["sha256"],
        sha(&whole[4_000_000..4_065_536]),
        "{range}"
    );
    assert_eq!(range["dropped_bytes"], whole.len() - (8 << 20), "{range}");
    // A range beyond the budget stops at it, and says where.
    let long = &r["long_range"];
    assert_eq!(long["to"], 16384, "{long}");
    assert_eq!(long["sha256"], sha(&whole[..16384]), "{long}");
    let grep = &r["grep"];
    assert_eq!(grep["matches"][0]["line"], "123456", "{grep}");
    let bad = &r["bad_range"];
    assert_eq!(bad["_is_error"], true, "{bad}");
    assert_eq!(bad["error"]["field"], "range", "{bad}");
}
