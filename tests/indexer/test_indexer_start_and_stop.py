"""How the indexer process starts and stops: a failed start leaves nothing running, and a stopping
server says NOT_SERVING before it stops taking calls.

The indexer's parts run in the test's loop (the fake embedder, no backends, the memory state); the
gRPC server listens on loopback and is watched through a real health client. Waits are bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from commands.ports import free_port
from indexer.api.process import IndexerProcess
from indexer.api.server import SERVICE_NAME, serving
from indexer.backends.backend_sessions import BackendSessionEnder
from indexer.embedder import FakeEmbedder
from indexer.retrieval.embeddings import Embeddings
from indexer.state import State
from indexer.upkeep.rebuilds import Rebuilder
from tests.support.indexers import running_indexer
from tests.support.waits import WAIT, wait_for
from toolsearch.config import Config, load_config

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def indexer_config(folder: Path, port: int = 0) -> Config:
    path = folder / "toolsearch.yaml"
    indexer = {"cache_dir": str(folder / "cache"), "listen": f"127.0.0.1:{port or free_port()}"}
    path.write_text(yaml.safe_dump({"indexer": indexer}))
    return load_config(path, {})


def spying(original: Callable[..., Any], part: object, name: str, closed: list[str]) -> Callable[..., Any]:
    """`original`, noting `name` in `closed` when it runs on `part` (and only then)."""

    def spy(self: object, *args: Any) -> Any:
        if self is part:
            closed.append(name)
        return original(self, *args)

    return spy


def record_closes(
    monkeypatch: pytest.MonkeyPatch, closed: list[str], parts: dict[str, tuple[object, type, str]]
) -> None:
    """Note in `closed`, by name, each part whose close method runs (on that very object)."""
    for name, (part, cls, method) in parts.items():
        monkeypatch.setattr(cls, method, spying(getattr(cls, method), part, name, closed))


async def test_a_part_failing_to_start_leaves_the_parts_started_before_it_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexer = IndexerProcess.build(indexer_config(tmp_path), FakeEmbedder(), {})
    assert indexer.ender is not None and indexer.monitor is not None
    closed: list[str] = []
    record_closes(
        monkeypatch,
        closed,
        {
            "transport": (indexer.transport, httpx2.AsyncHTTPTransport, "aclose"),
            "state": (indexer.state, State, "close"),
            "embeddings": (indexer.embeddings, Embeddings, "close"),
            "ender": (indexer.ender, BackendSessionEnder, "close"),
            "rebuilder": (indexer.rebuilder, Rebuilder, "close"),
        },
    )

    async def warm_up_fails() -> None:
        raise RuntimeError("the warm-up failed")

    monkeypatch.setattr(indexer.sessions, "warm", warm_up_fails)
    with pytest.raises(RuntimeError, match="the warm-up failed"):
        await indexer.start()
    # every part started before the warm-up is closed, the last started first
    assert closed == ["rebuilder", "ender", "embeddings", "state", "transport"]
    assert not indexer.monitor.tracked  # the probes, due after the warm-up, never started
    await indexer.close()  # nothing is left to close
    assert closed == ["rebuilder", "ender", "embeddings", "state", "transport"]


async def test_health_says_not_serving_before_the_server_stops_taking_calls(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    async with running_indexer(indexer_config(tmp_path, port), {}) as indexer:
        stopping = asyncio.Event()

        async def serve_until_stopped() -> None:
            async with serving(indexer, grace=WAIT):
                await stopping.wait()

        server = asyncio.create_task(serve_until_stopped())
        async with grpc.aio.insecure_channel(address) as channel:
            await asyncio.wait_for(channel.channel_ready(), WAIT)
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            first = await asyncio.wait_for(watch.read(), WAIT)
            stopping.set()
            # the watch, a call in flight, hears the server leave SERVING while the server drains it
            then = await asyncio.wait_for(watch.read(), WAIT)
            assert (first.status, then.status) == (SERVING, NOT_SERVING)
            watch.cancel()  # the balancer moves on; the server stops once nothing is in flight
            await wait_for(server.done)
            await server
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
