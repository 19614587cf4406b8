"""Backend answers are bounded: an oversized call result is a tool error, read no further than the limit.

The call tests run a real router in front of a catalog server whose test controls pad a server's call
results (tests/support/routers.py); the router's memory is measured around a 50 MB answer, and
other clients keep being served while it arrives. The listing tests drive the indexer's discovery
against the same catalog server. The transport tests check the bound itself on answers made up in
process: declared sizes, streamed sizes and compressed ones.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from indexer.backends.discovery import list_tools
from indexer.errors import BackendUnavailable
from tests.support.clients import until
from tests.support.routers import LightStack, light_stack
from toolsearch.responses import BoundedTransport, ResponseTooLarge

PAD = 50_000_000  # bytes the padded server adds to each call result
WAIT = 30.0
STALL = 8.0  # seconds each Cocktails call stalls: longer than another call takes on a busy machine


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LightStack]:
    # a pool of 2 connections per backend, so one backend's stalled calls can fill its own
    settings = {"max_connections_per_backend": 2}
    async with light_stack(
        tmp_path_factory.mktemp("answers"), router=settings, router_process=True
    ) as running:
        yield running


async def control(stack: LightStack, server: str, action: str, **params: float) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        (
            await http.post(f"{stack.catalog_url}/control/servers/{server}/{action}", params=params)
        ).raise_for_status()


@asynccontextmanager
async def mcp_client(stack: LightStack) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(timeout=WAIT)
    async with http, Client(streamable_http_client(stack.mcp_url, http_client=http), mode="legacy") as client:
        yield client


def peak_rss(pid: int) -> int:
    """The process's resident-set high-water mark (Linux): what the answer cost at its worst."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


async def test_an_oversized_result_is_a_tool_error_and_the_router_stays_small(stack: LightStack) -> None:
    pings: list[float] = []
    done = asyncio.Event()

    async def ping() -> None:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            while not done.is_set():
                started = time.perf_counter()
                assert (await http.get(f"{stack.router_url}/healthz")).status_code == 200
                pings.append(time.perf_counter() - started)
                await asyncio.sleep(0.05)

    await control(stack, "Free_NBA", "pad", bytes=PAD)
    try:
        async with mcp_client(stack) as client:
            await client.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})  # warm
            before = peak_rss(stack.router.pid)
            pinging = asyncio.create_task(ping())
            result = await client.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
            grew = peak_rss(stack.router.pid) - before
            done.set()
            await pinging
            await control(stack, "Free_NBA", "pad", bytes=0)
            again = await client.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
    finally:
        await control(stack, "Free_NBA", "pad", bytes=0)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "backend Free_NBA answered with more than 16777216 bytes" in text
    assert "backends[].max_response_bytes" in text
    assert not again.is_error  # the backend's pool is usable again at once
    slowest = max(pings)
    print(
        f"router peak RSS +{grew / 1e6:.1f} MB over a {PAD / 1e6:.0f} MB answer; slowest ping {slowest:.3f}s"
    )
    # Read whole, the answer raised the router's peak by about 250 MB. Cut, it costs at most the 16 MiB
    # read before the cut (and usually nothing: the bytes fit in memory freed earlier).
    assert grew < 40e6, grew
    assert pings and slowest < 5.0, pings  # the others were served all along (timing is the machine's)


async def calls_handled(stack: LightStack, server: str) -> int:
    async with httpx2.AsyncClient(timeout=10) as http:
        answer = await http.get(f"{stack.catalog_url}/control/servers/{server}/calls")
    answer.raise_for_status()
    return int(answer.json()["calls"])


async def test_a_backend_whose_calls_stall_holds_only_its_own_pool(stack: LightStack) -> None:
    handled_before = await calls_handled(stack, "Cocktails")
    await control(stack, "Cocktails", "stall", seconds=STALL)
    try:
        async with mcp_client(stack) as slow_client, mcp_client(stack) as other:
            # four stalled calls: two hold Cocktails' pool, two wait in the router for it
            stalled = [
                asyncio.create_task(
                    slow_client.call_tool(
                        "call_tool", {"tool_name": "Search_by_name", "parameters": {"name": "x"}}
                    )
                )
                for _ in range(4)
            ]

            async def pool_is_full() -> bool:
                return await calls_handled(stack, "Cocktails") - handled_before == 2

            await until(pool_is_full, "two stalled calls reached Cocktails", WAIT)
            result = await other.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
            # contention while the other call ran: its pool full, two calls still queued behind it
            reached = await calls_handled(stack, "Cocktails") - handled_before
            waiting = sum(not call.done() for call in stalled)
            answers = await asyncio.gather(*stalled)
    finally:
        await control(stack, "Cocktails", "stall", seconds=0)
    assert not result.is_error
    assert (reached, waiting) == (2, 4)
    assert all(not answer.is_error for answer in answers)


async def test_a_listing_over_the_limit_leaves_the_backend_out(stack: LightStack) -> None:
    url = f"{stack.catalog_url}/servers/AI_Weather_by_Meteosource/mcp"
    listed = await list_tools("weather", url, {}, WAIT, max_response_bytes=1_000_000)
    assert len(listed.tools) == 10
    with pytest.raises(BackendUnavailable) as refused:
        await list_tools("weather", url, {}, WAIT, max_response_bytes=2048)
    assert "answered tools/list with more than 2048 bytes" in str(refused.value)
    assert "backends[].max_response_bytes" in str(refused.value)


async def test_the_registry_lists_with_each_backends_own_limit(stack: LightStack) -> None:
    lister = stack.indexer.lister
    backend = lister.registry.get("AI_Weather_by_Meteosource").config
    with pytest.raises(BackendUnavailable, match="more than 2048 bytes"):
        await lister.list_backend(backend.model_copy(update={"max_response_bytes": 2048}))
    with pytest.raises(BackendUnavailable, match="more than 2048 bytes"):
        await lister.probe(backend.model_copy(update={"max_response_bytes": 2048}), WAIT)
    assert len((await lister.list_backend(backend)).tools) == 10


# The bound itself, on answers made up in process


def answering(content: bytes, **headers: str) -> httpx2.MockTransport:
    return httpx2.MockTransport(lambda request: httpx2.Response(200, headers=headers, content=content))


async def read(transport: BoundedTransport, method: str = "POST") -> httpx2.Response:
    async with httpx2.AsyncClient(transport=transport) as http:
        return await http.request(method, "http://backend.test/mcp")


async def test_an_answer_within_the_limit_passes_unchanged() -> None:
    bounded = BoundedTransport(answering(b"x" * 1000), limit=1000)
    response = await read(bounded)
    assert response.status_code == 200 and response.content == b"x" * 1000 and not bounded.exceeded


async def test_a_declared_or_streamed_answer_over_the_limit_becomes_a_jsonrpc_error() -> None:
    declared = BoundedTransport(answering(b"x" * 1001), limit=1000)
    response = await read(declared)
    assert response.status_code == 502 and declared.exceeded
    assert response.json()["error"]["message"] == "the answer is larger than 1000 bytes"

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b"x" * 100

    streamed = BoundedTransport(
        httpx2.MockTransport(lambda request: httpx2.Response(200, content=chunks())), limit=1000
    )
    assert (await read(streamed)).status_code == 502 and streamed.exceeded
    get = BoundedTransport(httpx2.MockTransport(lambda request: httpx2.Response(200, content=chunks())), 1000)
    with pytest.raises(ResponseTooLarge):
        await read(get, "GET")


async def test_an_event_stream_counted_per_event_may_run_long_but_no_event_may_be_large() -> None:
    def events(*sizes: int) -> httpx2.MockTransport:
        async def chunks() -> AsyncIterator[bytes]:
            for size in sizes:  # each event split across two chunks, its blank line too
                event = b"data: " + b"x" * size + b"\r\n\r\n"
                yield event[: len(event) - 3]
                yield event[len(event) - 3 :]

        return httpx2.MockTransport(lambda request: httpx2.Response(200, content=chunks()))

    many = BoundedTransport(events(*[900] * 100), limit=1000, per_event=True)  # 90 kB in all
    assert len((await read(many, "GET")).content) == 100 * 910
    one_large = BoundedTransport(events(900, 1200, 900), limit=1000, per_event=True)
    with pytest.raises(ResponseTooLarge):
        await read(one_large, "GET")
    assert one_large.exceeded


async def test_compression_is_counted_decompressed() -> None:
    bomb = gzip.compress(b"\0" * 10_000_000)  # 10 MB that travel as about 10 kB
    bounded = BoundedTransport(answering(bomb, **{"content-encoding": "gzip"}), limit=1_000_000)
    assert (await read(bounded)).status_code == 502 and bounded.exceeded
    small = BoundedTransport(answering(gzip.compress(b"{}"), **{"content-encoding": "gzip"}), limit=1000)
    response = await read(small)
    assert response.content == b"{}" and "content-encoding" not in response.headers
    other = BoundedTransport(answering(b"...", **{"content-encoding": "br"}), limit=1000)
    refused = await read(other)
    assert refused.status_code == 502 and "Content-Encoding br is not accepted" in refused.text
