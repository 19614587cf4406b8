"""What the runs start from and check against: the catalogs written for a run, the tool call_tool calls,
and the indexer's own account of its backends after it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from commands.bench.common import METATOOL, STABLETOOLBENCH, CatalogFile, slice_catalog
from commands.bench.embedding import catalog_tools
from commands.bench.latency import call_arguments
from commands.bench.plan import Plan
from commands.bench.stack import Stack
from commands.status import fetch
from indexer.retrieval.tools import advertise
from toolsearch.catalog import argument_problem, input_validator, load_catalog


@dataclass(frozen=True)
class RunCatalogs:
    """The catalog files of a run."""

    large: CatalogFile
    small: CatalogFile
    resident: CatalogFile  # the steady caller's catalog while another caller's cold session opens
    extra: tuple[CatalogFile, CatalogFile]  # JWT-protected catalogs of two teams (memory part)

    @classmethod
    def write(cls, plan: Plan, folder: Path) -> RunCatalogs:
        tools, meta, size = STABLETOOLBENCH / "tools.jsonl", METATOOL / "tools.jsonl", plan.extra_tools
        return cls(
            large=slice_catalog(tools, folder / "large.jsonl", plan.large_tools),
            small=slice_catalog(tools, folder / "small.jsonl", plan.small_tools),
            resident=slice_catalog(meta, folder / "resident.jsonl", plan.resident_tools, "resident"),
            extra=(
                slice_catalog(meta, folder / "team-one.jsonl", size, "team-one"),
                slice_catalog(meta, folder / "team-two.jsonl", size, "team-two", skip=size),
            ),
        )


def started(stack: Stack, seconds: float, catalog: CatalogFile) -> dict[str, Any]:
    """How an indexer start went, checked: every tool of the public catalog must have been listed."""
    status = fetch(stack.indexer_address, timeout=60)
    listed = sum(b.tool_count for b in status.backends)
    if listed != catalog.tools:
        sick = [f"{b.id}: {b.status} {b.last_error}" for b in status.backends if b.status != "healthy"]
        raise RuntimeError(f"the indexer listed {listed} of {catalog.tools} tools; not healthy: {sick[:5]}")
    cpu = psutil.Process(stack.procs["indexer"].pid).cpu_times()
    counters = status.embedding
    return {
        "tools": catalog.tools,
        "seconds_to_ready": round(seconds, 3),
        "cpu_seconds": round(cpu.user + cpu.system, 2),
        "texts_embedded": counters.texts_embedded,
        "model_calls": counters.model_calls,
        "cache_hits": counters.cache_hits,
    }


def advertised_backends(stack: Stack) -> int:
    """How many backends the indexer advertises now (healthy or degraded)."""
    status = fetch(stack.indexer_address, timeout=60)
    return sum(1 for b in status.backends if b.status in ("healthy", "degraded"))


def call_target(catalog: CatalogFile) -> tuple[str, str, str, dict[str, Any]]:
    """A tool to call: (backend id, advertised name, the backend's name, arguments it accepts)."""
    names = {(t.backend_id, t.original_name): t.name for t in advertise(catalog_tools(catalog))}
    for tool in load_catalog(catalog.path):
        arguments = call_arguments(tool.input_schema)
        if argument_problem(input_validator(tool), arguments) is None:
            backend = tool.server_slug[:64]
            return backend, names[(backend, tool.name)], tool.name, arguments
    raise RuntimeError("no tool of the catalog accepts plain arguments")
