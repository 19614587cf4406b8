"""One benchmark run: every part in order, each stack started for what it measures and stopped after.

Nothing runs beside a measurement but what it measures (and whatever else the machine runs, which
the CPU figures report as `other`). Queries are handed out once each per query set, so no request is
answered from the indexer's query cache; the floor uses the single-client run's queries.

With more than one embedder, the first runs every part; each other one runs the floor and find_tool
again on a stack of its own (its own indexer process and caches), with the same queries.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from commands.bench.authorized import authorization_part
from commands.bench.batching import InfinityServer, batching, find_tool_runs
from commands.bench.catalogs import RunCatalogs, advertised_backends, call_target, started
from commands.bench.common import CatalogFile, CpuMeter, QueryPool
from commands.bench.embedding import cold_build, restart_in_process
from commands.bench.first_run import make_run_from_clone
from commands.bench.latency import (
    call_tool_latency,
    describe,
    find_tool_load,
    floor,
    floor_once,
)
from commands.bench.memory import memory
from commands.bench.peer import peer_part
from commands.bench.plan import CLIENT_COUNTS, QUERY_SETS, Plan
from commands.bench.reindex import reindex
from commands.bench.second_stage import second_stage_part
from commands.bench.sessions import cold_open, open_many, open_once
from commands.bench.stack import CatalogSpec, Stack, secret
from commands.bench.stdio import stdio_part
from commands.status import fetch
from indexer.embedder import Embedder
from toolsearch.sections.indexer_settings import Health

CHECKOUT = Path(__file__).resolve().parents[2]  # the project's folder, when run from a checkout
FLOOR_WARMUP = 5  # model calls before the floor's clock starts: the first ones of a process are slow
# a cold open embeds a whole catalog inside initialize: far past the router's default deadlines
COLD_TIMEOUT = {"indexer_timeout": 1800.0, "open_session_timeout": 1800.0}


class Run:
    """The state of one run and its parts, in the order they run."""

    def __init__(
        self,
        plan: Plan,
        model: Path,
        embedders: dict[str, Embedder],
        work: Path,
        progress: Callable[[str], None],
        logs: Path | None = None,
        only: frozenset[str] | None = None,
    ):
        """`embedders`: indexer.embedder kind -> the embedder, the one that runs every part first;
        `only`: the `PARTS` to run (None: all)."""
        self.only = only
        self.logs = logs
        self.plan, self.model, self.work, self.progress = plan, model, work, progress
        self.embedders = embedders
        self.kind = next(iter(embedders))
        self.embedder = embedders[self.kind]
        self.catalogs = RunCatalogs.write(plan, work)
        self.pools = {name: QueryPool(name) for name in QUERY_SETS}
        # handed out up front, so the floor and the single client share theirs and nothing repeats
        self.queries = {
            name: {
                c: [self.pools[name].take(plan.per_client[name][c]) for _ in range(c)] for c in CLIENT_COUNTS
            }
            for name in QUERY_SETS
        }
        self.warmups = {
            name: {c: self.pools[name].take(plan.warmup) for c in CLIENT_COUNTS} for name in QUERY_SETS
        }
        self.out: dict[str, Any] = {
            "embedder": self.kind,
            "floor": {},
            "find_tool": {},
            "session_open": {"warm": {}, "cold": {}, "indexer_cold_start": {}},
            "embedding": {},
            "failures": [],
        }
        # each embedder's floor and find_tool figures (the first's are also "floor" and "find_tool")
        self.out["embedders"] = {
            self.kind: {
                "identity": self.embedder.identity,
                "floor": self.out["floor"],
                "find_tool": self.out["find_tool"],
            }
        }

    def wants(self, part: str) -> bool:
        """Whether this run measures `part` (one of `PARTS`)."""
        return self.only is None or part in self.only

    def floor(self) -> None:
        """Part 1, and part 7's cold throughput: the large catalog built in process, then searched."""
        self.progress(f"floor: building the index of {self.catalogs.large.tools} tools with an empty cache")
        version, cold = cold_build(self.embedder, self.catalogs.large, self.work / "floor-cache")
        self.version = version  # kept: the single-client run measures the floor beside itself
        self.out["embedding"]["cold_build"] = cold
        self.out["embedders"][self.kind]["cold_build"] = cold
        self.out["floor"].update(self._floors(self.embedder, version))

    def _floors(self, embedder: Embedder, version: Any) -> dict[str, Any]:
        """The floor of each query set, over the single client's queries."""
        floors = {}
        for name in QUERY_SETS:
            self.progress(f"floor: {name} queries")
            warmup = self.pools[name].take(FLOOR_WARMUP)
            floors[name] = floor(embedder, version, self.queries[name][1][0], warmup)
        return floors

    def _stack(
        self,
        name: str,
        specs: list[CatalogSpec],
        router: dict[str, Any] | None = None,
        kind: str | None = None,
    ) -> Stack:
        health = {"timeout": self.plan.health_timeout, "interval": self.plan.health_interval}
        indexer = {"health": health, "embedder": kind or self.kind}  # the floor's embedder
        extra: dict[str, dict[str, Any]] = {"indexer": indexer}
        if router:
            extra["router"] = router
        return Stack(self.work / name, self.model, specs, extra, logs=self.logs)

    async def guarded(self, part: str, step: Awaitable[None]) -> bool:
        """Run one step; a failure is recorded with the part it belongs to, and the run goes on."""
        try:
            await step
        except Exception as exc:
            self.out["failures"].append({"part": part, "error": describe(exc)})
            self.progress(f"{part}: FAILED: {describe(exc)}")
            return False
        return True

    async def large(self) -> None:
        """Parts 2, 3, 4 (warm, large), 6, 7 (restarts) and 5 on the large catalog's stack; with
        "batching", queries batched against one at a time on it too."""
        if not (self.wants("large") or self.wants("batching")):
            return
        cat, out = self.catalogs, self.out
        specs = [
            CatalogSpec("main", cat.large),
            CatalogSpec("one", cat.extra[0], secret()),
            CatalogSpec("two", cat.extra[1], secret()),
        ]
        stack = self._stack("large", specs)
        try:
            await stack.start_catalogs()
            self.progress(f"large stack: indexer cold start over {cat.large.tools} tools (empty cache)")
            ready = await stack.start_indexer()
            out["session_open"]["indexer_cold_start"]["large"] = started(stack, ready, cat.large)
            await stack.start_router()
            if self.wants("large"):
                self.progress(f"large stack: idle for {self.plan.idle_seconds:g}s (background CPU)")
                meter = CpuMeter(stack.pids())
                await asyncio.sleep(self.plan.idle_seconds)
                out["background"] = {"backends": len(cat.large.servers) + 2, **meter.stop()}
                await self.guarded("find_tool", self.find_tool(stack))
            if self.wants("batching"):
                await self.guarded("batching", self.batching(stack))
            if self.wants("large"):
                await self.rest_of_large(stack, specs)
        finally:
            stack.close()

    async def rest_of_large(self, stack: Stack, specs: list[CatalogSpec]) -> None:
        """Parts 3, 4 (warm), the probes, 7 (restarts), 6 and 5, after find_tool on the large stack."""
        cat, out = self.catalogs, self.out
        await self.guarded("call_tool", self.call_tool(stack))
        await self.guarded("session_open", self.warm_opens(stack, "large", cat.large))
        await self.guarded("probe_load", self.probe_load(stack))
        self.progress("indexer restart on its filled cache")
        out["embedding"]["process_restart"] = started(stack, await stack.start_indexer(), cat.large)
        await self.guarded("memory", self.memory(stack, specs))
        stack.stop("router")
        stack.stop("indexer")
        self.progress("in-process indexer start on the same cache, then re-index")
        indexer, restarted = await restart_in_process(stack.config_path, self.embedder)
        out["embedding"]["restart"] = restarted
        try:
            await self.guarded("reindex", self.reindex(indexer))
        finally:
            await indexer.close()

    async def batching(self, stack: Stack) -> None:
        """find_tool at 1 and 32 clients, one query a model call, then batched (bench/batching.py)."""
        self.out["batching"] = await batching(stack, self.queries, self.warmups, self.progress)

    async def server(self) -> None:
        """find_tool at 1 and 32 clients with the indexer embedding through Infinity, on this machine."""
        infinity = InfinityServer(CHECKOUT, self.model, self.work / "embedding-server.log")
        stack = self._stack("server", [CatalogSpec("main", self.catalogs.large)])
        try:
            self.progress(f"embedding server: Infinity serving {self.model.name}")
            figures: dict[str, Any] = {"server_start_seconds": round(await infinity.start(), 2)}
            self.out["server"] = figures
            # every query timed as it is answered, never by the lexical arm for a deadline passed
            embedder = {
                "url": infinity.url,
                "model": self.model.name,
                "timeout": 600.0,
                "query_timeout": 60.0,
            }
            config = stack.variant("server", {"embedder": embedder})
            await stack.start_catalogs()
            self.progress(f"embedding server: indexer cold start over {self.catalogs.large.tools} tools")
            ready = await stack.start_indexer(config=config)
            figures["indexer_cold_start"] = started(stack, ready, self.catalogs.large)
            stack.config_path = config  # the router reads the same file
            await stack.start_router()
            pids = stack.pids() | {"bench": os.getpid(), "embedding-server": infinity.pid}
            figures["find_tool"] = await find_tool_runs(
                stack, self.queries, self.warmups, pids, self.progress
            )
            status = fetch(stack.indexer_address, timeout=60).embedding
            figures["identity"] = fetch(stack.indexer_address, timeout=60).model
            figures["lexical_answers"] = int(status.lexical_answers)
        finally:
            stack.close()
            infinity.stop()
            if self.logs is not None and infinity.log.exists():
                self.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(infinity.log, self.logs / infinity.log.name)

    async def probe_load(self, stack: Stack) -> None:
        """The indexer's CPU while it probes every backend with the default health settings.

        The other parts probe once in `plan.health_interval` so that probes stay out of their
        figures; this one shows what the defaults cost an idle indexer with this many backends.
        """
        defaults = Health()
        seconds = max(self.plan.idle_seconds, 2 * defaults.interval)
        self.progress(f"health probes every {defaults.interval:g}s (the default): idle for {seconds:g}s")
        await stack.start_indexer(config=stack.variant("default-health", {"health": {}}))
        meter = CpuMeter({"indexer": stack.procs["indexer"].pid})
        await asyncio.sleep(seconds)
        self.out["probe_load"] = {
            "interval_seconds": defaults.interval,
            "timeout_seconds": defaults.timeout,
            "max_concurrent_probes": defaults.max_concurrent_probes,
            "backends": len(self.catalogs.large.servers) + 2,
            "backends_advertised_after": advertised_backends(stack),
            **meter.stop(),
        }

    async def reindex(self, indexer: Any) -> None:
        self.out["reindex"] = await reindex(indexer, self.plan.reindex_sessions, self.progress)

    async def call_tool(self, stack: Stack) -> None:
        """Part 3."""
        backend, advertised, original, arguments = call_target(self.catalogs.large)
        self.progress(f"call_tool: {advertised}, {self.plan.call_tool_calls} calls")
        backend_url = f"{stack.catalogs['main'].url}/servers/{backend}/mcp"
        self.out["call_tool"] = await call_tool_latency(
            stack.mcp_url, backend_url, advertised, original, arguments, self.plan.call_tool_calls
        )

    async def kept_sessions(self) -> None:
        """Part 3 again, against a backend that keeps sessions: call_tool over the kept backend session."""
        catalog = self.catalogs.small
        stack = self._stack("kept-sessions", [CatalogSpec("kept", catalog, sessions=True)])
        try:
            await stack.start_catalogs()
            self.progress(f"kept sessions: indexer start over {catalog.tools} tools")
            await stack.start_indexer()
            await stack.start_router()
            backend, advertised, original, arguments = call_target(catalog)
            self.progress(
                f"call_tool over a kept backend session: {advertised}, {self.plan.call_tool_calls} calls"
            )
            backend_url = f"{stack.catalogs['kept'].url}/servers/{backend}/mcp"
            # the router and the indexer work only for the routed calls: their CPU per call is the
            # hop's own work, which a loaded machine's latencies hide
            meter = CpuMeter({name: stack.procs[name].pid for name in ("router", "indexer")})
            figures = await call_tool_latency(
                stack.mcp_url, backend_url, advertised, original, arguments, self.plan.call_tool_calls
            )
            figures["cpu"] = meter.stop(requests=self.plan.call_tool_calls + 2)
            own = figures["backend_direct"]["p50_ms"]
            figures["router_over_backend_p50"] = round(figures["router"]["p50_ms"] / own, 2) if own else None
            self.out["call_tool_kept_session"] = figures
        finally:
            stack.close()

    async def stdio(self) -> None:
        """Part 8: a stdio server's tool through the bridge, and the gateway's start beside a stuck one."""
        self.out["stdio"] = await stdio_part(
            lambda name: self._stack(name, []), self.plan.call_tool_calls, self.progress
        )

    async def authorization(self) -> None:
        """The large catalog under a policy of 100 rules against without one (bench/authorized.py)."""
        count = self.plan.authorization_callers
        self.out["authorization"] = await authorization_part(
            self._stack,
            self.catalogs.large,
            self.pools["metatool"].take(4 * count),
            count,
            self.plan.call_tool_calls,
            self.progress,
        )

    async def first_run(self) -> None:
        """Part 9: `make run` from a clean clone of the checkout the benchmark runs in."""
        self.progress("first run: make run from a clean clone")
        self.out["first_run"] = await asyncio.to_thread(make_run_from_clone, CHECKOUT, self.work)

    async def warm_opens(self, stack: Stack, size: str, catalog: CatalogFile) -> None:
        """Part 4, warm."""
        self.progress(f"session open: warm, {size} catalog")
        opens = await open_many(stack.mcp_url, self.pools["metatool"].take(self.plan.warm_opens))
        self.out["session_open"]["warm"][size] = {"tools": catalog.tools, **opens}

    async def find_tool(self, stack: Stack) -> None:
        """Part 2: each query set at each concurrency, and the single client against the floor."""
        runs = await self._find_tool(stack, self.embedder, self.version, self.out["floor"])
        self.out["find_tool"].update(runs)

    async def other_embedder(self, kind: str) -> None:
        """The floor and find_tool of another embedder, on a large stack whose indexer runs it."""
        embedder = self.embedders[kind]
        self.progress(f"{kind} embedder: floor over {self.catalogs.large.tools} tools, empty cache")
        version, cold = cold_build(embedder, self.catalogs.large, self.work / f"floor-cache-{kind}")
        figures: dict[str, Any] = {"identity": embedder.identity, "cold_build": cold}
        self.out["embedders"][kind] = figures
        figures["floor"] = self._floors(embedder, version)
        stack = self._stack(f"large-{kind}", [CatalogSpec("main", self.catalogs.large)], kind=kind)
        try:
            await stack.start_catalogs()
            self.progress(f"{kind} embedder: indexer cold start over {self.catalogs.large.tools} tools")
            await stack.start_indexer()
            await stack.start_router()
            figures["find_tool"] = await self._find_tool(stack, embedder, version, figures["floor"])
        finally:
            stack.close()

    async def _find_tool(
        self, stack: Stack, embedder: Embedder, version: Any, floors: dict[str, Any]
    ) -> dict[str, Any]:
        pids = stack.pids() | {"bench": os.getpid()}
        out: dict[str, Any] = {}
        for name in QUERY_SETS:
            runs: dict[str, Any] = {}
            for clients in CLIENT_COUNTS:
                self.progress(f"find_tool: {name} queries, {clients} concurrent clients")
                queries, warmup = self.queries[name][clients], self.warmups[name][clients]
                beside = None
                if clients == 1:

                    def beside(query: str) -> float:
                        return floor_once(embedder, version, query)[0]

                run = await find_tool_load(stack.mcp_url, queries, warmup, pids, beside)
                run["backends_advertised_after"] = advertised_backends(stack)
                runs[str(clients)] = run
            # the target's ratio is against the floor measured beside the router, query by query
            runs["single_client_p50_over_floor_p50"] = round(
                runs["1"]["p50_ms"] / runs["1"]["beside"]["p50_ms"], 3
            )
            runs["single_client_p50_over_separate_floor_p50"] = round(
                runs["1"]["p50_ms"] / floors[name]["p50_ms"], 3
            )
            out[name] = runs
        return out

    async def memory(self, stack: Stack, specs: list[CatalogSpec]) -> None:
        """Part 6 on a freshly started indexer process."""
        callers = [
            ("anonymous", None),
            ("team-one", specs[1].token("one")),
            ("team-two", specs[2].token("two")),
        ]
        self.progress(f"memory: {self.plan.memory_sessions} sessions over 3 catalogs")
        query = self.pools["metatool"].take(1)[0]
        pid = stack.procs["indexer"].pid
        self.out["memory"] = await memory(
            stack.indexer_address,
            pid,
            callers,
            self.plan.memory_sessions,
            query,
            self.progress,
            self.plan.idle_seconds,
        )

    async def small(self) -> None:
        """Part 4 on the small catalog: the indexer's cold start, then warm opens; then part 10."""
        stack = self._stack("small", [CatalogSpec("main", self.catalogs.small)])
        try:
            await stack.start_catalogs()
            self.progress(f"small stack: indexer cold start over {self.catalogs.small.tools} tools")
            ready = await stack.start_indexer()
            self.out["session_open"]["indexer_cold_start"]["small"] = started(
                stack, ready, self.catalogs.small
            )
            await stack.start_router()
            await self.warm_opens(stack, "small", self.catalogs.small)
            await self.guarded("peer", self.peer(stack))
        finally:
            stack.close()

    async def peer(self, stack: Stack) -> None:
        """Part 10 on the small stack: the same queries through toolsearch and FastMCP's proxy.

        The small stack's indexer is a process of its own, so the large stack's queries reach no
        warm query cache here; each client gets the first of the queries it had there.
        """
        counts = self.plan.peer_per_client
        queries = {
            name: {c: [mine[: counts[c]] for mine in self.queries[name][c]] for c in CLIENT_COUNTS}
            for name in QUERY_SETS
        }
        warmups = {name: self.warmups[name][1] for name in QUERY_SETS}
        self.out["peer"] = await peer_part(stack, self.catalogs.small, queries, warmups, self.progress)

    async def second_stage(self) -> None:
        """Part 13 on a large stack of its own: one client, the second stage on, then off."""
        stack = self._stack("second-stage", [CatalogSpec("main", self.catalogs.large)])
        counts = self.plan.second_stage_queries
        queries = {name: self.queries[name][1][0][: counts[name]] for name in QUERY_SETS}
        warmups = {name: self.warmups[name][1] for name in QUERY_SETS}
        try:
            await stack.start_catalogs()
            self.progress(f"second stage: indexer starts over {self.catalogs.large.tools} tools")
            self.out["second_stage"] = await second_stage_part(
                stack, self.catalogs.large, queries, warmups, self.progress
            )
        finally:
            stack.close()

    async def cold(self, size: str, steady_queries: int | None) -> None:
        """Part 4, cold: a caller's first session on a catalog nobody has embedded, beside a steady load."""
        catalog = self.catalogs.small if size == "small" else self.catalogs.large
        steady, cold = (
            CatalogSpec("resident", self.catalogs.resident, secret()),
            CatalogSpec("cold", catalog, secret()),
        )
        stack = self._stack(f"cold-{size}", [steady, cold], COLD_TIMEOUT)
        try:
            await stack.start_catalogs()
            await stack.start_indexer()
            await stack.start_router()
            self.progress(f"session open: cold, {catalog.tools} tools, beside a steady find_tool load")
            meter = CpuMeter({"indexer": stack.procs["indexer"].pid})
            started = time.perf_counter()
            result = await cold_open(
                stack.mcp_url,
                cold_token=cold.token("newcomer"),
                steady_token=steady.token("regular"),
                cold_query=self.pools["stabletoolbench"].take(1)[0],
                # None: every query left, however long the open takes
                steady_queries=self.pools["metatool"].take(steady_queries or self.pools["metatool"].left),
                warm_queries=self.pools["stabletoolbench"].take(self.plan.cold_next_opens),
                rate=self.plan.steady_rate,
                baseline_seconds=self.plan.baseline_seconds,
            )
            result["indexer_cpu"] = meter.stop()["indexer"]
            result["wall_seconds"] = round(time.perf_counter() - started, 2)
            entry = self.out["session_open"]["cold"][size] = {"tools": catalog.tools, **result}
            if size == "small":
                entry["where_the_time_goes"] = await self.cold_alone(stack, cold, catalog)
        finally:
            stack.close()

    async def cold_alone(self, stack: Stack, cold: CatalogSpec, catalog: CatalogFile) -> dict[str, Any]:
        """Where a cold open's time goes: the same open with nothing beside it (an indexer restarted on
        an empty cache), and the floor, the model's own time for the catalog's texts in this process."""
        self.progress(f"session open: cold, {catalog.tools} tools, alone (indexer restarted, empty cache)")
        empty = stack.variant("cold-alone", {"cache_dir": str(stack.folder / "cache-alone")})
        await stack.start_indexer(config=empty)
        alone = await open_once(stack.mcp_url, self.pools["stabletoolbench"].take(1)[0], cold.token("alone"))
        self.progress(f"session open: the model's own time for the {catalog.tools} tools' texts (floor)")
        _, floor = await asyncio.to_thread(cold_build, self.embedder, catalog, self.work / "cold-floor-cache")
        return {
            "open_alone_seconds": round(alone["total"], 3),
            "initialize_alone_seconds": round(alone["initialize"], 3),
            "texts_embedded": floor["texts_embedded"],
            "model_floor_seconds": floor["embed_seconds"],
            "build_floor_seconds": floor["build_seconds"],
        }

    async def all(self) -> dict[str, Any]:
        """Every part `only` selects; one that fails is recorded in `failures` and the others still run."""
        if self.wants("large") or self.wants("other-embedder"):
            self.floor()  # find_tool's figures are read against it
        steps: list[tuple[str, str, Callable[[], Awaitable[None]]]] = [
            ("large", "large stack", self.large),
            ("server", "embedding server", self.server),
            *(
                ("other-embedder", f"{kind} embedder", functools.partial(self.other_embedder, kind))
                for kind in self.embedders
                if kind != self.kind
            ),
            ("second-stage", "second stage", self.second_stage),
            ("small", "small stack", self.small),
            ("kept-sessions", "kept sessions", self.kept_sessions),
            ("authorization", "authorization", self.authorization),
            # the large cold open's steady load takes every query left: it comes after all the others
            ("cold", "cold open, small", functools.partial(self.cold, "small", 2_000)),
            ("cold-large", "cold open, large", functools.partial(self.cold, "large", None)),
            ("stdio", "stdio servers", self.stdio),
        ]
        for selector, part, step in steps:
            if self.wants(selector) or (selector == "large" and self.wants("batching")):
                await self.guarded(part, step())
        if self.plan.first_run and self.wants("first-run"):
            await self.guarded("first run", self.first_run())
        return self.out
