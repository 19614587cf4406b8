"""`toolsearch router`: serve find_tool and call_tool over MCP at /mcp (`router.frontdoor.app.serve`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from commands.options import add_config, add_logging
from router.frontdoor.app import serve
from toolsearch.config import load_config
from toolsearch.logs import configure_logging
from toolsearch.tracing import configure_tracing

# uvicorn's levels: info has one access line per MCP request (router/observe/access_log.py); debug adds
# uvicorn's line for every HTTP request
UVICORN_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def run(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), os.environ)
    configure_logging("debug" if args.log_level == "trace" else args.log_level, args.log_format)
    configure_tracing("toolsearch-router", os.environ)  # off unless OTEL_* says where spans go
    return serve(config, os.environ, args.log_level, args.log_format)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch router`."""
    parser = subparsers.add_parser("router", help="serve find_tool and call_tool over MCP at /mcp")
    add_config(parser)
    help = "log level: info logs one line per MCP request, debug every HTTP request too (default: info)"
    add_logging(parser, default="info", levels=UVICORN_LEVELS, help=help)
    parser.set_defaults(func=run)
