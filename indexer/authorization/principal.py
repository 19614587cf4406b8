"""The caller as policies see it: `Client::"<sub>"`, its claims as attributes, its groups as parents.

As ToolHive makes it: every claim of the verified token becomes `claim_<key>` (on the principal and
in the context alike); the groups come from the configured group claim, else the first of `groups`,
`roles`, `cognito:groups` the token carries (a claim name with dots also reads nested objects:
`realm_access.roles`), and the configured role claim adds its roles; each becomes a parent
`THVGroup::"<name>"`. A claim named in `multi_valued_claims` is given as one space-separated string
(`claim_<name>`) and as the set of its elements (`claimset_<name>`).

A caller nobody authenticated (the router's `anonymous` mode) is `Client::"anonymous"` with no claim
and no group: a policy may name it, and every token holder carries `claim_sub`, which it lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from indexer.authorization.vocabulary import (
    CLAIM,
    CLAIM_SET,
    CLIENT,
    DEFAULT_GROUP_CLAIMS,
    GROUP,
    cedar_record,
)
from toolsearch.sections.authorization_settings import Authorization

logger = logging.getLogger(__name__)

ANONYMOUS_SUBJECT = "anonymous"


@dataclass(frozen=True, slots=True)
class PolicyPrincipal:
    """A caller in Cedar's terms: its subject, its claims' attributes, the groups it is a member of."""

    subject: str
    attributes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    groups: tuple[str, ...] = ()

    @classmethod
    def anonymous(cls) -> PolicyPrincipal:
        """The caller of a router that authenticates nobody."""
        return cls(ANONYMOUS_SUBJECT)

    @classmethod
    def of(cls, subject: str, claims: Mapping[str, Any], settings: Authorization) -> PolicyPrincipal:
        """A token holder, from the subject and the claims of its verified token."""
        groups = list(_first_groups(claims, settings.group_claim_name))
        if settings.role_claim_name:
            groups += _groups_in(claims, settings.role_claim_name) or []
        named = _normalized(claims, settings.multi_valued_claims)
        attributes = cedar_record({f"{CLAIM}{key}": value for key, value in named.items()})
        attributes |= _claim_sets(claims, settings.multi_valued_claims)
        return cls(subject, MappingProxyType(attributes), tuple(dict.fromkeys(groups)))

    @property
    def uid(self) -> dict[str, str]:
        return {"type": CLIENT, "id": self.subject}

    def entity(self) -> dict[str, Any]:
        """The principal's entity in Cedar's JSON form."""
        parents = [{"type": GROUP, "id": group} for group in self.groups]
        return {"uid": self.uid, "attrs": dict(self.attributes), "parents": parents}


def _claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """A claim by its name, else by a dotted path through nested objects (ToolHive's resolveNestedClaim)."""
    if path in claims or "." not in path:
        return claims.get(path)
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _groups_in(claims: Mapping[str, Any], name: str) -> list[str] | None:
    """A claim's names, or None when the claim is absent or not a list (then the next claim is tried)."""
    value = _claim_at(claims, name)
    if value is None:
        return None
    if not isinstance(value, list):
        logger.debug("group claim %r is not a list: ignored", name)
        return None
    return [group for group in value if isinstance(group, str)]


def _first_groups(claims: Mapping[str, Any], configured: str | None) -> list[str]:
    """The groups of the configured claim, else of the first of ToolHive's defaults the token carries."""
    for name in (configured, *DEFAULT_GROUP_CLAIMS):
        if name and (groups := _groups_in(claims, name)) is not None:
            return groups
    return []


def _elements(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [element for element in value if isinstance(element, str)]
    return None


def _normalized(claims: Mapping[str, Any], multi_valued: Sequence[str]) -> Mapping[str, Any]:
    """The claims with each multi-valued one as a space-separated string (a string kept as it came)."""
    if not multi_valued:
        return claims
    named = dict(claims)
    for name in multi_valued:
        if isinstance(value := claims.get(name), list):
            named[name] = " ".join(_elements(value) or [])
    return named


def _claim_sets(claims: Mapping[str, Any], multi_valued: Sequence[str]) -> dict[str, list[str]]:
    """`claimset_<name>`: the elements of each multi-valued claim the token carries."""
    sets = {}
    for name in multi_valued:
        if (elements := _elements(claims.get(name))) is not None:
            sets[f"{CLAIM_SET}{name}"] = elements
    return sets
