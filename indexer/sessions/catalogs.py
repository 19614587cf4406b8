"""Session catalogs: the tools a session may see now, and the index version a stored catalog names.

A catalog is the advertised tools of a session's usable backends, built from each backend's current
listing (or the session's own listing, for passthrough backends). It is memoised by the digests of
the listings it comes from, so sessions whose tokens see the same tools share one catalog (and its
version) however their listings were obtained, and it names them by digest (`refs`), which is what a
session record keeps: another replica holding the same listings (from the shared state) builds the
very same version from those references and the shared embeddings, without a model call.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from indexer.backends.registry import Registry
from indexer.retrieval.index import IndexVersion, VersionPool, fingerprint
from indexer.retrieval.tools import Tool, advertise
from indexer.state import CatalogRef, CatalogStore
from indexer.state.listings import Listing, digest_of
from toolsearch.sections.indexer_settings import Naming

logger = logging.getLogger(__name__)

_MEMO = 64  # catalogs remembered by the digests of the listings they come from


def named_tools(listings: Mapping[str, Listing], naming: Naming) -> list[Tool]:
    """The listings' tools under the names the configured naming gives them together: the one rule
    for a session's catalog and for the tools it pins (indexer/api/pinned.py)."""
    tools = {b: listing.tools for b, listing in listings.items()}
    servers = {b: listing.server for b, listing in listings.items() if listing.server}
    return advertise(tools, prefix=naming.prefix, separator=naming.separator, servers=servers)


@dataclass(frozen=True, slots=True)
class Catalog:
    """The advertised tools of a set of listings, their fingerprint, and the listings by digest."""

    listings: tuple[Listing, ...]
    tools: list[Tool]
    fingerprint: str
    refs: CatalogRef


class Catalogs:
    """Catalogs from the registry's listings, and versions from catalogs (built once per fingerprint)."""

    def __init__(
        self, registry: Registry, pool: VersionPool, naming: Naming, store: CatalogStore | None = None
    ) -> None:
        self._registry = registry
        self._pool = pool
        self._naming = naming
        self._store = store  # the shared listings, when replicas share state
        # its refs, (backend, listing digest) pairs -> catalog: equal tool lists are one catalog
        self._memo: OrderedDict[CatalogRef, Catalog] = OrderedDict()

    def current(self, accepted: Iterable[str], own: dict[str, Listing]) -> Catalog:
        """The advertised tools of a session's usable backends now, memoised by their listings' digests."""
        listings: dict[str, Listing] = {}
        digests: list[tuple[str, str]] = []
        for backend_id in sorted(accepted):
            state = self._registry.states.get(backend_id)
            if state is None or not state.advertised:
                continue
            listing = own.get(backend_id) or state.listing
            if listing is not None:
                listings[backend_id] = listing
                # the registry knows its own listings' digests; interned ones carry theirs
                known = state.health.digest if listing is state.listing else ""
                digests.append((backend_id, known or digest_of(listing)))
        key: CatalogRef = tuple(digests)
        catalog = self._memo.get(key)
        if catalog is None:
            tools = named_tools(listings, self._naming)
            catalog = Catalog(tuple(listings.values()), tools, fingerprint(tools), key)
            self._memo[key] = catalog
            if len(self._memo) > _MEMO:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return catalog

    async def version(self, catalog: Catalog) -> IndexVersion:
        """The version of a catalog: shared when built already, else built off the event loop."""
        return await self._pool.get(catalog.tools, catalog.fingerprint)

    async def share(self, catalogs: Iterable[Catalog]) -> None:
        """Store the listings of catalogs sessions are about to name, for other replicas to read."""
        if self._store is not None:
            pairs = {d: x for c in catalogs for (_, d), x in zip(c.refs, c.listings, strict=True)}
            await self._store.put(pairs.items())

    async def stored(self, refs: CatalogRef, key: str) -> IndexVersion | None:
        """The version a stored catalog names (fingerprint `key`); None when a listing is gone.

        Built from the shared listings and embeddings when this replica does not hold it yet.
        """
        known = self._pool.lookup(key)
        if known is not None:
            return known
        if self._store is None:
            return None
        found = await self._store.get(digest for _, digest in refs)
        if any(digest not in found for _, digest in refs):
            return None
        tools = named_tools({backend: found[digest] for backend, digest in refs}, self._naming)
        actual = fingerprint(tools)
        if actual != key:
            # replicas that name tools differently (another naming configuration) cannot share versions
            logger.warning("a stored catalog gives fingerprint %s here, not %s: naming differs", actual, key)
        return await self._pool.get(tools, actual)
