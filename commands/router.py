"""`toolsearch router`: serve find_tool and call_tool over MCP at /mcp (`router.app.serve`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from commands.options import add_config, add_logging
from router.app import serve
from toolsearch.config import load_config
from toolsearch.logs import configure_logging

# uvicorn's levels: requests are logged from debug on
LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def run(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), os.environ)
    configure_logging("debug" if args.log_level == "trace" else args.log_level, args.log_format)
    return serve(config, os.environ, args.log_level, args.log_format)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch router`."""
    parser = subparsers.add_parser("router", help="serve find_tool and call_tool over MCP at /mcp")
    add_config(parser)
    help = "log level; requests are logged from debug on (default: warning)"
    add_logging(parser, default="warning", levels=LEVELS, help=help)
    parser.set_defaults(func=run)
