"""The Redis state backend: key names, listings, health, embeddings, and the sweep.

Every command has a deadline (`TIMEOUT` for connecting and for each answer) and a connection error
is retried once (a pooled connection may predate a Redis restart, or a Sentinel failover:
`indexer.state.redis_connection`); a failure becomes
`StateUnavailable` here, never a Redis exception further up. Keys (docs/scaling.md lists them) share
one prefix, so several deployments can share a Redis database. Lua scripts build key names from that
prefix, so the backend needs one Redis (with replicas, if wanted), not a Redis Cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict

import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError

from indexer.state.backends import STATUSES, BackendHealth
from indexer.state.base import StateUnavailable
from indexer.state.listings import Listing, Offers, ServerInfo, intern_listing
from indexer.state.redis_connection import close_sync_client

logger = logging.getLogger(__name__)

_LISTINGS_KEPT = 512  # listings this replica keeps decoded, by digest
_WRITTEN_KEPT = 4096  # digests this replica remembers having stored lately
_CHUNK = 500  # keys per command or pipeline


class Keys:
    """Every key name the backend uses, under one prefix."""

    def __init__(self, prefix: str = "toolsearch:") -> None:
        self.prefix = prefix
        self.sessions = f"{prefix}sessions"  # set of live session ids (an index; swept)
        self.expiry = f"{prefix}sessions:expiry"  # sorted set: session id -> when it expires, unused
        self.implied = f"{prefix}implied"  # hash: principal -> its implied session's id (swept)
        self.health = f"{prefix}health"  # hash: backend id -> its health record
        self.generation = f"{prefix}health:generation"  # grows with every published health change
        self.lease = f"{prefix}lease"  # the replica that probes backends and runs rebuild passes
        self.events = f"{prefix}events"  # pub/sub channel of hints between replicas

    def session(self, session_id: str) -> str:
        return f"{self.prefix}session:{session_id}"

    def swaps(self, session_id: str) -> str:
        return f"{self.prefix}session:{session_id}:swaps"

    def backend_sessions(self, session_id: str) -> str:
        """The hash of a session's backend sessions: backend id -> [session id, protocol version]."""
        return f"{self.prefix}session:{session_id}:backends"

    def owned(self, principal: str) -> str:
        """The sorted set of a counted principal's sessions (as `expiry`), by a hash of its key."""
        return f"{self.prefix}principal:{hashlib.sha256(principal.encode()).hexdigest()[:32]}"

    def listing(self, digest: str) -> str:
        return f"{self.prefix}listing:{digest}"

    def token(self, key: str) -> str:
        """A token exchanged for a backend, under a digest of the backend's settings and the principal."""
        return f"{self.prefix}token:{key}"

    def round(self, session_id: str, token: str) -> str:
        """A call of the session waiting for its client's input, under the router's token for it."""
        return f"{self.prefix}round:{session_id}:{token}"

    def stream(self, session_id: str, stream_id: str) -> str:
        """A call's stream of the session, kept for its client to resume."""
        return f"{self.prefix}stream:{session_id}:{stream_id}"

    def embeddings(self, identity: str) -> str:
        return f"{self.prefix}embeddings:{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


@contextlib.asynccontextmanager
async def guarded(action: str) -> AsyncIterator[None]:
    """Turn a Redis failure into `StateUnavailable` (the exception's text may name the server)."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise StateUnavailable(f"shared state unavailable while {action} ({type(exc).__name__})") from None


def text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def chunks(items: Sequence[str], size: int = _CHUNK) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class RedisCatalogs:
    """Listings stored once each under `listing:<digest>`, kept while something refers to them."""

    def __init__(self, client: aredis.Redis, keys: Keys, ttl: float) -> None:
        self._client, self._keys = client, keys
        self._ttl_ms = int(ttl * 1000)
        self._decoded: OrderedDict[str, Listing] = OrderedDict()  # one object per digest, reused
        self._written: dict[str, float] = {}  # digest -> when this replica last stored it

    def remember(self, digest: str, listing: Listing) -> Listing:
        """The one `Listing` object this replica uses for a digest (identity keys catalog memos)."""
        known = self._decoded.get(digest)
        if known is not None:
            self._decoded.move_to_end(digest)
            return known
        self._decoded[digest] = listing
        if len(self._decoded) > _LISTINGS_KEPT:
            self._decoded.popitem(last=False)
        return listing

    async def put(self, listings: Iterable[tuple[str, Listing]]) -> None:
        now = time.monotonic()
        window = self._ttl_ms / 2000  # a digest stored this lately needs no second write
        fresh: dict[str, Listing] = {}
        for digest, listing in listings:
            self.remember(digest, listing)
            if now - self._written.get(digest, -window) >= window:
                fresh[digest] = listing
        if not fresh:
            return
        async with guarded("storing listings"), self._client.pipeline(transaction=False) as pipe:
            for digest, listing in fresh.items():
                encoded = json.dumps(
                    {
                        "tools": listing.tools,
                        "protocol_version": listing.protocol_version,
                        "server": listing.server.as_dict(),
                        "offers": listing.offers.as_list(),
                    }
                )
                pipe.set(self._keys.listing(digest), encoded, px=self._ttl_ms)
            await pipe.execute()
        self._written.update(dict.fromkeys(fresh, now))
        if len(self._written) > _WRITTEN_KEPT:
            self._written = {d: at for d, at in self._written.items() if now - at < window}

    async def get(self, digests: Iterable[str]) -> dict[str, Listing]:
        found: dict[str, Listing] = {}
        missing = []
        for digest in dict.fromkeys(digests):
            if (listing := self._decoded.get(digest)) is not None:
                found[digest] = listing
            else:
                missing.append(digest)
        for part in chunks(missing):
            async with guarded("reading listings"):
                values = await self._client.mget([self._keys.listing(d) for d in part])
            for digest, value in zip(part, values, strict=True):
                if value is None:
                    continue
                data = json.loads(value)
                server = ServerInfo.from_dict(data.get("server"))
                offers = Offers.from_list(data.get("offers"))
                listing = Listing(tuple(data["tools"]), str(data["protocol_version"]), 0.0, server, offers)
                # the object the sessions listing it here hold too, if any: one copy, digest known
                found[digest] = self.remember(digest, intern_listing(listing, digest))
        return found

    async def touch(self, digests: Iterable[str]) -> None:
        for part in chunks(list(dict.fromkeys(digests))):
            async with guarded("keeping listings"), self._client.pipeline(transaction=False) as pipe:
                for digest in part:
                    pipe.pexpire(self._keys.listing(digest), self._ttl_ms)
                await pipe.execute()


class RedisHealth:
    """The lease holder's verdicts: `health` (backend -> `BackendHealth` as JSON), `health:generation`."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client, self._keys = client, keys

    async def publish(self, health: Mapping[str, BackendHealth]) -> int:
        async with guarded("publishing health"), self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.health)
            if health:
                pipe.hset(self._keys.health, mapping={b: json.dumps(asdict(h)) for b, h in health.items()})
            pipe.incr(self._keys.generation)
            *_, generation = await pipe.execute()
        return int(generation)

    async def generation(self) -> int:
        async with guarded("reading the health generation"):
            value = await self._client.get(self._keys.generation)
        return int(value or 0)

    async def load(self) -> tuple[int, dict[str, BackendHealth]]:
        async with guarded("reading health"), self._client.pipeline(transaction=True) as pipe:
            pipe.get(self._keys.generation)
            pipe.hgetall(self._keys.health)
            generation, stored = await pipe.execute()
        health = {}
        for backend_id, value in stored.items():
            fields = json.loads(value)
            # a status this replica's code does not know (a newer replica's) is not adopted
            if fields.get("status") in STATUSES:
                health[text(backend_id)] = BackendHealth(**fields)
        return int(generation or 0), health


class RedisEmbeddings:
    """Vectors in one hash per model: key (sha256 of identity and text) -> float32 bytes.

    Called from worker threads while indexes build, so it has its own blocking client. Like the
    SQLite store it never raises: when Redis cannot answer, the vectors are computed instead.
    """

    def __init__(self, client: redis.Redis, keys: Keys, identity: str) -> None:
        self._client = client
        self._key = keys.embeddings(identity)

    def get(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        try:
            for start in range(0, len(keys), _CHUNK):
                part = list(keys[start : start + _CHUNK])
                values = self._client.hmget(self._key, part)
                found.update((k, v) for k, v in zip(part, values, strict=True) if isinstance(v, bytes))
        except (RedisError, OSError) as exc:
            logger.warning("shared embeddings unreadable, embedding instead (%s)", type(exc).__name__)
        return found

    def put(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        try:
            for start in range(0, len(items), _CHUNK):
                self._client.hset(self._key, mapping=dict(items[start : start + _CHUNK]))
        except (RedisError, OSError) as exc:
            logger.warning("shared embeddings not stored (%s)", type(exc).__name__)

    def close(self) -> None:
        close_sync_client(self._client)
