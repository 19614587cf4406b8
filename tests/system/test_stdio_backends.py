"""Stdio MCP servers behind the bridge, reached with the SDK's own client over Streamable HTTP.

One bridge process serves mcp-server-time, server-everything (shared and per session) and a small
echo server; each test talks to it as the indexer and the routers do.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from indexer.backends.discovery import list_tools
from tests.support.bridges import (
    HAVE_EVERYTHING,
    Bridge,
    everything,
    fake,
    mcp_client,
    needs_everything,
    poll_until,
    running_bridge,
    time_server,
)
from tests.support.stack import HEADERS, INITIALIZE

BACKENDS = [
    time_server(id="time"),
    fake("echo", id="echo"),
    fake("echo", id="scratch", isolation="per_session", max_processes=1, idle_timeout=1),
    everything(id="everything"),
    everything(id="private", isolation="per_session", max_processes=2, idle_timeout=60),
]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    backends = BACKENDS if HAVE_EVERYTHING else BACKENDS[:3]
    with running_bridge(tmp_path_factory.mktemp("bridge"), backends, max_restart_delay=2) as running:
        yield running


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent), result
    return block.text


async def test_mcp_server_time_serves_its_tools_over_streamable_http(bridge: Bridge) -> None:
    async with mcp_client(bridge.mcp_url("time")) as client:
        assert client.session.protocol_version == "2025-11-25"  # the handshake: discover is refused
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names == ["get_current_time", "convert_time"]
        result = await client.call_tool("get_current_time", {"timezone": "Europe/Paris"})
    assert not result.is_error, result
    assert json.loads(text(result))["timezone"] == "Europe/Paris"


async def test_initialize_answers_with_what_the_stdio_server_said_of_itself(bridge: Bridge) -> None:
    response = httpx2.post(bridge.mcp_url("echo"), json=INITIALIZE, headers=HEADERS, timeout=10)
    assert response.status_code == 200, response.text
    line = next(line for line in response.text.splitlines() if line.startswith("data:"))
    result = json.loads(line.removeprefix("data:"))["result"]
    assert result["serverInfo"] == {"name": "test-echo", "version": "1.0"}
    assert result["instructions"] == "echoes what it is given"
    assert result["capabilities"] == {"tools": {}}
    assert response.headers["mcp-session-id"]


async def test_the_indexers_listing_sees_a_stdio_server_as_any_http_backend(bridge: Bridge) -> None:
    listing = await list_tools("echo", bridge.mcp_url("echo"), {}, 10.0)
    assert [tool["name"] for tool in listing.tools] == ["echo"]
    assert listing.protocol_version == "2025-11-25"


async def test_a_killed_server_is_started_again_and_calls_recover(bridge: Bridge) -> None:
    async with mcp_client(bridge.mcp_url("echo")) as client:
        first = json.loads(text(await client.call_tool("echo", {"text": "a"})))["pid"]
        os.kill(first, signal.SIGKILL)
        # the same session goes on: calls fail with a reason while the server is down, then succeed
        deadline = anyio.current_time() + 20
        while True:
            try:
                result = await client.call_tool("echo", {"text": "b"})
            except MCPError as exc:
                assert "backend echo" in exc.error.message, exc
                assert anyio.current_time() < deadline, "the echo server did not come back"
                await anyio.sleep(0.2)
                continue
            break
    answer = json.loads(text(result))
    assert answer["arguments"] == {"text": "b"}
    assert answer["pid"] != first
    assert bridge.health()["echo"]["starts"] >= 2


async def test_a_callers_cancellation_reaches_the_stdio_server(bridge: Bridge) -> None:
    async with mcp_client(bridge.mcp_url("echo")) as client:
        with pytest.raises(MCPError):  # the client gives up, and says so: notifications/cancelled
            await client.call_tool("wait", {}, read_timeout_seconds=0.5)
        for _ in range(50):
            if cancelled := json.loads(text(await client.call_tool("cancelled", {}))):
                break
            await anyio.sleep(0.1)
    assert len(cancelled) == 1  # the bridge cancelled its own request to the server in turn


def test_an_idle_per_session_process_is_reaped_and_its_session_ends_with_it(bridge: Bridge) -> None:
    url = bridge.mcp_url("scratch")
    response = httpx2.post(url, json=INITIALIZE, headers=HEADERS, timeout=10)
    assert response.status_code == 200, response.text
    session = {**HEADERS, "mcp-session-id": response.headers["mcp-session-id"]}
    assert bridge.health()["scratch"]["pids"] == []  # its process starts with its first call
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    assert httpx2.post(url, json=call, headers=session, timeout=30).status_code == 200
    assert len(bridge.health()["scratch"]["pids"]) == 1
    poll_until(lambda: not bridge.health()["scratch"]["pids"], 15, "the idle process reaped")
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    gone = httpx2.post(url, json=ping, headers=session, timeout=10)
    assert gone.status_code == 404
    assert "Session not found" in gone.json()["error"]["message"]


def test_a_rebinding_host_starts_no_per_session_process(bridge: Bridge) -> None:
    headers = {**HEADERS, "host": "attacker.example:80"}
    response = httpx2.post(bridge.mcp_url("scratch"), json=INITIALIZE, headers=headers, timeout=10)
    assert response.status_code == 421
    assert bridge.health()["scratch"]["pids"] == []


@needs_everything
async def test_progress_is_relayed_on_the_calls_own_stream(bridge: Bridge) -> None:
    reports: list[tuple[float, float | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        reports.append((done, total))

    async with mcp_client(bridge.mcp_url("everything")) as client:
        result = await client.call_tool(
            "trigger-long-running-operation", {"duration": 1, "steps": 2}, progress_callback=progress
        )
    assert "completed" in text(result)
    assert reports == [(1, 2), (2, 2)]


@needs_everything
async def test_the_servers_log_messages_reach_the_listening_session(bridge: Bridge) -> None:
    received = anyio.Event()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.set()

    async with mcp_client(bridge.mcp_url("private"), logging_callback=on_log) as client:
        await client.list_tools()  # by now the session's GET stream, which carries them, is open
        assert text(await client.call_tool("toggle-simulated-logging", {})).startswith("Started")
        with anyio.fail_after(12):  # one at once, then one every 5 seconds
            await received.wait()
        await client.call_tool("toggle-simulated-logging", {})


def _no_private_processes(bridge: Bridge) -> None:
    # Ending a session stops its process in the background; an earlier test's may still be exiting
    # and counts against max_processes until it has.
    poll_until(lambda: not bridge.health()["private"]["pids"], 20, "earlier sessions' processes stopped")


async def _toggle(url: str) -> str:
    async with mcp_client(url) as client:
        return text(await client.call_tool("toggle-simulated-logging", {})).split()[0]


@needs_everything
async def test_shared_isolation_gives_every_session_the_one_process(bridge: Bridge) -> None:
    url = bridge.mcp_url("everything")
    first, second = await _toggle(url), await _toggle(url)
    assert {first, second} == {"Started", "Stopped"}  # the second session saw the first's state


@needs_everything
async def test_per_session_isolation_gives_two_sessions_two_processes(bridge: Bridge) -> None:
    _no_private_processes(bridge)
    url = bridge.mcp_url("private")
    async with mcp_client(url) as one, mcp_client(url) as two:
        answers = [await c.call_tool("toggle-simulated-logging", {}) for c in (one, two)]
        assert [text(a).split()[0] for a in answers] == ["Started", "Started"]
        assert len(bridge.health()["private"]["pids"]) == 2
        # the pool is full: a third session is refused, saying why, and nothing waits
        response = httpx2.post(url, json=INITIALIZE, headers=HEADERS, timeout=10)
        assert response.status_code == 503, response.text
        assert "max_processes" in response.json()["error"]["message"]
        for client in (one, two):
            await client.call_tool("toggle-simulated-logging", {})
    # ending a session (the client's DELETE) ends its process
    poll_until(lambda: not bridge.health()["private"]["pids"], 20, "both processes stopped")


@needs_everything
async def test_a_session_whose_process_died_is_gone_and_a_new_one_works(bridge: Bridge) -> None:
    _no_private_processes(bridge)
    url = bridge.mcp_url("private")
    errors: list[str] = []
    async with mcp_client(url) as client:
        await client.call_tool("echo", {"message": "x"})
        (pid,) = bridge.health()["private"]["pids"]
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(20):  # no call hangs: each fails at once, saying why
            while not errors or "Session not found" not in errors[-1]:
                with pytest.raises(MCPError) as failure:
                    await client.call_tool("echo", {"message": "x"})
                errors.append(failure.value.error.message)
    # what became of the process, while the session lasts; then the session is gone with its state
    *before, gone = errors
    assert all(e.startswith("backend private: ") and "killed by SIGKILL" in e for e in before), errors
    assert gone.startswith("Session not found"), errors
    async with mcp_client(url) as fresh:
        result = await fresh.call_tool("echo", {"message": "again"})
    assert "again" in text(result)
