"""`toolsearch bench`: where the time goes, measured on the real stack on loopback.

One run starts the catalog server, indexer and router as real processes (in a temporary folder,
with the model of `models/`) and measures: the in-process floor of a find_tool (query embedding and
search), find_tool through the router at 1, 8 and 32 concurrent clients, call_tool beside the
backend's own time, session opens warm and cold, re-indexing after a health change, the indexer's
memory, embedding throughput with a restart that embeds nothing, and a peer (FastMCP's proxy with
its BM25 search) with the same queries over the same catalog, and what an authorization policy of
100 rules costs session opens, find_tool, call_tool and memory against none. It writes results.json,
results.md (every target with pass or miss) and a chart to `--out`. `--quick` measures every part
with small counts and catalogs, for tests; the full run is what docs/performance.md reports.

Modules: `plan` (counts), `common` (statistics, queries, catalog slices, CPU), `catalogs` (a run's
catalogs and checks), `stack` (processes), `latency` (floor, find_tool, call_tool), `sessions`
(session open), `reindex`, `memory`, `embedding` (throughput, restart), `stdio`, `peer`,
`authorized` (a policy against none; `authorization` is the engine alone, in process), `run` (the
order of the parts), `report` (targets, JSON, chart) and `markdown` (the report).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from commands.bench.plan import PARTS
from indexer.embedder import EMBEDDER_KINDS
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME

BOTH = ("onnx", "torch")  # --embedder both: the first runs every part, the second the floor and find_tool


async def _main(args: argparse.Namespace) -> int:
    from commands.bench.common import Progress, machine
    from commands.bench.latency import close_clients
    from commands.bench.plan import FULL, QUICK
    from commands.bench.report import write
    from commands.bench.run import Run
    from indexer.embedder import load_embedder

    progress = Progress()
    plan = QUICK if args.quick else FULL
    if args.calls is not None:
        plan = dataclasses.replace(plan, call_tool_calls=args.calls)
    model = args.model.resolve()
    info = machine()
    progress(
        f"{'quick' if plan.quick else 'full'} run on {info['cpus']} CPUs ({info['cpu_model']}), "
        f"{info['memory_gb']} GB, load average {info['load_average']}"
    )
    started = time.monotonic()
    kinds = BOTH if args.embedder == "both" else (args.embedder,)
    embedders = {kind: await asyncio.to_thread(load_embedder, kind, model) for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="toolsearch-bench-") as folder:
        only = frozenset(args.only.split(",")) if args.only else None
        run = Run(plan, model, embedders, Path(folder), progress, logs=args.out / "logs", only=only)
        try:
            results = await run.all()
        finally:
            await close_clients()
        results["catalogs"] = {
            "large": run.catalogs.large.tools,
            "large_servers": len(run.catalogs.large.servers),
            "small": run.catalogs.small.tools,
            "small_servers": len(run.catalogs.small.servers),
        }
    results = {
        "mode": "quick" if plan.quick else "full",
        "command": " ".join(["toolsearch", *map(shlex.quote, sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "health_probes": {"interval_seconds": plan.health_interval, "timeout_seconds": plan.health_timeout},
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started, 1),
        **results,
    }
    paths = write(results, args.out)
    progress(f"wrote {', '.join(str(p) for p in paths.values())}")
    for target in results["targets"]:
        if target["value"] is None:
            print(f"----  {target['target']}: not measured")
            continue
        verdict = "pass" if target["pass"] else "MISS"
        print(
            f"{verdict:4}  {target['target']}: {target['value']} {target['unit']} (limit {target['limit']})"
        )
    return 0


def run_cli(args: argparse.Namespace) -> int:
    """Run `toolsearch bench`; returns the exit code."""
    from indexer.embedder.base import EmbedderError

    if not args.model.is_dir():
        print(f"toolsearch bench: no model at {args.model}: run `toolsearch model prepare`", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except (EmbedderError, RuntimeError, OSError) as exc:
        print(f"toolsearch bench: {exc}", file=sys.stderr)
        return 1


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch bench`."""
    parser = subparsers.add_parser(
        "bench",
        help="measure latency, throughput, session opens, re-indexing and memory on the real stack",
        description="Start the stack on loopback and measure where the time goes; writes results.json, "
        "results.md and bench-latency.png to --out.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="every part with small counts (4 to 5 minutes on 2 cores)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="output folder (default: bench-results)"
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=Path("models") / TUNED_MODEL_NAME,
        help=f"the embedding model folder (default: models/{TUNED_MODEL_NAME}, the one the indexer serves)",
    )
    parser.add_argument(
        "--embedder",
        choices=[*EMBEDDER_KINDS, "both"],
        default="both",
        help="the floor's and the indexer's embedder (indexer.embedder); both (the default): every part "
        f"with {BOTH[0]}, and the floor and find_tool again with {BOTH[1]}, side by side",
    )
    parser.add_argument(
        "--calls",
        type=_positive,
        default=None,
        metavar="N",
        help="call_tool calls of each kind measured (parts 3 and 8; default: 200, 10 with --quick): "
        "a quick run with more calls gives steadier medians of the hop",
    )
    parser.add_argument(
        "--only",
        type=_parts,
        default=None,
        metavar="PART[,PART...]",
        help="run only these parts: " + ", ".join(PARTS) + " (default: all of them)",
    )
    parser.set_defaults(func=run_cli)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {number}")
    return number


def _parts(value: str) -> str:
    unknown = [part for part in value.split(",") if part not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part {unknown[0]!r}: one of {', '.join(PARTS)}")
    return value
