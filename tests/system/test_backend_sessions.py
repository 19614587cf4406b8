"""Backend sessions that live as long as the client session, across router replicas.

Real processes on loopback: server-everything over Streamable HTTP (it keeps state per session and
logs each session it opens and ends, which is how the tests count them) and the catalog server
(stateless, counting the requests it receives), an indexer in the test's loop, and router
processes. Clients speak raw JSON-RPC, so that one client session can be carried from one router
replica to another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.bridges import mcp_client, needs_everything
from tests.support.clients import RawClient
from tests.support.everything import stack_with_everything
from tests.support.routers import LightStack, another_router
from tests.support.waits import wait_for

TOGGLE = "toggle-simulated-logging"


def text_of(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


def kept_backend_session(stack: LightStack, client: RawClient, backend: str) -> str:
    """The backend session the indexer keeps with the client's session at `backend` ("" if none)."""
    for live in stack.indexer.sessions.sessions():
        if live.id == client.session_id and backend in live.record.backend_sessions:
            return live.record.backend_sessions[backend].session_id
    return ""


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=30) as client:
        yield client


@needs_everything
async def test_a_stateful_tool_keeps_its_state_over_two_calls_through_two_router_replicas(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    async with stack_with_everything(tmp_path) as (stack, _):
        second, second_url = await asyncio.to_thread(another_router, stack, "second", {})
        try:
            client = RawClient(http)
            await client.initialize(stack.mcp_url)
            first = await client.call(stack.mcp_url, TOGGLE, {})
            then = await client.call(f"{second_url}/mcp", TOGGLE, {})
        finally:
            second.stop()
        assert not first.get("isError") and not then.get("isError"), (first, then)
        kept = kept_backend_session(stack, client, "everything")
        assert text_of(first).startswith(f"Started simulated, random-leveled logging for session {kept}")
        assert text_of(then) == f"Stopped simulated logging for session {kept}"


@needs_everything
async def test_a_backend_restarted_mid_session_gets_a_new_backend_session_and_the_result_says_state_is_gone(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    async with stack_with_everything(tmp_path) as (stack, everything):
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        first = await client.call(stack.mcp_url, TOGGLE, {})
        before = kept_backend_session(stack, client, "everything")
        assert before and text_of(first).startswith("Started"), first
        assert "_meta" not in first and len(first["content"]) == 1, first  # nothing to say yet
        await asyncio.to_thread(everything.restart)
        again = await client.call(stack.mcp_url, TOGGLE, {})
        after = kept_backend_session(stack, client, "everything")
        assert not again.get("isError"), again
        assert after and after != before
        assert text_of(again).startswith(f"Started simulated, random-leveled logging for session {after}")
        assert everything.live_sessions() == {after}
        # the backend's own answer first, then what the agent must know
        note = again["content"][-1]["text"]
        assert note.startswith("[toolsearch] backend everything ") and "earlier calls set up" in note, note
        assert again["_meta"]["toolsearch/backendSession"]["replaced"] is True, again
        later = await client.call(stack.mcp_url, TOGGLE, {})
        assert "_meta" not in later and len(later["content"]) == 1, later  # said once, when it happened


@needs_everything
async def test_ending_the_client_session_ends_its_backend_session(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    async with stack_with_everything(tmp_path) as (stack, everything):
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        await client.call(stack.mcp_url, TOGGLE, {})
        kept = kept_backend_session(stack, client, "everything")
        assert everything.live_sessions() == {kept}  # the indexer's listing ended its own
        await client.end(stack.mcp_url)
        await wait_for(lambda: not everything.live_sessions())


@needs_everything
async def test_an_expired_client_session_ends_its_backend_session(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    async with stack_with_everything(tmp_path, indexer={"session_ttl": 2}) as (stack, everything):
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        await client.call(stack.mcp_url, TOGGLE, {})
        assert everything.live_sessions() == {kept_backend_session(stack, client, "everything")}
        ender = stack.indexer.ender
        assert ender is not None

        def ended() -> bool:
            ender.end_expired()  # what its timer does every 30 s
            return not everything.live_sessions()

        await wait_for(ended)
        response = await http.post(
            stack.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers=client.headers()
        )
        assert response.status_code == 404  # the client session itself is gone too


@needs_everything
async def test_later_calls_of_a_session_reach_the_backend_in_one_request(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    async with stack_with_everything(tmp_path) as (stack, everything):
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        before = everything.posts()
        first = await client.call(stack.mcp_url, "get-sum", {"a": 2, "b": 3})
        opened = everything.posts()
        second = await client.call(stack.mcp_url, "get-sum", {"a": 4, "b": 5})
        third = await client.call(stack.mcp_url, TOGGLE, {})
        assert [text_of(r) for r in (first, second)] == [
            "The sum of 2 and 3 is 5.",
            "The sum of 4 and 5 is 9.",
        ]
        assert not third.get("isError"), third
        assert opened - before == 3  # initialize, notifications/initialized, tools/call
        assert everything.posts() - opened == 2  # then one request per call


@needs_everything
async def test_two_anonymous_2026_07_28_clients_never_share_a_backend_session(tmp_path: Path) -> None:
    async with stack_with_everything(tmp_path) as (stack, everything):
        results = []
        for _ in range(2):
            # two programs: the anonymous implied session is all they have in common
            async with mcp_client(stack.mcp_url) as client:
                result = await client.call_tool("call_tool", {"tool_name": TOGGLE, "parameters": {}})
            assert not result.is_error, result
            results.append(result)
        texts = [r.content[0].text for r in results]
        assert texts[0].startswith("Started") and texts[1].startswith("Started"), texts
        for result in results:  # each says its session was its own, and is not kept
            assert result.meta is not None and result.meta["toolsearch/backendSession"]["kept"] is False
            assert "nothing it set up there is kept" in result.content[-1].text
        await wait_for(lambda: not everything.live_sessions())  # each ended once it answered
