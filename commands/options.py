"""Options several subcommands share, each defined once: `--config`, `--log-level`, `--log-format`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from toolsearch.logs import LOG_FORMATS

LEVELS = ("debug", "info", "warning", "error")


def add_config(parser: argparse.ArgumentParser, required: bool = True, help: str | None = None) -> None:
    """`--config FILE`: the YAML configuration the subcommand reads."""
    parser.add_argument("--config", required=required, help=help or "the YAML configuration file")


def add_logging(
    parser: argparse.ArgumentParser,
    default: str = "info",
    levels: Sequence[str] = LEVELS,
    help: str | None = None,
) -> None:
    """`--log-level` (choices `levels`, default `default`) and `--log-format text|json`."""
    parser.add_argument(
        "--log-level", default=default, choices=list(levels), help=help or f"log level (default: {default})"
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text for people (the default), json for one JSON object per line",
    )
