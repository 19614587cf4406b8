"""The stack the benchmark measures, as real processes on loopback: catalog servers, an indexer, a router.

Each process writes its output to a log file in the stack's folder (a pipe left unread could block
it); a process that exits or does not get ready in time fails the run with the end of its log.
Catalog servers with a secret require a JWT signed with it on every server they serve, and the
indexer lists their servers with each caller's own token (passthrough): that is how sessions of
different callers get different catalogs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from commands.bench.common import CatalogFile
from commands.ports import free_port

FIND_DEADLINE = 60.0  # seconds the bench's routers wait for the indexer (router.indexer_timeout)
CLI = [sys.executable, "-m", "commands.cli"]
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
_LOOPBACK_ENV = {
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "PYTHONUNBUFFERED": "1",
}
POLL = 0.05  # seconds between readiness checks


def http_answers(url: str) -> bool:
    """Whether a GET of `url` answers 2xx now."""
    try:
        with _DIRECT.open(url, timeout=2.0) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError):
        return False


def grpc_serving(address: str) -> bool:
    """Whether the gRPC health service at `address` says SERVING."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class Proc:
    """A started process with its output in a log file, and a stop that always ends it."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **_LOOPBACK_ENV, **(env or {})},
                start_new_session=True,  # its own process group, so stop() can reap what it started
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


async def wait_for(condition: Callable[[], bool], timeout: float, proc: Proc) -> float:
    """Poll `condition` off the event loop until true; returns the seconds it took."""
    started = time.perf_counter()
    while not await asyncio.to_thread(condition):
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{proc.name} not ready within {timeout:g}s:\n{proc.tail()}")
        await asyncio.sleep(POLL)
    return time.perf_counter() - started


@dataclass
class CatalogSpec:
    """A catalog server to start; with `secret`, each of its servers requires a JWT signed with it."""

    name: str
    catalog: CatalogFile
    secret: str | None = None
    port: int = 0
    sessions: bool = False  # serve the initialize handshake only, a session per client

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, subject: str) -> str:
        """A bearer token this catalog server accepts."""
        assert self.secret is not None, f"catalog {self.name} needs no token"
        claims = {"sub": subject, "exp": int(time.time()) + 24 * 3600}
        return jwt.encode(claims, self.secret, algorithm="HS256")


def secret() -> str:
    """A fresh HS256 secret, long enough for the catalog server."""
    return secrets.token_hex(32)


class Stack:
    """Catalog servers, one indexer and one router, started and stopped one by one."""

    def __init__(
        self,
        folder: Path,
        model: Path,
        catalogs: list[CatalogSpec],
        extra: dict[str, dict[str, Any]] | None = None,
        logs: Path | None = None,
    ) -> None:
        self.folder = folder
        self.logs = logs
        folder.mkdir(parents=True, exist_ok=True)
        self.catalogs = {spec.name: spec for spec in catalogs}
        for spec in catalogs:
            spec.port = free_port()
        self.indexer_address = f"127.0.0.1:{free_port()}"
        self.router_port = free_port()
        self.cache_dir = folder / "cache"
        config: dict[str, Any] = {
            "router": {
                "listen": f"127.0.0.1:{self.router_port}",
                "indexer": [self.indexer_address],
                # every query is timed: one the router would give up on at its default deadline (5 s)
                # on a starved machine counts in the latencies, not as an error left out of them
                "indexer_timeout": FIND_DEADLINE,
            },
            "indexer": {
                "listen": self.indexer_address,
                "model": str(model),
                "cache_dir": str(self.cache_dir),
                "discovery_timeout": 60.0,  # hundreds of backends are listed at once on a busy machine
            },
            "catalog_servers": [
                {
                    "catalog": str(spec.catalog.path),
                    "listen": f"127.0.0.1:{spec.port}",
                    "require_jwt": spec.catalog.servers if spec.secret else [],
                }
                for spec in catalogs
            ],
        }
        for section, values in (extra or {}).items():
            for key, value in values.items():
                if isinstance(value, dict):
                    config.setdefault(section, {}).setdefault(key, {}).update(value)
                else:
                    config.setdefault(section, {})[key] = value
        self.config_path = folder / "toolsearch.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.procs: dict[str, Proc] = {}

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}/mcp"

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items() if proc.popen.poll() is None}

    def launch(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        """Start one process of the stack, its output in the stack's folder."""
        proc = Proc(name, args, self.folder / f"{name}.log", env)
        self.procs[name] = proc
        return proc

    async def start_catalogs(self) -> None:
        for spec in self.catalogs.values():
            args = [*CLI, "catalog-server", "--catalog", str(spec.catalog.path), "--port", str(spec.port)]
            env: dict[str, str] = {}
            if spec.secret:
                variable = f"TOOLSEARCH_BENCH_SECRET_{spec.name.upper()}"
                args += ["--require-jwt", "*", "--jwt-secret-env", variable]
                env[variable] = spec.secret
            if spec.sessions:
                args.append("--sessions")
            proc = self.launch(f"catalog-{spec.name}", args, env)
            await wait_for(functools.partial(http_answers, f"{spec.url}/healthz"), 60, proc)

    def variant(self, name: str, indexer: dict[str, Any]) -> Path:
        """A copy of the stack's configuration with some indexer settings replaced; returns its path."""
        config = yaml.safe_load(self.config_path.read_text())
        config["indexer"].update(indexer)
        path = self.folder / f"toolsearch-{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    async def start_indexer(self, timeout: float = 1800.0, config: Path | None = None) -> float:
        """Start the indexer (on `config`, default the stack's); returns the seconds until it serves."""
        self.stop("indexer")  # a restart: the log file goes on
        path = config or self.config_path
        proc = self.launch("indexer", [*CLI, "indexer", "--config", str(path)])
        return await wait_for(lambda: grpc_serving(self.indexer_address), timeout, proc)

    async def start_router(self) -> None:
        proc = self.launch("router", [*CLI, "router", "--config", str(self.config_path)])
        await wait_for(lambda: http_answers(f"http://127.0.0.1:{self.router_port}/readyz"), 120, proc)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.stop()

    def close(self) -> None:
        """Stop the router first, then the indexer, then the catalog servers; keep their logs."""
        for name in ["router", "indexer", *self.procs]:
            self.stop(name)
        if self.logs is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
            for log in self.folder.glob("*.log"):
                shutil.copy(log, self.logs / f"{self.folder.name}-{log.name}")
