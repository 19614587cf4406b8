"""`toolsearch up`: every process a configuration describes, started in order, stopped together.

Catalog servers first, then the indexer (which lists them), then the router (which needs the
indexer). Each runs as its own process, as in production; `up` waits for each to be ready, prints
the MCP URL, and on Ctrl-C or SIGTERM stops them in reverse order.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from commands.options import add_config
from toolsearch.config import Config, load_config
from toolsearch.transport import ChannelSecurity, TransportConfigError, channel_security, sync_channel

READY_TIMEOUT = 180.0  # the indexer loads a model and embeds every tool on a cold cache
STOP_TIMEOUT = 10.0


class StartError(RuntimeError):
    """Raised when a process exits or is not ready in time."""


def _http_ready(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    return check


def _grpc_ready(address: str, security: ChannelSecurity) -> Callable[[], bool]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def check() -> bool:
        with sync_channel(address, security) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            except grpc.RpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    return check


class Stack:
    """The started processes, newest last."""

    def __init__(self) -> None:
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: Sequence[str], ready: Callable[[], bool]) -> None:
        command = [sys.executable, "-m", "commands.cli", *args]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        self.processes.append((name, process))
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready():
            if process.poll() is not None:
                raise StartError(f"{name} exited with code {process.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise StartError(f"{name} was not ready within {READY_TIMEOUT:.0f}s")
            time.sleep(0.2)

    def stop(self) -> None:
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in reversed(self.processes):
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def wait(self) -> str:
        """Block until one process exits; returns its name."""
        while True:
            for name, process in self.processes:
                if process.poll() is not None:
                    return name
            time.sleep(0.5)


def run(config: Config, config_path: Path) -> int:
    """Start the stack of a configuration and keep it in the foreground."""
    stack = Stack()

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for server in config.catalog_servers:
            host, _, port = server.listen.rpartition(":")
            args = ["catalog-server", "--catalog", str(server.catalog), "--host", host, "--port", port]
            if server.require_jwt:
                args += ["--require-jwt", *server.require_jwt]
            stack.start(
                f"catalog server {server.listen}", args, _http_ready(f"http://{server.listen}/healthz")
            )
        # the health service needs no shared secret, but mutual TLS covers the whole port
        indexer_ready = _grpc_ready(config.indexer.listen, channel_security(config.router, os.environ))
        stack.start("indexer", ["indexer", "--config", str(config_path)], indexer_ready)
        stack.start(
            "router",
            ["router", "--config", str(config_path)],
            _http_ready(f"http://{config.router.listen}/readyz"),
        )
        print(
            f"\ntoolsearch is up: MCP endpoint http://{config.router.listen}/mcp  (Ctrl-C stops it)\n",
            flush=True,
        )
        name = stack.wait()
        print(f"{name} exited; stopping the rest", file=sys.stderr)
        return 1
    except (StartError, TransportConfigError) as exc:
        print(f"toolsearch up: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


def run_cli(args: argparse.Namespace) -> int:
    path = Path(args.config)
    return run(load_config(path, os.environ), path)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="start everything a configuration describes, in the foreground")
    add_config(parser)
    parser.set_defaults(func=run_cli)
