"""A caller's allowed set over one index version: the tools it may find, applied inside the search.

An index version is the catalog's, shared by every session over that catalog whatever its caller may
use; what a caller may find is an `Allowed`: a mask over the version's tools (a byte per tool: 2.5 kB
over 2,479 tools), handed to the search (`SearchIndex.search`, which ranks over those tools alone),
the names it resolves and the tools it counts. So memory grows with the distinct catalogs (the
indexes) and, by a mask each, with the distinct allowed sets, never with a second index.

A `Scoped` version is what a session is on: the shared version and its allowed set (None: every
tool, as without a policy). Its `fingerprint` is the version's, with a digest of the allowed set
after a `+` when there is one: content-addressed, equal for two sessions that may find the same tools
of the same catalog, different when either changes, and the version's own fingerprint is its part
before the `+` (`catalog_fingerprint`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from indexer.retrieval.index import IndexVersion
from indexer.retrieval.lifts import Mask
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, Method
from indexer.retrieval.tools import Tool

SCOPE_MARK = "+"  # between a version's fingerprint and its allowed set's digest


def catalog_fingerprint(scoped: str) -> str:
    """The version's own fingerprint in a scoped one (the whole of an unscoped one)."""
    return scoped.split(SCOPE_MARK, 1)[0]


@dataclass(frozen=True, eq=False)
class Allowed:
    """The tools of one version a caller may find (a mask over its positions), and those decided at
    call time by the call's arguments (`conditional`, a subset)."""

    mask: Mask = field(repr=False)
    conditional: frozenset[str]
    digest: str  # of the allowed names: part of the scoped fingerprint

    @classmethod
    def of(cls, version: IndexVersion, names: Collection[str], conditional: Collection[str] = ()) -> Allowed:
        """The allowed set of `version` holding the tools named in `names` (others are ignored)."""
        mask = np.fromiter(
            (tool.name in names for tool in version.tools), dtype=np.bool_, count=len(version.tools)
        )
        held = sorted(tool.name for tool, allowed in zip(version.tools, mask, strict=True) if allowed)
        digest = hashlib.sha256("\0".join(held).encode()).hexdigest()[:16]
        return cls(mask, frozenset(conditional) & frozenset(held), digest)

    @cached_property
    def count(self) -> int:
        return int(np.count_nonzero(self.mask))


@dataclass(frozen=True, eq=False)
class Scoped:
    """A shared index version as one caller may use it: its tools cut to the allowed set."""

    version: IndexVersion
    allowed: Allowed | None = None  # None: every tool of the version

    @property
    def fingerprint(self) -> str:
        if self.allowed is None:
            return self.version.fingerprint
        return f"{self.version.fingerprint}{SCOPE_MARK}{self.allowed.digest}"

    @cached_property
    def tools(self) -> tuple[Tool, ...]:
        """The tools the caller may find, in the version's order."""
        if self.allowed is None:
            return self.version.tools
        return tuple(
            tool for tool, allowed in zip(self.version.tools, self.allowed.mask, strict=True) if allowed
        )

    @cached_property
    def baseline_tokens(self) -> int:
        """What the caller's tools would weigh in tools/list."""
        if self.allowed is None:
            return self.version.baseline_tokens
        return sum(tool.tokens for tool in self.tools)

    def resolve(self, name: str) -> Tool | None:
        """The tool advertised under `name`, if the caller may use it."""
        tool = self.version.resolve(name)
        return tool if tool is not None and self.may_use(tool) else None

    def may_use(self, tool: Tool) -> bool:
        if self.allowed is None:
            return True
        return bool(self.allowed.mask[self.version.position(tool.name)])

    def conditional(self, name: str) -> bool:
        """Whether a call of the tool is decided by its arguments (asked at call time)."""
        return self.allowed is not None and name in self.allowed.conditional

    def find_hits(self, query: Query, limit: int, method: Method = "hybrid") -> list[tuple[Tool, Hit]]:
        """The best `limit` tools the caller may use, ranked over those alone, best first."""
        index = self.version.search_index
        if index is None:
            return []
        hits = index.search(query, limit, method, None if self.allowed is None else self.allowed.mask)
        return [(self.version.tools[hit.position], hit) for hit in hits]
