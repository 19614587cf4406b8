"""The `toolsearch` command: one entry point, one subcommand per role.

Each subcommand lives in the module of the thing it runs; that module's `add_parser(subparsers)`
registers it and sets `func`, which takes the parsed arguments and returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import MutableMapping, Sequence

from commands import examples
from commands.supervisor import as_supervised_part
from toolsearch.config import ConfigError

# module -> the subcommands it registers, imported lazily so `toolsearch router` never loads torch
_COMMANDS = {
    "commands.up": ("up",),
    "commands.indexer": ("indexer",),
    "commands.router": ("router",),
    "commands.bridge": ("bridge",),
    "commands.catalog_server": ("catalog-server",),
    "commands.retrieval.model_command": ("model",),
    "commands.retrieval.evaluation": ("eval",),
    "commands.retrieval.bands": ("bands",),
    "commands.status": ("status",),
    "commands.bench": ("bench",),
    "commands.health_check": ("health",),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with `only`, just that subcommand's module is imported."""
    parser = argparse.ArgumentParser(
        prog="toolsearch",
        description="A tool-search layer for MCP.",
        epilog="Each command's --help shows an example. Run without a command: this help, exit code 2.",
    )
    parser.add_argument("--version", action="version", version=f"toolsearch {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name, commands in _COMMANDS.items():
        if only is not None and only not in commands:
            subparsers.add_parser(commands[0], add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            if (exc.name or "").split(".")[0] in _OURS:
                raise
            _add_missing(subparsers, commands, exc)  # an extra this install lacks (pyproject.toml)
            continue
        module.add_parser(subparsers)
    examples.apply(parser)
    return parser


def version() -> str:
    """The installed package's version (pyproject.toml), or "unknown" when run from a bare copy."""
    try:
        return importlib.metadata.version("toolsearch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_OURS = ("commands", "router", "indexer", "bridge", "toolsearch")
# the extra each command needs beyond the base install
_EXTRAS = {
    "up": "indexer",
    "indexer": "indexer",
    "model": "model",
    "eval": "bench",
    "bands": "bench",
    "bench": "bench",
}


def _add_missing(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    commands: Sequence[str],
    error: ModuleNotFoundError,
) -> None:
    """Commands whose module needs a library this install lacks: each says which extra to install."""
    for command in commands:
        extra = _EXTRAS.get(command, "dev")
        message = (
            f"toolsearch {command} needs the {extra} extra, which this install lacks "
            f"(no module named {error.name!r}): pip install 'toolsearch[{extra}]'"
        )
        # no option prefix: whatever follows the command (--config F, ...) is taken as it is
        stub = subparsers.add_parser(
            command, help=f"(needs the {extra} extra)", add_help=False, prefix_chars="\0"
        )
        stub.add_argument("rest", nargs="*")
        stub.set_defaults(func=lambda _args, message=message: _missing(message))


def _missing(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def prepare_process(environ: MutableMapping[str, str]) -> None:
    """What every process of the command does before it loads anything: `environ` is its environment."""
    as_supervised_part(environ)  # a part `up` started: its signals, before anything else runs
    # Before anything loads torch: its OpenMP workers then sleep while they wait instead of spinning,
    # so a model call on every core does not stall when the router or a client takes one of them
    # (see `indexer.embedder.sentence.default_threads`). An operator's own setting wins.
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Before anything loads gRPC: its core's fork handlers off. No part forks a process that goes on
    # using gRPC; with them on, every fork of a process running the core (a library's, or Python's
    # subprocess where it cannot use vfork) stops and restarts its threads in the parent, and
    # restarts them in the child too, where they abort it if it closes descriptors before exec
    # (docs/reliability.md, "Starts that abort"). An operator's own setting wins.
    environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    prepare_process(os.environ)
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first is None and "--version" in args_list:
        first = ""  # the answer needs no command's module: import none of them
    parser = build_parser(first)
    if not args_list:
        # a usage error as argparse counts them (exit 2), but one that shows every command
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.error(f"unknown command {args.command!r}")
    try:
        return int(func(args))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
