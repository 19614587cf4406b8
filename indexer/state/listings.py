"""Backend listings, their digests, and one object per distinct value that many sessions hold.

A `Listing` is what one `tools/list` walk of a backend found (discovery makes it; the state stores
it, once per digest), with what the server said of itself when it was initialized (`ServerInfo`).
Its digest covers the tools only, so a changed tool list is told from the same one whatever else
differs (server info, protocol version, walk latency).

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
class ServerInfo:
    """What a server says of itself in its `initialize` result: `serverInfo` and `instructions`."""

    name: str = ""
    title: str = ""
    description: str = ""
    instructions: str = ""

    def __bool__(self) -> bool:
        return bool(self.name or self.title or self.description or self.instructions)

    @property
    def about(self) -> str:
        """Everything it says of itself as one text, for its server document."""
        parts = (self.title or self.name, self.description, self.instructions)
        return " ".join(dict.fromkeys(part.strip() for part in parts if part.strip()))

    def as_dict(self) -> dict[str, str]:
        return {key: value for key, value in self._fields() if value}

    def _fields(self) -> tuple[tuple[str, str], ...]:
        return (
            ("name", self.name),
            ("title", self.title),
            ("description", self.description),
            ("instructions", self.instructions),
        )

    @classmethod
    def from_dict(cls, raw: object) -> ServerInfo:
        """The info a stored listing kept (`as_dict`); empty for anything else."""
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            **{key: str(raw[key]) for key in ("name", "title", "description", "instructions") if key in raw}
        )


@dataclass(frozen=True, slots=True)
class Offers:
    """What a server offers beside tools, from the capabilities of its `initialize` result.

    The router reads it to know which backends to ask for resources, prompts and completions
    (indexer/api/reachable.py), so a backend that offers none of them is never asked.
    """

    resources: bool = False
    prompts: bool = False
    completions: bool = False

    def as_list(self) -> list[str]:
        return [name for name, offered in self._fields() if offered]

    def _fields(self) -> tuple[tuple[str, bool], ...]:
        return (("resources", self.resources), ("prompts", self.prompts), ("completions", self.completions))

    @classmethod
    def from_list(cls, raw: object) -> Offers:
        """The offers a stored listing kept (`as_list`); none for anything else."""
        names = {str(name) for name in raw} if isinstance(raw, list) else set()
        return cls(**{name: True for name in ("resources", "prompts", "completions") if name in names})


@dataclass(frozen=True, slots=True)
class Listing:
    """What one `tools/list` walk found."""

    tools: tuple[Mapping[str, Any], ...]  # MCP tool definitions, as the backend named them
    protocol_version: str
    latency: float  # seconds for the whole walk
    server: ServerInfo = ServerInfo()  # what the server said of itself at initialize
    offers: Offers = Offers()  # what it offers beside tools, from its capabilities


def listing_digest(listing: Listing) -> str:
    """A hash of a listing's tools, to tell a changed tool list from the same one.

    What the server says of itself (its info, its offers) is left out: a server may announce itself
    in one protocol version and not in another (the 2026 era's stamp is optional), and a probe that
    merely spoke another version must not look like a changed tool list. The registry keeps the
    listing it has while the digest holds, so what a backend first said of itself stays with its
    tools.
    """
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
    shared = SharedListing(
        listing.tools, listing.protocol_version, listing.latency, listing.server, listing.offers
    )
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
