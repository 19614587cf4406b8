"""`toolsearch bridge`: the stdio and legacy SSE backends of a configuration, as Streamable HTTP."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bridge.app import serve
from bridge.transports.process import LaunchError
from commands.options import add_config, add_logging
from toolsearch.config import load_config
from toolsearch.logs import configure_logging
from toolsearch.tracing import configure_tracing


def run(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), os.environ)
    if not any(backend.bridged for backend in config.backends):
        print(
            f"bridge: {args.config} has no backends for the bridge (stdio ones, with a command, or "
            "legacy SSE ones, with transport: sse)",
            file=sys.stderr,
        )
        return 2
    configure_logging(args.log_level, args.log_format)
    configure_tracing("toolsearch-bridge", os.environ)  # off unless OTEL_* says where spans go
    try:
        return serve(config, os.environ, args.log_level, args.log_format)
    except LaunchError as exc:
        print(f"bridge: {exc}", file=sys.stderr)
        return 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch bridge`."""
    parser = subparsers.add_parser(
        "bridge",
        help="run the configuration's stdio backends and hold its legacy SSE ones' sessions, each served "
        "as Streamable HTTP",
    )
    add_config(parser)
    add_logging(parser)
    parser.set_defaults(func=run)
