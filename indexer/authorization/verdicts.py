"""The engine's answers: whether a principal may see each item of a catalog, and whether a call may run.

A tool is visible when a call of it could be permitted: `allowed` (permitted whatever the
arguments), or `conditional` (a permit or a forbid depends on the arguments: decided at call time).
`denied` says why: the forbids that decided it, or no policy permitting it. Policies are named by
their labels (`@id`, else `file:line`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.vocabulary import Kind

NO_PERMIT = "no policy permits it"


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    CONDITIONAL = "conditional"  # the call's arguments decide
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class Seen:
    """One item's verdict and the policies behind it (permits that allow it, policies that wait on
    the arguments, forbids that deny it; none for a denial no policy permits)."""

    verdict: Verdict
    policies: tuple[str, ...] = ()

    @property
    def visible(self) -> bool:
        return self.verdict is not Verdict.DENIED

    @property
    def reason(self) -> str:
        """What decided, in words, for logs and status."""
        if self.verdict is Verdict.DENIED:
            return f"forbidden by {', '.join(self.policies)}" if self.policies else NO_PERMIT
        if self.verdict is Verdict.CONDITIONAL:
            return f"the arguments decide ({', '.join(self.policies)})"
        return f"permitted by {', '.join(self.policies)}"


DENIED_BY_DEFAULT = Seen(Verdict.DENIED)


@dataclass(frozen=True)
class Visibility:
    """Each item of a catalog as one principal may see it, under one policy."""

    catalog: Catalog
    seen: tuple[Seen, ...]  # the catalog's items' verdicts, in its order
    policy_fingerprint: str

    def of(self, item: Item) -> Seen:
        return self.seen[self.catalog.positions[item]]

    def __iter__(self) -> Iterator[tuple[Item, Seen]]:
        return zip(self.catalog.items, self.seen, strict=True)

    @cached_property
    def visible(self) -> tuple[Item, ...]:
        """The items the principal may see: allowed or conditional, in the catalog's order."""
        return tuple(item for item, seen in self if seen.visible)

    def names(self, kind: Kind) -> frozenset[str]:
        """The visible items of one kind, by name (a resource's by URI)."""
        return frozenset(item.name for item in self.visible if item.kind == kind)

    @cached_property
    def fingerprint(self) -> str:
        """A hash of the visible set: equal for two principals who may see the same items."""
        return Catalog(self.visible).fingerprint


@dataclass(frozen=True, slots=True)
class Decision:
    """A call's answer: permitted or not, the policies that decided, and any that failed to evaluate."""

    allowed: bool
    policies: tuple[str, ...] = ()  # the permits that allowed it, or the forbids that denied it
    errors: tuple[str, ...] = ()  # Cedar's words for a policy that could not be evaluated (it did not apply)

    @property
    def reason(self) -> str:
        if self.allowed:
            return f"permitted by {', '.join(self.policies)}"
        return f"forbidden by {', '.join(self.policies)}" if self.policies else NO_PERMIT
