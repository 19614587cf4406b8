"""Small catalogs cut from the demo catalog, so health tests probe a few backends, not 27."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tests.support.stack import DEMO_CATALOG
from toolsearch.catalog import server_slug

# Three servers with distinct vocabularies, so a query finds one server's tools and no other's.
DEFAULT_SERVERS = ("Cocktails", "Free NBA", "AI Weather by Meteosource")


def small_catalog(path: Path, servers: Sequence[str] = DEFAULT_SERVERS) -> dict[str, set[str]]:
    """Write the demo catalog's tools of `servers` to `path`; returns each server slug's tool names."""
    lines = DEMO_CATALOG.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["server"] in servers]
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    names: dict[str, set[str]] = {}
    for line in kept:
        tool = json.loads(line)
        names.setdefault(server_slug(tool["server"]), set()).add(tool["name"])
    return names
