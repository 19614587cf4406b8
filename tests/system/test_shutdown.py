"""Stopping and killing: SIGTERM drains what is in flight; SIGKILL mid-embedding leaves a usable cache.

The drain tests start a router or an indexer of their own next to a running stack, slow a backend
so that a request is surely in flight, wait until the backend has received it (the catalog server
counts requests on arrival), send SIGTERM, and check that the request completes and the process
exits 0 within its grace period; a call that outlasts the grace gets a JSON-RPC error instead. The
kill test embeds a cold catalog, SIGKILLs the indexer once the first chunk of vectors is committed,
and restarts it on the same cache folder. A router told to stop while a client holds a standalone
stream ends that stream at once, rather than waiting out its grace.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx2
import jwt
import pytest
import yaml

from commands.ports import free_port
from tests.support.asking import asking_stack
from tests.support.catalogs import small_catalog
from tests.support.clients import RawClient, listening
from tests.support.processes import Proc, start_process
from tests.support.routers import another_router
from tests.support.stack import (
    CLI,
    DEMO_CATALOG,
    HEADERS,
    START_TIMEOUT,
    Stack,
    grpc_ready,
    open_session,
    running_stack,
    wait_until,
    write_config,
)
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

GRACE = 8.0  # router.shutdown_grace and indexer.shutdown_grace of these tests
SLOW = 2.0  # seconds the slowed backend takes to answer
SECRET = "shutdown-test-secret-long-enough-for-hs256"
WAIT = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("shutdown")
    small_catalog(folder / "catalog.jsonl")
    extra = {
        "router": {"shutdown_grace": GRACE},
        "indexer": {"shutdown_grace": GRACE, "health": {"enabled": False}},
    }
    with running_stack(
        folder,
        catalog=folder / "catalog.jsonl",
        extra=extra,
        require_jwt=["Cocktails"],
        env={"TOOLSEARCH_CATALOG_JWT_SECRET": SECRET},
        backend_timeout=10.0,
    ) as running:
        yield running


def exits_cleanly(proc: Proc, signalled: float) -> float:
    """Wait for `proc` to exit after a SIGTERM sent at `signalled`; returns the seconds it took."""
    wait_until(lambda: proc.returncode is not None, GRACE + 10)
    took = time.monotonic() - signalled
    assert proc.returncode == 0, proc.output()
    return took


async def test_sigterm_lets_a_router_finish_a_call_in_flight_then_exit_0(stack: Stack) -> None:
    port = free_port()
    router = start_process(
        [*CLI, "router", "--config", str(stack.config_path)],
        f"http://127.0.0.1:{port}/readyz",
        env={"TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}"},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    session = open_session(url)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "call_tool",
            "arguments": {"tool_name": "Get_All_Teams", "parameters": {"page": "1"}},
        },
    }
    headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    stack.control("Free_NBA", "slow", seconds=SLOW)
    try:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            arrived = stack.requests("Free_NBA")
            answer = asyncio.create_task(http.post(url, json=call, headers=headers))
            await until(lambda: stack.requests("Free_NBA") > arrived, "the call reached the backend")
            signalled = time.monotonic()
            router.send_signal(signal.SIGTERM)
            response = await answer
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        assert not result["isError"], result
        assert result["structuredContent"]["arguments"] == {"page": "1"}
        took = await asyncio.to_thread(exits_cleanly, router, signalled)
    finally:
        stack.control("Free_NBA", "slow", seconds=0)
        router.stop()
    assert took < GRACE, took


async def test_a_call_still_running_when_the_grace_ends_gets_a_jsonrpc_error(stack: Stack) -> None:
    config = {**stack.config, "router": {**stack.config["router"], "shutdown_grace": 0.5}}
    path = stack.workdir / "short-grace.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    router = start_process(
        [*CLI, "router", "--config", str(path)],
        f"http://127.0.0.1:{port}/readyz",
        env={"TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}"},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "call_tool", "arguments": {"tool_name": "Get_All_Teams", "parameters": {}}},
    }
    headers = {**HEADERS, "Mcp-Session-Id": open_session(url), "MCP-Protocol-Version": "2025-11-25"}
    stack.control("Free_NBA", "slow", seconds=5)
    try:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            arrived = stack.requests("Free_NBA")
            answer = asyncio.create_task(http.post(url, json=call, headers=headers))
            await until(lambda: stack.requests("Free_NBA") > arrived, "the call reached the backend")
            router.send_signal(signal.SIGTERM)
            response = await answer
        await asyncio.to_thread(exits_cleanly, router, time.monotonic())
    finally:
        stack.control("Free_NBA", "slow", seconds=0)
        output = router.stop()
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    error = response.json()
    assert error["id"] == 7 and "router.shutdown_grace is 0.5s" in error["error"]["message"]
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output


async def test_sigterm_lets_an_indexer_finish_opening_a_session_then_exit_0(stack: Stack) -> None:
    port = free_port()
    indexer = start_process(
        [*CLI, "indexer", "--config", str(stack.config_path)],
        None,
        env={"TOOLSEARCH_INDEXER_LISTEN": f"127.0.0.1:{port}"},
    )
    address = f"127.0.0.1:{port}"
    try:
        await asyncio.to_thread(wait_until, lambda: grpc_ready(address), START_TIMEOUT, indexer)
        stack.control("Cocktails", "slow", seconds=SLOW)
        token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")
        request = pb.OpenSessionRequest(
            principal=pb.Principal(issuer="https://issuer.test", subject="alice"),
            credentials=pb.Credentials(bearer_token=token),
        )
        arrived = stack.requests("Cocktails")
        async with grpc.aio.insecure_channel(address) as channel:
            opening = asyncio.ensure_future(pb_grpc.IndexerStub(channel).OpenSession(request, timeout=WAIT))
            await until(lambda: stack.requests("Cocktails") > arrived, "the listing reached the backend")
            signalled = time.monotonic()
            indexer.send_signal(signal.SIGTERM)
            opened = await opening
        assert opened.session_id and "Cocktails" in opened.backends
        took = await asyncio.to_thread(exits_cleanly, indexer, signalled)
    finally:
        stack.control("Cocktails", "slow", seconds=0)
        indexer.stop()
    assert took < GRACE + 6, took  # the grace, plus the interpreter's own exit


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll a blocking `check` off the loop until it holds; fail after `WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT}s: {what}")
        await asyncio.sleep(0.02)


# SIGKILL while embedding


def cold_catalog(path: Path, copies: int = 1) -> int:
    """The demo catalog `copies` times over, under renamed servers: texts no cache has seen (2+ chunks)."""
    lines = [json.loads(line) for line in DEMO_CATALOG.read_text(encoding="utf-8").splitlines() if line]
    tools = [{**tool, "server": f"{tool['server']} {copy}"} for copy in range(copies) for tool in lines]
    path.write_text("".join(json.dumps(tool) + "\n" for tool in tools), encoding="utf-8")
    return len(tools)


def stored_vectors(cache_dir: Path) -> int:
    files = list(cache_dir.glob("embeddings-*.sqlite3"))
    if not files:
        return 0
    connection = sqlite3.connect(files[0], timeout=5)
    try:
        return int(connection.execute("SELECT count(*) FROM vectors").fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # the table is not created yet
    finally:
        connection.close()


def metric(url: str, name: str) -> float:
    text = httpx2.get(url, timeout=5).text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from {url}"
    return float(match.group(1))


def test_an_indexer_killed_while_embedding_restarts_on_its_cache_and_serves(tmp_path: Path) -> None:
    cold_catalog(tmp_path / "catalog.jsonl")
    catalog_port, indexer_port, metrics_port = free_port(), free_port(), free_port()
    cache_dir = tmp_path / "cache"  # its own: the cold start is the subject
    metrics_listen = f"127.0.0.1:{metrics_port}"
    extra = {
        "indexer": {
            "health": {"enabled": False},
            "health_listen": metrics_listen,
            "cache_dir": str(cache_dir),
        }
    }
    config, _ = write_config(
        tmp_path, tmp_path / "catalog.jsonl", catalog_port, indexer_port, free_port(), extra
    )
    address, metrics_url = f"127.0.0.1:{indexer_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    catalog = start_process(
        [*CLI, "catalog-server", "--catalog", str(tmp_path / "catalog.jsonl"), "--port", str(catalog_port)],
        f"http://127.0.0.1:{catalog_port}/healthz",
    )
    indexer = start_process([*CLI, "indexer", "--config", str(config)], None)
    try:
        seen = [0]

        def first_chunk_committed() -> bool:
            seen[-1] = stored_vectors(cache_dir)
            return seen[-1] > 0

        wait_until(first_chunk_committed, START_TIMEOUT, indexer)
        assert not grpc_ready(address)  # not serving yet: still embedding its catalog
        indexer.popen.send_signal(signal.SIGKILL)
        indexer.popen.wait()
        committed = seen[-1]  # at least: the file is not opened again before the restart recovers it
        indexer.stop()
        indexer = start_process([*CLI, "indexer", "--config", str(config)], None)
        wait_until(lambda: grpc_ready(address), START_TIMEOUT, indexer)
        # it serves: a session opens and finds tools
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.IndexerStub(channel)
            session = stub.OpenSession(pb.OpenSessionRequest(principal=pb.Principal()), timeout=WAIT)
            found = stub.FindTools(
                pb.FindToolsRequest(session_id=session.session_id, query="cocktail recipes", limit=3),
                timeout=WAIT,
            )
        assert len(found.tools) == 3
        # what was committed before the kill was kept and used; the rest was embedded now
        assert metric(metrics_url, "toolsearch_indexer_embedding_cache_hits_total") >= committed
        assert metric(metrics_url, "toolsearch_indexer_embedding_cache_misses_total") > 0
        connection = sqlite3.connect(next(cache_dir.glob("embeddings-*.sqlite3")), timeout=5)
        try:
            assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert connection.execute("SELECT count(*) FROM vectors").fetchone()[0] > committed
        finally:
            connection.close()
        assert not list(cache_dir.glob("*.corrupt"))  # never found damaged, never discarded
        assert "damaged" not in indexer.output()
    finally:
        indexer.stop()
        catalog.stop()


async def test_a_router_told_to_stop_ends_its_standalone_streams_at_once_instead_of_waiting_its_grace(
    tmp_path: Path,
) -> None:
    """A router process beside a light stack whose backend keeps standalone streams (the asking
    server): SIGTERM while a client holds one, and the process exits 0 long before its grace."""
    async with asking_stack(tmp_path, timeout=10) as stack:
        # a grace far longer than the wait below: only streams that end by themselves let it stop in time
        stopping, url = await asyncio.to_thread(another_router, stack, "stopping", {"shutdown_grace": 120})
        try:
            async with httpx2.AsyncClient(timeout=30) as http:
                client = RawClient(http)
                await client.initialize(f"{url}/mcp")
                async with listening(http, client, f"{url}/mcp") as stream:
                    assert stream.status == 200
                    stopping.send_signal(signal.SIGTERM)
                    await asyncio.to_thread(stopping.wait_exit, 30)
        finally:
            stopping.stop()
    assert stopping.returncode == 0
