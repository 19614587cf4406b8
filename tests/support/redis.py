"""A real redis-server for tests: on a free loopback port, in a temporary folder, never persisting.

    with running_redis(tmp_path) as server:
        state = await open_state(server.url, ...)
        ...

Tests that need it are skipped when redis-server is not installed (`scripts/ensure-redis` installs
it; `make test` runs that first).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from commands.ports import free_port
from indexer.state import State, make_state
from tests.support.processes import Proc, start_process
from tests.support.stack import wait_until

START_TIMEOUT = 10.0


def redis_answers(port: int) -> bool:
    """Whether a redis-server answers PING on the port now (a raw RESP exchange: no client needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """A running redis-server and the URL to reach it."""

    port: int
    folder: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again, on the same port, empty: nothing is saved)."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (scripts/ensure-redis installs it)")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = start_process([*args, "--dir", str(self.folder)], ready_url=None)
        wait_until(lambda: redis_answers(self.port), START_TIMEOUT, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    """A redis-server for the block; stopped after it, whatever happened."""
    folder.mkdir(parents=True, exist_ok=True)
    server = RedisServer(free_port(), folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def open_state(
    url: str,
    identity: str,
    dimension: int,
    session_ttl: float = 86_400.0,
    lease_ttl: float = 10.0,
    prefix: str = "toolsearch:",
) -> State:
    """The state backend at a Redis `url`, checked to answer (else `StateUnavailable`, nothing left open)."""
    state = make_state(url, identity, dimension, session_ttl=session_ttl, lease_ttl=lease_ttl, prefix=prefix)
    try:
        await state.ready()
    except BaseException:
        if state.embeddings is not None:
            state.embeddings.close()
        await state.close()
        raise
    return state
