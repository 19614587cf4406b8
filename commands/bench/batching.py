"""Queries batched against one at a time, and find_tool with the model behind an embedding server.

Batching: the large stack's indexer restarted twice with the same configuration but for
`indexer.query_batching.enabled`, each time followed by find_tool at 1 and 32 clients with the
same queries as part 2 (a restarted indexer's query cache is empty, so nothing is answered from it),
one query a model call first, then batched; the model calls and texts each run cost are read from
the indexer's Status. The server: the same find_tool runs on a stack whose indexer embeds through
Infinity (`.venv-infinity`, installed by `make setup`) serving the same model folder on the same
machine, so its figures are what the hop to a server costs, not what a server on hardware of its
own would give.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from commands.bench.latency import find_tool_load
from commands.bench.plan import QUERY_SETS
from commands.bench.stack import Proc, Stack, http_answers, wait_for
from commands.ports import free_port
from commands.status import fetch

BATCHED_CLIENTS = (1, 32)  # the concurrencies compared: a lone client's latency, a busy indexer's throughput
INFINITY = Path(".venv-infinity") / "bin" / "infinity_emb"  # in the checkout, made by `make setup`
SERVER_START = 600.0  # seconds for Infinity to load torch and the model on a busy machine
# Infinity offline: the model is a local folder; no hub, no usage report
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}

Queries = Mapping[str, Mapping[int, Sequence[Sequence[str]]]]  # query set -> clients -> each client's
Warmups = Mapping[str, Mapping[int, Sequence[str]]]  # query set -> clients -> the warm-up queries


def _counters(stack: Stack) -> tuple[int, int]:
    counters = fetch(stack.indexer_address, timeout=60).embedding
    return int(counters.model_calls), int(counters.texts_embedded)


async def find_tool_runs(
    stack: Stack, queries: Queries, warmups: Warmups, pids: dict[str, int], progress: Callable[[str], None]
) -> dict[str, Any]:
    """find_tool at `BATCHED_CLIENTS` for each query set, with the model calls each run made."""
    out: dict[str, Any] = {}
    for name in QUERY_SETS:
        for clients in BATCHED_CLIENTS:
            progress(f"  {name} queries, {clients} concurrent clients")
            calls, texts = await asyncio.to_thread(_counters, stack)
            run = await find_tool_load(stack.mcp_url, queries[name][clients], warmups[name][clients], pids)
            after_calls, after_texts = await asyncio.to_thread(_counters, stack)
            answered = max(run["count"], 1)
            run["model_calls_per_query"] = round((after_calls - calls) / answered, 3)
            run["texts_per_model_call"] = round((after_texts - texts) / max(after_calls - calls, 1), 2)
            out.setdefault(name, {})[str(clients)] = run
    return out


async def batching(
    stack: Stack, queries: Queries, warmups: Warmups, progress: Callable[[str], None]
) -> dict[str, Any]:
    """The same find_tool runs, one query a model call and batched, each on a freshly started indexer."""
    out: dict[str, Any] = {}
    for mode, enabled in (("one_at_a_time", False), ("batched", True)):
        progress(f"batching: indexer restarted with query_batching.enabled: {str(enabled).lower()}")
        config = stack.variant(f"batching-{mode}", {"query_batching": {"enabled": enabled}})
        await stack.start_indexer(config=config)
        pids = stack.pids() | {"bench": os.getpid()}
        out[mode] = await find_tool_runs(stack, queries, warmups, pids, progress)
    await stack.start_indexer()  # the stack's own configuration again, for the parts after
    for name in QUERY_SETS:
        one, batched = out["one_at_a_time"][name], out["batched"][name]
        out.setdefault("ratios", {})[name] = {
            "throughput_32_batched_over_one_at_a_time": _ratio(
                batched["32"]["throughput_per_second"], one["32"]["throughput_per_second"]
            ),
            "p50_1_batched_over_one_at_a_time": _ratio(batched["1"]["p50_ms"], one["1"]["p50_ms"]),
        }
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


class InfinityServer:
    """Infinity serving `model` on loopback, its output in `log`; `url` is the API's base URL."""

    def __init__(self, checkout: Path, model: Path, log: Path) -> None:
        self.binary = checkout / INFINITY
        if not self.binary.exists():
            raise RuntimeError(f"the embedding server is not installed ({self.binary}): run `make setup`")
        self.model = model
        self.port = free_port()
        self.log = log
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    async def start(self) -> float:
        """Start it; returns the seconds until it answers."""
        args = [str(self.binary), "v2", "--model-id", str(self.model), "--served-model-name", self.model.name]
        args += ["--engine", "torch", "--device", "cpu", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--url-prefix", "/v1", "--no-model-warmup", "--log-level", "warning"]
        self.proc = Proc("embedding-server", args, self.log, OFFLINE)
        return await wait_for(
            lambda: http_answers(f"http://127.0.0.1:{self.port}/health"), SERVER_START, self.proc
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
