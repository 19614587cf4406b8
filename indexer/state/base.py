"""What a state backend keeps, and the protocols its stores implement.

The session manager works on `SessionRecord`s: everything about a session that outlives a request
(who it belongs to, its backends, the number and fingerprint of its current index version, and the
catalog that version was built from). Built index versions are never stored: a replica rebuilds a
version from its catalog (each backend's listing, stored once by digest) and the shared embeddings.

Two backends implement these protocols (docs/scaling.md):

- memory (`indexer.state.memory`): the process's own objects are the state; nothing is shared.
- redis (`indexer.state.redis`): sessions, listings, embeddings, health and a lease live in Redis,
  so any replica serves any session.

Stores raise `StateUnavailable` when the backend does not answer in time; the gRPC service answers
it with UNAVAILABLE (`indexer.errors` draws it in the indexer's error tree). Every store bounds its
sessions: each expires `ttl` seconds after its last use, and `create` refuses one that would not fit
under the caps it is given (`Room`) with `RoomFull`, checked atomically with the creation.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from indexer.state.backends import BackendHealth
from indexer.state.listings import Listing
from toolsearch.sessions import BackendSession, Principal, Subscription, VersionRef

SWAPS_KEPT = 8  # swap records kept per session, for Status

CatalogRef = tuple[tuple[str, str], ...]  # (backend id, listing digest) pairs, by backend id


# claims that change with every token of one caller: left out of what tells its implied sessions apart
_PER_TOKEN_CLAIMS = frozenset({"exp", "iat", "nbf", "jti", "auth_time"})


def caller_digest(claims: str) -> str:
    """What tells apart two callers of one principal whose verified claims differ ("" for none): a
    digest of the claims but those that change with every token. A principal's implied session is one
    per digest, so a 2026-07-28 caller whose token carries other groups is scoped by them, and a
    refreshed token (a new `exp`) finds the same session."""
    if not claims:
        return ""
    try:
        parsed = json.loads(claims)
    except ValueError:
        parsed = claims
    if isinstance(parsed, dict):
        parsed = {key: value for key, value in parsed.items() if key not in _PER_TOKEN_CLAIMS}
    if not parsed:
        return ""
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class StateUnavailable(Exception):
    """Raised when the shared state (Redis) does not answer in time; another replica may, later."""


class Room(NamedTuple):
    """The caps a new session must fit under; 0 sets none."""

    sessions: int = 0  # live sessions in the whole state, every principal's
    per_principal: int = 0  # live sessions of the new one's principal; 0: its principal is not counted


NO_CAPS = Room()


class RoomFull(Exception):
    """Raised by `SessionStore.create` and `check` when a cap leaves no room; nothing was stored."""

    def __init__(self, scope: Literal["sessions", "principal"], limit: int, frees_in: float) -> None:
        super().__init__(f"no room for a session: the {scope} cap of {limit} is reached")
        self.scope = scope
        self.limit = limit
        self.frees_in = frees_in  # seconds until the least recently used counted session expires, unused


class EndedSession(NamedTuple):
    """A session that ended, with what is needed to end its backend sessions in turn."""

    session_id: str
    token: str | None  # the credentials for passthrough backends, when known
    backend_sessions: Mapping[str, BackendSession]  # backend id -> its session


@dataclass(frozen=True, slots=True)
class Swap:
    """One change of a session's version; references only, so old versions can be freed."""

    previous: VersionRef | None
    current: VersionRef
    reason: str
    at: float


@dataclass(eq=False)
class SessionRecord:
    """A session as the state keeps it: identity, backends and a reference to its current version.

    The memory store keeps these very objects; the Redis store serialises them. Requests do not read
    the version from `ref` but through the `LiveSession` (`indexer.session_views`) that holds it.
    """

    id: str
    principal: Principal
    token: str | None = field(repr=False)  # the credentials stored at creation, for background rebuilds
    implied: bool
    accepted: frozenset[str]
    rejected_at_creation: frozenset[str]
    own_listings: dict[str, Listing]  # passthrough backends, listed with this caller's token
    ref: VersionRef
    catalog: CatalogRef  # what the current version was built from
    listed_epochs: dict[str, int] = field(default_factory=dict)  # passthrough backend -> epoch last listed
    # backends whose rejection of the stored credentials ends the session, while ending it has failed
    ending: frozenset[str] = frozenset()
    # backend id -> the backend session a router opened for this session (handshake-era backends)
    backend_sessions: dict[str, BackendSession] = field(default_factory=dict)
    # what the client said of itself, for every replica's router: the capabilities it declared at
    # initialize (JSON, "" for none) and the log level it set last ("" for none)
    client_capabilities: str = ""
    log_level: str = ""
    # the claims of the token the session was opened with (JSON, "" for none): what the
    # authorization policy reads of its caller, on every replica (indexer/sessions/access.py)
    claims: str = field(default="", repr=False)
    # resources the client subscribed to at backends that keep no subscriptions (2026-07-28 ones):
    # the replica holding its standalone stream asks those backends for their updates
    subscriptions: frozenset[Subscription] = frozenset()
    swaps: deque[Swap] = field(default_factory=lambda: deque(maxlen=SWAPS_KEPT))
    created_at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class SwapChange:
    """A compare-and-set of one session's version: from `record.ref.fingerprint` to `fingerprint`."""

    record: SessionRecord
    fingerprint: str
    catalog: CatalogRef
    reason: str
    at: float


class EmbeddingStore(Protocol):
    """The second tier behind the embedding cache's memory: key -> vector bytes. Thread-safe; never raises."""

    def get(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """The stored vectors of those `keys` that are stored."""
        ...

    def put(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Store `items`; a failure loses only cached work."""
        ...

    def close(self) -> None:
        """Release what the store holds open."""
        ...


class SessionStore(Protocol):
    """Where sessions live. `shared`: other replicas see them (the caller's objects are then a cache)."""

    @property
    def shared(self) -> bool: ...

    @property
    def ttl(self) -> float:
        """Seconds a session lives after its last use."""
        ...

    async def check(self, principal: Principal, room: Room) -> None:
        """Raise `RoomFull` if a session of `principal` would not fit now: an early, cheap refusal."""
        ...

    async def create(self, record: SessionRecord, room: Room = NO_CAPS) -> str:
        """Store a new session if it fits in `room` (else `RoomFull`); returns its id.

        For an implied session whose principal has one already (with the same `caller_digest` of its
        claims), returns that one's id (no room needed).
        """
        ...

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session, if it lives; a load is a use, so it renews the session's time to live."""
        ...

    async def records(self) -> list[SessionRecord]:
        """Every live session (rebuild passes, status)."""
        ...

    async def save(self, records: Sequence[SessionRecord]) -> None:
        """Store what changed in sessions' backends: accepted, rejected, own listings, epochs."""
        ...

    async def swap(self, changes: Sequence[SwapChange]) -> list[int]:
        """Apply each change if its session still has the expected fingerprint.

        Returns each session's new version number, or 0 when it was not swapped (gone, or another
        swap came first). Numbers grow by one per swap, whichever replica makes it.
        """
        ...

    async def delete(self, record: SessionRecord) -> None:
        """Forget a session (and its principal's implied-session entry, if it is that one)."""
        ...

    async def implied(self, principal: Principal, claims: str = "") -> str | None:
        """The id of the principal's implied session for these claims (`caller_digest`), if it has one."""
        ...

    async def set_backend_session(
        self, record: SessionRecord, backend_id: str, previous: str, session: BackendSession | None
    ) -> BackendSession | None:
        """Store `session` (None: forget it) as the record's at `backend_id` if the stored one's id is
        still `previous` ("" for none); returns the one stored afterwards (None when the session is gone).
        """
        ...

    async def set_log_level(self, record: SessionRecord, level: str) -> bool:
        """Keep the log level the record's client set; returns False when the session is gone."""
        ...

    async def subscribe(
        self, record: SessionRecord, subscription: Subscription, subscribed: bool, limit: int
    ) -> frozenset[Subscription] | None:
        """Add (`subscribed`) or drop a subscription of the record's client, adding none beyond
        `limit`; the subscriptions stored afterwards (None when the session is gone)."""
        ...

    def take_expired(self) -> list[EndedSession]:
        """The sessions found expired since the last call that had backend sessions (each once)."""
        ...

    async def close(self) -> None: ...


class CatalogStore(Protocol):
    """Backend listings, stored once each by digest (content-addressed)."""

    async def put(self, listings: Iterable[tuple[str, Listing]]) -> None:
        """Store listings under their digests (`indexer.state.listings.listing_digest`)."""
        ...

    async def get(self, digests: Iterable[str]) -> dict[str, Listing]:
        """The listings stored under those digests (missing ones are left out)."""
        ...

    async def touch(self, digests: Iterable[str]) -> None:
        """Keep listings that live sessions or backends still refer to."""
        ...


class HealthStore(Protocol):
    """The lease holder's verdicts, per backend, and a generation that grows with every publication."""

    async def publish(self, health: Mapping[str, BackendHealth]) -> int:
        """Replace the stored health with `health`; returns the new generation."""
        ...

    async def generation(self) -> int: ...

    async def load(self) -> tuple[int, dict[str, BackendHealth]]:
        """The generation and the health published with it (statuses this replica knows only)."""
        ...


class Lease(Protocol):
    """Who probes backends and runs rebuild passes: one replica at a time."""

    @property
    def holder(self) -> str:
        """This replica's id."""
        ...

    @property
    def held(self) -> bool:
        """Whether this replica holds the lease now (renewed in time)."""
        ...

    async def acquire(self) -> bool:
        """Take the lease when it is free, or renew it when held; returns whether it is held."""
        ...

    async def release(self) -> None: ...


class Events(Protocol):
    """Hints between replicas; correctness never depends on them arriving."""

    async def publish(self, message: Mapping[str, Any]) -> None: ...

    def listen(self) -> AsyncIterator[dict[str, Any]]:
        """Messages from every replica (this one's included), until cancelled."""
        ...


@dataclass
class Shared:
    """The parts only a shared state has: listings, health, the lease, events and its sweep."""

    catalogs: CatalogStore
    health: HealthStore
    lease: Lease
    events: Events
    session_ttl: float
    lease_ttl: float
    # drops expired sessions from the indexes and keeps the listings live sessions (and the digests
    # given) refer to; returns how many sessions it dropped
    sweep: Callable[[Iterable[str]], Awaitable[int]]
    closer: Callable[[], Awaitable[None]]

    async def close(self) -> None:
        await self.closer()
