"""The servers people run, through the whole stack: stdio ones behind the bridge, a legacy SSE one.

Real processes on loopback: a bridge running mcp-server-time and a small echo server and holding
the sessions of a server-everything speaking the 2024-11-05 HTTP+SSE transport, and an indexer and a
router over a small catalog. find_tool finds the stdio servers' tools, call_tool runs them, a stdio
server killed mid-way is started again and calls recover, and the SSE server's tools are discovered
and called.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from commands.ports import free_port
from tests.support.bridges import (
    EVERYTHING,
    HAVE_EVERYTHING,
    Bridge,
    bridge_config,
    fake,
    mcp_client,
    time_server,
)
from tests.support.catalogs import small_catalog
from tests.support.processes import start_process
from tests.support.stack import CLI, Stack, running_stack, structured


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Bridge]]:
    folder = tmp_path_factory.mktemp("people")
    catalog = folder / "catalog.jsonl"
    small_catalog(catalog)
    backends: list[dict[str, Any]] = [time_server(id="time"), fake("echo", id="parrot")]
    procs = []
    try:
        if HAVE_EVERYTHING:
            port = free_port()
            sse = start_process(
                ["node", str(EVERYTHING), "sse"], f"http://127.0.0.1:{port}/sse", env={"PORT": str(port)}
            )
            procs.append(sse)
            backends.append({"id": "everything", "url": f"http://127.0.0.1:{port}/sse", "transport": "sse"})
        # the bridge runs the stdio servers and holds the legacy SSE server's sessions
        path, config = bridge_config(folder, backends, max_restart_delay=2)
        url = f"http://{config['bridge']['listen']}"
        procs.insert(0, start_process([*CLI, "bridge", "--config", str(path)], f"{url}/readyz", timeout=90))
        extra = {"bridge": config["bridge"], "backends": backends}
        with running_stack(folder, catalog=catalog, extra=extra) as running:
            yield running, Bridge(url, procs[0], path)
    finally:
        for proc in procs:
            proc.stop()


async def find(url: str, query: str) -> list[dict[str, Any]]:
    async with mcp_client(url) as client:
        result = await client.call_tool("find_tool", {"tool_description": query, "limit": 3})
    assert not result.is_error, result
    tools: list[dict[str, Any]] = structured(result)["tools"]
    return tools


async def call(url: str, name: str, parameters: dict[str, Any]) -> Any:
    async with mcp_client(url) as client:
        return await client.call_tool("call_tool", {"tool_name": name, "parameters": parameters})


async def test_find_tool_finds_a_stdio_servers_tool_and_call_tool_runs_it(
    stack: tuple[Stack, Bridge],
) -> None:
    running, _ = stack
    tools = await find(running.mcp_url, "what time is it now in a given time zone")
    assert tools[0]["name"] == "get_current_time", [t["name"] for t in tools]
    assert "timezone" in tools[0]["inputSchema"]["properties"]
    result = await call(running.mcp_url, "get_current_time", {"timezone": "Asia/Tokyo"})
    assert not result.is_error, result
    assert json.loads(result.content[0].text)["timezone"] == "Asia/Tokyo"


async def test_a_killed_stdio_server_is_restarted_and_calls_through_the_router_recover(
    stack: tuple[Stack, Bridge],
) -> None:
    running, bridge = stack
    echo = "parrot_echo" if HAVE_EVERYTHING else "echo"  # server-everything has an echo tool too
    first = await call(running.mcp_url, echo, {"text": "one"})
    assert not first.is_error, first
    pid = json.loads(first.content[0].text)["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        result = await call(running.mcp_url, echo, {"text": "two"})
        if not result.is_error:
            break
        assert "parrot" in result.content[0].text, result  # the failure names the backend
        assert time.monotonic() < deadline, result
        await anyio.sleep(0.2)
    answer = json.loads(result.content[0].text)
    assert answer["arguments"] == {"text": "two"} and answer["pid"] != pid
    assert bridge.health()["parrot"]["starts"] == 2


@pytest.mark.skipif(not HAVE_EVERYTHING, reason="server-everything needs node and `make setup`")
async def test_a_legacy_sse_server_is_discovered(stack: tuple[Stack, Bridge]) -> None:
    running, _ = stack
    tools = await find(running.mcp_url, "add two numbers and return their sum")
    assert tools[0]["name"] == "get-sum", [t["name"] for t in tools]


@pytest.mark.skipif(not HAVE_EVERYTHING, reason="server-everything needs node and `make setup`")
async def test_a_legacy_sse_servers_tool_is_called_through_the_router(stack: tuple[Stack, Bridge]) -> None:
    running, _ = stack
    result = await call(running.mcp_url, "get-sum", {"a": 2, "b": 3})
    assert not result.is_error, result
    assert result.content[0].text == "The sum of 2 and 3 is 5."


def test_the_indexer_judges_stdio_and_sse_backends_as_any_other(stack: tuple[Stack, Bridge]) -> None:
    running, _ = stack
    status = start_process([*CLI, "status", "--json", "--config", str(running.config_path)], None)
    output = status.wait_exit(30)
    backends = {b["id"]: b for b in json.loads(output[output.index("{") :])["backends"]}
    # the bridge's session offers sampling, elicitation and roots (its callers' requests are relayed),
    # for which server-everything adds 4 tools to its 13
    expected = {"time": 2, "parrot": 1} | ({"everything": 17} if HAVE_EVERYTHING else {})
    for backend, tools in expected.items():
        assert backends[backend]["status"] in ("healthy", "degraded"), backends[backend]
        assert backends[backend]["tool_count"] == tools, backends[backend]
