"""MCP tasks of `opmark mcp` driven by the official MCP Python SDK's task client
(`mcp.client.experimental.tasks`, the 2025-11-25 tasks wire; the SDK dropped it in 2.0,
so tests/it/tasks.rs runs this with the pinned 1.x of scripts/install-deps.sh).

usage: tasks.py OPMARK SSH_CONFIG DIR

The commands append a line to files in DIR (loopback targets share this filesystem), so
the Rust test counts executions. Prints one JSON report; fails only on protocol errors.
"""

import asyncio
import json
import os
import signal
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult


def task_doc(task):
    return json.loads(task.model_dump_json(exclude_none=True))


def result_doc(result):
    doc = dict(result.structuredContent or {})
    doc["_is_error"] = bool(result.isError)
    return doc


def server(opmark, ssh_config, pidfile):
    # The shell records the server's pid (exec keeps it), so the test can kill it.
    return StdioServerParameters(
        command="/bin/sh",
        args=["-c", f'echo $$ > {pidfile}; exec "$0" -F "$1" mcp', opmark, ssh_config],
        env=dict(os.environ),
    )


async def poll_until(session, task_id, done, limit=90):
    seen = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        task = await session.experimental.get_task(task_id)
        if not seen or seen[-1] != task.status:
            seen.append(task.status)
        if done(task.status):
            return task, seen
        await asyncio.sleep((task.pollInterval or 1000) / 1000)
    return task, seen


async def main(opmark, ssh_config, directory):
    report = {"transcript": []}
    note = report["transcript"].append
    pidfile = os.path.join(directory, "server.pid")
    long_cmd = f"echo ran >> {directory}/long; sleep 20; echo finished"
    run = {"host": "target1", "op_id": "task-1", "command": long_cmd}

    # First server: start the 20 s task, see it working, then kill the server mid-task.
    try:
        async with stdio_client(server(opmark, ssh_config, pidfile)) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                report["capabilities"] = json.loads(init.capabilities.model_dump_json())
                started = time.monotonic()
                created = await session.experimental.call_tool_as_task("run", run)
                report["created_seconds"] = time.monotonic() - started
                report["created"] = task_doc(created.task)
                note({"call": "tools/call run (task)", "answer": report["created"]})
                # A short one whose command the ledger keeps redacted (a password in it).
                secret = await session.experimental.call_tool_as_task(
                    "run",
                    {"host": "target1", "op_id": "task-5",
                     "command": f"echo ran >> {directory}/secret; echo password=CanaryT1 >/dev/null"},
                )
                report["secret_done"] = task_doc(
                    (await poll_until(session, secret.task.taskId, lambda s: s != "working", 20))[0]
                )
                got = await session.experimental.get_task(created.task.taskId)
                report["first_get"] = task_doc(got)
                note({"call": "tasks/get", "answer": report["first_get"]})
                with open(pidfile) as f:
                    os.kill(int(f.read().strip()), signal.SIGKILL)
                note({"event": "server killed (SIGKILL)"})
                await asyncio.sleep(0.5)
    except BaseException as e:  # the killed server takes the session down with it
        report["kill_ended_session"] = type(e).__name__

    task_id = report["created"]["taskId"]
    # Second server, a new process: the same task id answers from the ledger and marker.
    async with stdio_client(server(opmark, ssh_config, pidfile)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            got = await session.experimental.get_task("task-5@target1")
            report["secret_new_server"] = task_doc(got)
            result = await session.experimental.get_task_result("task-5@target1", CallToolResult)
            report["secret_result"] = result_doc(result)
            got = await session.experimental.get_task(task_id)
            report["new_server_get"] = task_doc(got)
            note({"call": "tasks/get (new server)", "answer": report["new_server_get"]})
            final, seen = await poll_until(session, task_id, lambda s: s != "working")
            report["new_server_statuses"] = seen
            report["new_server_final"] = task_doc(final)
            note({"call": "tasks/get (polled)", "answer": report["new_server_final"]})
            result = await session.experimental.get_task_result(task_id, CallToolResult)
            report["result"] = result_doc(result)
            note({"call": "tasks/result", "answer": {k: report["result"].get(k) for k in ("verdict", "exit_code", "stdout", "reason_code")}})

            # Cancel a running command through its task.
            cancel_cmd = f"echo ran >> {directory}/cancelled; sleep 30; echo not-reached"
            created = await session.experimental.call_tool_as_task(
                "run", {"host": "target1", "op_id": "task-2", "command": cancel_cmd}
            )
            report["cancel_created"] = task_doc(created.task)
            working, _ = await poll_until(
                session, created.task.taskId, lambda s: s == "working", limit=10
            )
            await asyncio.sleep(2)
            cancelled = await session.experimental.cancel_task(created.task.taskId)
            report["cancel"] = task_doc(cancelled)
            note({"call": "tasks/cancel", "answer": report["cancel"]})
            after, _ = await poll_until(
                session, created.task.taskId, lambda s: s != "working", limit=30
            )
            report["after_cancel"] = task_doc(after)
            result = await session.experimental.get_task_result(
                created.task.taskId, CallToolResult
            )
            report["cancel_result"] = result_doc(result)

            # A run policy holds for a human is input_required, with what to decide.
            created = await session.experimental.call_tool_as_task(
                "run",
                {"host": "target1", "op_id": "task-3", "command": "mkfs.ext4 /dev/nothing-here"},
            )
            blocked, _ = await poll_until(
                session, created.task.taskId, lambda s: s != "working", limit=30
            )
            report["blocked"] = task_doc(blocked)
            note({"call": "tasks/get (blocked run)", "answer": report["blocked"]})
            result = await session.experimental.get_task_result(
                created.task.taskId, CallToolResult
            )
            report["blocked_result"] = result_doc(result)

            # A cancel that comes after the command ended says it lost the race.
            late = await session.experimental.cancel_task(task_id)
            report["late_cancel"] = task_doc(late)
            note({"call": "tasks/cancel (after the end)", "answer": report["late_cancel"]})
            try:
                await session.experimental.get_task("never-ran@target1")
                report["unknown_task"] = "answered"
            except Exception as e:
                report["unknown_task"] = str(e)

            listed = await session.experimental.list_tasks()
            report["list"] = [task_doc(t) for t in listed.tasks]
            note({"call": "tasks/list", "answer": [{"taskId": t.taskId, "status": t.status} for t in listed.tasks]})

            # A client that does not ask for a task gets today's tool call.
            plain = await session.call_tool(
                "run", {"host": "target1", "op_id": "task-4", "command": "echo plain", "wait": "5s"}
            )
            report["plain"] = result_doc(plain)
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
