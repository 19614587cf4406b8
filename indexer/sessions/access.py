"""What a session's caller may use, under the authorization policy in force: the one place sessions
ask the policy (indexer/authorization/).

A session's version is the catalog's shared index scoped to its caller (`Scoped`,
indexer/retrieval/allowed.py): the tools the caller may see (allowed, or conditional on the call's
arguments) as a mask the search applies inside itself. The caller is the session's principal with
the claims of the token it was opened with (`SessionRecord.claims`); a session no router verified
(no issuer: the `anonymous` mode) is `Client::"anonymous"`. What the policy answers is kept by
what decides it (the Authorizer keeps visibility per policy, catalog and caller as the policy reads
it; this class the catalog's items per version and one `Allowed` per distinct allowed set), so a
thousand sessions of fifty kinds of caller hold fifty masks over one index.

Without a policy every caller may use every tool: sessions are on the shared version unscoped, as
they always were.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.sets import Bounded
from indexer.authorization.verdicts import NO_PERMIT, Decision, Verdict, Visibility
from indexer.authorization.vocabulary import ACTIONS
from indexer.retrieval.allowed import Allowed, Scoped
from indexer.retrieval.index import IndexVersion
from indexer.retrieval.tools import Tool
from indexer.state import SessionRecord
from toolsearch.sessions import Offered

logger = logging.getLogger(__name__)

CATALOGS_KEPT = 32  # versions' items as the policy sees them
ALLOWED_KEPT = 1024  # distinct allowed sets (a byte per tool of their version each)
PRINCIPALS_KEPT = 4096  # callers as the policy reads them, by subject and claims
NO_POLICY = Decision(True)


def tool_item(tool: Tool) -> Item:
    """A tool as the policy sees it: its advertised name, its backend, the annotations its server set."""
    annotations = tool.definition.get("annotations")
    return Item.tool(tool.name, tool.backend_id, annotations if isinstance(annotations, Mapping) else None)


def offered_item(offered: Offered) -> Item:
    if offered.kind == "prompt":
        return Item.prompt(offered.name, offered.backend_id)
    if offered.kind == "resource":
        return Item.resource(offered.name, offered.backend_id)
    return Item.tool(offered.name, offered.backend_id)


class Access:
    """Scopes sessions' versions to their callers and decides their calls, under one authorizer."""

    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self.authorizer = authorizer  # None: no authorization section, every caller may use every tool
        self._catalogs: Bounded[str, Catalog] = Bounded(CATALOGS_KEPT)
        self._allowed: Bounded[tuple[str, str], Allowed] = Bounded(ALLOWED_KEPT)
        # one Scoped per version and allowed set while a session is on it, shared by all that are:
        # a pass over ten thousand sessions makes no object per session (nor does one without a
        # policy). Held weakly: a version no session is on is freed, as before.
        self._scoped: weakref.WeakValueDictionary[tuple[str, str], Scoped] = weakref.WeakValueDictionary()
        self._scoped_lock = threading.Lock()
        self._principals: Bounded[tuple[str, str, str], PolicyPrincipal] = Bounded(PRINCIPALS_KEPT)
        # denials since start, by (action, policy label; "" when no policy permits): the metric
        self.denials: Counter[tuple[str, str]] = Counter()

    def enforce(self, authorizer: Authorizer) -> None:
        """Scope sessions by this authorizer's policy from now on (set once, before sessions open)."""
        self.authorizer = authorizer

    @property
    def policy(self) -> str:
        """The fingerprint of the policy in force ("" without one): a scope asked of another is stale."""
        return self.authorizer.policy.fingerprint if self.authorizer is not None else ""

    def principal(self, record: SessionRecord) -> PolicyPrincipal:
        """The session's caller as the policy sees it."""
        if self.authorizer is None or not record.principal.issuer:
            return PolicyPrincipal.anonymous()
        key = (self.policy, record.principal.subject, record.claims)
        known = self._principals.get(key)
        if known is None:
            claims = _claims(record.claims)
            known = self._principals.put(key, self.authorizer.principal(record.principal.subject, claims))
        return known

    def catalog(self, version: IndexVersion) -> Catalog:
        """The version's tools as the policy's items, made once per version."""
        return self._catalogs.get_or_make(
            version.fingerprint, lambda: Catalog(tool_item(tool) for tool in version.tools)
        )

    def visibility(self, record: SessionRecord, version: IndexVersion) -> Visibility | None:
        """What the session's caller may see of the version (None: no policy). Blocking."""
        if self.authorizer is None:
            return None
        return self.authorizer.visibility(self.principal(record), self.catalog(version))

    def whole(self, version: IndexVersion) -> Scoped:
        """The version unscoped (every tool: no policy), one object per version."""
        return self._kept((version.fingerprint, ""), version, lambda: Scoped(version))

    def _kept(self, key: tuple[str, str], version: IndexVersion, make: Callable[[], Scoped]) -> Scoped:
        with self._scoped_lock:
            kept = self._scoped.get(key)
            if kept is None or kept.version is not version:  # the same catalog built anew: the new one
                kept = self._scoped[key] = make()
            return kept

    def scope(self, record: SessionRecord, version: IndexVersion) -> Scoped:
        """The version as the session's caller may use it (blocking: run it off the loop)."""
        seen = self.visibility(record, version)
        if seen is None:
            return self.whole(version)
        names = seen.names("tool")
        conditional = frozenset(i.name for i, s in seen if s.verdict is Verdict.CONDITIONAL)
        key = (version.fingerprint, seen.fingerprint + "/" + ",".join(sorted(conditional)))
        allowed = self._allowed.get_or_make(key, lambda: Allowed.of(version, names, conditional))
        return self._kept(key, version, lambda: Scoped(version, allowed))

    async def scoped(self, record: SessionRecord, version: IndexVersion) -> Scoped:
        """`scope`, off the event loop when a policy has to be asked."""
        if self.authorizer is None:
            return self.whole(version)
        return await asyncio.to_thread(self.scope, record, version)

    async def scoped_all(
        self, records: Sequence[SessionRecord], versions: Sequence[IndexVersion]
    ) -> list[Scoped]:
        """`scope` of each session on its version, in one trip off the event loop (a rebuild's many)."""
        if self.authorizer is None:
            wholes: dict[int, Scoped] = {}  # by the version object: sessions share a few
            return [wholes.get(id(v)) or wholes.setdefault(id(v), self.whole(v)) for v in versions]
        pairs = zip(records, versions, strict=True)
        return await asyncio.to_thread(lambda: [self.scope(record, version) for record, version in pairs])

    def decide(self, record: SessionRecord, item: Item, arguments: Mapping[str, Any] | None) -> Decision:
        """Whether the session's caller may make this call, with these arguments. Blocking, under a ms."""
        if self.authorizer is None:
            return NO_POLICY
        return self.authorizer.decide(self.principal(record), item, arguments)

    def visible(self, record: SessionRecord, offered: Sequence[Offered]) -> list[bool]:
        """Which of the items the session's caller may see (blocking: run it off the loop)."""
        return self._visible(record, [offered_item(entry) for entry in offered])

    def visible_tools(self, record: SessionRecord, tools: Sequence[Tool]) -> list[bool]:
        """Which of the tools (with their annotations) the session's caller may see; blocking."""
        return self._visible(record, [tool_item(tool) for tool in tools])

    def _visible(self, record: SessionRecord, items: Sequence[Item]) -> list[bool]:
        if self.authorizer is None:
            return [True] * len(items)
        seen = self.authorizer.visibility(self.principal(record), Catalog(items))
        return [seen.of(item).visible for item in items]

    def denied(self, record: SessionRecord, item: Item, policies: Sequence[str]) -> None:
        """Record a denial of the session's caller: one log line, the request's span, the counter.

        The operator's record names the item and what decided; the client's answer names neither.
        """
        action = ACTIONS[item.kind]
        why = f"forbidden by {', '.join(policies)}" if policies else NO_PERMIT
        logger.info(
            "authorization: denied %s of %s (backend %s) to %s: %s",
            action,
            item.name,
            item.backend,
            record.principal.subject or "anonymous",
            why,
        )
        span = trace.get_current_span()
        span.set_attribute("toolsearch.authorization.denied", action)
        span.set_attribute("toolsearch.authorization.policies", list(policies) or [NO_PERMIT])
        for label in policies or ("",):
            self.denials[(action, label)] += 1


def _claims(text: str) -> dict[str, Any]:
    """A session's stored claims (checked when the session was opened)."""
    if not text:
        return {}
    claims = json.loads(text)
    return claims if isinstance(claims, dict) else {}
