"""Part 13: what find_tool's second stage costs, at one client, with it and without it in one run.

One stack over the large catalog (the router started once, after the first indexer); its indexer
runs with the second stage (`indexer.search.second_stage`,
on by default), then is restarted with it off, and each time one client sends the same queries (the
single-client run's first ones; a restarted indexer has an empty query cache, so none is answered
from it). Reported per query set: p50 and p99, and the CPU each process used per find_tool, both ways,
and the ratios of p50 and of the indexer's CPU per find_tool (on over off).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from commands.bench.catalogs import advertised_backends, started
from commands.bench.common import CatalogFile
from commands.bench.latency import find_tool_load
from commands.bench.stack import Stack


async def second_stage_part(
    stack: Stack,
    catalog: CatalogFile,
    queries: Mapping[str, Sequence[str]],
    warmups: Mapping[str, Sequence[str]],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Each query set at one client, the stack's indexer with its second stage, then without it.

    Each start is checked to have listed every tool of `catalog`, so that no answer is measured
    over a part of it.
    """
    out: dict[str, Any] = {name: {} for name in queries}
    for label, config in (("on", stack.config_path), ("off", stack.variant("first-stage-only", _off()))):
        started(stack, await stack.start_indexer(config=config), catalog)
        if "router" not in stack.procs:  # the router after the first indexer: it waits for one
            await stack.start_router()
        for name, asked in queries.items():
            progress(f"second stage {label}: {name} queries, 1 client")
            pids = stack.pids() | {"bench": os.getpid()}
            run = await find_tool_load(stack.mcp_url, [list(asked)], warmups[name], pids)
            run["backends_advertised_after"] = advertised_backends(stack)
            out[name][label] = run
    for runs in out.values():
        on, off = runs["on"], runs["off"]
        runs["p50_on_over_off"] = round(on["p50_ms"] / off["p50_ms"], 3) if off.get("p50_ms") else None
        cpu_on = on["cpu"].get("indexer", {}).get("ms_per_request")
        cpu_off = off["cpu"].get("indexer", {}).get("ms_per_request")
        runs["indexer_cpu_on_over_off"] = round(cpu_on / cpu_off, 3) if cpu_on and cpu_off else None
    return out


def _off() -> dict[str, Any]:
    return {"search": {"second_stage": False}}
