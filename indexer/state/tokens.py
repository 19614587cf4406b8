"""Tokens exchanged for backends, kept until shortly before they expire (docs/auth.md).

A token minted for a backend in exchange for a caller's is kept under a key that names the backend's
exchange settings and the principal (indexer/backends/backend_tokens.py makes the keys), so that
every request of that principal to that backend, on any replica, uses it until it is about to
expire. In memory (one indexer) at most `TOKENS_KEPT` are held, the least recently used dropped
first; in Redis each is a string that expires by itself, under `token:<key>`, so every replica
reads the same. They are credentials: stored as sessions store theirs, never logged.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple, Protocol

import redis.asyncio as aredis

from indexer.state.redis import Keys, guarded, text

TOKENS_KEPT = 10_000  # tokens one indexer holds in memory: principals x token-exchange backends


class TokenStore(Protocol):
    """Where exchanged tokens are kept: `get` a live one, `put` one for `ttl` seconds, `drop` one."""

    async def get(self, key: str) -> str | None: ...

    async def put(self, key: str, token: str, ttl: float) -> None: ...

    async def drop(self, key: str) -> None: ...


class _Kept(NamedTuple):
    token: str
    expires: float  # monotonic


class LocalTokens:
    """The `TokenStore` of a single indexer: its own memory, bounded."""

    def __init__(self, limit: int = TOKENS_KEPT, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # least recently used first

    async def get(self, key: str) -> str | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        if kept.expires <= self._clock():
            del self._kept[key]
            return None
        self._kept.move_to_end(key)
        return kept.token

    async def put(self, key: str, token: str, ttl: float) -> None:
        self._kept[key] = _Kept(token, self._clock() + ttl)
        self._kept.move_to_end(key)
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)

    async def drop(self, key: str) -> None:
        self._kept.pop(key, None)

    def __len__(self) -> int:
        return len(self._kept)


class RedisTokens:
    """The `TokenStore` replicas share: one Redis string per token, expiring by itself."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client, self._keys = client, keys

    async def get(self, key: str) -> str | None:
        async with guarded("reading an exchanged token"):
            value = await self._client.get(self._keys.token(key))
        return text(value) or None

    async def put(self, key: str, token: str, ttl: float) -> None:
        async with guarded("storing an exchanged token"):
            await self._client.set(self._keys.token(key), token, px=max(1, int(ttl * 1000)))

    async def drop(self, key: str) -> None:
        async with guarded("dropping an exchanged token"):
            await self._client.delete(self._keys.token(key))
