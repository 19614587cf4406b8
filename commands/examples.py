"""The examples each command's `--help` ends with, kept in one table so none is forgotten.

Keys are command paths as typed after `toolsearch` ("up", "model prepare"); `apply` puts each one
in its parser's epilog. A command registered without an entry here fails
tests/system/test_command_line.py, which reads every parser.
"""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[str, ...]] = {
    "up": (
        "toolsearch up --config examples/demo.yaml",
        "toolsearch up --config toolsearch.yaml --log-level debug --log-format json",
    ),
    "indexer": ("toolsearch indexer --config toolsearch.yaml --log-format json",),
    "router": ("toolsearch router --config toolsearch.yaml --log-level info",),
    "bridge": ("toolsearch bridge --config toolsearch.yaml",),
    "catalog-server": ("toolsearch catalog-server --catalog examples/catalog.jsonl --port 9100",),
    "model": ("toolsearch model prepare", "toolsearch model verify models/all-MiniLM-L6-v2"),
    "model prepare": ("toolsearch model prepare --models-dir models",),
    "model verify": (
        "toolsearch model verify models/all-MiniLM-L6-v2",
        "toolsearch model verify models/all-MiniLM-L6-v2-tools",
    ),
    "model train": ("toolsearch model train && git diff --stat indexer/embedder/",),
    "model recipe": (
        "toolsearch model prepare --with-torch && "
        "toolsearch model recipe models/all-MiniLM-L6-v2 --out /tmp/recipe",
    ),
    "eval": (
        "toolsearch eval --all",
        "toolsearch eval --catalog tools.jsonl --queries queries.jsonl --method hybrid",
    ),
    "bands": ("toolsearch bands", "toolsearch bands --limit-queries 200 --calibrate"),
    "status": (
        "toolsearch status --config toolsearch.yaml",
        "toolsearch status --config toolsearch.yaml --json",
    ),
    "bench": ("toolsearch bench --quick --out bench-results",),
    "health": (
        "toolsearch health grpc 127.0.0.1:50051",
        "toolsearch health http http://127.0.0.1:8000/readyz",
        "python -m commands.health_check http http://127.0.0.1:8000/healthz   # the same, cheaper",
    ),
    "health grpc": ("toolsearch health grpc 127.0.0.1:50051 --timeout 2",),
    "health http": ("toolsearch health http http://127.0.0.1:8000/readyz",),
}


def epilog(path: str) -> str | None:
    """The epilog text for the command at `path`, or None when it has no examples."""
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    return "example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {line}" for line in lines)


def apply(parser: argparse.ArgumentParser, path: str = "") -> None:
    """Give `parser`'s subcommands (and theirs) their examples; epilogs keep their line breaks."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            sub_path = f"{path} {name}".strip()
            if (text := epilog(sub_path)) is not None and sub.add_help:
                sub.epilog = text
                sub.formatter_class = argparse.RawDescriptionHelpFormatter
            apply(sub, sub_path)
