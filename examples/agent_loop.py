#!/usr/bin/env python3
"""An agent's loop around `opmark run`: copy it into your framework's tool layer.

usage: agent_loop.py HOST OP_ID -- COMMAND...
       OP_ID "-" recovers the op id of the newest operation of the same command on
       HOST from the ledger (after a crash lost it), else mints a new one.

The rules it follows (README "Agents"):
  * one op id per intended effect, kept across every retry of that effect;
  * branch on `verdict` + `retryable` from the one JSON line, never on prose;
  * retryable=true: the same op id again, later (opmark probes before any rerun, so
    this never runs the command twice);
  * anything else that is not completed/replayed goes to a human, with the op id.

Exit status: the command's own when it ran (completed or replayed); 3 when a human
must act (blocked, indeterminate, conflict...); 4 when retries ran out; 2 on bad use.
"""

import json
import os
import subprocess
import sys
import time
import uuid

OPMARK = os.environ.get("OPMARK", "opmark")
MAX_TRIES = int(os.environ.get("AGENT_MAX_TRIES", "5"))


def opmark(*args):
    """One opmark call: its JSON document (a result or an error) and its exit status."""
    out = subprocess.run(
        [OPMARK, "--json", "-q", *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    return json.loads(out.stdout.decode().splitlines()[-1]), out.returncode


def recover_op_id(host, command):
    """The op id of the newest operation of `command` on `host`, if the ledger has one."""
    doc, _ = opmark("list", "--host", host)
    for op in doc.get("operations", []):  # newest first
        if op.get("display") == command:
            return op["op_id"]
    return None


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    host, op_id, command = argv[0], argv[1], " ".join(argv[3:])
    if op_id == "-":
        op_id = recover_op_id(host, command) or f"agent-{uuid.uuid4().hex[:16]}"
    print(f"agent: op {op_id}", file=sys.stderr)
    for attempt in range(1, MAX_TRIES + 1):
        doc, status = opmark("run", host, "--op", op_id, "--", command)
        if "error" in doc:
            err = doc["error"]
            if not err["retryable"]:
                print(f"agent: error {err['reason_code']}: {err['message']}", file=sys.stderr)
                return 3
        elif doc["verdict"] in ("completed", "replayed"):
            sys.stdout.write(doc["stdout"])
            sys.stderr.write(doc["stderr"])
            print(f"agent: {doc['verdict']} exit {doc['exit_code']}", file=sys.stderr)
            return status
        elif not doc["retryable"]:
            # blocked, conflict, refused, indeterminate that needs a decision, ...
            print(
                f"agent: {doc['verdict']} ({doc['reason_code']}): a human decides; "
                f"`opmark show {op_id}` has the timeline. {doc['reason']}",
                file=sys.stderr,
            )
            return 3
        code = doc["error"]["reason_code"] if "error" in doc else doc["reason_code"]
        delay = min(2 ** attempt, 60)
        print(f"agent: {code}, retrying op {op_id} in {delay}s", file=sys.stderr)
        time.sleep(delay)
    print(f"agent: still not done after {MAX_TRIES} tries; op {op_id}", file=sys.stderr)
    return 4


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
