//! MCP tasks of `opmark mcp`: a task-augmented `run` is the operation, so its task
//! survives the server. Driven by the official Python SDK's task client (tests/mcp/tasks.py)
//! against a real sshd lab target.

use std::path::PathBuf;
use std::process::Command;

use crate::support::mcp::python_client;
use crate::support::{fresh_dir, skip_or_fail, Sealed};

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

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
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
