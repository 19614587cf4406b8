"""Per-request latency: the in-process floor, find_tool through the router, call_tool beside the backend.

The floor is what a find_tool cannot avoid: the indexer's own model call for the query (the whole
query and each of its sentences, one call, as the indexer batches them) and the indexer's own search
over an index built by the indexer's own code. Everything else a find_tool through the router takes
is overhead: HTTP, the MCP SDK on both sides, the session check and the gRPC hop to the indexer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.bench.common import CpuMeter, interleaved, summarize
from indexer.embedder import Embedder
from indexer.retrieval.index import IndexVersion
from indexer.retrieval.query import Query
from indexer.retrieval.text import query_texts

LIMIT = 8  # the default find_tool limit: what a client gets when it asks for nothing else
TIMEOUT = 1800.0  # seconds; a cold session open embeds a whole catalog before it answers


_pool: list[httpx2.AsyncHTTPTransport] = []  # one connection pool for every client of a run


def _transport() -> httpx2.AsyncHTTPTransport:
    # An HTTP client with a pool of its own builds a TLS context first (about 20 ms), a cost of the
    # client's set-up that would land in the server's figures; the router shares one pool the same way.
    if not _pool:
        _pool.append(httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=200)))
    return _pool[0]


@asynccontextmanager
async def connect(url: str, token: str | None = None, mode: str = "legacy") -> AsyncIterator[Client]:
    """An SDK client with its own session (an `initialize` handshake in legacy mode)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(TIMEOUT)
    # not closed: closing a client closes its transport, the shared pool
    http = httpx2.AsyncClient(headers=headers, timeout=timeout, transport=_transport(), trust_env=False)
    transport = streamable_http_client(url, http_client=http)
    async with Client(transport, mode=mode, read_timeout_seconds=TIMEOUT) as client:
        yield client


async def close_clients() -> None:
    """Close the connection pool the clients of a run share."""
    while _pool:
        await _pool.pop().aclose()


def found_tools(result: types.CallToolResult) -> list[dict[str, Any]]:
    """The tools of a find_tool answer; raises when it is an error or empty."""
    data = result.structured_content
    if result.is_error or not isinstance(data, dict) or not data.get("tools"):
        text = result.content[0].text if result.content and hasattr(result.content[0], "text") else ""
        raise RuntimeError(f"find_tool failed or found nothing: {text[:300]}")
    tools: list[dict[str, Any]] = data["tools"]
    return tools


async def find(client: Client, query: str) -> list[dict[str, Any]]:
    """One find_tool call the way an application makes it (the SDK checks the structured output)."""
    return found_tools(await client.call_tool("find_tool", {"tool_description": query}))


def floor_once(embedder: Embedder, version: IndexVersion, query: str) -> tuple[float, float, int, float]:
    """One floor query: (seconds in all, seconds embedding, texts embedded, CPU seconds of the model
    call: every thread of this process, which runs nothing else meanwhile)."""
    started = time.perf_counter()
    parts = query_texts(query)
    cpu = time.process_time()
    vectors = embedder.embed(parts)
    model_cpu = time.process_time() - cpu
    embedded = time.perf_counter()
    if not version.find(Query.embedded(query, vectors), LIMIT):
        raise RuntimeError(f"the floor's search found nothing for {query!r}")
    return time.perf_counter() - started, embedded - started, len(parts), model_cpu


def floor(
    embedder: Embedder, version: IndexVersion, queries: Sequence[str], warmup: Sequence[str]
) -> dict[str, Any]:
    """Embed each query (one model call, like the indexer's batch) and search, one query at a time."""
    for query in warmup:
        floor_once(embedder, version, query)
    runs = [floor_once(embedder, version, query) for query in queries]
    return {
        **summarize([total for total, _, _, _ in runs]),
        "embed": summarize([embed for _, embed, _, _ in runs]),
        "search": summarize([total - embed for total, embed, _, _ in runs]),
        "texts_per_query": round(sum(n for _, _, n, _ in runs) / max(len(runs), 1), 2),
        # the model's own CPU per query: what the indexer's CPU per find_tool is held against
        "model_cpu_ms_per_query": round(1000 * sum(cpu for *_, cpu in runs) / max(len(runs), 1), 3),
    }


def describe(exc: BaseException) -> str:
    """The innermost error of an exception (group), for the report."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return repr(exc)[:200]


async def find_tool_load(
    url: str,
    per_client: Sequence[Sequence[str]],
    warmup: Sequence[str],
    pids: dict[str, int],
    beside: Callable[[str], float] | None = None,
    finder: Callable[[Client, str], Awaitable[object]] = find,
) -> dict[str, Any]:
    """Concurrent clients, each its own session sending its own queries back to back.

    `finder(client, query)` sends one query: find_tool by default, another server's search tool for
    a peer measured the same way.

    Every client connects and lists the tools (as applications do) before the clock starts, and a
    separate client sends the `warmup` queries first, so the figures are of a running system, not a
    start-up. Each client runs in its own task: a client whose session breaks counts its unsent
    queries as errors and the others go on. `cpu` is what each process of `pids` (and everything
    else on the machine) used while the clock ran.

    With `beside` (one client), `beside(query)` runs before each request and its seconds are
    reported as `beside`: the floor measured in the same minutes as the router, query by query, so a
    change in the machine's other load moves both. Its CPU is left out of the `bench` figure.
    """
    beside_seconds: list[float] = []
    beside_cpu = [0.0]
    latencies: list[float] = []
    errors: list[str] = []
    warmup_errors: list[str] = []
    async with connect(url) as client:
        for query in warmup:
            try:
                await finder(client, query)
            except Exception as exc:
                warmup_errors.append(describe(exc))
    ready, go = asyncio.Semaphore(0), asyncio.Event()

    async def run(queries: Sequence[str]) -> None:
        handled, signalled = 0, False
        try:
            async with connect(url) as client:
                await client.list_tools()
                ready.release()
                signalled = True
                await go.wait()
                for query in queries:
                    if beside is not None:
                        cpu = time.thread_time()
                        beside_seconds.append(beside(query))
                        beside_cpu[0] += time.thread_time() - cpu
                    started = time.perf_counter()
                    try:
                        await finder(client, query)
                    except Exception as exc:  # counted and reported, never timed as an answer
                        errors.append(describe(exc))
                    else:
                        latencies.append(time.perf_counter() - started)
                    handled += 1
        except Exception as exc:  # the session broke: the queries it did not get answered fail
            errors.extend([describe(exc)] * (len(queries) - handled))
            if not signalled:
                ready.release()

    tasks = [asyncio.create_task(run(queries)) for queries in per_client]
    for _ in tasks:
        await ready.acquire()
    meter = CpuMeter(pids)
    started = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - started
    cpu = meter.stop(requests=len(latencies), excluded={"bench": beside_cpu[0]})
    extra = {"beside": summarize(beside_seconds)} if beside is not None else {}
    return {
        **extra,
        "clients": len(per_client),
        **summarize(latencies),
        "throughput_per_second": round(len(latencies) / wall, 2),
        "wall_seconds": round(wall, 3),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "warmup_errors": warmup_errors[:3],
        "cpu": cpu,
    }


def call_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Plain values for every property of a tool's input schema (a string for anything untyped)."""
    values = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    properties = schema.get("properties") or {}
    return {name: values.get(str(spec.get("type")), "bench") for name, spec in properties.items()}


async def call_tool_latency(
    router_url: str, backend_url: str, advertised: str, original: str, arguments: dict[str, Any], calls: int
) -> dict[str, Any]:
    """call_tool through the router, and the same tool called on its backend directly, in turns.

    `backend_direct` is one SDK client session kept open, one `tools/call` per call: the backend's own
    time. `backend_fresh_client` opens a client per call, as the router does for every call_tool.
    """
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=original, arguments=arguments))
    through_router = {"tool_name": advertised, "parameters": arguments}

    async def direct(client: Client) -> None:
        result = await client.session.send_request(request, types.CallToolResult)
        if result.is_error:
            raise RuntimeError(f"the backend refused the call: {result.content}")

    async with connect(router_url) as routed_client, connect(backend_url, mode="auto") as client:
        await routed_client.list_tools()

        async def routed() -> None:
            result = await routed_client.call_tool("call_tool", through_router)
            if result.is_error:
                raise RuntimeError(f"call_tool failed: {json.dumps(result.model_dump(mode='json'))[:300]}")

        # in turns, so that both medians are of the same moments of a shared machine's load
        through, kept = await interleaved(routed, lambda: direct(client), calls)
        mode = client.protocol_version
    fresh: list[float] = []
    for _ in range(calls + 2):
        started = time.perf_counter()
        async with connect(backend_url, mode=mode if mode.startswith("2026") else "legacy") as client:
            await direct(client)
        fresh.append(time.perf_counter() - started)
    return {
        "tool": advertised,
        "router": summarize(through),
        "backend_direct": summarize(kept),
        "backend_fresh_client": summarize(fresh[2:]),
        "backend_protocol": mode,
    }
