//! MCP tasks of `opmark mcp`: a task-augmented `run` is the operation, so its task
//! survives the server. Driven by the official Python SDK's task client (tests/mcp/tasks.py)
//! against a real sshd lab target.

use std::path::PathBuf;
use std::process::Command;

use crate::support::mcp::{python_client, McpClient};
use crate::support::{fresh_dir, lines, skip_or_fail, Sealed};

/// The interpreter of the pinned SDK with the task client (the 1.x line: 2.0 dropped it),
/// from the virtualenv scripts/install-deps.sh makes, or `OPMARK_MCP_TASKS_PYTHON`.
fn python_with_tasks(test: &str) -> Option<PathBuf> {
    let python = std::env::var_os("OPMARK_MCP_TASKS_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/opmark/mcp-tasks-venv/bin/python"))
        })?;
    let ok = Command::new(&python)
        .args(["-c", "import mcp.client.experimental.tasks"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_or_fail(
            test,
            "the MCP Python SDK with its task client in ~/.cache/opmark/mcp-tasks-venv (scripts/install-deps.sh)",
        );
        return None;
    }
    Some(python)
}

#[test]
fn a_task_is_the_operation_and_outlives_the_server_that_started_it() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let Some(python) = python_with_tasks(crate::test_name!()) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let (r, stderr) = python_client(
        &python,
        &env,
        "tasks.py",
        &[lab.ssh_config().as_os_str(), dir.as_os_str()],
    );
    let all = format!("{r:#}\n{stderr}");
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&r["transcript"]).unwrap()
    );

    assert_eq!(
        r["capabilities"]["tasks"]["requests"]["tools"]["call"],
        serde_json::json!({}),
        "{all}"
    );
    // Created at once, working, named by the operation.
    let created = &r["created"];
    assert_eq!(created["taskId"], "task-1@target1", "{all}");
    assert_eq!(created["status"], "working", "{all}");
    assert!(r["created_seconds"].as_f64().unwrap() < 5.0, "{all}");
    assert!(created["pollInterval"].as_u64().unwrap() > 0, "{all}");
    assert_eq!(r["first_get"]["status"], "working", "{all}");

    // A new server process answers for the same task id: still working, then completed,
    // and the result is the run document; the command ran once.
    assert_eq!(r["new_server_get"]["status"], "working", "{all}");
    assert_eq!(r["new_server_final"]["status"], "completed", "{all}");
    let result = &r["result"];
    assert_eq!(result["schema"], "opmark/2", "{all}");
    assert_eq!(result["op_id"], "task-1", "{all}");
    assert!(
        ["completed", "replayed"].contains(&result["verdict"].as_str().unwrap()),
        "{all}"
    );
    assert_eq!(result["exit_code"], 0, "{all}");
    assert_eq!(result["stdout"], "finished\n", "{all}");
    assert_eq!(lines(&dir.join("long")), 1, "{all}");

    // A finished task whose command the ledger keeps redacted: the new server cannot
    // replay its run document and says so, but the state is the marker's truth.
    assert_eq!(r["secret_done"]["status"], "completed", "{all}");
    assert_eq!(r["secret_new_server"]["status"], "completed", "{all}");
    assert_eq!(
        r["secret_result"]["reason_code"], "task_from_ledger",
        "{all}"
    );
    assert_eq!(r["secret_result"]["marker"]["exit_code"], 0, "{all}");
    assert!(!all.contains("CanaryT1"), "{all}");
    assert_eq!(lines(&dir.join("secret")), 1, "{all}");

    // Cancel stops the running command, once, and says the cancel won.
    assert_eq!(r["cancel"]["status"], "cancelled", "{all}");
    assert_eq!(
        r["cancel"]["cancel"]["cancel_outcome"], "cancelled",
        "{all}"
    );
    assert_eq!(r["after_cancel"]["status"], "cancelled", "{all}");
    assert_eq!(lines(&dir.join("cancelled")), 1, "{all}");
    assert_eq!(r["cancel_result"]["cancelled"], true, "{all}");
    assert_eq!(r["cancel_result"]["exit_code"], 143, "{all}");
    assert!(
        !r["cancel_result"]["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("not-reached"),
        "{all}"
    );

    // A cancel after the end stopped nothing and says so; the task stays completed.
    let late = &r["late_cancel"];
    assert_eq!(late["status"], "completed", "{all}");
    assert_eq!(
        late["cancel"]["cancel_outcome"], "already_completed",
        "{all}"
    );
    assert!(
        r["unknown_task"].as_str().unwrap().contains("no task"),
        "{all}"
    );

    // Blocked by policy: input_required, with what a human must do.
    assert_eq!(r["blocked"]["status"], "input_required", "{all}");
    assert_eq!(r["blocked_result"]["verdict"], "blocked", "{all}");
    assert!(
        r["blocked"]["statusMessage"]
            .as_str()
            .unwrap()
            .contains("human"),
        "{all}"
    );

    let listed: Vec<&str> = r["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    for id in ["task-1@target1", "task-2@target1", "task-3@target1"] {
        assert!(listed.contains(&id), "{id} not listed: {all}");
    }
    let status = |id: &str| {
        r["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["taskId"] == id)
            .map(|t| t["status"].clone())
            .unwrap()
    };
    assert_eq!(status("task-2@target1"), "cancelled", "{all}");
    assert_eq!(status("task-3@target1"), "input_required", "{all}");
    // Without `task`, the plain tool call of today.
    assert_eq!(r["plain"]["verdict"], "completed", "{all}");
    assert_eq!(r["plain"]["stdout"], "plain\n", "{all}");
}

/// The tasks extension (protocol 2026-07-28) through rmcp's own task handlers. No
/// released client speaks it yet, so this test writes its messages by hand: the client
/// declares the extension per request, in `_meta`, as the extension allows.
#[test]
fn the_tasks_extension_gets_the_same_tasks_through_the_sdk() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let dir = fresh_dir(crate::test_name!());
    let mut cmd = env.opmark();
    cmd.arg("-F").arg(lab.ssh_config()).arg("mcp");
    let mut client = McpClient::start(cmd);
    let declared = serde_json::json!({"io.modelcontextprotocol/clientCapabilities":
        {"extensions": {"io.modelcontextprotocol/tasks": {}}}});
    let count = dir.join("ext");
    let command = format!("echo ran >> {}; sleep 3; echo ext", count.display());
    let created = client.request(
        "tools/call",
        serde_json::json!({"_meta": declared, "name": "run",
            "arguments": {"host": "target1", "op_id": "ext-1", "command": command}}),
    );
    let task = &created["result"];
    assert_eq!(task["taskId"], "ext-1@target1", "{created}");
    assert_eq!(task["status"], "working", "{created}");
    assert_eq!(task["pollIntervalMs"], 2000, "{created}");

    // Without the declaration, the same task on the 2025-11-25 wire (its field names).
    let older = client.request("tasks/get", serde_json::json!({"taskId": "ext-1@target1"}));
    assert_eq!(older["result"]["pollInterval"], 2000, "{older}");
    assert!(older["result"].get("pollIntervalMs").is_none(), "{older}");

    let get = |client: &mut McpClient, id: &str| {
        client.request(
            "tasks/get",
            serde_json::json!({"_meta": declared, "taskId": id}),
        )["result"]
            .clone()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let done = loop {
        let now = get(&mut client, "ext-1@target1");
        if now["status"] != "working" || std::time::Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["stdout"], "ext\n",
        "{done}"
    );
    assert_eq!(lines(&count), 1);

    // Cancel: an empty acknowledgement, the outcome in the next tasks/get.
    let created = client.request(
        "tools/call",
        serde_json::json!({"_meta": declared, "name": "run",
            "arguments": {"host": "target1", "op_id": "ext-2", "command": "sleep 30"}}),
    );
    assert_eq!(created["result"]["status"], "working", "{created}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let ack = client.request(
        "tasks/cancel",
        serde_json::json!({"_meta": declared, "taskId": "ext-2@target1"}),
    );
    assert!(ack["result"].is_object(), "{ack}");
    let after = get(&mut client, "ext-2@target1");
    assert_eq!(after["status"], "cancelled", "{after}");
    assert!(
        after["statusMessage"]
            .as_str()
            .unwrap()
            .contains("the command was stopped"),
        "{after}"
    );

    // Blocked: input_required, with no request a client could answer.
    let created = client.request(
        "tools/call",
        serde_json::json!({"_meta": declared, "name": "run",
            "arguments": {"host": "target1", "op_id": "ext-3", "command": "mkfs.ext4 /dev/nothing-here"}}),
    );
    assert!(created["result"]["taskId"].is_string(), "{created}");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let blocked = get(&mut client, "ext-3@target1");
    assert_eq!(blocked["status"], "input_required", "{blocked}");
    assert_eq!(blocked["inputRequests"], serde_json::json!({}), "{blocked}");
    client.close();
}
