"""State backends: where an indexer keeps sessions, listings, embeddings and health (docs/scaling.md).

    state = make_state("redis://redis:6379/0", identity, dimension, cache_dir, session_ttl, lease_ttl)
    await state.ready()  # StateUnavailable when Redis does not answer
    ...
    await state.close()

`memory` (the default) keeps everything in the process and embeddings in a SQLite file under
`cache_dir`; a `redis://` (or `rediss://`, `unix://`, `redis+sentinel://`) URL keeps it all in
Redis, shared by every replica, and gives the replicas a lease and an event channel (`State.shared`).
Whether this process leads (probes the backends, publishes their health, runs the rebuild passes) is
answered by `State.leadership` alone, over the lease when there is one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from indexer.state.backends import BackendHealth
from indexer.state.base import (
    NO_CAPS,
    SWAPS_KEPT,
    CatalogRef,
    CatalogStore,
    EmbeddingStore,
    EndedSession,
    Events,
    HealthStore,
    Lease,
    Room,
    RoomFull,
    SessionRecord,
    SessionStore,
    Shared,
    StateUnavailable,
    Swap,
    SwapChange,
)
from indexer.state.disk import disk_embeddings
from indexer.state.memory import LocalSessions
from indexer.state.redis import Keys, RedisCatalogs, RedisEmbeddings, RedisHealth
from indexer.state.redis_connection import RedisTarget, close_async_client
from indexer.state.redis_lease import RedisEvents, RedisLease
from indexer.state.redis_sessions import RedisSessions
from indexer.state.rounds import LocalRounds, RedisRounds, RoundStore
from indexer.state.stream_events import LocalStreams, RedisStreams, StreamStore
from indexer.state.tokens import LocalTokens, RedisTokens, TokenStore

__all__ = [
    "NO_CAPS",
    "SWAPS_KEPT",
    "BackendHealth",
    "CatalogRef",
    "CatalogStore",
    "EmbeddingStore",
    "EndedSession",
    "Events",
    "HealthStore",
    "Leadership",
    "Lease",
    "LocalSessions",
    "LocalTokens",
    "Room",
    "RoomFull",
    "RoundStore",
    "SessionRecord",
    "SessionStore",
    "Shared",
    "State",
    "StateUnavailable",
    "Swap",
    "SwapChange",
    "TokenStore",
    "make_state",
    "state_secret",
]


class Leadership:
    """Whether this process leads: the one place that answers it, so every part agrees.

    The leader probes the backends, publishes their health and runs the rebuild passes. A process
    alone (no lease: memory state) always leads; replicas sharing state lead one at a time, while
    they hold the lease (renewed in time). Taking and renewing the lease stay with the `Replica`.
    """

    def __init__(self, lease: Lease | None = None) -> None:
        self._lease = lease

    @property
    def leads(self) -> bool:
        return self._lease is None or self._lease.held


@dataclass
class State:
    """One indexer's state backend. `shared` is None in memory mode."""

    sessions: SessionStore
    embeddings: EmbeddingStore | None  # handed to `Embeddings`, which closes it
    shared: Shared | None = None
    description: str = "memory"  # for logs: the URL without a password
    check: Callable[[], Awaitable[None]] | None = None  # raises `StateUnavailable` when unreachable
    leadership: Leadership = field(init=False)  # over the shared state's lease, if there is one
    tokens: TokenStore = field(default_factory=LocalTokens)  # tokens exchanged for backends
    rounds: RoundStore = field(default_factory=LocalRounds)  # calls waiting for their client's input
    streams: StreamStore = field(default_factory=LocalStreams)  # call streams kept for resumption

    def __post_init__(self) -> None:
        self.leadership = Leadership(self.shared.lease if self.shared is not None else None)

    async def ready(self) -> None:
        """Check that the backend answers; raises `StateUnavailable` when it does not."""
        if self.check is not None:
            await self.check()

    async def close(self) -> None:
        await self.sessions.close()
        if self.shared is not None:
            await self.shared.close()


def state_secret(environ: Mapping[str, str], name: str | None, setting: str) -> str | None:
    """The value of the variable `setting` names (None when unnamed); StateUnavailable when unset."""
    if not name:
        return None
    value = environ.get(name)
    if not value:
        raise StateUnavailable(
            f"{setting}: the variable {name} is not set; set it to the password, or unset {setting}"
        )
    return value


def make_state(
    url: str,
    identity: str,
    dimension: int,
    cache_dir: Path | None = None,
    session_ttl: float = 86_400.0,
    lease_ttl: float = 10.0,
    prefix: str = "toolsearch:",
    password: str | None = None,
    sentinel_password: str | None = None,
    acks: int = 0,
) -> State:
    """The state backend `url` names (`memory`, a Redis URL or Redis Sentinel); connects on first use.

    `password` (the Redis servers') and `sentinel_password` come from the variables the
    configuration names, read by the entry point; `acks` replicas must hold a new session before
    it is acknowledged (Redis's WAIT), so that a failover cannot lose it.
    """
    if url == "memory":
        return State(LocalSessions(session_ttl), disk_embeddings(cache_dir, identity, dimension))
    keys = Keys(prefix)
    target = RedisTarget(url, password, sentinel_password)
    client = target.async_client()
    catalogs = RedisCatalogs(client, keys, session_ttl)
    sessions = RedisSessions(client, keys, catalogs, session_ttl, acks)
    shared = Shared(
        catalogs=catalogs,
        health=RedisHealth(client, keys),
        lease=RedisLease(client, keys, lease_ttl),
        events=RedisEvents(client, keys),
        session_ttl=session_ttl,
        lease_ttl=lease_ttl,
        sweep=sessions.sweep,
        closer=partial(close_async_client, client),
    )

    async def check() -> None:
        await target.check(client)

    embeddings = RedisEmbeddings(target.sync_client(), keys, identity)
    return State(
        sessions,
        embeddings,
        shared,
        target.description,
        check,
        RedisTokens(client, keys),
        RedisRounds(client, keys),
        RedisStreams(client, keys),
    )
