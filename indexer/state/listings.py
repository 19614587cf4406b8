"""Backend listings, their digests, and one object per distinct value that many sessions hold.

A `Listing` is what one `tools/list` walk of a backend found (discovery makes it; the state stores
it, once per digest). Its digest covers the tools only, so a changed tool list is told from the same
one whatever else differs.

Thousands of a team's sessions list their passthrough backends with their own tokens and mostly get
the very same tools back. Interned by digest, those listings are one object, which the catalog memo
(keyed by digest) then turns into one catalog and one index version, and the sessions' sets of
backends are shared the same way. The tables hold their values weakly: a value lives exactly as
long as some session (or catalog) holds it.

Only what a backend answered is interned. A rejection (401, 403) is a verdict on one caller's
token and never shared: it stays in that session's own `rejected_at_creation`.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Listing:
    """What one `tools/list` walk found."""

    tools: tuple[Mapping[str, Any], ...]  # MCP tool definitions, as the backend named them
    protocol_version: str
    latency: float  # seconds for the whole walk


def listing_digest(listing: Listing) -> str:
    """A hash of a listing's tools, to tell a changed tool list from the same one."""
    text = json.dumps(listing.tools, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class SharedListing(Listing):
    """An interned listing: weakly referable, and it carries its digest so nobody hashes it again."""

    __slots__ = ("__weakref__", "digest")


_listings: weakref.WeakValueDictionary[str, SharedListing] = weakref.WeakValueDictionary()
# keyed by the sorted ids: a frozenset key would be the value itself, held strongly
_backends: weakref.WeakValueDictionary[tuple[str, ...], frozenset[str]] = weakref.WeakValueDictionary()


def intern_listing(listing: Listing, digest: str | None = None) -> SharedListing:
    """The one object for a listing's tools: one held already with the same digest, else this one.

    The digest covers the tools only, as the shared listing store does, so listings that differ in
    protocol version or walk latency alone are one object (the first one's).
    """
    if isinstance(listing, SharedListing):
        return listing
    digest = digest or listing_digest(listing)
    known = _listings.get(digest)
    if known is not None:
        return known
    shared = SharedListing(listing.tools, listing.protocol_version, listing.latency)
    object.__setattr__(shared, "digest", digest)  # not a dataclass field: the frozen setter refuses it
    _listings[digest] = shared
    return shared


def digest_of(listing: Listing) -> str:
    """A listing's digest: the one it carries when interned, else computed."""
    return getattr(listing, "digest", None) or listing_digest(listing)


def intern_backends(backend_ids: Iterable[str]) -> frozenset[str]:
    """The one frozenset object for a set of backend ids (a session's usable or rejected backends)."""
    key = tuple(sorted(backend_ids))
    known = _backends.get(key)
    if known is None:
        known = _backends[key] = frozenset(key)
    return known
