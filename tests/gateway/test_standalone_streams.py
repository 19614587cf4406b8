"""What a backend sends outside calls reaches the client on its standalone stream (`GET /mcp`),
whichever router replica holds that stream and whichever one its subscription went through.

Every part in the test's process: a handshake-era server with a subscribable resource and a tool
that changes it (tests/support/asking_server.py), an indexer in the test's loop, two routers in front
of it, and a raw JSON-RPC client that holds its standalone stream on one replica and sends
everything else to the other. A router process ending its streams when told to stop is in
tests/system/test_shutdown.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from router.frontdoor.streams.standalone import MAX_PER_SESSION
from tests.support.asking import asking_replicas
from tests.support.clients import RawClient, listening, until
from tests.support.routers import LightStack
from tests.support.waits import wait_for

NOTE = "asking://note"


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[tuple[LightStack, str]]:
    """A stack whose one backend has a subscribable note, and a second router's MCP URL."""
    async with asking_replicas(tmp_path, timeout=10) as replicas:
        yield replicas


async def test_a_subscribed_resources_update_reaches_the_stream_held_on_another_replica(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        async with listening(http, client, stack.mcp_url) as stream:
            assert stream.status == 200
            status, answers = await client.request(other, "resources/subscribe", {"uri": NOTE})
            assert status == 200 and answers[0]["result"] == {"resultType": "complete"}, answers

            async def updated() -> bool:
                # the stream's replica finds the backend session the subscription opened within
                # its poll interval: the note is changed until an update arrives
                await client.call(other, "touch", {})
                return any(m["method"] == "notifications/resources/updated" for m in stream.messages)

            await until(updated, "a resource update on the stream held on the other replica")
            # the touch's log line comes after its update, on the same stream
            await wait_for(lambda: any(m["method"] == "notifications/message" for m in stream.messages))
            status, answers = await client.request(other, "resources/unsubscribe", {"uri": NOTE})
            assert status == 200, answers
            told = await client.call(other, "touch", {})
    update = next(m for m in stream.messages if m["method"] == "notifications/resources/updated")
    assert update["params"] == {"uri": NOTE}
    logs = [m for m in stream.messages if m["method"] == "notifications/message"]
    assert logs and logs[0]["params"]["data"] == "the note changed"  # outside any call, too
    assert told["content"][0]["text"] == "told 0"  # the unsubscription reached the backend


async def test_a_standalone_stream_needs_a_live_session_and_to_accept_an_event_stream(
    replicas: tuple[LightStack, str],
) -> None:
    stack, _ = replicas
    async with httpx2.AsyncClient(timeout=30) as http:
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        plain = await http.get(stack.mcp_url, headers={**client.headers(), "Accept": "application/json"})
        await client.end(stack.mcp_url)
        gone = await http.get(stack.mcp_url, headers={**client.headers(), "Accept": "text/event-stream"})
    assert plain.status_code == 406, plain.text
    assert plain.json()["error"]["message"] == "Not Acceptable: a GET must accept text/event-stream"
    assert gone.status_code == 404, gone.text


async def test_one_session_may_hold_only_so_many_standalone_streams_on_a_router(
    replicas: tuple[LightStack, str],
) -> None:
    stack, other = replicas
    async with httpx2.AsyncClient(timeout=30) as http, contextlib.AsyncExitStack() as held:
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        for _ in range(MAX_PER_SESSION):
            stream = await held.enter_async_context(listening(http, client, stack.mcp_url))
            assert stream.status == 200
        refused = await held.enter_async_context(listening(http, client, stack.mcp_url))
        elsewhere = await held.enter_async_context(listening(http, client, other))
    assert refused.status == 409
    assert elsewhere.status == 200  # the bound is each router's


async def test_a_backend_saying_its_tools_changed_has_them_listed_again_long_before_its_next_probe(
    tmp_path: Path,
) -> None:
    # probes an hour apart: only the backend's notification can explain a new tool found in time
    health = {"health": {"enabled": True, "interval": 3600}}
    async with (
        asking_replicas(tmp_path, timeout=10, indexer=health) as (stack, other),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        client = RawClient(http)
        await client.initialize(stack.mcp_url)
        find = {"name": "find_tool", "arguments": {"tool_description": "water the garden's seedlings"}}
        _, before = await client.request(other, "tools/call", find)
        async with listening(http, client, stack.mcp_url) as stream:
            assert stream.status == 200

            async def found() -> bool:
                # the stream's replica listens in the backend session the call opened within its
                # look interval: the tool is added again until the new one is found
                assert (await client.call(other, "grow", {}))["content"][0]["text"] == "grown"
                _, answers = await client.request(other, "tools/call", find)
                return "sprout" in json.dumps(answers[-1]["result"])

            await until(found, "the backend's new tool found after it said its tools changed")
    assert "sprout" not in json.dumps(before[-1]["result"])
