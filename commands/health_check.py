"""`toolsearch health`: one health check of a running service, as an exit code, for container healthchecks.

    toolsearch health grpc 127.0.0.1:50051      # the standard gRPC health service says SERVING
    toolsearch health grpc 127.0.0.1:50051 --config toolsearch.yaml   # with the router's TLS settings
    toolsearch health http http://127.0.0.1:8000/readyz   # the URL answers 200
    toolsearch health http http://127.0.0.1:8001/readyz --host 10.0.0.7:8001   # with that Host header

    python -m commands.health_check http http://127.0.0.1:8000/healthz   # the same, without the CLI

Exit code 0 means healthy, 1 unhealthy (with one line on stderr saying why), 2 a usage error. It
imports neither torch nor the services; run as a module it skips the command line's set-up too (the
configuration's modules, every command's parser), which is what the containers' healthchecks do,
every few seconds.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

DEFAULT_TIMEOUT = 3.0
# Inside a container a proxy from the environment must not answer for the service itself.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def check_grpc(
    target: str, service: str = "", timeout: float = DEFAULT_TIMEOUT, config: str | None = None
) -> str | None:
    """None when `target` answers the gRPC health check for `service` with SERVING, else why not.

    With `config`, the channel uses that file's `router.indexer_tls` (an indexer with mutual TLS
    accepts no connection without a client certificate, health checks included).
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if config is None:
        channel = grpc.insecure_channel(target)
    else:
        # imported only here: the configuration's modules cost more to import than the check itself
        import os
        from pathlib import Path

        from toolsearch.config import ConfigError, load_config
        from toolsearch.transport import TransportConfigError, channel_security, sync_channel

        try:
            security = channel_security(load_config(Path(config), os.environ).router, os.environ)
        except (ConfigError, TransportConfigError) as exc:
            return f"{config}: {exc}"
        channel = sync_channel(target, security)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            return f"{target}: no answer ({code.name if code else exc})"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def check_http(url: str, timeout: float = DEFAULT_TIMEOUT, host: str | None = None) -> str | None:
    """None when a GET of `url` answers 200, else why not.

    `host` is the Host header to send instead of the URL's (the kubelet's probes send the pod's IP
    and port; `--host` lets a check ask as they do).
    """
    if not url.startswith(("http://", "https://")):
        return f"{url}: not an http:// or https:// URL"
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"{url}: no answer ({reason})"
    return None if status == 200 else f"{url}: HTTP {status}"


def run_cli(args: argparse.Namespace) -> int:
    """Run one check; 0 when healthy, 1 when not."""
    if args.kind == "grpc":
        problem = check_grpc(args.target, args.service, args.timeout, args.config)
    else:
        problem = check_http(args.target, args.timeout, args.host)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch health grpc|http TARGET`."""
    parser = subparsers.add_parser(
        "health",
        help="check a running service once: exit 0 when healthy (for container healthchecks)",
        description=DESCRIPTION,
    )
    add_kinds(parser)


DESCRIPTION = "Check a running service once. Exit code 0: healthy; 1: not (the reason on stderr)."


def add_kinds(parser: argparse.ArgumentParser) -> None:
    """The `grpc` and `http` checks and their options, under `parser`."""
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    grpc_parser = kinds.add_parser("grpc", help="the standard gRPC health service answers SERVING")
    grpc_parser.add_argument("target", metavar="HOST:PORT", help="the gRPC address (or a dns:/// target)")
    grpc_parser.add_argument(
        "--service", default="", help="the service name to ask about (default: the server)"
    )
    grpc_parser.add_argument(
        "--config", help="a configuration file whose router.indexer_tls the check connects with"
    )
    http_parser = kinds.add_parser("http", help="a GET of the URL answers 200")
    http_parser.add_argument("target", metavar="URL", help="e.g. http://127.0.0.1:8001/readyz")
    http_parser.add_argument(
        "--host", help="the Host header to send (default: the URL's), e.g. POD_IP:PORT as the kubelet sends"
    )
    for sub in (grpc_parser, http_parser):
        sub.add_argument(
            "--timeout", type=float, default=DEFAULT_TIMEOUT, help=f"seconds (default: {DEFAULT_TIMEOUT:g})"
        )
        sub.set_defaults(func=run_cli)


def standalone_parser() -> argparse.ArgumentParser:
    """The parser of `python -m commands.health_check`: the checks of `toolsearch health`, alone."""
    parser = argparse.ArgumentParser(
        prog="python -m commands.health_check",
        description=DESCRIPTION,
        epilog="example:\n  python -m commands.health_check grpc 127.0.0.1:50051",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kinds(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m commands.health_check grpc|http TARGET`: the check alone, without the command line."""
    return run_cli(standalone_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
