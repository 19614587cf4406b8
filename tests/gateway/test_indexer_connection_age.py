"""indexer.connection_max_age: routers reconnect now and then (and so resolve dns:/// again), losing no call.

A router that keeps one connection to the indexer for ever never learns of replicas an autoscaler
adds behind the headless Service's name. The indexer asks each connection to go away after
`connection_max_age`; the router opens a new one, which is when gRPC resolves the name again. Here
the age is half a second: the router's connections to the indexer are seen to change while a
client calls without pause, and every call is answered. The stack is served from the test's process
(tests/support/in_process.py), so the router's connections are this process's own.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx2
import psutil

from tests.support.in_process import in_process_stack
from tests.support.stack import HEADERS, open_session

CALLS_FOR = 4.0  # seconds of calls at least: several connection lifetimes of 0.5 s
WITHIN = 60.0  # seconds the calls may go on for, on a busy machine, until a second connection is seen


def router_ports_to(indexer_port: int) -> set[int]:
    """The local ports of the router's established connections to the indexer's port: the only
    connections to it this process opens as a client."""
    connections = psutil.Process().net_connections(kind="tcp")
    return {
        c.laddr.port
        for c in connections
        if c.raddr and c.raddr.port == indexer_port and c.status == psutil.CONN_ESTABLISHED
    }


def test_routers_reconnect_after_the_connection_age_and_every_call_is_answered(tmp_path: Path) -> None:
    with in_process_stack(tmp_path, extra={"indexer": {"connection_max_age": 0.5}}) as stack:
        indexer_port = int(stack.indexer_address.rpartition(":")[2])
        session = open_session(stack.mcp_url)
        headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        find = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "find_tool", "arguments": {"tool_description": "weather", "limit": 1}},
        }
        seen: set[int] = set()
        statuses = []
        started = time.monotonic()

        def calling() -> bool:  # for CALLS_FOR, and on (within a bound) until a second connection shows
            spent = time.monotonic() - started
            return spent < CALLS_FOR or (len(seen) < 2 and spent < WITHIN)

        with httpx2.Client(timeout=30) as http:
            while calling():
                statuses.append(http.post(stack.mcp_url, json=find, headers=headers).status_code)
                seen |= router_ports_to(indexer_port)
        assert statuses and set(statuses) == {200}, statuses
        assert len(seen) >= 2, f"the router kept one connection for {WITHIN:g}s: {seen}"
