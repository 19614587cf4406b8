"""Input rounds: calls waiting for their 2026-07-28 client's input, kept with the session (docs/gateway.md).

When a handshake-era backend asks a 2026-07-28 client something during a call, the router that runs
the call answers the client with an input-required result and keeps a record of the round here,
under a token it makes, for as long as the call may last; the replica the client's retry reaches
reads it, passes the client's answers on, and reads what the call came to, which the first replica
writes here when it knows. The records are the router's (JSON it makes and reads); the indexer keeps
them by session, so a token read in another session finds nothing. In memory (one indexer) at most
`ROUNDS_KEPT` are held, the oldest dropped first; in Redis each is a string that expires by itself,
under `round:<session>:<token>`, so every replica reads the same.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple, Protocol

import redis.asyncio as aredis

from indexer.state.redis import Keys, guarded, text

ROUNDS_KEPT = 10_000  # rounds one indexer holds in memory


class RoundStore(Protocol):
    """Where input rounds are kept: `put` one for `ttl` seconds, `get` a live one."""

    async def put(self, session_id: str, token: str, record: str, ttl: float) -> None: ...

    async def get(self, session_id: str, token: str) -> str | None: ...


class _Kept(NamedTuple):
    record: str
    expires: float  # monotonic


class LocalRounds:
    """The `RoundStore` of a single indexer: its own memory, bounded."""

    def __init__(self, limit: int = ROUNDS_KEPT, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()  # oldest first

    async def put(self, session_id: str, token: str, record: str, ttl: float) -> None:
        key = (session_id, token)
        self._kept[key] = _Kept(record, self._clock() + ttl)
        self._kept.move_to_end(key)
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)

    async def get(self, session_id: str, token: str) -> str | None:
        kept = self._kept.get((session_id, token))
        if kept is None:
            return None
        if kept.expires <= self._clock():
            del self._kept[(session_id, token)]
            return None
        return kept.record

    def __len__(self) -> int:
        return len(self._kept)


class RedisRounds:
    """The `RoundStore` replicas share: one Redis string per round, expiring by itself."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client, self._keys = client, keys

    async def put(self, session_id: str, token: str, record: str, ttl: float) -> None:
        async with guarded("keeping an input round"):
            await self._client.set(self._keys.round(session_id, token), record, px=max(1, int(ttl * 1000)))

    async def get(self, session_id: str, token: str) -> str | None:
        async with guarded("reading an input round"):
            value = await self._client.get(self._keys.round(session_id, token))
        return text(value) or None
