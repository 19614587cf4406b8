"""The backends a session can reach right now, for the resources, prompts and completions routers carry.

Tools reach a client through the session's index version, which health swaps; resources and prompts
are not indexed, so the router lists them from the backends themselves, on each request. It asks the
indexer which ones (`ReachableBackends`): the session's usable backends that are advertised now
(healthy or degraded, the same test a catalog applies), each with what its `initialize` result
declared beside tools, how to reach it, and the backend session the client session keeps there. A
backend that goes down drops out of the answer at once, so its resources and prompts disappear as
its tools do, and come back with it.

The answer is a `ReachableTargets` (toolsearch/targets.py), the value both sides of the link know:
indexer/api/messages.py turns it into the wire's `ReachableBackendsResponse`.
"""

from __future__ import annotations

from typing import NamedTuple

from indexer.backends.registry import Registry
from indexer.sessions.views import LiveSession
from indexer.state.listings import Listing, Offers
from toolsearch.sections.indexer_settings import Naming
from toolsearch.targets import ReachableTarget, ReachableTargets


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


def reachable_targets(session: LiveSession, registry: Registry, naming: Naming) -> ReachableTargets:
    """`ReachableBackends`' answer: each reachable backend that offers anything beside tools, with
    the session's backend session there, and the naming its resources and prompts follow."""
    found = []
    for entry in reachable(session, registry):
        offers = entry.offers
        if not (offers.resources or offers.prompts or offers.completions):
            continue  # nothing to aggregate: the router need not hear of it
        target = registry.get(entry.backend_id).target(session.record.backend_sessions.get(entry.backend_id))
        found.append(ReachableTarget(target, offers.resources, offers.prompts, offers.completions))
    return ReachableTargets(tuple(found), naming.prefix, naming.separator)
