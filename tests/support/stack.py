"""The whole stack as real processes on loopback: a catalog server, an indexer and routers."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx2
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from commands.ports import free_port
from tests.support.processes import Proc, start_process
from toolsearch.config import load_config
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME
from toolsearch.transport import ChannelSecurity, channel_security, sync_channel

ROOT = Path(__file__).resolve().parents[2]
DEMO_CATALOG = ROOT / "examples" / "catalog.jsonl"
MODEL = ROOT / "models" / TUNED_MODEL_NAME  # the model the indexer serves by default
# One embedding cache for the suite's stacks (every worker, every run; SQLite shares it between
# processes): a catalog is embedded once per model, and each later stack's indexer starts warm, which
# saves it about 8 s of CPU on two cores. Tests whose subject is the cache or a cold start give their
# own `cache_dir`.
EMBEDDING_CACHE = ROOT / ".toolsearch" / "cache"
CLI = [sys.executable, "-m", "commands.cli"]
START_TIMEOUT = 180.0  # a cold indexer embeds every tool before it serves
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}


def open_session(mcp_url: str, headers: dict[str, str] | None = None) -> str:
    """A handshake-era session opened with a raw initialize; returns its Mcp-Session-Id."""
    response = httpx2.post(mcp_url, json=INITIALIZE, headers={**HEADERS, **(headers or {})}, timeout=30)
    assert response.status_code == 200, response.text
    return str(response.headers["mcp-session-id"])


def grpc_ready(address: str, timeout: float = 1.0, security: ChannelSecurity | None = None) -> bool:
    """Whether the indexer's standard health service says SERVING (over TLS when `security` says)."""
    with sync_channel(address, security) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass
class Stack:
    """Addresses and processes of a running stack."""

    workdir: Path
    config_path: Path
    config: dict[str, Any]
    catalog_url: str
    indexer_address: str
    router_urls: list[str]
    procs: dict[str, Proc] = field(default_factory=dict)
    service_args: list[str] = field(default_factory=list)  # e.g. --log-level debug, for indexer and routers
    env: dict[str, str] = field(default_factory=dict)  # added to the environment of every process
    security: ChannelSecurity | None = None  # how the config's routers reach the indexer (TLS, secret)

    @property
    def mcp_url(self) -> str:
        return f"{self.router_urls[0]}/mcp"

    def backend_url(self, server: str) -> str:
        return f"{self.catalog_url}/servers/{server}/mcp"

    def control(self, server: str, action: str, **params: Any) -> None:
        """Drive the catalog server's test controls: down, up, slow."""
        response = httpx2.post(
            f"{self.catalog_url}/control/servers/{server}/{action}", params=params, timeout=5
        )
        response.raise_for_status()

    def calls(self, server: str) -> int:
        """How many tools/call requests the catalog server has handled for `server`."""
        return self._counter(server, "calls")

    def requests(self, server: str) -> int:
        """How many MCP requests the catalog server has received for `server` (counted on arrival)."""
        return self._counter(server, "requests")

    def _counter(self, server: str, name: str) -> int:
        response = httpx2.get(f"{self.catalog_url}/control/servers/{server}/calls", timeout=5)
        response.raise_for_status()
        return int(response.json()[name])

    def start_indexer(self) -> Proc:
        proc = start_process(
            [*CLI, "indexer", "--config", str(self.config_path), *self.service_args],
            ready_url=None,
            env=self.env,
        )
        self.procs["indexer"] = proc
        wait_until(lambda: grpc_ready(self.indexer_address, security=self.security), START_TIMEOUT, proc)
        return proc

    def stop_indexer(self) -> str:
        return self.procs.pop("indexer").stop()


def wait_until(condition: Any, timeout: float, proc: Proc | None = None) -> None:
    """Poll `condition` until true; fail with the process output on timeout or exit."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.returncode is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{proc.output()}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"condition not met within {timeout}s" + (f":\n{proc.output()}" if proc else "")
            )
        time.sleep(0.05)


def write_config(
    workdir: Path,
    catalog: Path,
    catalog_port: int,
    indexer_port: int,
    router_port: int,
    extra: dict[str, Any] | None = None,
    backend_timeout: float = 30.0,
    require_jwt: Sequence[str] = (),
) -> tuple[Path, dict[str, Any]]:
    config: dict[str, Any] = {
        "router": {"listen": f"127.0.0.1:{router_port}", "indexer": [f"127.0.0.1:{indexer_port}"]},
        "indexer": {
            "listen": f"127.0.0.1:{indexer_port}",
            "model": str(MODEL),
            "cache_dir": str(EMBEDDING_CACHE),
            "discovery_timeout": 10.0,
        },
        "catalog_servers": [
            {
                "catalog": str(catalog),
                "listen": f"127.0.0.1:{catalog_port}",
                "backend_timeout": backend_timeout,
                "require_jwt": list(require_jwt),
            }
        ],
    }
    for section, values in (extra or {}).items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    path = workdir / "toolsearch.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


def planned_stack(
    workdir: Path,
    catalog: Path,
    routers: int,
    extra: dict[str, Any] | None,
    env: Mapping[str, str] | None,
    backend_timeout: float,
    require_jwt: Sequence[str],
) -> Stack:
    """A stack's ports picked and its configuration written: one catalog server, one indexer and
    `routers` routers; `env` is the environment its parts get (overrides and secrets)."""
    catalog_port, indexer_port = free_port(), free_port()
    router_ports = [free_port() for _ in range(routers)]
    config_path, config = write_config(
        workdir, catalog, catalog_port, indexer_port, router_ports[0], extra, backend_timeout, require_jwt
    )
    environment = {**os.environ, **(env or {})}
    return Stack(
        workdir=workdir,
        config_path=config_path,
        config=config,
        catalog_url=f"http://127.0.0.1:{catalog_port}",
        indexer_address=f"127.0.0.1:{indexer_port}",
        router_urls=[f"http://127.0.0.1:{port}" for port in router_ports],
        env=dict(env or {}),
        security=channel_security(load_config(config_path, environment).router, environment),
    )


def _port(url: str) -> int:
    return int(url.rpartition(":")[2])


@contextmanager
def running_stack(
    workdir: Path,
    catalog: Path = DEMO_CATALOG,
    routers: int = 1,
    extra: dict[str, Any] | None = None,
    catalog_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    backend_timeout: float = 30.0,
    require_jwt: Sequence[str] = (),
    service_args: Sequence[str] = (),
    replicas: int = 1,
) -> Iterator[Stack]:
    """Start a catalog server (with test controls), indexers and `routers` routers; stop them after.

    `require_jwt` names catalog servers that demand a JWT (their backends use passthrough auth; the
    catalog server reads the secret from `env`); `service_args` go to the indexer and the routers.
    With `replicas` above 1 (a shared state in `env` is then the caller's to give), the extra
    indexers run as `indexer2`, ... and every router knows every indexer address.
    """
    stack = planned_stack(workdir, catalog, routers, extra, env, backend_timeout, require_jwt)
    stack.service_args = list(service_args)
    config_path, catalog_port = stack.config_path, _port(stack.catalog_url)
    router_ports = [_port(url) for url in stack.router_urls]
    extra_indexers = [f"127.0.0.1:{free_port()}" for _ in range(replicas - 1)]
    jwt_args = ["--require-jwt", *require_jwt] if require_jwt else []
    with ExitStack() as cleanup:
        catalog_proc = start_process(
            [
                *CLI,
                "catalog-server",
                "--catalog",
                str(catalog),
                "--port",
                str(catalog_port),
                "--control",
                *jwt_args,
                *catalog_args,
            ],
            f"{stack.catalog_url}/healthz",
            env=env,
        )
        cleanup.callback(catalog_proc.stop)
        stack.procs["catalog"] = catalog_proc
        stack.start_indexer()
        cleanup.callback(lambda: stack.procs["indexer"].stop() if "indexer" in stack.procs else None)
        for number, address in enumerate(extra_indexers, start=2):
            replica = start_process(
                [*CLI, "indexer", "--config", str(config_path), *service_args],
                ready_url=None,
                env={**(env or {}), "TOOLSEARCH_INDEXER_LISTEN": address},
            )
            stack.procs[f"indexer{number}"] = replica
            cleanup.callback(replica.stop)
            wait_until(lambda a=address: grpc_ready(a, security=stack.security), START_TIMEOUT, replica)
        addresses = {"TOOLSEARCH_INDEXER_ADDRESSES": ",".join([stack.indexer_address, *extra_indexers])}
        for number, port in enumerate(router_ports):
            proc = start_process(
                [*CLI, "router", "--config", str(config_path), *service_args],
                f"http://127.0.0.1:{port}/readyz",
                timeout=60,
                env={
                    "TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}",
                    **(env or {}),
                    **(addresses if extra_indexers else {}),
                },
            )
            stack.procs[f"router{number}"] = proc
            cleanup.callback(proc.stop)
        yield stack


def structured(result: Any) -> dict[str, Any]:
    """The structured content of a tool result, checked against its text block."""
    data = result.structured_content
    assert isinstance(data, dict), result
    assert json.loads(result.content[0].text) == data
    return data
