"""(Not named secrets.py: that would shadow the standard library module the SDK imports.)
Drives `opmark mcp --secret TOKEN=file:PATH` with the official MCP Python SDK: a run
naming the secret, whose command prints it; the `output` tool reading what the host kept;
and a run naming a secret the server does not offer. Run by tests/it/secrets.rs against a
real sshd target.

usage: secret_values.py OPMARK SSH_CONFIG SECRET_FILE

Prints one JSON report on stdout (every result whole, text content included); the Rust
test asserts on it, and that the value is nowhere in it.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client


def whole(result):
    return {
        "structured": result.structured_content,
        "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
        "is_error": bool(result.is_error),
    }


async def main(opmark, ssh_config, secret_file):
    server = StdioServerParameters(
        command=opmark,
        args=["-F", ssh_config, "mcp", "--secret", "TOKEN=file:" + secret_file],
        env=dict(os.environ),
    )
    report = {}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            run_tool = next(t for t in tools.tools if t.name == "run")
            report["run_schema_secrets"] = run_tool.input_schema["properties"].get("secrets")
            report["run"] = whole(
                await session.call_tool(
                    "run",
                    {
                        "host": "target1",
                        "op_id": "py-sec-1",
                        "command": 'echo "t=$TOKEN"; printf %s "$TOKEN" | base64',
                        "secrets": ["TOKEN"],
                    },
                )
            )
            report["output"] = whole(
                await session.call_tool("output", {"op_id": "py-sec-1", "host": "target1"})
            )
            report["unknown"] = whole(
                await session.call_tool(
                    "run",
                    {
                        "host": "target1",
                        "op_id": "py-sec-2",
                        "command": 'echo "$OTHER"',
                        "secrets": ["OTHER"],
                    },
                )
            )
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
