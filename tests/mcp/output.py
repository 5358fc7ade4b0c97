"""Drives `opmark mcp` with the official MCP Python SDK: a command printing about 55 MB,
whose result must stay within the output budget, then the `output` tool reading exact
byte ranges of what the host kept. Run by tests/it/output.rs against a real sshd target.

usage: output.py OPMARK SSH_CONFIG DIR

Prints one JSON report on stdout; the Rust test asserts on it.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client


def result_doc(result):
    doc = dict(result.structured_content or {})
    doc["_is_error"] = bool(result.is_error)
    return doc


async def main(opmark, ssh_config, directory):
    server = StdioServerParameters(command=opmark, args=["-F", ssh_config, "mcp"], env=dict(os.environ))
    report = {}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            run = await session.call_tool(
                "run",
                {"host": "target1", "op_id": "big-1", "command": "seq 1 7000000", "wait": "120s"},
            )
            report["run"] = result_doc(run)
            # What a model would be handed: the text content, counted in bytes.
            report["result_text_bytes"] = sum(
                len(c.text.encode()) for c in run.content if getattr(c, "type", "") == "text"
            )
            report["range"] = result_doc(
                await session.call_tool(
                    "output",
                    {"op_id": "big-1", "host": "target1", "range": "4000000-4065536", "output_budget": 65536},
                )
            )
            report["long_range"] = result_doc(
                await session.call_tool("output", {"op_id": "big-1", "range": "0-8000000"})
            )
            report["grep"] = result_doc(
                await session.call_tool("output", {"op_id": "big-1", "grep": "^123456$"})
            )
            report["bad_range"] = result_doc(
                await session.call_tool("output", {"op_id": "big-1", "range": "9-3"})
            )
    # The long documents' text is not needed by the test.
    for key in ("range", "long_range"):
        report[key].pop("text", None)
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
