"""Redis's primary lost under load: two indexer replicas and two routers on Redis with Sentinel.

Real processes on loopback: a Redis primary, two replicas and three sentinels (with the timing of
deploy/kubernetes), the catalog server, two indexers sharing the state through the sentinels, two
routers. 16 MCP clients call find_tool and call_tool through both routers (tests/support/soak.py);
once each has had an answer, the primary is killed (SIGKILL: its connections refused at once) or
frozen (SIGSTOP: a node that stops answering, its connections silent until they time out).
Counted: what the clients see (503s, lost sessions, anything else), the time until the sentinels
agree on a new primary, the time until each indexer replica sends its commands there, and, from a
raw client, that every 503 carried Retry-After. Then a failover that can never complete (two of
three sentinels gone with the primary): every request is answered 503 with Retry-After within a
bound, none hangs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis

from tests.support.sentinel import SentinelGroup, node, running_sentinels
from tests.support.soak import soak
from tests.support.stack import HEADERS, Stack, open_session, running_stack

PASSWORD = "failover-test-password"
CLIENTS = 16
STEADY_SECONDS = float(os.environ.get("TOOLSEARCH_FAILOVER_SECONDS", "10"))
FOLLOW_WITHIN = 60.0  # seconds every replica may take to reach the new primary (measured: below)
ANSWER_WITHIN = 15.0  # seconds a request may take, however the failover goes: two indexer timeouts
HANDSHAKE = {"client|setname", "client|setinfo", "hello", "auth", "select", "ping", "NULL"}
FIND: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "find_tool", "arguments": {"tool_description": "weather", "limit": 1}},
}


@dataclass
class Failover:
    """What the disruption measured, in seconds from the SIGKILL of the primary."""

    promoted_after: float = 0.0
    followed_after: dict[str, float] = field(default_factory=dict)  # indexer process -> seconds
    answers: list[tuple[int, str | None, float]] = field(default_factory=list)  # status, Retry-After, s


def indexer_pids(stack: Stack) -> dict[str, int]:
    return {name: proc.pid for name, proc in stack.procs.items() if name.startswith("indexer")}


def working_clients(port: int) -> set[int]:
    """The pids of the indexer processes whose connections to the server on `port` did real work."""
    try:
        clients = node(port, PASSWORD).client_list()
    except (redis.RedisError, OSError):
        return set()
    pids = set()
    for client in clients:
        name = str(client.get("name", ""))
        if name.startswith("toolsearch-indexer:") and client.get("cmd") not in HANDSHAKE:
            pids.add(int(name.rpartition(":")[2]))
    return pids


def lose_the_primary(group: SentinelGroup, stack: Stack, measured: Failover, how: str) -> None:
    """Kill or freeze the primary, then wait for the promotion and for every indexer on the new one."""
    killed = time.monotonic()
    group.lose_primary(how)
    primary = group.wait_for_promotion(FOLLOW_WITHIN)
    measured.promoted_after = time.monotonic() - killed
    pids = indexer_pids(stack)
    while len(measured.followed_after) < len(pids):
        seen = working_clients(primary)
        for name, pid in pids.items():
            if pid in seen and name not in measured.followed_after:
                measured.followed_after[name] = time.monotonic() - killed
        assert time.monotonic() - killed < FOLLOW_WITHIN, f"not every indexer followed: {measured}"
        time.sleep(0.05)


async def probe_while(stack: Stack, measured: Failover, until: asyncio.Event) -> None:
    """A raw client's find_tool every 100 ms on one session: every status, Retry-After and duration."""
    session = await asyncio.to_thread(open_session, stack.mcp_url)
    headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    async with httpx2.AsyncClient(timeout=ANSWER_WITHIN + 5) as http:
        while not until.is_set():
            started = time.monotonic()
            response = await http.post(stack.mcp_url, json=FIND, headers=headers)
            elapsed = time.monotonic() - started
            measured.answers.append((response.status_code, response.headers.get("retry-after"), elapsed))
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("how", ["killed", "frozen"])
async def test_a_lost_redis_primary_is_replaced_and_followed_losing_no_session(
    tmp_path: Path, how: str
) -> None:
    with (
        running_sentinels(tmp_path / "redis", replicas=2, password=PASSWORD) as group,
        running_stack(
            tmp_path,
            routers=2,
            replicas=2,
            extra={"indexer": {"state_password_env": "TOOLSEARCH_REDIS_PASSWORD"}},
            env={
                "TOOLSEARCH_INDEXER_STATE": group.url,
                "TOOLSEARCH_REDIS_PASSWORD": PASSWORD,
                "TOOLSEARCH_INDEXER_STATE_ACKS": "1",  # as deploy/kubernetes's scaled overlay
            },
        ) as stack,
    ):
        measured = Failover()
        done = asyncio.Event()
        prober = asyncio.create_task(probe_while(stack, measured, done))
        try:
            report = await soak(
                stack,
                STEADY_SECONDS,
                clients=CLIENTS,
                disrupt=lambda s: lose_the_primary(group, s, measured, how),
                call_bound=ANSWER_WITHIN + 5,
            )
        finally:
            done.set()
            await prober

        figures: dict[str, Any] = {
            "primary": how,
            **report.as_dict(),
            "promoted_after_s": round(measured.promoted_after, 2),
            "followed_after_s": {k: round(v, 2) for k, v in measured.followed_after.items()},
            "probe_statuses": {
                str(s): sum(1 for a in measured.answers if a[0] == s)
                for s in {a[0] for a in measured.answers}
            },
            "probe_slowest_s": round(max(a[2] for a in measured.answers), 2),
        }
        print(json.dumps(figures, indent=1))
        (tmp_path / f"sentinel-failover-{how}.json").write_text(json.dumps(figures, indent=1))

        outcomes = report.outcomes
        assert outcomes["hung"] == 0 and outcomes["unexpected"] == 0, report.unexpected
        assert outcomes["session_lost"] == 0, "a session acknowledged before the failover was lost"
        assert report.sessions_opened == CLIENTS  # nobody had to re-initialize
        assert report.recovered_clients == CLIENTS
        assert set(measured.followed_after) == set(indexer_pids(stack))
        for status, retry_after, elapsed in measured.answers:
            assert status in (200, 503), status
            assert elapsed < ANSWER_WITHIN
            if status == 503:
                assert retry_after is not None and int(retry_after) >= 1
        assert measured.answers[-1][0] == 200  # the probe's own session survived too

        # a failover that can never complete: two sentinels gone with the new primary
        sessions = [await asyncio.to_thread(open_session, f"{url}/mcp") for url in stack.router_urls]
        for sentinel in group.sentinels[1:]:
            group.kill(sentinel)
        group.kill_primary()
        slowest = 0.0
        async with httpx2.AsyncClient(timeout=ANSWER_WITHIN + 5) as http:
            for _ in range(3):
                for url, session in zip(stack.router_urls, sessions, strict=True):
                    headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
                    started = time.monotonic()
                    response = await http.post(f"{url}/mcp", json=FIND, headers=headers)
                    slowest = max(slowest, time.monotonic() - started)
                    assert slowest < ANSWER_WITHIN
                    assert response.status_code == 503, response.text
                    assert int(response.headers["retry-after"]) >= 1
        print(json.dumps({"no_failover_possible_slowest_503_s": round(slowest, 2)}))
