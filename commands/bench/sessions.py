"""Session open: `initialize` to the first find_tool answer, warm and cold, and what a cold one costs others.

Warm: the session's catalog is embedded and indexed already (the indexer did it at start-up), so an
open is a handshake, a catalog lookup and a search. Cold: the session's catalog has never been
embedded. The indexer embeds every caller-independent backend before it serves, so the one way a
session meets a catalog nobody has embedded is a catalog that depends on who it is: backends listed
with the caller's own token (passthrough). The cold figure is therefore the first session of a
caller whose token opens a JWT-protected catalog server: listing its servers with that token,
embedding their tools, building the index, then the search. While it runs, another session (another
caller, another catalog) keeps sending find_tool at a steady pace; its latencies during the cold
open are compared with its own baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import mcp_types as types

from commands.bench.common import summarize
from commands.bench.latency import LIMIT, connect, find, found_tools


async def open_once(url: str, query: str, token: str | None = None) -> dict[str, float]:
    """One session: seconds for `initialize`, for the first find_tool, and for both."""
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(
            name="find_tool", arguments={"tool_description": query, "limit": LIMIT}
        )
    )
    started = time.perf_counter()
    async with connect(url, token) as client:
        initialized = time.perf_counter()
        # sent as is: the SDK's call_tool would list the tools first to check the answer's schema
        found_tools(await client.session.send_request(request, types.CallToolResult))
        answered = time.perf_counter()
    return {"total": answered - started, "initialize": initialized - started, "find": answered - initialized}


async def open_many(url: str, queries: Sequence[str], token: str | None = None) -> dict[str, Any]:
    """Sessions opened one after another, each with its own query."""
    runs = [await open_once(url, query, token) for query in queries]
    return {
        **summarize([r["total"] for r in runs]),
        "initialize": summarize([r["initialize"] for r in runs]),
        "find": summarize([r["find"] for r in runs]),
    }


class SteadyLoad:
    """find_tool from one session at a fixed pace, each request with its own query, timestamped."""

    def __init__(self, client: Any, queries: Sequence[str], rate: float) -> None:
        self._client = client
        self._queries = iter(queries)
        self._interval = 1.0 / rate
        self.samples: list[tuple[float, float]] = []  # (started, seconds)
        self._stop = asyncio.Event()

    async def run(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            query = next(self._queries, None)
            if query is None:
                raise RuntimeError("the steady load ran out of queries")
            started = time.perf_counter()
            await find(self._client, query)
            self.samples.append((started, time.perf_counter() - started))
            due = max(due + self._interval, time.perf_counter())
            with contextlib.suppress(TimeoutError):  # the pause ends early when the load is stopped
                await asyncio.wait_for(self._stop.wait(), timeout=due - time.perf_counter())

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> list[float]:
        return [seconds for started, seconds in self.samples if start <= started < end]


async def cold_open(
    url: str,
    cold_token: str,
    steady_token: str,
    cold_query: str,
    steady_queries: Sequence[str],
    warm_queries: Sequence[str],
    rate: float,
    baseline_seconds: float,
) -> dict[str, Any]:
    """The first session of a not-yet-embedded catalog, with a steady load from another session."""
    async with connect(url, steady_token) as steady:
        await steady.list_tools()
        queries = iter(steady_queries)
        await find(steady, next(queries))  # its own first open embedded its catalog; settle before timing
        load = SteadyLoad(steady, list(queries), rate)
        task = asyncio.create_task(load.run())
        baseline_start = time.perf_counter()
        await asyncio.sleep(baseline_seconds)
        cold_start = time.perf_counter()
        cold = await open_once(url, cold_query, cold_token)
        cold_end = time.perf_counter()
        load.stop()
        await task
    baseline = summarize(load.between(baseline_start, cold_start))
    during = summarize(load.between(cold_start, cold_end))
    warm = await open_many(url, warm_queries, cold_token)
    return {
        "open_seconds": round(cold["total"], 3),
        "initialize_seconds": round(cold["initialize"], 3),
        "find_seconds": round(cold["find"], 3),
        "steady_rate_per_second": rate,
        "steady_baseline": baseline,
        "steady_during": during,
        "steady_p99_ratio": round(during["p99_ms"] / baseline["p99_ms"], 2) if baseline["p99_ms"] else None,
        "others_slowed_past_p99": during["p99_ms"] > baseline["p99_ms"],
        "same_caller_next_opens": warm,
    }
