"""Settings every test process shares, made before any test module loads torch.

The suite has two tiers, a folder each (tests/support/tiers.py says which, and keeps the first
honest). The in-process tier starts no process: `search/` (retrieval on the real and the fake
embedder), `gateway/` (the router's answers, up to the whole stack served from the test's own process
by tests/support/in_process.py), `indexer/` (health, sessions, start and stop) and `operations/`
(configuration, credentials, logs, compose). `system/` holds what is about processes or needs them:
`up`, shutdown, replicas, Redis and Sentinel, stdio servers, third-party servers, Kubernetes,
packaging, the conformance suite, the soak and the benchmark. `make test` runs the first, then the
second; `make test-fast` the first alone.
"""

import os

# Before anything imports gRPC (the imports below do): its core's fork handlers off, as the `toolsearch`
# command has them (commands/cli.py), so that a test forking a worker that runs the core (a
# pseudo-terminal's child) does not have them restart its threads in the copy, which they may abort.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aredis

from commands.ports import PORTS
from indexer.state.redis_connection import TIMEOUT
from tests.support.redis import RedisServer, running_redis

# the tiers: which folder is which, `--tier`, and no process started in the in-process one
pytest_plugins = ("tests.support.tiers",)

# Tests run in several worker processes side by side (pytest-xdist): each takes its ports from a
# slice of its own, so that two workers never hand out one port.
if "PYTEST_XDIST_WORKER" in os.environ:
    worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    PORTS.share(worker, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))

# As the `toolsearch` command does for its processes: the in-process model then runs on every core
# without its OpenMP workers spinning against the stack's processes on the same cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# pytest-xdist hands a worker one file at a time in the order collected, so the longest files of each
# tier go first and the short ones fill in at the end: no worker is left running a long file alone
# while the others have finished. (Files of the system tier go before the in-process tier's when both
# run in one go.)
LONGEST_FIRST = (
    "test_bench",
    "test_sentinel_failover",
    "test_kubernetes_processes",
    "test_soak",
    "test_fuzz",
    "test_retrieval_quality",
    "test_embedding_cache",
    "test_match_bands",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def cost(item: pytest.Item) -> tuple[int, int]:
        name = item.path.stem
        rank = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return (0 if item.path.parent.name == "system" else 1, rank)

    items.sort(key=cost)  # stable: a file's tests stay together and in their order


# A redis-server per test module that asks for one, and a plain client on its emptied database.
@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as running:
        yield running


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aredis.Redis]:
    """A plain client on an emptied database, to look at what the stores wrote."""
    plain = aredis.Redis.from_url(redis_server.url, socket_timeout=TIMEOUT)
    await plain.flushall()
    try:
        yield plain
    finally:
        await plain.aclose()
