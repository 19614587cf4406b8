"""Backend health seen by MCP clients: the whole stack as real processes, sessions that never reconnect.

A small catalog (three servers) keeps probing cheap; a short probe interval makes recovery quick.
Waits are on conditions with bounded timeouts. The load test's duration is a constant.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.clients import until
from tests.support.stack import Stack, running_stack, structured
from toolsearch.v1 import indexer_pb2 as pb

INTERVAL = 0.3  # seconds between probes of one backend
WAIT = 60.0  # seconds any condition may take at most, on a busy machine
RECOVERY_BOUND = 10 * INTERVAL  # about one interval, with room for a loaded machine
LOAD_SECONDS = 20.0
LOAD_CLIENTS = 16
FLAP_SECONDS = 0.2
WEATHER = "AI_Weather_by_Meteosource"
QUERIES = ("current weather conditions", "nba teams and players", "cocktail with an ingredient")


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, set[str]]]:
    path = tmp_path_factory.mktemp("health-catalog") / "catalog.jsonl"
    return path, small_catalog(path)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, tools: tuple[Path, dict[str, set[str]]]
) -> Iterator[Stack]:
    health = {"interval": INTERVAL, "timeout": 2.0, "unhealthy_after": 1}
    extra = {"indexer": {"health": health}}
    with running_stack(tmp_path_factory.mktemp("health"), catalog=tools[0], extra=extra) as running:
        yield running


async def status(stack: Stack) -> pb.StatusResponse:
    return await asyncio.to_thread(fetch, stack.indexer_address, 5.0)


async def backend_status(stack: Stack, backend_id: str) -> str:
    return next(b.status for b in (await status(stack)).backends if b.id == backend_id)


class Notifications:
    """Everything the server sent the client unasked."""

    def __init__(self) -> None:
        self.received: list[Any] = []

    async def __call__(self, message: Any) -> None:
        self.received.append(message)

    def tool_list_changes(self) -> list[Any]:
        return [m for m in self.received if isinstance(m, types.ToolListChangedNotification)]


@asynccontextmanager
async def client(stack: Stack, notifications: Notifications | None = None) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(timeout=30)
    async with (
        http,
        Client(
            streamable_http_client(stack.mcp_url, http_client=http),
            mode="legacy",
            message_handler=notifications,
        ) as c,
    ):
        yield c


async def find(c: Client, query: str) -> tuple[list[str], tuple[int, str]]:
    """The names find_tool returns and the (version, fingerprint) that answered."""
    result = await c.call_tool("find_tool", {"tool_description": query, "limit": 10})
    assert not result.is_error, result
    index = (result.meta or {})["toolsearch/index"]
    return [t["name"] for t in structured(result)["tools"]], (index["version"], index["fingerprint"])


def text(result: Any) -> str:
    return str(result.content[0].text)


async def test_one_session_follows_a_backend_recovering_and_failing_without_reconnecting(
    stack: Stack, tools: tuple[Path, dict[str, set[str]]]
) -> None:
    weather = tools[1][WEATHER]
    stack.control(WEATHER, "down")
    await until(lambda: _is(stack, WEATHER, "unhealthy"), "weather unhealthy")
    notifications = Notifications()
    async with client(stack, notifications) as c:
        names, (version, _) = await find(c, "current weather conditions")
        assert not set(names) & weather

        stack.control(WEATHER, "up")
        started = time.monotonic()
        names, (recovered, _) = await until(lambda: _finds(c, weather, True), "weather tools found")
        assert time.monotonic() - started < RECOVERY_BOUND
        assert recovered > version
        result = await c.call_tool("call_tool", {"tool_name": "current", "parameters": {"lat": "50N"}})
        assert not result.is_error, result
        assert result.structured_content == {
            "tool": "current",
            "server": "AI Weather by Meteosource",
            "arguments": {"lat": "50N"},
        }

        stack.control(WEATHER, "down")
        _, (dropped, _) = await until(lambda: _finds(c, weather, False), "weather tools gone")
        assert dropped > recovered
        result = await c.call_tool("call_tool", {"tool_name": "current", "parameters": {}})
        assert result.is_error and text(result).startswith("tool not found: current"), result
        (session,) = (await status(stack)).sessions  # the one session, kept throughout
        reasons = [swap.reason for swap in session.swaps]
        assert reasons[-2:] == [f"backend {WEATHER} recovered", f"backend {WEATHER} unhealthy"]
        stack.control(WEATHER, "up")
    assert notifications.tool_list_changes() == []


async def _is(stack: Stack, backend_id: str, wanted: str) -> bool:
    return await backend_status(stack, backend_id) == wanted


async def _finds(c: Client, tool_names: set[str], present: bool) -> tuple[list[str], tuple[int, str]] | None:
    names, ref = await find(c, "current weather conditions")
    return (names, ref) if bool(set(names) & tool_names) == present else None


async def test_answers_stay_consistent_with_their_version_while_a_backend_flaps(
    stack: Stack, tools: tuple[Path, dict[str, set[str]]]
) -> None:
    weather = tools[1][WEATHER]
    await until(lambda: _is(stack, WEATHER, "healthy"), "weather healthy")
    answers: dict[tuple[str, str], set[tuple[str, ...]]] = {}  # (fingerprint, query) -> name lists
    errors: list[str] = []
    stop = time.monotonic() + LOAD_SECONDS

    async def flap() -> None:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            while time.monotonic() < stop:
                for action in ("down", "up"):
                    (
                        await http.post(f"{stack.catalog_url}/control/servers/{WEATHER}/{action}")
                    ).raise_for_status()
                    await asyncio.sleep(FLAP_SECONDS)

    async def work(number: int) -> None:
        notifications = Notifications()
        async with client(stack, notifications) as c:
            seen = 0
            while time.monotonic() < stop:
                query = QUERIES[number % len(QUERIES)]
                names, (version, fingerprint) = await find(c, query)
                assert version >= seen, "a session's version went backwards"
                seen = version
                answers.setdefault((fingerprint, query), set()).add(tuple(names))
                for tool, params in (("current", {}), ("Get_All_Teams", {})):
                    result = await c.call_tool("call_tool", {"tool_name": tool, "parameters": params})
                    message = text(result) if result.is_error else ""
                    expected = tool == "current" and (
                        message.startswith(("tool not found: current", f"backend {WEATHER} "))
                    )
                    if result.is_error and not expected:
                        errors.append(message)
                number += 1
        assert notifications.tool_list_changes() == []

    try:
        await asyncio.gather(flap(), *(work(n) for n in range(LOAD_CLIENTS)))
    finally:
        stack.control(WEATHER, "up")
    assert errors == []
    # one version, one answer: the same query under the same fingerprint always gives the same tools
    mixed = {key: lists for key, lists in answers.items() if len(lists) > 1}
    assert mixed == {}
    with_weather = {fp for (fp, _), lists in answers.items() for names in lists if set(names) & weather}
    fingerprints = {fp for fp, _ in answers}
    assert with_weather and fingerprints - with_weather, "the flapping backend never changed a version"
    for (fingerprint, query), lists in answers.items():
        if query == QUERIES[0]:  # the weather query finds weather tools exactly when they are indexed
            assert all(bool(set(names) & weather) == (fingerprint in with_weather) for names in lists)


async def test_a_sighup_reload_adds_and_removes_a_backend_of_a_live_session(stack: Stack) -> None:
    original = stack.config_path.read_text()
    config = yaml.safe_load(original)
    copy = {"weather_copy_current"}  # the copy's `current` is prefixed: two backends now share the name
    async with client(stack) as c:
        _, (version, _) = await find(c, "current weather conditions")
        config["backends"] = [{"id": "weather_copy", "url": stack.backend_url(WEATHER)}]
        stack.config_path.write_text(yaml.safe_dump(config))
        stack.procs["indexer"].send_signal(signal.SIGHUP)
        _, (added, _) = await until(lambda: _finds(c, copy, True), "the added backend's tools found")
        stack.config_path.write_text(original)
        stack.procs["indexer"].send_signal(signal.SIGHUP)
        _, (removed, _) = await until(lambda: _finds(c, copy, False), "the removed backend's tools gone")
        assert version < added < removed
        (session,) = (await status(stack)).sessions
        # Under load a probe of this module's flapped backend may coincide with a reload: its change
        # shares the swap's reason ("backend X recovered; config reload: ...") or swaps in between.
        reloads = [
            part
            for swap in session.swaps
            for part in swap.reason.split("; ")
            if part.startswith("config reload: ")
        ]
        assert reloads[-2:] == ["config reload: added weather_copy", "config reload: removed weather_copy"]
