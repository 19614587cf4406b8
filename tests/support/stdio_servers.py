"""Small stdio MCP servers that behave well or badly on purpose, for the bridge's tests.

    python tests/support/stdio_servers.py KIND

- `echo`: a correct server with a tool `echo`, answering its arguments as text (and its pid), a
  tool `wait` that never answers, and a tool `cancelled` listing the requests cancelled so far;
- `patient`: `echo`, listing `wait` and `cancelled` too, so that they can be found and called;
- `banner`: prints a line that is not JSON-RPC to stdout first, then behaves as `echo`;
- `flood`: `echo`, writing FLOOD_LINES lines to stderr as fast as it can meanwhile;
- `noise`: writes only lines that are not JSON-RPC to stdout, and never answers;
- `silent`: reads its stdin and never answers;
- `exit`: says why on stderr and exits with code 3 at once.

It imports nothing of the project (and nothing slow), so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

FLOOD_LINES = 50_000
CANCELLED: list[object] = []  # ids of the requests a notifications/cancelled named
LISTED = ["echo"]  # the tools tools/list names


def _send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _answer(request: dict[str, object]) -> dict[str, object] | None:
    method, params = request.get("method"), request.get("params") or {}
    assert isinstance(params, dict)
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "test-echo", "version": "1.0"},
            "instructions": "echoes what it is given",
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        described = {
            "echo": "Echo the text back",
            "wait": "Wait for ever: never answers",
            "cancelled": "The ids of the requests cancelled so far",
        }
        return {"tools": [{"name": n, "description": described[n], "inputSchema": schema} for n in LISTED]}
    if method == "tools/call" and params.get("name") == "cancelled":
        return {"content": [{"type": "text", "text": json.dumps(CANCELLED)}]}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        text = json.dumps({"arguments": arguments, "pid": os.getpid()})
        return {"content": [{"type": "text", "text": text}]}
    return None


def echo() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("method") == "notifications/cancelled":
            CANCELLED.append(request["params"]["requestId"])
        if "id" not in request or "method" not in request:
            continue  # a notification, or an answer
        if request["method"] == "tools/call" and request["params"].get("name") == "wait":
            continue  # answered never: the caller gives up and cancels it
        result = _answer(request)
        if result is None:
            error = {"code": -32601, "message": "Method not found"}
            _send({"jsonrpc": "2.0", "id": request["id"], "error": error})
        else:
            _send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def flood() -> None:
    def write() -> None:
        for n in range(FLOOD_LINES):
            sys.stderr.write(f"flood line {n}\n")
        sys.stderr.flush()

    threading.Thread(target=write, daemon=True).start()
    echo()


def main(kind: str) -> None:
    if kind == "patient":
        LISTED.extend(["wait", "cancelled"])
        echo()
    elif kind == "echo":
        echo()
    elif kind == "banner":
        print("server starting up (a banner on stdout)", flush=True)
        echo()
    elif kind == "flood":
        flood()
    elif kind == "noise":
        for n in range(3):
            print(f"hello from a server that forgot stdout is for messages ({n})", flush=True)
        for _ in sys.stdin:
            print("still not JSON", flush=True)
    elif kind == "silent":
        for _ in sys.stdin:
            time.sleep(0)
    elif kind == "exit":
        print("fatal: no configuration found", file=sys.stderr, flush=True)
        sys.exit(3)
    else:
        sys.exit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1])
