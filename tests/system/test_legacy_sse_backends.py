"""Legacy HTTP+SSE servers keep their sessions: the bridge holds one event stream per session.

Real processes on loopback: a counter server made with the SDK's `MCPServer` speaking the 2024-11-05
SSE transport, one counter per session (tests/support/counter_server.py), behind a bridge; and, for
the whole path, an indexer and a router that reach it at the bridge like any backend.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from commands.ports import free_port
from commands.up import listen_addresses
from tests.support.bridges import Bridge, mcp_client, poll_until, running_bridge
from tests.support.clients import RawClient
from tests.support.processes import Proc, port_accepts, start_process
from tests.support.routers import LightStack, light_stack
from toolsearch.config import parse_config

COUNTER = Path(__file__).parents[1] / "support" / "counter_server.py"
KEY = "a-key-for-the-counter"
CLIENT = {"name": "test", "version": "1"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": CLIENT},
}
SAMPLED = {"role": "assistant", "content": {"type": "text", "text": "a haiku"}, "model": "the client's"}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def counter_server(key: str = "") -> tuple[Proc, str]:
    """The counter over SSE (asking for `X-Api-Key: key` when given); its process and endpoint."""
    port = free_port()
    args = [sys.executable, str(COUNTER), "sse", str(port)]
    proc = start_process(args, None, env={"COUNTER_KEY": key} if key else None)
    poll_until(lambda: port_accepts(port) or proc.returncode is not None, 30, "the counter listening")
    return proc, f"http://127.0.0.1:{port}/sse"


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Bridge, Proc]]:
    """A bridge holding the counter's sessions (backend `counter`), and the counter's process."""
    proc, url = counter_server()
    try:
        backend = {"id": "counter", "url": url, "transport": "sse", "timeout": 10}
        with running_bridge(tmp_path_factory.mktemp("legacy"), [backend]) as bridge:
            yield bridge, proc
    finally:
        proc.stop()


@pytest.fixture
async def stack(counter: tuple[Bridge, Proc], tmp_path: Path) -> AsyncIterator[LightStack]:
    """An indexer and a router whose backend `counter` is the bridge's."""
    bridge, _ = counter
    async with light_stack(tmp_path, backends=[{"id": "counter", "url": bridge.mcp_url("counter")}]) as stack:
        yield stack


def count(result: dict[str, Any]) -> int:
    return int(json.loads(result["content"][0]["text"])["count"])


async def test_each_client_session_keeps_its_own_legacy_session_through_the_router(stack: LightStack) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        first, second = RawClient(http), RawClient(http)
        await first.initialize(stack.mcp_url)
        await second.initialize(stack.mcp_url)
        counts = [count(await first.call(stack.mcp_url, "increment", {})) for _ in range(3)]
        other = count(await second.call(stack.mcp_url, "increment", {}))
        again = count(await first.call(stack.mcp_url, "increment", {}))
    assert counts == [1, 2, 3]  # one session at the server, kept from call to call
    assert other == 1  # another client session, another legacy session
    assert again == 4


async def test_a_legacy_servers_request_of_its_client_reaches_the_client_through_the_router(
    stack: LightStack,
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url, {"sampling": {}})
        async with asyncio.timeout(20):
            result, asked = await client.call_answering(
                stack.mcp_url, "ask", {}, stack.mcp_url, lambda _: SAMPLED
            )
    assert [r["method"] for r in asked] == ["sampling/createMessage"]
    assert asked[0]["params"]["messages"][0]["content"]["text"] == "hello?"  # as the server asked it
    assert result["content"][0]["text"] == "answered: a haiku", result


async def test_a_bridge_session_is_one_event_stream_opened_at_initialize_and_closed_at_its_end(
    counter: tuple[Bridge, Proc],
) -> None:
    bridge, _ = counter
    async with mcp_client(bridge.mcp_url("counter"), mode="legacy") as client:
        tools = await client.list_tools()
        assert sorted(t.name for t in tools.tools) == ["ask", "increment", "offered"]
        result = await client.call_tool("increment", {})
        assert json.loads(result.content[0].text)["count"] == 1
        assert bridge.health()["counter"]["sessions"] == 1
    poll_until(lambda: bridge.health()["counter"]["sessions"] == 0, 10, "the session's stream closed")


def test_the_auth_header_of_a_sessions_initialize_reaches_the_legacy_server_and_a_refusal_its_status(
    tmp_path: Path,
) -> None:
    proc, url = counter_server(KEY)
    auth = {"type": "header", "header": "X-Api-Key", "value_env": "COUNTER_KEY"}
    backend = {"id": "keyed", "url": url, "transport": "sse", "auth": auth}
    try:
        with running_bridge(tmp_path, [backend]) as bridge:
            endpoint = bridge.mcp_url("keyed")
            refused = httpx2.post(endpoint, json=INITIALIZE, headers=ACCEPT, timeout=30)
            wrong = httpx2.post(endpoint, json=INITIALIZE, headers={**ACCEPT, "X-Api-Key": "no"}, timeout=30)
            opened = httpx2.post(endpoint, json=INITIALIZE, headers={**ACCEPT, "X-Api-Key": KEY}, timeout=30)
    finally:
        proc.stop()
    assert refused.status_code == 401 and wrong.status_code == 401, (refused.text, wrong.text)
    assert "refused its event stream with HTTP 401" in refused.json()["error"]["message"]
    assert opened.status_code == 200, opened.text
    assert opened.headers["mcp-session-id"]


def test_a_legacy_backend_is_reached_at_the_bridge_which_keeps_its_endpoint(tmp_path: Path) -> None:
    raw = {
        "bridge": {"listen": "127.0.0.1:9300"},
        "backends": [{"id": "old", "url": "http://127.0.0.1:3001/sse", "transport": "sse"}],
    }
    (backend,) = parse_config(raw, tmp_path / "toolsearch.yaml").backends
    assert backend.url == "http://127.0.0.1:9300/old/mcp" and backend.transport == "streamable_http"
    assert backend.sse_url == "http://127.0.0.1:3001/sse" and backend.bridged
    # what the loading made is a valid configuration in turn (the parts pass it on as they read it)
    again = parse_config({"bridge": raw["bridge"], "backends": [backend.model_dump()]}, tmp_path / "t.yaml")
    assert again.backends[0] == backend
    # `toolsearch up` starts the bridge for it, and for no file without such a backend
    assert ("bridge", "bridge.listen", "127.0.0.1:9300") in listen_addresses(again)
    modern = {"id": "new", "url": "http://127.0.0.1:3002/mcp"}
    plain = parse_config({"backends": [modern]}, tmp_path / "p.yaml")
    assert [part for part, _, _ in listen_addresses(plain)] == ["indexer", "router"]


async def test_a_legacy_server_that_goes_away_ends_its_sessions_and_a_new_one_opens_once_it_is_back(
    tmp_path: Path,
) -> None:
    proc, url = counter_server()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with running_bridge(tmp_path, [{"id": "gone", "url": url, "transport": "sse"}]) as bridge:
            endpoint = bridge.mcp_url("gone")
            async with httpx2.AsyncClient(timeout=30) as http:
                client = RawClient(http)
                await client.initialize(endpoint)
                proc.stop()
                poll_until(lambda: bridge.health()["gone"]["sessions"] == 0, 30, "the session ended")
                status, answers = await client.request(endpoint, "tools/list", {})
                assert status == 404, answers
                assert "its legacy SSE server has stopped" in answers[0]["error"]["message"]
                proc = start_process([sys.executable, str(COUNTER), "sse", str(port)], None)
                poll_until(lambda: port_accepts(port), 30, "the counter listening again")
                await client.initialize(endpoint)
                status, answers = await client.request(endpoint, "tools/list", {})
    finally:
        proc.stop()
    assert status == 200 and {t["name"] for t in answers[-1]["result"]["tools"]} == {
        "ask",
        "increment",
        "offered",
    }
