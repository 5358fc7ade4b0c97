"""A held run over MCP, driven by the official MCP Python SDK (`mcp` from PyPI): the
agent's side of docs/trust.md#the-approval-flow. Run by tests/it/approvals.rs against a
real sshd lab target, under a policy whose `approvers` names one key.

usage: approval.py OPMARK SSH_CONFIG POLICY SELF_SERVICE_POLICY APPROVER_KEY STRANGER_KEY
                   DIR COMMAND

The human's steps (`opmark approve`, with a key the agent does not hold) are played by
this script between tool calls, as subprocesses; the agent's steps are tool calls only.
Prints one JSON report on stdout; the Rust test asserts on it.
"""

import asyncio
import json
import os
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client

OP = "held-mcp"


def doc_of(result):
    doc = dict(result.structured_content or {})
    doc["_is_error"] = bool(result.is_error)
    return doc


def approve(opmark, ssh_config, policy, key, intent, out):
    """`opmark approve` as a human runs it: the token's text, or the failure."""
    made = subprocess.run(
        [opmark, "-F", ssh_config, "--policy", policy, "approve", OP, "target1",
         "--intent", intent, "--note", "checked the rollback plan", "-i", key, "-o", out],
        capture_output=True, text=True, check=False,
    )
    if made.returncode != 0:
        raise SystemExit(f"opmark approve failed: {made.stderr}")
    with open(out, encoding="utf-8") as f:
        return f.read()


async def main(opmark, ssh_config, policy, self_service, approver, stranger, workdir, command):
    server = StdioServerParameters(
        command=opmark,
        args=["-F", ssh_config, "--policy", policy, "mcp"],
        env=dict(os.environ),
    )
    report = {}
    run = {"host": "target1", "op_id": OP, "command": command}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            first = doc_of(await session.call_tool("run", run))
            report["first"] = first
            needed = first.get("approval_needed") or {}
            approve_command = needed.get("approve_command") or ""
            intent = approve_command.split("--intent ")[1].split(" ")[0]
            # What an agent can pass without a human: a note, a token of its own key.
            report["self_approved"] = doc_of(
                await session.call_tool("run", dict(run, approve="trust me"))
            )
            forged = approve(opmark, ssh_config, self_service, stranger, intent,
                             os.path.join(workdir, "stranger.tok"))
            report["stranger"] = doc_of(await session.call_tool("run", dict(run, approval=forged)))
            report["garbage"] = doc_of(
                await session.call_tool("run", dict(run, approval="not a token"))
            )
            # The command appends to DIR/effect.log on the (loopback) host.
            report["ran_before_approval"] = os.path.exists(os.path.join(workdir, "effect.log"))
            # The human signs; the agent presents the token it was handed.
            good = approve(opmark, ssh_config, policy, approver, intent,
                           os.path.join(workdir, "good.tok"))
            report["approved"] = doc_of(await session.call_tool("run", dict(run, approval=good)))
            report["again"] = doc_of(await session.call_tool("run", dict(run, approval=good)))
            report["other_op"] = doc_of(
                await session.call_tool("run", dict(run, op_id="held-mcp-2", approval=good))
            )
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:9]))
