"""Drives `opmark mcp` with the official MCP Python SDK (`mcp` from PyPI), a client
this project did not write. Run by tests/it/mcp.rs against a real sshd lab target.

usage: client.py OPMARK SSH_CONFIG COUNT_FILE
       client.py --lost OPMARK SSH_CONFIG DIR   (the test cuts the link mid-run, then
       creates DIR/restored once it is back; the same op id is run again after that)

Prints one JSON report on stdout: what the server answered at each step. The Rust test
asserts on it; this script only fails on protocol errors.
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client


def result_doc(result):
    """The tool result's structured content (the opmark/2 document), with is_error."""
    doc = dict(result.structured_content or {})
    doc["_is_error"] = bool(result.is_error)
    # The text content must carry the same document, for clients that read only text.
    texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
    doc["_text_matches"] = bool(texts) and json.loads(texts[0]) == result.structured_content
    return doc


async def main(opmark, ssh_config, count_file):
    server = StdioServerParameters(
        command=opmark,
        args=["-F", ssh_config, "mcp", "--max-output", "1k"],
        env=dict(os.environ),
    )
    report = {}
    progress = []

    async def on_progress(done, total, message):
        progress.append(message)

    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            report["server_name"] = init.server_info.name
            tools = (await session.list_tools()).tools
            report["tools"] = {
                t.name: {
                    "annotations": t.annotations.model_dump() if t.annotations else None,
                    "required": (t.input_schema or {}).get("required", []),
                    "properties": sorted((t.input_schema or {}).get("properties", {})),
                    "input_schema": t.input_schema,
                    "has_output_schema": bool(t.output_schema),
                }
                for t in tools
            }
            command = f"echo ran >> {count_file}; head -c 3000 /dev/zero | tr '\\0' x; echo; sleep 3"
            run = {"host": "target1", "op_id": "mcp-1", "command": command}
            report["first"] = result_doc(
                await session.call_tool("run", run, progress_callback=on_progress)
            )
            report["second"] = result_doc(await session.call_tool("run", run))
            report["progress"] = progress
            report["blocked"] = result_doc(
                await session.call_tool(
                    "run",
                    {"host": "target1", "op_id": "mcp-2", "command": "mkfs.ext4 /dev/nothing-here"},
                )
            )
            report["blocked_again"] = result_doc(
                await session.call_tool(
                    "run",
                    {"host": "target1", "op_id": "mcp-2", "command": "mkfs.ext4 /dev/nothing-here"},
                )
            )
            report["stranger"] = result_doc(
                await session.call_tool(
                    "run", {"host": "stranger", "op_id": "mcp-3", "command": "true"}
                )
            )
            report["bad_op"] = result_doc(
                await session.call_tool(
                    "run", {"host": "target1", "op_id": "no spaces", "command": "true"}
                )
            )
            report["probe"] = result_doc(
                await session.call_tool("probe", {"host": "target1", "op_id": "mcp-1"})
            )
            report["show"] = result_doc(await session.call_tool("show", {"op_id": "mcp-1"}))
            report["show_unknown"] = result_doc(
                await session.call_tool("show", {"op_id": "never-ran"})
            )
            report["list"] = result_doc(
                await session.call_tool("list", {"unresolved": False, "host": "target1"})
            )
            report["list_limited"] = result_doc(
                await session.call_tool("list", {"unresolved": False, "limit": 1})
            )
            # Refused before anything: an argument the tool does not have, a missing one.
            report["unknown_argument"] = result_doc(
                await session.call_tool(
                    "run",
                    {"host": "target1", "op_id": "mcp-4", "command": "true", "approve": "yes"},
                )
            )
            report["missing_op_id"] = result_doc(
                await session.call_tool("run", {"host": "target1", "command": "true"})
            )
            # The wait budget: the command waits for a gate this client opens only after
            # the answer, so an answer can only come from the budget. The read timeout is
            # a watchdog (a server that blocks for the whole command fails here, not hangs).
            workdir = os.path.dirname(count_file)
            gate = os.path.join(workdir, "gate")
            gated = (
                f"echo go >> {workdir}/gated; while [ ! -e {gate} ]; do sleep 0.1; done; echo through"
            )
            started = time.monotonic()
            try:
                report["waited"] = result_doc(
                    await session.call_tool(
                        "run",
                        {"host": "target1", "op_id": "mcp-5", "command": gated, "wait": "2s"},
                        read_timeout_seconds=30,
                    )
                )
            except Exception as e:  # the watchdog fired: the budget did not bound the call
                report["waited"] = {"_exception": repr(e)}
            report["waited_seconds"] = time.monotonic() - started
            report["gate_open_at_answer"] = os.path.exists(gate)
            open(gate, "w").close()
            report["after_gate"] = result_doc(
                await session.call_tool(
                    "run",
                    {"host": "target1", "op_id": "mcp-5", "command": gated, "wait": "30s"},
                )
            )
            report["detached"] = result_doc(
                await session.call_tool(
                    "run",
                    {"host": "target1", "op_id": "mcp-6", "command": "sleep 2; echo later", "detach": True},
                )
            )
            report["after_detach"] = result_doc(
                await session.call_tool(
                    "run",
                    {"host": "target1", "op_id": "mcp-6", "command": "sleep 2; echo later"},
                )
            )
            report["reconcile"] = result_doc(await session.call_tool("reconcile", {}))
            report["cancel"] = result_doc(
                await session.call_tool("cancel", {"host": "target1", "op_id": "mcp-1"})
            )
    print(json.dumps(report))


async def lost(opmark, ssh_config, directory):
    server = StdioServerParameters(command=opmark, args=["-F", ssh_config, "mcp"], env=dict(os.environ))
    # The budget outlasts the loss's detection (keepalives, about 2 s after the cut), so
    # the answer is the probes' (the link is cut), not the budget's.
    run = {"host": "target1", "op_id": "lost-1", "command": "sleep 2; exit 4", "wait": "8s"}
    report = {}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            report["during_cut"] = result_doc(await session.call_tool("run", run))
            restored = os.path.join(directory, "restored")
            while not os.path.exists(restored):
                await asyncio.sleep(0.1)
            report["after_restore"] = result_doc(await session.call_tool("run", run))
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "--lost":
        asyncio.run(lost(*sys.argv[2:5]))
    else:
        asyncio.run(main(*sys.argv[1:4]))
