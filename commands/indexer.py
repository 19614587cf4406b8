"""`toolsearch indexer`: run the indexer's gRPC service until SIGTERM (`indexer.api.server.serve`).

With an `authorization` section the policy file is checked first: a file that does not parse, or
names what the vocabulary lacks, stops the start with one line naming the file, line and column.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path

from commands.authorization import policy_problem
from commands.options import add_config, add_logging
from indexer.api.server import serve
from indexer.embedder.base import EmbedderError
from indexer.state import StateUnavailable
from toolsearch.config import load_config
from toolsearch.logs import configure_logging
from toolsearch.tracing import configure_tracing
from toolsearch.transport import TransportConfigError


def run(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), os.environ)
    if problem := policy_problem(config):
        print(f"indexer: {problem}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    configure_tracing("toolsearch-indexer", os.environ)  # off unless OTEL_* says where spans go
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config, os.environ, Path(args.config)))
    except (EmbedderError, TransportConfigError) as exc:
        print(f"indexer: {exc}", file=sys.stderr)
        return 2
    except (OSError, StateUnavailable) as exc:
        print(f"indexer: {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch indexer`."""
    parser = subparsers.add_parser("indexer", help="run the indexer (gRPC)")
    add_config(parser)
    add_logging(parser)
    parser.set_defaults(func=run)
