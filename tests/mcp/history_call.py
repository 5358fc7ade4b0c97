"""One `run` of the fault-history checker's MCP agent (tests/it/history.rs), through
`opmark mcp` with the official MCP Python SDK: start the server, call the `run` tool
with the arguments given, print what it answered.

usage: history_call.py OPMARK SSH_CONFIG ARGUMENTS_JSON

Prints one JSON document on stdout: the tool's structured content (the run document,
or the error document of a refusal), else {"error": TEXT} with the text it answered,
with "_answered_at": the moment the answer came (seconds since the epoch), since the
server's shutdown after it takes a while of its own.
The server inherits this process's environment (the agent's ledger, key and keeper).
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters, stdio_client


async def main(opmark, ssh_config, arguments):
    server = StdioServerParameters(
        command=opmark,
        args=["-F", ssh_config, "mcp"],
        env=dict(os.environ),
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("run", json.loads(arguments))
            answered_at = time.time()
            doc = result.structured_content
            if doc is None:
                texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
                doc = {"error": " ".join(texts)}
            print(json.dumps({**doc, "_answered_at": answered_at}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
