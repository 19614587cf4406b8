"""How much a run measures: the full run (what docs/performance.md reports) and `--quick`."""

from __future__ import annotations

from dataclasses import dataclass, field

QUERY_SETS = ("stabletoolbench", "metatool")
CLIENT_COUNTS = (1, 8, 32)  # clients searching at once: one run each
# what `toolsearch bench --only` selects: the large stack's parts (1 to 7), queries batched against
# one at a time, find_tool with the model behind an embedding server, then the other stacks' parts
# (the second stage's on one of its own)
PARTS = (
    "large",
    "batching",
    "server",
    "other-embedder",
    "second-stage",
    "small",
    "kept-sessions",
    "authorization",
    "cold",
    "cold-large",
    "stdio",
    "first-run",
)


@dataclass(frozen=True)
class Plan:
    """Counts and sizes for one run; every part runs in both modes, `quick` only with less."""

    quick: bool
    large_tools: int | None  # the large catalog: None for the whole StableToolBench catalog
    small_tools: int  # the small catalog: the first servers until this many tools
    resident_tools: int  # the other caller's catalog while a cold session opens
    extra_tools: int  # each JWT-protected catalog of the memory part
    # per query set: find_tool queries each client sends, by number of concurrent clients
    per_client: dict[str, dict[int, int]] = field(default_factory=dict)
    warmup: int = 3  # unmeasured find_tool calls before each measured run
    call_tool_calls: int = 200
    warm_opens: int = 100
    cold_next_opens: int = 5  # opens by the same caller after its cold one
    steady_rate: float = 20.0  # find_tool per second from the other session during a cold open
    baseline_seconds: float = 10.0
    idle_seconds: float = 25.0  # window for the indexer's background CPU (health probes)
    reindex_sessions: tuple[int, ...] = (1, 1_000, 10_000)
    # Seconds a health probe may take. The default (5) lets a round of probes of 800 backends time
    # out under load, and the indexer then drops every backend; docs/performance.md has the figures.
    health_timeout: float = 30.0
    # Seconds between health probes. At the default (10) an indexer probing 800 backends spends
    # about half a core on probes alone and find_tool through the router cannot be measured for the
    # queueing behind them (docs/performance.md); the runs probe once in ten minutes instead.
    health_interval: float = 600.0
    memory_sessions: int = 10_000
    first_run: bool = True  # `make run` from a clean clone (minutes, and downloads): full runs only
    # the peer's queries per client, by number of concurrent clients (commands.bench.peer): its search
    # lists every server for every query, about a second each over the small catalog's 22 servers
    peer_per_client: dict[int, int] = field(default_factory=lambda: {1: 20, 8: 4, 32: 2})
    # find_tool queries of one client, per query set, with the second stage and again without it
    second_stage_queries: dict[str, int] = field(
        default_factory=lambda: {"stabletoolbench": 100, "metatool": 200}
    )
    # callers of different allowed sets under the authorization part's policy (commands.bench.authorized)
    authorization_callers: int = 50


FULL = Plan(
    quick=False,
    large_tools=None,
    small_tools=140,
    resident_tools=199,
    extra_tools=20,
    per_client={
        "stabletoolbench": {1: 100, 8: 30, 32: 12},  # 724 of its 764 distinct queries
        "metatool": {1: 200, 8: 50, 32: 30},
    },
)

QUICK = Plan(
    quick=True,
    large_tools=60,
    small_tools=20,
    resident_tools=30,
    extra_tools=5,
    per_client={"stabletoolbench": {1: 8, 8: 2, 32: 1}, "metatool": {1: 10, 8: 2, 32: 1}},
    warmup=1,
    call_tool_calls=10,
    warm_opens=5,
    cold_next_opens=2,
    baseline_seconds=2.0,
    idle_seconds=2.0,
    reindex_sessions=(1, 10, 100),
    memory_sessions=30,
    first_run=False,
    peer_per_client={1: 2, 8: 1, 32: 1},
    second_stage_queries={"stabletoolbench": 4, "metatool": 5},
    authorization_callers=3,
)
