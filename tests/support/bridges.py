"""A bridge as a real process, and the stdio servers the tests give it.

    with running_bridge(tmp_path, [fake("echo", id="echo"), time_server(id="time")]) as bridge:
        async with mcp_client(bridge.mcp_url("echo")) as client:
            ...

The servers: mcp-server-time (PyPI, installed with the dev extra), `@modelcontextprotocol/
server-everything` (npm, installed by `make setup` under tests/servers/; tests that need it are
skipped without node), and the small ones of tests/support/stdio_servers.py.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.ports import free_port
from tests.support.processes import Proc, start_process

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "commands.cli"]
FAKE_SERVERS = ROOT / "tests" / "support" / "stdio_servers.py"
EVERYTHING = ROOT / "tests/servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

HAVE_EVERYTHING = shutil.which("node") is not None and EVERYTHING.is_file()
needs_everything = pytest.mark.skipif(
    not HAVE_EVERYTHING, reason="server-everything needs node and `make setup` (npm ci in tests/servers)"
)


def fake(kind: str, **backend: Any) -> dict[str, Any]:
    """A backend running one of tests/support/stdio_servers.py's servers."""
    return {"command": sys.executable, "args": [str(FAKE_SERVERS), kind], **backend}


def time_server(**backend: Any) -> dict[str, Any]:
    """A backend running mcp-server-time (its zone fixed, so that no machine's setting matters)."""
    return {
        "command": sys.executable,
        "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        **backend,
    }


def everything(**backend: Any) -> dict[str, Any]:
    """A backend running server-everything over stdio."""
    return {"command": "node", "args": [str(EVERYTHING), "stdio"], **backend}


@dataclass
class Bridge:
    url: str
    proc: Proc
    config_path: Path

    def mcp_url(self, backend: str) -> str:
        return f"{self.url}/{backend}/mcp"

    def health(self) -> dict[str, Any]:
        response = httpx2.get(f"{self.url}/healthz", timeout=5)
        response.raise_for_status()
        backends: dict[str, Any] = response.json()["backends"]
        return backends


def bridge_config(
    workdir: Path, backends: list[dict[str, Any]], **settings: Any
) -> tuple[Path, dict[str, Any]]:
    """A configuration file of stdio backends on a free port; returns its path and its content."""
    config: dict[str, Any] = {
        "bridge": {"listen": f"127.0.0.1:{free_port()}", **settings},
        "backends": backends,
    }
    path = workdir / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


@contextmanager
def running_bridge(
    workdir: Path,
    backends: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    every_start: bool = True,
    **settings: Any,
) -> Iterator[Bridge]:
    """`toolsearch bridge` over `backends`, once every shared server has started or failed.

    Its readiness stops waiting for a server far slower than the others (a busy machine can make
    one so), and requests for it are refused until it answers; so unless `every_start` is False (a
    test of a server that never answers), each first start is waited for too, at most 90 s.
    """
    path, config = bridge_config(workdir, backends, **settings)
    url = f"http://{config['bridge']['listen']}"
    proc = start_process([*CLI, "bridge", "--config", str(path)], f"{url}/readyz", timeout=90, env=env)
    try:
        if every_start:
            poll_until(lambda: _all_started(url), 90, "every stdio server's first start")
        yield Bridge(url, proc, path)
    finally:
        proc.stop()


def _all_started(url: str) -> bool:
    """Whether the bridge at `url` says no server's first start is pending."""
    answer = httpx2.get(f"{url}/readyz", timeout=10)
    return answer.status_code == 200 and not answer.json()["starting"]


@asynccontextmanager
async def mcp_client(url: str, **options: Any) -> AsyncIterator[Client]:
    """The SDK's client on a bridge endpoint (it negotiates, and falls back to the handshake)."""
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), **options) as c,
    ):
        yield c


def poll_until(condition: Any, timeout: float, what: str) -> Any:
    """Poll `condition` until it returns something true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if value := condition():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.1)
