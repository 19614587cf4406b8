"""`isolation: per_session` behind the bridge: every session its own process, from its first request;
never one process for two callers; and a process that is gone is never gone in silence.

A real bridge process runs a stateful FastMCP server (tests/support/counter_server.py: a counter per
process) with one process per session. Clients of the bridge speak raw JSON-RPC as the router does
(initialize, then at once notifications/initialized and the call); clients of the router (an
indexer in the test's loop and a router process in front of the bridge) are the SDK's, in either
protocol era, or raw handshake-era ones.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.bridges import Bridge, mcp_client, poll_until, running_bridge
from tests.support.clients import RawClient
from tests.support.routers import light_stack
from tests.support.stack import HEADERS, INITIALIZE
from tests.support.waits import wait_for

COUNTER_SERVER = Path(__file__).resolve().parents[1] / "support" / "counter_server.py"
BURST = 4


def counter(**backend: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(COUNTER_SERVER)], **backend}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    backends = [
        counter(id="counter", isolation="per_session", max_processes=BURST, idle_timeout=120),
        counter(id="brief", isolation="per_session", max_processes=2, idle_timeout=2),
    ]
    with running_bridge(tmp_path_factory.mktemp("bridge"), backends) as running:
        yield running


def answer_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a response: its JSON body, or the message of its SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        found: dict[str, Any] = json.loads(next(d for d in data if d))
        return found
    body: dict[str, Any] = response.json()
    return body


class Session:
    """One client session at the bridge, opened and used the way the router does."""

    def __init__(
        self, http: httpx2.AsyncClient, url: str, capabilities: dict[str, Any] | None = None
    ) -> None:
        self.http = http
        self.url = url
        self.headers = dict(HEADERS)
        self.initialize = INITIALIZE
        if capabilities is not None:  # the client's, as it declares them at initialize
            self.initialize = {**INITIALIZE, "params": {**INITIALIZE["params"], "capabilities": capabilities}}

    async def open(self, eager: httpx2.AsyncClient) -> None:
        """initialize; notifications/initialized goes on another connection (`eager`) as soon as the
        answer's headers name the session, before its body is read: the session must exist by then."""
        async with self.http.stream("POST", self.url, json=self.initialize, headers=self.headers) as opened:
            assert opened.status_code == 200
            self.headers |= {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            notified = await eager.post(self.url, json=initialized, headers=self.headers)
            assert notified.status_code == 202, notified.text
            await opened.aread()
        self.headers["MCP-Protocol-Version"] = answer_of(opened)["result"]["protocolVersion"]

    async def increment(self) -> dict[str, Any]:
        return await self.call("increment")

    async def call(self, tool: str) -> dict[str, Any]:
        """Call `tool`, which answers JSON: what it answered."""
        message = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool}}
        response = await self.http.post(self.url, json=message, headers=self.headers)
        assert response.status_code == 200, response.text
        result = answer_of(response)["result"]
        assert not result.get("isError"), result
        answered: dict[str, Any] = json.loads(result["content"][0]["text"])
        return answered

    async def end(self) -> None:
        response = await self.http.delete(self.url, headers=self.headers)
        assert response.status_code == 200, response.text


async def first_call(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    session = Session(http, url)
    async with httpx2.AsyncClient(timeout=60) as eager:
        await session.open(eager)
    try:
        return await session.increment()
    finally:
        await session.end()


def no_processes_left(bridge: Bridge, backend: str = "counter") -> None:
    poll_until(lambda: not bridge.health()[backend]["pids"], 20, "the ended sessions' processes stopped")


def count_of(result: dict[str, Any]) -> dict[str, Any]:
    """The counter's answer in a call_tool result (its first block: the backend's own)."""
    assert not result.get("isError"), result
    found: dict[str, Any] = json.loads(result["content"][0]["text"])
    return found


async def test_ten_sessions_in_a_row_each_get_their_own_process_from_their_first_call(bridge: Bridge) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        counts = [await first_call(http, bridge.mcp_url("counter")) for _ in range(10)]
    assert [c["count"] for c in counts] == [1] * 10
    assert len({c["pid"] for c in counts}) == 10
    no_processes_left(bridge)


async def test_a_sessions_process_is_offered_only_the_capabilities_its_client_declared(
    bridge: Bridge,
) -> None:
    """A per_session process has one client, so it asks only what that client can answer (a shared
    process, whose callers come and go, is offered all three)."""
    declared_by_each = ({}, {"sampling": {}}, {"elicitation": {}, "roots": {"listChanged": True}})
    async with httpx2.AsyncClient(timeout=60) as http, httpx2.AsyncClient(timeout=60) as eager:
        for declared in declared_by_each:
            session = Session(http, bridge.mcp_url("counter"), declared)
            await session.open(eager)
            try:
                offered = await session.call("offered")
            finally:
                await session.end()
            assert set(offered) == set(declared), (declared, offered)
    no_processes_left(bridge)


async def test_a_burst_of_sessions_as_large_as_the_pool_all_answer_their_first_call(bridge: Bridge) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        for _ in range(3):
            url = bridge.mcp_url("counter")
            counts = await asyncio.gather(*(first_call(http, url) for _ in range(BURST)))
            assert [c["count"] for c in counts] == [1] * BURST
            assert len({c["pid"] for c in counts}) == BURST
            no_processes_left(bridge)  # so the next burst finds the pool empty, not full


async def test_two_anonymous_2026_07_28_clients_never_share_a_process(bridge: Bridge, tmp_path: Path) -> None:
    backends = [{"id": "counter", "url": bridge.mcp_url("counter")}]
    async with light_stack(tmp_path, backends=backends) as stack:
        no_processes_left(bridge)  # the indexer's listing ended its own
        counts, notes = [], []
        async with mcp_client(stack.mcp_url) as one, mcp_client(stack.mcp_url) as two:
            for client in (one, two, one, two):
                result = await client.call_tool("call_tool", {"tool_name": "increment", "parameters": {}})
                assert not result.is_error, result
                counts.append(json.loads(result.content[0].text))
                assert result.meta is not None
                notes.append(result.meta["toolsearch/backendSession"])
        assert [c["count"] for c in counts] == [1, 1, 1, 1]  # nobody counts on another's counter
        assert len({c["pid"] for c in counts}) == 4
        assert all(note["kept"] is False for note in notes), notes  # and each result says so
        no_processes_left(bridge)


async def test_a_reaped_process_is_replaced_and_the_next_call_says_its_state_is_gone(
    bridge: Bridge, tmp_path: Path
) -> None:
    backends = [{"id": "brief", "url": bridge.mcp_url("brief")}]
    async with light_stack(tmp_path, backends=backends) as stack, httpx2.AsyncClient(timeout=60) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        first = await client.call(stack.mcp_url, "increment", {})
        second = await client.call(stack.mcp_url, "increment", {})
        assert [count_of(first)["count"], count_of(second)["count"]] == [1, 2]  # one process, kept
        assert "_meta" not in second and len(second["content"]) == 1, second
        no_processes_left(bridge, "brief")  # idle for its 2 s: reaped, and its session with it
        again = await client.call(stack.mcp_url, "increment", {})
        assert count_of(again)["count"] == 1
        assert count_of(again)["pid"] != count_of(first)["pid"]
        note = again["content"][-1]["text"]
        assert note.startswith("[toolsearch] backend brief forgot its session") and "is gone" in note, note
        assert again["_meta"]["toolsearch/backendSession"] == {
            "backend": "brief",
            "replaced": True,
            "reason": "forgot its session (HTTP 404)",
        }
        await client.end(stack.mcp_url)
        no_processes_left(bridge, "brief")  # the client session's end ended its backend session


async def test_health_probes_of_a_per_session_backend_start_no_process(
    bridge: Bridge, tmp_path: Path
) -> None:
    backends = [{"id": "counter", "url": bridge.mcp_url("counter")}]
    before = bridge.health()["counter"]
    health = {"enabled": True, "interval": 0.2, "timeout": 10}
    async with light_stack(tmp_path, backends=backends, indexer={"health": health}) as stack:
        monitor = stack.indexer.monitor
        assert monitor is not None
        await wait_for(lambda: monitor.probes >= 10, within=60)
        state = stack.indexer.registry.states["counter"]
        assert state.status == "healthy" and state.listing is not None
        assert sorted(tool["name"] for tool in state.listing.tools) == ["ask", "increment", "offered"]
    after = bridge.health()["counter"]
    # the probes' listings were the lister's: one process all along, none started for them
    assert after["starts"] == before["starts"]
    assert after["lister"]["starts"] == 1 and after["lister"]["state"] == "ready"
    assert after["pids"] == []
