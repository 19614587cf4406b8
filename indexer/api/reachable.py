"""The backends a session can reach right now, for the resources, prompts and completions routers carry.

Tools reach a client through the session's index version, which health swaps; resources and prompts
are not indexed, so the router lists them from the backends themselves, on each request. It asks the
indexer which ones (`ReachableBackends`): the session's usable backends that are advertised now
(healthy or degraded, the same test a catalog applies), each with what its `initialize` result
declared beside tools, how to reach it, and the backend session the client session keeps there. A
backend that goes down drops out of the answer at once, so its resources and prompts disappear as
its tools do, and come back with it.

The answer is a list of `ReachableBackend`, plain values: indexer/api/messages.py turns them into
the wire's `ReachableBackendsResponse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from indexer.backends.registry import Registry
from indexer.sessions.views import LiveSession
from indexer.state import BackendSession
from indexer.state.listings import Listing, Offers
from toolsearch.sections.backend_settings import Backend


class Reachable(NamedTuple):
    """One backend of a session that is advertised now, and what its last listing says it offers."""

    backend_id: str
    offers: Offers


def reachable(session: LiveSession, registry: Registry) -> list[Reachable]:
    """The session's usable backends that are advertised now, in id order.

    A passthrough backend's offers come from the session's own listing (listed with the caller's
    token), any other's from the registry's; a backend never listed offers nothing yet.
    """
    found = []
    for backend_id in sorted(session.record.accepted):
        state = registry.states.get(backend_id)
        if state is None or not state.advertised:
            continue
        listing: Listing | None = session.record.own_listings.get(backend_id) or state.listing
        found.append(Reachable(backend_id, listing.offers if listing is not None else Offers()))
    return found


@dataclass(frozen=True, slots=True)
class ReachableBackend:
    """A reachable backend the router aggregates: how to reach it, and what it offers beside tools."""

    backend: Backend  # the backend's configuration: where it is, how to reach it, its limits
    protocol_version: str  # what the backend negotiated at its last check
    backend_session: BackendSession | None  # the session's own session at the backend, if any
    offers: Offers

    @property
    def backend_id(self) -> str:
        return self.backend.id


def reachable_backends(session: LiveSession, registry: Registry) -> list[ReachableBackend]:
    """`ReachableBackends`' answer: each reachable backend that offers anything beside tools."""
    found = []
    for entry in reachable(session, registry):
        offers = entry.offers
        if not (offers.resources or offers.prompts or offers.completions):
            continue  # nothing to aggregate: the router need not hear of it
        state = registry.get(entry.backend_id)
        found.append(
            ReachableBackend(
                backend=state.config,
                protocol_version=state.health.protocol_version,
                backend_session=session.record.backend_sessions.get(entry.backend_id),
                offers=offers,
            )
        )
    return found
