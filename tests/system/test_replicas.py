"""Two indexer replicas sharing state through Redis, behind two routers: real processes on loopback.

Router A tries indexer 1 first and router B indexer 2 first; each has both addresses. One SDK client
alternates between the routers, so every session is served by both replicas. A small catalog keeps
start-up and probing cheap; a short probe interval and lease make changes and take-overs quick. Waits
are on conditions with bounded timeouts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.ports import free_port
from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.clients import Alternating, SessionIds, until
from tests.support.processes import Proc, start_process
from tests.support.redis import RedisServer, running_redis
from tests.support.stack import (
    CLI,
    HEADERS,
    START_TIMEOUT,
    grpc_ready,
    open_session,
    structured,
    wait_until,
    write_config,
)
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

WAIT = 30.0  # seconds any condition may take at most
WEATHER = "AI_Weather_by_Meteosource"
HEALTH = {"interval": 0.3, "timeout": 2.0, "unhealthy_after": 1}
QUERIES = ("current weather conditions", "nba teams and players", "cocktail with an ingredient")
ANONYMOUS = pb.Principal()
CLIENTS = 8  # concurrent clients of the kill-and-restart load


@dataclass
class Replicas:
    """Redis, a catalog server, two indexers and two routers (A: indexer 1 first; B: indexer 2 first)."""

    redis: RedisServer
    config_path: Path
    catalog_url: str
    indexers: list[str]  # HOST:PORT of indexer 1 and 2
    routers: list[int]  # ports of router A and B
    procs: dict[str, Proc] = field(default_factory=dict)

    def start_indexer(self, number: int) -> None:
        address = self.indexers[number - 1]
        env = {"TOOLSEARCH_INDEXER_LISTEN": address, "TOOLSEARCH_INDEXER_STATE": self.redis.url}
        proc = start_process([*CLI, "indexer", "--config", str(self.config_path)], None, env=env)
        self.procs[f"indexer{number}"] = proc
        wait_until(lambda: grpc_ready(address), START_TIMEOUT, proc)

    def kill_indexer(self, number: int) -> None:
        """SIGKILL: no goodbye, no lease handed on."""
        proc = self.procs.pop(f"indexer{number}")
        proc.send_signal(signal.SIGKILL)
        proc.popen.wait(timeout=10)
        proc.stop()

    def freeze_indexer(self, number: int, frozen: bool = True) -> None:
        """SIGSTOP (or SIGCONT): the replica holds every call it has, answering none."""
        self.procs[f"indexer{number}"].send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def control(self, server: str, action: str) -> None:
        httpx2.post(f"{self.catalog_url}/control/servers/{server}/{action}", timeout=5).raise_for_status()

    def mcp_url(self, router: int) -> str:
        return f"http://127.0.0.1:{self.routers[router]}/mcp"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    workdir = tmp_path_factory.mktemp("replicas")
    catalog = workdir / "catalog.jsonl"
    small_catalog(catalog)
    catalog_port, routers = free_port(), [free_port(), free_port()]
    indexers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    extra = {"indexer": {"health": HEALTH, "lease_ttl": 1.0}}
    config_path, _ = write_config(workdir, catalog, catalog_port, 0, routers[0], extra)
    with running_redis(workdir / "redis") as redis, ExitStack() as cleanup:
        args = [*CLI, "catalog-server", "--catalog", str(catalog), "--port", str(catalog_port), "--control"]
        catalog_url = f"http://127.0.0.1:{catalog_port}"
        cleanup.callback(start_process(args, f"{catalog_url}/healthz").stop)
        stack = Replicas(redis, config_path, catalog_url, indexers, routers)
        cleanup.callback(lambda: [proc.stop() for proc in stack.procs.values()])
        stack.start_indexer(1)  # embeds the catalog and stores the vectors in Redis
        stack.start_indexer(2)  # reads them back
        for name, port, order in (("A", routers[0], indexers), ("B", routers[1], indexers[::-1])):
            env = {
                "TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}",
                "TOOLSEARCH_INDEXER_ADDRESSES": ",".join(order),
            }
            router = [*CLI, "router", "--config", str(config_path)]
            stack.procs[f"router{name}"] = start_process(router, f"http://127.0.0.1:{port}/readyz", env=env)
        yield stack


@asynccontextmanager
async def client(url: str, ids: SessionIds | None = None, **http: Any) -> AsyncIterator[Client]:
    hooks = {"response": [ids]} if ids is not None else {}
    async with (
        httpx2.AsyncClient(timeout=30, event_hooks=hooks, **http) as http_client,
        Client(streamable_http_client(url, http_client=http_client), mode="legacy") as c,
    ):
        yield c


async def find(c: Client, query: str) -> tuple[list[str], int]:
    """The tool names find_tool returns and the number of the index version that answered."""
    result = await c.call_tool("find_tool", {"tool_description": query, "limit": 10})
    assert not result.is_error, result
    return [t["name"] for t in structured(result)["tools"]], int(
        (result.meta or {})["toolsearch/index"]["version"]
    )


def direct(address: str, session_id: str) -> tuple[int, int]:
    """The version number one indexer gives a session: from GetSession and from a FindTools."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.IndexerStub(channel)
        got = stub.GetSession(pb.GetSessionRequest(session_id=session_id, principal=ANONYMOUS), timeout=10)
        request = pb.FindToolsRequest(session_id=session_id, principal=ANONYMOUS, query=QUERIES[0], limit=3)
        found = stub.FindTools(request, timeout=10)
    return got.version.number, found.version.number


async def test_a_session_opened_through_one_router_and_indexer_is_served_through_the_other(
    replicas: Replicas,
) -> None:
    ids = SessionIds()
    async with client(replicas.mcp_url(0), ids, transport=Alternating(replicas.routers)) as c:
        versions = {(await find(c, query))[1] for query in QUERIES * 2}
        result = await c.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
        assert not result.is_error, result
        assert len(ids.seen) == 1 and len(versions) == 1
        (version,) = versions
        for address in replicas.indexers:
            assert await asyncio.to_thread(direct, address, ids.seen[0]) == (version, version)


async def test_a_killed_replica_costs_the_client_no_error_and_serves_the_same_sessions_after_a_restart(
    replicas: Replicas,
) -> None:
    ids = SessionIds()
    answered: list[int] = []  # version numbers, one per find_tool answer
    errors: list[BaseException] = []
    stop = asyncio.Event()

    async def calls(c: Client, offset: int) -> None:
        for n in itertools.count(offset):
            if stop.is_set():
                return
            try:
                answered.append((await find(c, QUERIES[n % len(QUERIES)]))[1])
            except Exception as exc:  # collected, so the report shows every failed call
                errors.append(exc)

    alternating = [Alternating(replicas.routers), Alternating(replicas.routers[::-1])]
    async with (
        client(replicas.mcp_url(0), ids, transport=alternating[0]) as first,
        client(replicas.mcp_url(1), ids, transport=alternating[1]) as second,
    ):
        before = {(await find(c, QUERIES[0]))[1] for c in (first, second)}
        running = [asyncio.create_task(calls(c, n)) for n, c in enumerate((first, second))]
        try:
            await until(lambda: _at_least(answered, 10), "calls before the kill")
            await asyncio.to_thread(replicas.kill_indexer, 1)  # the first replica: the lease holder
            killed_at = len(answered)
            await until(lambda: _at_least(answered, killed_at + 20), "calls after the kill")
        finally:
            stop.set()
            await asyncio.gather(*running)
        assert not errors, errors
        assert set(answered) == before and len(before) == 1
        assert "UNAVAILABLE" in replicas.procs["routerA"].output()  # its calls went to the lost replica
        await asyncio.to_thread(replicas.start_indexer, 1)
        (version,) = before
        for session_id in ids.seen:
            assert await asyncio.to_thread(direct, replicas.indexers[0], session_id) == (version, version)
        statuses = [await asyncio.to_thread(fetch, address, 5.0) for address in replicas.indexers]
        listed = [{s.session_id: s.version.number for s in status.sessions} for status in statuses]
        assert listed[0] == listed[1] and all(listed[0][i[:8]] == version for i in ids.seen)
    assert "this replica holds the lease" in replicas.procs["indexer2"].output()  # it took over


class Counted(Alternating):
    """Alternates between the routers and keeps every HTTP answer and failure a client met."""

    def __init__(self, ports: list[int], load: Load) -> None:
        super().__init__(ports)
        self.load = load

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        opening = request.method == "POST" and json.loads(request.content).get("method") == "initialize"
        if opening:
            self.load.opening[request] = time.monotonic()
        try:
            response = await super().handle_async_request(request)
        except httpx2.TransportError as exc:  # a reset, a refused connection: what a user would see
            self.load.errors.append(f"{request.method}: {type(exc).__name__} {exc}")
            raise
        finally:
            self.load.opening.pop(request, None)
        self.load.requests += 1
        if response.status_code >= 400:
            self.load.errors.append(f"{request.method}: HTTP {response.status_code}")
        return response


@dataclass
class Load:
    """Clients that open sessions, search, call a tool and close, over and over, through both routers."""

    replicas: Replicas
    requests: int = 0  # HTTP requests answered, initialize and DELETE included
    sessions: int = 0  # sessions opened and closed
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    opening: dict[httpx2.Request, float] = field(default_factory=dict)  # initialize requests: sent at

    async def session(self, ports: list[int], number: int) -> None:
        """One client session: initialize, search, call a tool, search, close."""
        try:
            async with (
                httpx2.AsyncClient(timeout=30, transport=Counted(ports, self)) as http,
                Client(
                    streamable_http_client(self.replicas.mcp_url(0), http_client=http), mode="legacy"
                ) as c,
            ):
                await find(c, QUERIES[number % len(QUERIES)])
                called = await c.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
                assert not called.is_error, called
                await find(c, QUERIES[(number + 1) % len(QUERIES)])
        except Exception as exc:  # collected, so the report shows every failure
            self.errors.append(f"{type(exc).__name__}: {exc}")
        else:
            self.sessions += 1

    async def client(self, number: int) -> None:
        ports = self.replicas.routers[number % 2 :] + self.replicas.routers[: number % 2]
        while not self.stop.is_set():
            await self.session(ports, number)

    async def more(self, count: int) -> None:
        target = self.requests + count
        await until(lambda: _at_least_value(lambda: self.requests, target), f"{count} more answers")


async def _at_least_value(value: Callable[[], int], target: int) -> bool:
    return value() >= target


async def freeze_amid_an_open(replicas: Replicas, load: Load, openers: list[asyncio.Task[None]]) -> int:
    """Freeze a replica a router sends to, once an `initialize` waits on it; returns its number.

    A router sends its calls where the last one was answered, so which replica that is depends on
    what happened before: each is frozen in turn, a session opened through each router at once
    (the router's next calls move on after a timeout), and thawed again if no open waits on it.
    """

    async def an_open_waits() -> bool:
        return any(time.monotonic() - sent > 1.0 for sent in list(load.opening.values()))

    for number in (1, 2):
        await asyncio.to_thread(replicas.freeze_indexer, number)
        openers += [asyncio.create_task(load.session([port], 0)) for port in replicas.routers]
        try:
            await until(an_open_waits, f"an initialize waiting on frozen indexer {number}", timeout=10)
        except AssertionError:
            await asyncio.to_thread(replicas.freeze_indexer, number, False)
            continue
        return number
    raise AssertionError("no initialize waited on either replica")


async def test_replicas_killed_and_restarted_under_clients_opening_sessions_cost_no_client_an_error(
    replicas: Replicas,
) -> None:
    load = Load(replicas)
    clients = [asyncio.create_task(load.client(n)) for n in range(CLIENTS)]
    try:
        await load.more(50)
        for _ in range(2):  # the replica in use, each time: SIGKILL amid an open, then back
            number = await freeze_amid_an_open(replicas, load, clients)
            await asyncio.to_thread(replicas.kill_indexer, number)
            await load.more(100)  # served by the other alone
            await asyncio.to_thread(replicas.start_indexer, number)
            await load.more(100)
    finally:
        load.stop.set()
        await asyncio.gather(*clients)
    print(f"\n{load.requests} HTTP requests, {load.sessions} sessions, {len(load.errors)} errors")
    assert load.errors == [], load.errors[:10]
    assert load.sessions >= CLIENTS


async def _at_least(items: list[int], count: int) -> bool:
    return len(items) >= count


async def test_a_health_change_gives_each_session_exactly_one_new_version_across_both_replicas(
    replicas: Replicas,
) -> None:
    ids = SessionIds()
    async with client(replicas.mcp_url(0), ids) as a, client(replicas.mcp_url(1), ids) as b:
        start = [(await find(c, QUERIES[0]))[1] for c in (a, b)]

        async def at(step: int) -> bool:
            return [(await find(c, QUERIES[0]))[1] for c in (a, b)] == [n + step for n in start]

        replicas.control(WEATHER, "down")
        try:
            await until(lambda: at(1), "both sessions on the version without the weather tools")
        finally:
            replicas.control(WEATHER, "up")
        await until(lambda: at(2), "both sessions on the version with the weather tools again")
        # the follower reports the backends as the lease holder judged them
        await until(lambda: _backends_agree(replicas), "both replicas report the same backend statuses")
        statuses = [await asyncio.to_thread(fetch, address, 5.0) for address in replicas.indexers]
    for session_id, first in zip(ids.seen, start, strict=True):
        seen = [next(s for s in status.sessions if s.session_id == session_id[:8]) for status in statuses]
        assert seen[0] == seen[1]  # one record, whichever replica answers
        swaps = [(s.previous.number, s.current.number, s.reason) for s in seen[0].swaps]
        assert swaps[-2:] == [
            (first, first + 1, f"backend {WEATHER} unhealthy"),
            (first + 1, first + 2, f"backend {WEATHER} recovered"),
        ]
        assert seen[0].version.number == first + 2


def _logged(proc: Proc, text: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return text in proc.output()

    return check


async def _backends_agree(replicas: Replicas) -> bool:
    statuses = [await asyncio.to_thread(fetch, address, 5.0) for address in replicas.indexers]
    seen = [{b.id: b.status for b in status.backends} for status in statuses]
    return seen[0] == seen[1] and seen[0][WEATHER] in ("healthy", "degraded")


async def test_a_redis_outage_answers_503_retry_shortly_and_no_replica_logs_a_traceback(
    replicas: Replicas,
) -> None:
    session_id = await asyncio.to_thread(open_session, replicas.mcp_url(0))
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
    call["params"] = {"name": "find_tool", "arguments": {"tool_description": QUERIES[0]}}
    headers = {**HEADERS, "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": "2025-11-25"}
    replicas.redis.stop()
    try:
        for router in (0, 1):
            answer = httpx2.post(replicas.mcp_url(router), json=call, headers=headers, timeout=30)
            assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
            assert answer.json()["error"]["message"] == "indexer unavailable, retry shortly"
        for name in ("indexer1", "indexer2"):  # each replica's lease loop notices on its next beat
            proc = replicas.procs[name]
            await until(_logged(proc, "shared state unavailable"), f"{name} reports the outage")
    finally:
        replicas.redis.start()  # empty: the sessions are gone, as with a Redis that lost its data
    for name in ("indexer1", "indexer2"):
        assert "Traceback" not in replicas.procs[name].output()
