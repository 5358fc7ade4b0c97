//! `opmark mcp` driven by a real MCP client this project did not write: the official
//! Python SDK (`mcp` from PyPI, pinned in scripts/install-deps.sh) runs
//! tests/mcp/client.py against the server, which talks to a real sshd lab target.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::json::variant_of_target1;
use crate::support::mcp::{python_client, McpClient};
use crate::support::{fresh_dir, skip_or_fail, text, Sealed};

/// The real interpreter behind `python3` when it can `import mcp`; else None after a
/// skip (locally).
pub(crate) fn python_with_mcp(test: &str) -> Option<PathBuf> {
    let python = crate::json::real_python(test)?;
    let has_mcp = Command::new(&python)
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_mcp {
        skip_or_fail(
            test,
            "python3 with the `mcp` package (scripts/install-deps.sh)",
        );
        return None;
    }
    Some(python)
}

#[test]
fn python_sdk_client_runs_replays_and_is_refused_through_opmark_mcp() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(python) = python_with_mcp(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    // The lab's targets plus `stranger`: target1 under a host key nobody knows.
    let empty_known = dir.join("known_hosts");
    std::fs::write(&empty_known, "").unwrap();
    let cfg = dir.join("ssh_config");
    std::fs::write(
        &cfg,
        // Include first: after a `Host` line it would belong to that block.
        format!(
            "Include {}\n{}",
            lab.ssh_config().display(),
            variant_of_target1(&lab, "stranger", None, Some(&empty_known)),
        ),
    )
    .unwrap();
    // Written on the target by the command: loopback targets share this filesystem.
    let count = dir.join("count");
    let (r, stderr) = python_client(
        &python,
        &env,
        "client.py",
        &[cfg.as_os_str(), count.as_os_str()],
    );

    assert_eq!(r["server_name"], "opmark");
    let tools = &r["tools"];
    for name in [
        "run",
        "probe",
        "output",
        "show",
        "list",
        "reconcile",
        "cancel",
    ] {
        assert!(tools[name].is_object(), "tool {name} missing: {tools}");
    }
    assert_eq!(tools["run"]["annotations"]["idempotent_hint"], true);
    for name in ["probe", "output", "show", "list"] {
        assert_eq!(tools[name]["annotations"]["read_only_hint"], true, "{name}");
    }
    let run_required = tools["run"]["required"].as_array().unwrap();
    for field in ["host", "op_id", "command"] {
        assert!(run_required.contains(&field.into()), "{run_required:?}");
    }
    // Approval is a human's act: the run tool has no way to give it (no `approve`); it
    // can only present a token a human signed (`approval`, checked like the CLI's).
    assert!(
        !tools["run"]["properties"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap() == "approve"),
        "{}",
        tools["run"]
    );

    let first = &r["first"];
    assert_eq!(first["schema"], "opmark/2", "{first}");
    assert_eq!(first["verdict"], "completed", "{first}\n{stderr}");
    assert_eq!(first["exit_code"], 0);
    assert_eq!(first["_is_error"], false);
    assert_eq!(first["_text_matches"], true);
    // 3000 x's and a newline, cut to --max-output 1k (768 of head, 256 of tail) with
    // counts, digest and the way on.
    assert_eq!(first["stdout_bytes"], 3001, "{first}");
    assert_eq!(first["stdout_truncated"], true);
    let stdout = first["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with(&format!("{}\n[opmark: 1977 bytes", "x".repeat(768))),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("]\n{}\n", "x".repeat(255))),
        "{stdout}"
    );
    assert_eq!(
        first["stdout_left_out"],
        serde_json::json!({"from": 768, "to": 2745})
    );
    assert_eq!(first["stdout_sha256"].as_str().unwrap().len(), 64);
    assert!(stdout.contains(r#"op_id "mcp-1", host "target1", stream "stdout", range "768-2745""#));
    assert!(first["output_rest"]
        .as_str()
        .unwrap()
        .contains("`output` tool"));
    assert!(
        !r["progress"].as_array().unwrap().is_empty(),
        "no progress notification during a 3 s run: {}",
        r["progress"]
    );
    // The 3001 bytes come before the sleep: a notification during the sleep counts them.
    assert!(
        r["progress"].as_array().unwrap().iter().any(|m| m
            .as_str()
            .is_some_and(|m| m.contains("output so far: 3001 bytes of stdout, 0 of stderr"))),
        "no notification counted the output: {}",
        r["progress"]
    );

    let second = &r["second"];
    assert_eq!(second["verdict"], "replayed", "{second}");
    assert_eq!(second["fingerprint"], first["fingerprint"]);
    assert_eq!(second["stdout_sha256"], first["stdout_sha256"]);
    let ran = std::fs::read_to_string(&count).unwrap();
    assert_eq!(
        ran,
        "ran\n",
        "the command ran {} times",
        ran.lines().count()
    );

    for step in ["blocked", "blocked_again"] {
        let b = &r[step];
        assert_eq!(b["verdict"], "blocked", "{step}: {b}");
        assert_eq!(b["reason_code"], "approval_required");
        assert_eq!(b["retryable"], false);
    }

    let stranger = &r["stranger"];
    assert_eq!(stranger["verdict"], "not_applied", "{stranger}");
    assert_eq!(stranger["reason_code"], "host_key_rejected");
    assert_eq!(stranger["retryable"], false);

    // A bad op id is an error naming the field, the same shape as a bad class.
    let bad_op = &r["bad_op"];
    assert_eq!(bad_op["_is_error"], true, "{bad_op}");
    assert_eq!(bad_op["error"]["reason_code"], "invalid_input", "{bad_op}");
    assert_eq!(bad_op["error"]["field"], "op_id", "{bad_op}");

    assert_eq!(r["probe"]["marker_state"], "completed", "{}", r["probe"]);
    assert_eq!(r["probe"]["fingerprint"], first["fingerprint"]);
    assert_eq!(r["show"]["operation"]["op_id"], "mcp-1", "{}", r["show"]);
    let unknown = &r["show_unknown"];
    assert_eq!(unknown["_is_error"], true, "{unknown}");
    assert_eq!(unknown["error"]["reason_code"], "unknown_operation");
    let listed: Vec<_> = r["list"]["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(listed.contains(&"mcp-1".to_owned()), "{listed:?}");
    assert_eq!(r["reconcile"]["schema"], "opmark/2", "{}", r["reconcile"]);
    assert_eq!(r["cancel"]["schema"], "opmark/2", "{}", r["cancel"]);
    the_tools_teach_their_contract(&r);
    let gated = std::fs::read_to_string(dir.join("gated")).unwrap();
    assert_eq!(
        gated,
        "go\n",
        "the gated command ran {} times",
        gated.lines().count()
    );
}

/// What the Python SDK client saw of the tools' contract, beyond running: schemas,
/// argument errors, `list`'s limit, the wait budget and `detach`.
fn the_tools_teach_their_contract(r: &Value) {
    let tools = &r["tools"];
    // Every tool declares an output schema, and the SDK validated every successful
    // result above against it (it raises on a mismatch, failing the client).
    for name in ["run", "probe", "show", "list", "reconcile", "cancel"] {
        assert_eq!(
            tools[name]["has_output_schema"], true,
            "{name}: {}",
            tools[name]
        );
        assert_eq!(
            tools[name]["input_schema"]["additionalProperties"], false,
            "{name}: unknown arguments must be refused: {}",
            tools[name]
        );
    }
    let class = &tools["run"]["input_schema"]["properties"]["class"];
    assert_eq!(
        class["enum"],
        serde_json::json!(["read-only", "convergent", "append-only", "destructive"]),
        "{class}"
    );
    assert!(
        tools["run"]["properties"]
            .as_array()
            .unwrap()
            .contains(&"detach".into()),
        "{}",
        tools["run"]
    );
    assert!(
        tools["list"]["properties"]
            .as_array()
            .unwrap()
            .contains(&"limit".into()),
        "{}",
        tools["list"]
    );

    let limited = r["list_limited"]["operations"].as_array().unwrap();
    assert_eq!(limited.len(), 1, "{}", r["list_limited"]);

    let unknown = &r["unknown_argument"];
    assert_eq!(unknown["_is_error"], true, "{unknown}");
    assert_eq!(unknown["error"]["reason_code"], "invalid_input");
    assert_eq!(unknown["error"]["field"], "approve", "{unknown}");
    let m = unknown["error"]["message"].as_str().unwrap();
    assert!(m.contains("`op_id`") && m.contains("--approve"), "{m}");

    let missing = &r["missing_op_id"];
    assert_eq!(missing["_is_error"], true, "{missing}");
    assert_eq!(missing["error"]["field"], "op_id", "{missing}");
    let m = missing["error"]["message"].as_str().unwrap();
    assert!(m.contains("needs the argument `op_id`"), "{m}");
    assert!(!m.contains("deserialize"), "{m}");

    // The wait budget answered while the command was still held at its gate.
    let waited = &r["waited"];
    eprintln!(
        "mcp run with wait 2s on a gated command answered after {:.2} s",
        r["waited_seconds"].as_f64().unwrap_or(-1.0)
    );
    assert_eq!(waited["verdict"], "in_progress", "{waited}");
    assert_eq!(waited["reason_code"], "wait_budget_spent", "{waited}");
    assert_eq!(waited["retryable"], true, "{waited}");
    assert_eq!(waited["exit_status"], 240, "{waited}");
    assert_eq!(r["gate_open_at_answer"], false);
    let after = &r["after_gate"];
    assert!(
        after["verdict"] == "replayed" || after["verdict"] == "completed",
        "{after}"
    );
    assert_eq!(after["exit_code"], 0, "{after}");
    assert!(
        after["stdout"].as_str().unwrap().contains("through"),
        "{after}"
    );

    let detached = &r["detached"];
    assert_eq!(detached["verdict"], "in_progress", "{detached}");
    assert_eq!(detached["reason_code"], "detached", "{detached}");
    let later = &r["after_detach"];
    assert!(
        later["verdict"] == "replayed" || later["verdict"] == "completed",
        "{later}"
    );
    assert_eq!(later["exit_code"], 0, "{later}");
}

#[test]
fn a_garbled_or_oversized_line_gets_a_json_rpc_error_and_the_server_stays_up() {
    let env = Sealed::new(crate::test_name!());
    let mut cmd = env.opmark();
    cmd.arg("mcp");
    let mut client = McpClient::start(cmd);

    client.send_raw(b"this is not json\n");
    let parse = client.next_message();
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    assert_eq!(parse["id"], Value::Null, "{parse}");

    client.send_raw(b"{\"id\": 9, \"params\": {}}\n");
    let invalid = client.next_message();
    assert_eq!(invalid["error"]["code"], -32600, "{invalid}");
    assert_eq!(invalid["id"], 9, "{invalid}");

    // 33 MiB in one line: over the 32 MiB limit, skipped without being held whole.
    let mut huge = vec![b'x'; 33 << 20];
    huge.push(b'\n');
    client.send_raw(&huge);
    let over = client.next_message();
    assert_eq!(over["error"]["code"], -32600, "{over}");
    let message = over["error"]["message"].as_str().unwrap();
    assert!(message.contains("limit of 32 MiB"), "{message}");

    // Still serving.
    let tools = client.request("tools/list", serde_json::json!({}));
    assert!(
        tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| t.len() == 8),
        "{tools}"
    );
    assert!(client.close().success());
}

#[test]
fn mcp_server_still_stops_on_sigterm_after_a_run() {
    use std::time::Duration;

    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let mut cmd = env.opmark_with_lab(&lab);
    cmd.arg("mcp");
    let mut client = McpClient::start(cmd);
    let run = client.call(
        "run",
        serde_json::json!({"host": "target1", "op_id": "sig-1", "command": "true"}),
    );
    assert_eq!(
        run["result"]["structuredContent"]["verdict"], "completed",
        "{run}"
    );
    // A run installs signal handlers; the idle server must still obey SIGTERM.
    let pid = client.server.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // A generous watchdog, not a speed assertion: the bug it catches never exits.
    let status = client
        .exited_within(Duration::from_secs(30))
        .expect("opmark mcp ignored SIGTERM for 30 s");
    assert!(status.success(), "{status:?}");
}

#[test]
fn python_sdk_client_hears_the_honest_verdict_of_a_link_cut_mid_run() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let Some(lab) = crate::support::netns_lab(1) else {
        return;
    };
    let Some(python) = python_with_mcp(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let cfg = crate::support::fast_loss_config(&lab, &dir);
    let marker = lab
        .target("target1")
        .unwrap()
        .marker_root()
        .join("ops")
        .join("lost-1");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let sealed = env.opmark();
    let client = Command::new(python)
        .arg(&script)
        .arg("--lost")
        .arg(env!("CARGO_BIN_EXE_opmark"))
        .arg(&cfg)
        .arg(&dir)
        .env_clear()
        .envs(sealed.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.join("started").exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.cut("target1").unwrap();
    // Restored only once the command has finished on the host, unseen by the client.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.join("exit").exists() {
        assert!(Instant::now() < deadline, "no exit record on the host");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The first answer must be in before the link comes back: wait for the verdict in
    // the ledger (the client's first call has returned once it is recorded).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = env
            .opmark()
            .args(["--json", "list", "--unresolved"])
            .output()
            .unwrap();
        if text(&out.stdout).contains("\"verdict\":\"indeterminate\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no verdict recorded for the cut run"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    lab.restore("target1").unwrap();
    std::fs::write(dir.join("restored"), "").unwrap();
    let out = client.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "client failed: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cut = &r["during_cut"];
    // The command may have run: the tool says so, with no invented exit code.
    assert_eq!(cut["verdict"], "indeterminate", "{cut}");
    assert_eq!(cut["exit_code"], Value::Null, "{cut}");
    assert_eq!(cut["retryable"], true, "{cut}");
    assert_eq!(cut["_is_error"], false);
    let after = &r["after_restore"];
    assert_eq!(after["verdict"], "replayed", "{after}");
    assert_eq!(after["exit_code"], 4, "{after}");
    let record = std::fs::read_to_string(marker.join("exit")).unwrap();
    assert!(record.contains("code=4"), "{record}");
}
