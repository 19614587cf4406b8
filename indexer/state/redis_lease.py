"""The lease (one replica probes and rebuilds at a time) and the event channel between replicas.

The lease is one key, `lease`, set with `SET NX PX` to the holder's replica id and renewed by the
holder (a script renews it only if it still names this replica). A replica counts itself the holder
until its last successful renewal plus nine tenths of the time to live: by then it has stopped,
before the key can expire and another replica can take it. When a holder dies its lease expires
after `lease_ttl` seconds and the next replica to try takes it over.

Events are pub/sub messages (JSON) on one channel: hints that let replicas fetch new index versions
and health early. A replica that misses them still answers correctly, since every request reads its
session's record and followers also poll the health generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import RedisError

from indexer.state.redis import Keys, guarded, text

logger = logging.getLogger(__name__)

_SAFETY = 0.9  # of the time to live: a holder stops counting itself the holder this early
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RECONNECT_SECONDS = 1.0  # pause before subscribing again after the connection broke


class RedisLease:
    """A lease in Redis with a time to live; `acquire` both takes and renews it."""

    def __init__(self, client: aredis.Redis, keys: Keys, ttl: float, holder: str | None = None) -> None:
        self._client, self._key = client, keys.lease
        self._ttl = ttl
        self._holder = holder or secrets.token_hex(8)
        self._until = 0.0  # monotonic time until which this replica holds the lease
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def held(self) -> bool:
        return time.monotonic() < self._until

    async def acquire(self) -> bool:
        started = time.monotonic()  # the key's time to live counts from no later than this
        async with guarded("renewing the lease"):  # a failure leaves the last renewal's bound
            won = await self._renew(keys=[self._key], args=[self._holder, int(self._ttl * 1000)])
        self._until = started + self._ttl * _SAFETY if won else 0.0
        return bool(won)

    async def release(self) -> None:
        held, self._until = self.held, 0.0
        if held:
            async with guarded("releasing the lease"):
                await self._release(keys=[self._key], args=[self._holder])


class RedisEvents:
    """Publishes and receives JSON messages on the `events` channel."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client, self._channel = client, keys.events

    async def publish(self, message: Mapping[str, Any]) -> None:
        async with guarded("publishing an event"):
            await self._client.publish(self._channel, json.dumps(message))

    async def listen(self) -> AsyncIterator[dict[str, Any]]:
        """Every message from now on; resubscribes after a broken connection, until cancelled."""
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None or message.get("type") != "message":
                        continue
                    with contextlib.suppress(ValueError):
                        data = json.loads(text(message["data"]))
                        if isinstance(data, dict):
                            yield data
            except (RedisError, OSError) as exc:
                logger.debug("event channel broken (%s); subscribing again", type(exc).__name__)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            await asyncio.sleep(_RECONNECT_SECONDS)
