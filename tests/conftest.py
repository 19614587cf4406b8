"""Settings every test process shares, made before any test module loads torch."""

import os
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aredis

from commands.ports import PORTS
from indexer.state.redis_connection import TIMEOUT
from tests.support.redis import RedisServer, running_redis

# Tests run in several worker processes side by side (pytest-xdist): each takes its ports from a
# slice of its own, so that two workers never hand out one port.
if "PYTEST_XDIST_WORKER" in os.environ:
    worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    PORTS.share(worker, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))

# As the `toolsearch` command does for its processes: the in-process model then runs on every core
# without its OpenMP workers spinning against the stack's processes on the same cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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
