"""The backend registry: every configured backend, its last listing, and what its health is now.

Backends whose outgoing auth does not depend on the caller (`none`, `header`) are listed once and
the listing is shared by every session; `passthrough` backends are listed per session with the
caller's token (see `indexer.credentials`). The registry holds only what was learned: the listing
itself, a request to a backend, is the `BackendLister`'s (`indexer.backends.lister`), so reading
or recording a backend's state never needs a secret, a connection or a timeout. Every change goes
through a method of the registry, which replaces the backend's `BackendState` whole: the lister and
the health monitor record their verdicts here (`record_listing`, `record_answer`, `record_failure`,
`set_circuit`), a follower replica adopts the lease holder's (`adopt`), a config reload adds and
removes backends. Readers get `states`, a read-only view, so none of them can change a backend
behind the registry's rules (the epoch).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from indexer.errors import BackendError
from indexer.state.backends import ADVERTISED, BackendHealth, Status
from indexer.state.listings import Listing, listing_digest
from toolsearch.outgoing import OutgoingAuth
from toolsearch.sections.backend_settings import Backend
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget


@dataclass(frozen=True, slots=True)
class BackendState:
    """What the indexer knows of one backend now: its configuration, health and last listing."""

    config: Backend
    health: BackendHealth = field(default_factory=BackendHealth)
    listing: Listing | None = None  # kept while the backend is down: its tools return with it

    @property
    def advertised(self) -> bool:
        return self.health.advertised

    @property
    def status(self) -> Status:
        return self.health.status

    def target(self, session: BackendSession | None = None) -> BackendTarget:
        """How a router reaches the backend: its configuration, the protocol it spoke at its last
        check, and a client session's `session` there (None where none is kept)."""
        config = self.config
        return BackendTarget(
            backend_id=config.id,
            url=config.url,
            auth=OutgoingAuth(config.auth.type, config.auth.header, config.auth.value_env),
            protocol_version=self.health.protocol_version,
            timeout_seconds=config.timeout,
            max_response_bytes=config.max_response_bytes,
            session=session,
        )


def _verdict(health: BackendHealth, status: Status) -> BackendHealth:
    """`health` with a new status, judged now; becoming advertised starts a new epoch."""
    epoch = health.epoch + 1 if status in ADVERTISED and not health.advertised else health.epoch
    return replace(health, status=status, epoch=epoch, checked_at=time.time())


class Registry:
    """The configured backends and what was last learned of each."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self._states: dict[str, BackendState] = {}
        self._view = MappingProxyType(self._states)
        # the backends whose tools are not advertised now: usually a few of hundreds, so a request
        # that names a session's unavailable backends looks at these, not at all it may use
        self._unadvertised: set[str] = set()
        for backend in backends:
            self._put(backend.id, BackendState(config=backend))

    @property
    def states(self) -> Mapping[str, BackendState]:
        """Every backend's state, by id: a read-only view that follows the registry's changes."""
        return self._view

    @property
    def unadvertised(self) -> frozenset[str]:
        """The ids of the backends whose tools are not advertised now (down, unknown, unauthorized)."""
        return frozenset(self._unadvertised)

    def get(self, backend_id: str) -> BackendState:
        return self._states[backend_id]

    def _put(self, backend_id: str, state: BackendState) -> None:
        self._states[backend_id] = state
        if state.advertised:
            self._unadvertised.discard(backend_id)
        else:
            self._unadvertised.add(backend_id)

    def add(self, backend: Backend) -> BackendState:
        """Register a backend (or replace one with the same id); its status is unknown until listed."""
        state = BackendState(config=backend)
        self._put(backend.id, state)
        return state

    def remove(self, backend_id: str) -> None:
        """Forget a backend; sessions stop seeing its tools at their next rebuild."""
        self._states.pop(backend_id, None)
        self._unadvertised.discard(backend_id)

    def record_listing(self, backend_id: str, listing: Listing, status: Status = "healthy") -> bool:
        """Store a successful listing; returns whether the tool list changed."""
        state = self._states[backend_id]
        digest = listing_digest(listing)
        changed = digest != state.health.digest
        # An unchanged list keeps its Listing object: session catalogs are memoised by listing
        # identity, so a probe that finds nothing new must not look like a new catalog.
        kept = state.listing if state.listing is not None and not changed else listing
        health = replace(
            _verdict(state.health, status),
            digest=digest,
            protocol_version=listing.protocol_version,
            latency=listing.latency,
            last_error="",
            consecutive_failures=0,
        )
        self._put(backend_id, replace(state, health=health, listing=kept))
        return changed

    def record_answer(self, backend_id: str, latency: float, status: Status) -> None:
        """Store that a backend answered, without a listing to keep (passthrough backends)."""
        state = self._states[backend_id]
        health = replace(
            _verdict(state.health, status), latency=latency, last_error="", consecutive_failures=0
        )
        self._put(backend_id, replace(state, health=health))

    def record_failure(self, backend_id: str, error: BackendError, status: Status) -> None:
        state = self._states[backend_id]
        failures = state.health.consecutive_failures + 1
        health = replace(
            _verdict(state.health, status), last_error=error.reason, consecutive_failures=failures
        )
        self._put(backend_id, replace(state, health=health))

    def set_circuit(self, backend_id: str, circuit: str) -> None:
        """Store the state of the backend's circuit breaker ("closed", "open", "half-open")."""
        state = self._states[backend_id]
        self._put(backend_id, replace(state, health=replace(state.health, circuit=circuit)))

    def adopt(self, backend_id: str, health: BackendHealth, listing: Listing | None = None) -> None:
        """Take the lease holder's verdict on a backend as it is, epoch included (a follower judges nothing).

        `listing` is the one `health.digest` names, given when this replica did not hold it yet.
        Without it the backend keeps its listing and that listing's digest: a digest always names
        the listing held. A backend this replica's configuration lacks is ignored.
        """
        state = self._states.get(backend_id)
        if state is None:
            return
        if listing is None:
            listing, health = state.listing, replace(health, digest=state.health.digest)
        self._put(backend_id, replace(state, health=health, listing=listing))
