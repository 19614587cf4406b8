"""What a session costs Redis, measured on the real stack.

One router and one indexer on a real redis-server, the example catalog (231 tools) as backends;
sessions opened with a raw `initialize` through the router, 16 at a time. Redis's `used_memory` is
read before and after (the indexer's own cost per session is `toolsearch bench`'s: its resident
memory moves by more than that as it returns what its start-up took). The figure, per 10,000
sessions, is printed for docs/kubernetes.md, "Sizing", and bounded here so that a change that
makes a session much dearer fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx2
import redis

from tests.support.redis import running_redis
from tests.support.stack import HEADERS, INITIALIZE, running_stack

SESSIONS = int(os.environ.get("TOOLSEARCH_CAPACITY_SESSIONS", "2000"))
AT_ONCE = 16
REDIS_BYTES_PER_SESSION = 8192  # the bound: twice what was measured (3.8 kB; docs/kubernetes.md)


async def open_sessions(mcp_url: str, count: int) -> None:
    limit = asyncio.Semaphore(AT_ONCE)
    async with httpx2.AsyncClient(timeout=30) as http:

        async def one() -> None:
            async with limit:
                response = await http.post(mcp_url, json=INITIALIZE, headers=HEADERS)
                assert response.status_code == 200, response.text

        await asyncio.gather(*(one() for _ in range(count)))


async def test_a_session_costs_redis_a_few_kilobytes(tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        with running_stack(tmp_path, env={"TOOLSEARCH_INDEXER_STATE": server.url}) as stack:
            await open_sessions(stack.mcp_url, 50)  # the first ones build what every session shares
            redis_before = int(client.info("memory")["used_memory"])
            await open_sessions(stack.mcp_url, SESSIONS)
            redis_after = int(client.info("memory")["used_memory"])
            keys = int(client.dbsize())
    per_session = (redis_after - redis_before) / SESSIONS
    figures = {
        "sessions": SESSIONS,
        "redis_bytes_per_session": round(per_session),
        "redis_mb_per_10000_sessions": round(per_session * 10_000 / 1e6, 1),
        "redis_keys": keys,
    }
    print(json.dumps(figures))
    assert 0 < per_session < REDIS_BYTES_PER_SESSION, figures
