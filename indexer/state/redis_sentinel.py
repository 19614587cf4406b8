"""Finding the primary through sentinels that may disagree: every sentinel is asked, the majority wins.

The Redis client's own discovery takes the first sentinel that names a primary. A sentinel that is
stale (cut off during a failover) or misconfigured then sends every connection to a server that is
no longer the primary, and every write fails for as long as that sentinel comes first. Here every
sentinel is asked (at once, each within its own deadline), and the primary is the address named by
more than half of those that answered. With no such majority (a tie while they disagree, or none
answering) there is no primary: the command fails at once with `MasterNotFoundError`, which the
state turns into `StateUnavailable`, and the request into 503 with Retry-After, never a hang.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import Any

from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import Sentinel as SyncSentinel

Address = tuple[str, int]


def named_primary(masters: Any, service: str, check: Any) -> Address | None:
    """The address one sentinel's SENTINEL MASTERS answer names for `service`, if it thinks it up."""
    state = masters.get(service)
    if not state or not check(state, service):
        return None
    return str(state["ip"]), int(state["port"])


def elect(service: str, answers: Iterable[Address | None], asked: int) -> Address:
    """The address more than half of the answering sentinels name; MasterNotFoundError without one."""
    named = [a for a in answers if a is not None]
    votes = Counter(named).most_common(2)
    if votes and votes[0][1] * 2 > len(named):
        return votes[0][0]
    why = (
        "none of them names one"
        if not named
        else "they disagree: " + ", ".join(f"{host}:{port} ({count})" for (host, port), count in votes)
    )
    raise MasterNotFoundError(f"no primary for {service!r} from {asked} sentinels: {why}")


class VotingSentinel(Sentinel):
    """The asyncio client's sentinels, electing the primary by majority."""

    async def discover_master(self, service_name: str) -> Address:
        async def ask(node: Any) -> Address | None:
            try:
                return named_primary(await node.sentinel_masters(), service_name, self.check_master_state)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                return None

        answers = await asyncio.gather(*(ask(node) for node in self.sentinels))
        return elect(service_name, answers, len(self.sentinels))


class SyncVotingSentinel(SyncSentinel):
    """The blocking client's sentinels (embeddings, from worker threads), electing the same way."""

    def discover_master(self, service_name: str) -> Address:
        answers = []
        for node in self.sentinels:
            try:
                answers.append(named_primary(node.sentinel_masters(), service_name, self.check_master_state))
            except (RedisConnectionError, RedisTimeoutError, OSError):
                answers.append(None)
        return elect(service_name, answers, len(self.sentinels))
