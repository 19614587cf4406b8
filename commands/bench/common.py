"""What every part of the benchmark shares: statistics, query sets, catalog slices, progress, CPU use.

Latencies are kept in seconds and reported in milliseconds. Query sets are deduplicated and shuffled
with a fixed seed, so a run is repeatable and every request of a run can be given a query that no
earlier request of the same process sent (the indexer caches query vectors by text).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from toolsearch.catalog import EVAL_DATA

STABLETOOLBENCH = EVAL_DATA / "stabletoolbench"
METATOOL = EVAL_DATA / "metatool"
QUERY_FILES = {
    # task instructions of several sentences: each find_tool embeds the whole text and each sentence
    "stabletoolbench": (STABLETOOLBENCH / "queries.jsonl",),
    # one-line requests: one text embedded per find_tool
    "metatool": (METATOOL / "queries.jsonl", METATOOL / "queries_multi.jsonl"),
}
SEED = 20240607


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Count, p50, p90, p99, mean and max of latencies given in seconds, in milliseconds."""
    if not samples:
        return {"count": 0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "mean_ms": 0.0, "max_ms": 0.0}
    array = np.asarray(samples, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {
        "count": len(samples),
        "p50_ms": round(float(p50), 3),
        "p90_ms": round(float(p90), 3),
        "p99_ms": round(float(p99), 3),
        "mean_ms": round(float(array.mean()), 3),
        "max_ms": round(float(array.max()), 3),
    }


async def interleaved(
    first: Callable[[], Awaitable[object]], second: Callable[[], Awaitable[object]], calls: int
) -> tuple[list[float], list[float]]:
    """Seconds each of `calls` runs of `first` and of `second` took, called in turns (which goes first
    alternating), after two of each that warm the path. On a shared machine whose load comes and
    goes, two series measured one after the other compare two different moments; in turns, the
    ratio of their medians compares the same ones."""
    took: tuple[list[float], list[float]] = ([], [])
    for turn in range(calls + 2):
        order = ((0, first), (1, second)) if turn % 2 == 0 else ((1, second), (0, first))
        for which, call in order:
            started = time.perf_counter()
            await call()
            took[which].append(time.perf_counter() - started)
    return took[0][2:], took[1][2:]


class Progress:
    """Progress lines on stderr, each stamped with the seconds since the run began."""

    def __init__(self) -> None:
        self._started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[bench {time.monotonic() - self._started:7.1f}s] {message}", file=sys.stderr, flush=True)


class QueryPool:
    """The distinct queries of one set, handed out once each, in a fixed shuffled order."""

    def __init__(self, name: str) -> None:
        seen: dict[str, None] = {}
        for path in QUERY_FILES[name]:
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    seen.setdefault(" ".join(json.loads(line)["query"].split()), None)
        self.name = name
        self.queries = list(seen)
        random.Random(SEED).shuffle(self.queries)
        self._next = 0

    @property
    def left(self) -> int:
        return len(self.queries) - self._next

    def take(self, count: int) -> list[str]:
        """The next `count` queries; none is handed out twice."""
        if count > self.left:
            raise ValueError(f"query set {self.name} has {self.left} unused queries; {count} were asked for")
        taken = self.queries[self._next : self._next + count]
        self._next += count
        return taken


@dataclass(frozen=True)
class CatalogFile:
    """A catalog written for the run: its file, tool count and server slugs."""

    path: Path
    tools: int
    servers: list[str]


def _slug(server: str) -> str:
    from toolsearch.catalog import server_slug

    return server_slug(server)


def write_catalog(lines: Iterable[dict[str, Any]], path: Path) -> CatalogFile:
    """Write tools (catalog JSON objects) to `path` as JSON Lines."""
    rows = list(lines)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    servers = list(dict.fromkeys(_slug(str(row.get("server", ""))) for row in rows))
    return CatalogFile(path, len(rows), servers)


def slice_catalog(
    source: Path, path: Path, max_tools: int | None, server: str | None = None, skip: int = 0
) -> CatalogFile:
    """The first servers of `source` until at least `max_tools` tools (whole servers; None: all).

    With `server`, tools `skip` to `skip + max_tools` are moved to that one server.
    """
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    if server is not None:
        end = None if max_tools is None else skip + max_tools
        kept = [{**row, "server": server, "id": f"{server}::{row['name']}"} for row in rows[skip:end]]
        return write_catalog(kept, path)
    kept, servers = [], set()
    for row in rows:
        if max_tools is not None and len(kept) >= max_tools and row["server"] not in servers:
            break
        servers.add(row["server"])
        kept.append(row)
    return write_catalog(kept, path)


def machine() -> dict[str, Any]:
    """The machine the run is on: CPUs, memory, CPU model, load, and the software that matters."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": model,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        # read from the installed packages, so neither runtime is imported for its version
        "torch": _version("torch"),
        "onnxruntime": _version("onnxruntime"),
    }


def _version(package: str) -> str | None:
    """An installed package's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class CpuMeter:
    """CPU seconds used by named processes, and by everything else on the machine, over a window."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._start = self._sample()

    @staticmethod
    def _seconds(proc: psutil.Process) -> float:
        # the process's own threads only: the benchmark's own process is the parent of every other
        try:
            times = proc.cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.user + times.system)

    def _sample(self) -> dict[str, float]:
        sample = {name: self._seconds(proc) for name, proc in self._procs.items()}
        system = psutil.cpu_times()
        sample["_busy"] = float(system.user + system.system + system.nice + getattr(system, "irq", 0.0))
        sample["_busy"] += float(getattr(system, "softirq", 0.0) + getattr(system, "steal", 0.0))
        sample["_wall"] = time.monotonic()
        return sample

    def stop(self, requests: int = 0, excluded: dict[str, float] | None = None) -> dict[str, Any]:
        """Per process: CPU seconds, percent of one core, and ms per request; `other` is the rest.

        `excluded` CPU seconds of a process (work it did that is not the one measured) are taken off
        its figure and not counted anywhere else.
        """
        end = self._sample()
        wall = max(end["_wall"] - self._start["_wall"], 1e-9)
        used = {name: max(0.0, end[name] - self._start[name]) for name in self._procs}
        used["other"] = max(0.0, end["_busy"] - self._start["_busy"] - sum(used.values()))
        for name, seconds in (excluded or {}).items():
            if name in used:
                used[name] = max(0.0, used[name] - seconds)
        out: dict[str, Any] = {"wall_seconds": round(wall, 3)}
        for name, seconds in used.items():
            entry = {"cpu_seconds": round(seconds, 3), "core_percent": round(100 * seconds / wall, 1)}
            if requests:
                entry["ms_per_request"] = round(1000 * seconds / requests, 3)
            out[name] = entry
        return out


def rss_mb(pid: int) -> dict[str, float]:
    """A process's resident and unique memory in MB."""
    proc = psutil.Process(pid)
    info = proc.memory_full_info()
    return {"rss_mb": round(info.rss / 2**20, 1), "uss_mb": round(info.uss / 2**20, 1)}
