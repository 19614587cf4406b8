"""Stdio servers that do not work: each is a clear message naming its backend, and nothing else waits.

One bridge runs a correct server beside one of each kind of broken one (missing, exiting at once,
writing noise to stdout, never answering, flooding stderr); the correct one is served throughout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from indexer.backends.discovery import list_tools
from indexer.errors import BackendUnavailable
from tests.support.bridges import Bridge, fake, mcp_client, poll_until, running_bridge
from tests.support.clients import RawClient
from tests.support.routers import light_stack
from tests.support.stack import HEADERS, INITIALIZE
from tests.support.stdio_servers import FLOOD_LINES

START_TIMEOUT = 8.0  # seconds: a busy two-core machine starts every good server well within it
BROKEN = {
    "missing": (
        {"command": "toolsearch-test-no-such-program"},
        "cannot run 'toolsearch-test-no-such-program'",
    ),
    "exits": (fake("exit"), "exited with code 3 (its last stderr line: fatal: no configuration found)"),
    "noise": (fake("noise"), "line(s) to stdout that are not JSON-RPC messages, the first: 'hello from"),
    "silent": (fake("silent"), f"did not answer initialize within {START_TIMEOUT:g}s"),
}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    backends = [
        fake("echo", id="good"),
        fake("banner", id="banner"),
        fake("flood", id="flood"),
        *({"id": name, **backend} for name, (backend, _) in BROKEN.items()),
    ]
    folder = tmp_path_factory.mktemp("broken")
    with running_bridge(
        folder, backends, every_start=False, start_timeout=START_TIMEOUT, max_restart_delay=2
    ) as running:
        yield running


@pytest.mark.parametrize("name", sorted(BROKEN))
async def test_a_broken_server_is_a_clear_error_naming_its_backend(bridge: Bridge, name: str) -> None:
    expected = BROKEN[name][1]
    state = poll_until(
        lambda: (s := bridge.health()[name])["last_error"] and s["state"] != "ready" and s,
        30,
        f"{name} judged",
    )
    assert expected in state["last_error"], state
    # the indexer's listing (and so its health probe) fails at once, with the reason
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as failure:
        await list_tools(name, bridge.mcp_url(name), {}, 10.0)
    assert time.monotonic() - started < START_TIMEOUT + 2
    assert f"backend {name}" in failure.value.reason, failure.value.reason


def test_a_new_session_on_a_dead_backend_is_refused_with_503(bridge: Bridge) -> None:
    poll_until(lambda: bridge.health()["missing"]["state"] == "waiting", 10, "missing is down")
    response = poll_until(
        lambda: (
            (
                r := httpx2.post(bridge.mcp_url("missing"), json=INITIALIZE, headers=HEADERS, timeout=10)
            ).status_code
            == 503
            and r
        ),
        10,
        "a 503",
    )
    message = response.json()["error"]["message"]
    assert message.startswith("backend missing is unavailable: its stdio server did not start: cannot run")
    assert response.headers["retry-after"]


async def test_a_banner_on_stdout_is_logged_and_the_server_still_served(bridge: Bridge) -> None:
    async with mcp_client(bridge.mcp_url("banner")) as client:
        result = await client.call_tool("echo", {"text": "hi"})
    assert not result.is_error
    assert "not a JSON-RPC message" in bridge.proc.output()
    assert "server starting up (a banner on stdout)" in bridge.proc.output()


async def test_a_flood_on_stderr_is_rate_limited_and_the_server_still_served(bridge: Bridge) -> None:
    async with mcp_client(bridge.mcp_url("flood")) as client:
        result = await client.call_tool("echo", {"text": "hi"})
    assert not result.is_error
    logged = poll_until(
        lambda: "stderr lines not logged" in bridge.proc.output() and bridge.proc.output(), 30, "the flood"
    )
    lines = [line for line in logged.splitlines() if "backend flood: flood line" in line]
    assert 10 <= len(lines) < FLOOD_LINES / 100  # a burst, then a trickle: never the flood itself


async def test_the_working_server_answers_at_once_throughout(bridge: Bridge) -> None:
    for _ in range(3):
        started = time.monotonic()
        async with mcp_client(bridge.mcp_url("good")) as client:
            result = await client.call_tool("echo", {"text": "still here"})
        assert not result.is_error
        # sooner than a silent server's start timeout: it never waits behind a broken server's start
        assert time.monotonic() - started < START_TIMEOUT


async def test_a_server_that_never_answers_holds_nobodys_readiness(tmp_path: Path) -> None:
    # it has all the time in the world to start, so whatever waited for it would wait 600 s
    backends = [fake("echo", id="good"), fake("silent", id="stuck")]
    (tmp_path / "stack").mkdir()
    # ready within 90 s, the stuck one's start going on
    with running_bridge(tmp_path, backends, every_start=False, start_timeout=600) as bridge:
        served = [{"id": b["id"], "url": bridge.mcp_url(b["id"])} for b in backends]
        indexer = {"discovery_timeout": 600, "health": {"enabled": True, "interval": 60}}
        async with (
            light_stack(tmp_path / "stack", backends=served, indexer=indexer) as stack,
            httpx2.AsyncClient(timeout=60) as http,
        ):
            client = RawClient(http)
            await client.initialize(stack.mcp_url)
            result = await client.call(stack.mcp_url, "echo", {"text": "ready"})
            states = stack.indexer.registry.states
            stuck = states["stuck"].health
            # the good one is usable while the broken one is still starting, and says so
            assert not result.get("isError") and "ready" in result["content"][0]["text"], result
            assert bridge.health()["stuck"]["state"] == "starting"
            assert states["good"].health.status == "healthy"
            # the bridge stopped waiting for it when it became ready, and says so at once rather
            # than hold whoever asks (here the indexer's first listing) for its 600 s start timeout
            assert stuck.status == "unhealthy" and "still starting, far slower than the others" in (
                stuck.last_error
            ), stuck
            with pytest.raises(BackendUnavailable) as failure:
                await list_tools("stuck", bridge.mcp_url("stuck"), {}, 60.0)
            assert "still starting, far slower than the others" in failure.value.reason
