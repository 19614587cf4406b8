"""`toolsearch up`: every process a configuration describes, started in order and supervised.

The bridge first when the file has stdio or legacy SSE backends (it serves them), then catalog
servers, then the indexer (which lists them all), then the router (which needs the indexer).
Before anything starts, every port the file listens on must be free: a port in use is one line
naming the port, the part and its key, and nothing is started (a process of an earlier run still
listening would otherwise answer the readiness checks); a policy file the indexer would refuse is
one line too (commands/authorization.py). Each part then runs in a session of its own
(commands/supervisor.py), so the terminal's signals reach `up` alone, and `up` decides:

- Ctrl-C or SIGTERM: every part is stopped, newest first; exit 0.
- SIGHUP (`kill -HUP`): a reload. The indexer rereads the file (its backends, docs/health.md); the
  router, the catalog servers and the bridge have no reload: restart `up` to change their settings.
- SIGHUP because the terminal closed: everything is stopped, as for Ctrl-C. Under `nohup` (SIGHUP
  ignored when `up` started) every SIGHUP is a reload.
- A part that exits: reported with its exit code, the others stopped; exit 1.

`toolsearch is up` is printed once every part answers its readiness check, with what callers may use
(without an `authorization` section: every tool, docs/authorization.md). `--log-level` and
`--log-format` reach the bridge, the indexer and the router; the catalog servers (demo backends)
log warnings only, unless the level is debug.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from commands.authorization import policy_checked
from commands.options import LEVELS, add_config, add_logging
from commands.supervisor import StartError, Stopped, Supervisor, port_problem, say
from toolsearch.config import Config, load_config
from toolsearch.transport import ChannelSecurity, TransportConfigError, channel_security, sync_channel

WILDCARDS = {"0.0.0.0", "::", "[::]", ""}
READY_TIMEOUT = 180.0  # the indexer loads a model and embeds every tool on a cold cache
RELOAD_NOTE = (
    "reloading: the indexer rereads {path} (its backends); the router and the catalog servers have "
    "no reload: restart toolsearch up to change their settings"
)


def _http_ready(url: str) -> Callable[[], bool]:
    import urllib.error
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy's answer

    def check() -> bool:
        try:
            with direct.open(url, timeout=2) as response:
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


def listen_addresses(config: Config) -> list[tuple[str, str, str]]:
    """(part, key, HOST:PORT) of everything `up` would start, in start order."""
    addresses = [("bridge", "bridge.listen", config.bridge.listen)] if _has_bridged(config) else []
    addresses += [
        (f"catalog server {n}", f"catalog_servers[{n}].listen", server.listen)
        for n, server in enumerate(config.catalog_servers)
    ]
    addresses.append(("indexer", "indexer.listen", config.indexer.listen))
    if config.indexer.health_listen:
        addresses.append(("indexer's health port", "indexer.health_listen", config.indexer.health_listen))
    addresses.append(("router", "router.listen", config.router.listen))
    if config.router.health_listen:
        addresses.append(("router's health port", "router.health_listen", config.router.health_listen))
    return addresses


def _has_bridged(config: Config) -> bool:
    """Whether the file has backends the bridge serves: stdio servers, legacy SSE servers."""
    return any(backend.bridged for backend in config.backends)


def ports_problem(config: Config) -> str | None:
    """Why `up` cannot start: a port in use or given twice, or an address it cannot listen on."""
    seen: list[tuple[str, str, str]] = []  # (host, port, key) of the parts before
    for part, key, listen in listen_addresses(config):
        host, _, port = listen.rpartition(":")
        for other_host, other_port, other_key in seen:
            # one port on two addresses clashes when they are the same, or one is every address
            if port != "0" and port == other_port and (host == other_host or {host, other_host} & WILDCARDS):
                return f"port {port} is given twice: {other_key} and {key}; give each part its own port"
        seen.append((host, port, key))
        if problem := port_problem(part, key, listen):
            return problem
    return None


class LogSettings(NamedTuple):
    """How the parts log: `--log-level` and `--log-format` of `up`, passed on to each part."""

    level: str = "info"
    format: str = "text"

    def args(self) -> list[str]:
        return ["--log-level", self.level, "--log-format", self.format]

    def catalog_args(self) -> list[str]:
        # uvicorn logs every request of a catalog server from info on: demo chatter, not news
        return ["--log-level", "debug" if self.level == "debug" else "warning"]


DEFAULT_LOGS = LogSettings()


def run(config: Config, config_path: Path, logs: LogSettings = DEFAULT_LOGS) -> int:
    """Start the stack of a configuration and supervise it in the foreground."""
    refused, authorization = policy_checked(config)  # the banner says what is in force
    if problem := ports_problem(config) or refused:
        say(problem)
        return 1
    supervisor = Supervisor(READY_TIMEOUT, reload_note=RELOAD_NOTE.format(path=config_path))
    with supervisor.signals():
        try:
            if _has_bridged(config):
                # listening is enough: the indexer starts beside the stdio servers' own starts, and
                # its first listing of one still starting waits in the bridge, under the indexer's
                # one rule for a slow part (docs/health.md), not the bridge's too
                bridge_ready = _http_ready(f"{config.bridge.base_url()}/healthz")
                bridge_args = ["bridge", "--config", str(config_path), *logs.args()]
                supervisor.start("bridge", bridge_args, bridge_ready)
            for n, server in enumerate(config.catalog_servers):
                host, _, port = server.listen.rpartition(":")
                args = ["catalog-server", "--catalog", str(server.catalog), "--host", host, "--port", port]
                if server.require_jwt:
                    args += ["--require-jwt", *server.require_jwt]
                args += logs.catalog_args()
                ready = _http_ready(f"http://{server.listen}/healthz")
                supervisor.start(f"catalog server {n} ({server.listen})", args, ready)
            # the health service needs no shared secret, but mutual TLS covers the whole port
            indexer_ready = _grpc_ready(config.indexer.listen, channel_security(config.router, os.environ))
            indexer_args = ["indexer", "--config", str(config_path), *logs.args()]
            supervisor.start("indexer", indexer_args, indexer_ready, reloads=True)
            router_ready = _http_ready(f"http://{config.router.listen}/readyz")
            supervisor.start("router", ["router", "--config", str(config_path), *logs.args()], router_ready)
            print(
                f"\ntoolsearch is up: MCP endpoint http://{config.router.listen}/mcp  (Ctrl-C stops it)\n"
                f"{authorization}\n",
                flush=True,
            )
            return supervisor.supervise()
        except (StartError, TransportConfigError) as exc:
            say(str(exc))
            return 1
        except Stopped:
            return 0
        finally:
            supervisor.stop()


def run_cli(args: argparse.Namespace) -> int:
    path = Path(args.config)
    return run(load_config(path, os.environ), path, LogSettings(args.log_level, args.log_format))


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="start everything a configuration describes, in the foreground")
    add_config(parser)
    add_logging(parser, levels=LEVELS, help="every part's log level (default: info)")
    parser.set_defaults(func=run_cli)
