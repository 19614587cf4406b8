"""A tool name resolved in a session's current version: the backend that runs it, or why none does.

`ResolveTool` answers with it, and so do `GetSession` and `OpenSession` when the router names the
tool a `call_tool` is about to run: the session check every request makes and the lookup of the
tool then cost one round trip to the indexer, not two.

A name resolves as the version advertises it, or by the tool's own name when that means one tool
only (a client that kept `<backend>_<name>` from before a collision went away, or the bare name of
a tool prefixed since). A name that resolves to nothing raises `ToolNotFound` with the closest
names and, when a backend that is down has the tool, the reason it cannot be called now. The
registry's word on health is the newest: a tool whose backend went down between a health check and
the swap of the session's version is refused as the swap will refuse it, so `Status` and `call_tool`
never disagree.

Only the tools the session's caller may use resolve (its scoped version, indexer/sessions/access.py):
a tool the policy denies it answers exactly as an unknown name does, its suggestions drawn from the
tools the caller may use, and the denial is recorded with the policies that decided. A tool the
policy decides by the call's arguments resolves marked `conditional`: the router asks
`AuthorizeCall` with the arguments before calling, and `authorize` answers it.

A resolution is a `ResolvedTool` (toolsearch/targets.py), the value both sides of the link know:
indexer/api/messages.py turns it into the wire's `ResolveToolResponse`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from indexer.api.finder import server_title
from indexer.authorization.catalog import Catalog, Item
from indexer.backends.registry import Registry
from indexer.errors import CallDenied, ItemDenied, ToolNotFound
from indexer.retrieval.names import by_own_name, closest_tools
from indexer.retrieval.text import name_key
from indexer.retrieval.tools import Tool
from indexer.sessions.access import Access, offered_item, tool_item
from indexer.sessions.views import LiveSession
from toolsearch.sessions import Offered, VersionRef
from toolsearch.targets import ResolvedTool


class ToolResolver:
    """Resolves tool names in a session's current version against the registry's backends."""

    def __init__(self, registry: Registry, access: Access | None = None) -> None:
        self._registry = registry
        self._access = access or Access()

    def resolve(self, session: LiveSession, name: str) -> ResolvedTool:
        """The tool `name` means in the session and how to call it; raises `ToolNotFound` (`CallDenied`
        for a tool the caller may not use: the same answer, recorded)."""
        found = self.resolved(session, name)
        if found is not None:
            return found
        denied = self._denied(session, name)
        if denied is not None:
            tool, policies = denied
            self._access.denied(session.record, tool_item(tool), policies)
            raise CallDenied(name, self._closest(session, name), policies)
        raise ToolNotFound(name, self._closest(session, name), self._down_reason(session, name))

    def _closest(self, session: LiveSession, name: str) -> list[tuple[str, str, str]]:
        """The names closest to `name` among the tools the caller may use."""
        scoped = session.current.scoped
        return [
            (t.name, t.backend_id, server_title(scoped.version.server(t.backend_id)))
            for t in closest_tools(name, scoped.tools)
        ]

    def _denied(self, session: LiveSession, name: str) -> tuple[Tool, tuple[str, ...]] | None:
        """The tool `name` means in the session's catalog when the caller may not use it, with the
        policies that deny it (none when no policy permits it)."""
        snapshot = session.current
        if snapshot.scoped.allowed is None:
            return None
        version = snapshot.version
        tool = version.resolve(name) or by_own_name(version.tools, name)
        if tool is None or snapshot.scoped.may_use(tool):
            return None
        seen = self._access.visibility(session.record, version)
        return tool, seen.of(tool_item(tool)).policies if seen is not None else ()

    def resolved(self, session: LiveSession, name: str) -> ResolvedTool | None:
        """As `resolve`, with None for a name that means no tool the caller may use (the caller asks
        `resolve` why)."""
        snapshot = session.current
        scoped = snapshot.scoped
        tool = scoped.resolve(name) or by_own_name(scoped.tools, name)
        if tool is None:
            return None
        state = self._registry.get(tool.backend_id)
        if not state.advertised:
            # health has taken the backend down and the swap that drops its tools is on its way:
            # refuse now, with the reason, rather than forward a call to a backend known to be down
            return None
        return ResolvedTool(
            name=tool.name,
            original_name=tool.original_name,
            input_schema_json=tool.input_schema_json,
            target=state.target(session.record.backend_sessions.get(tool.backend_id)),
            version=VersionRef(snapshot.number, snapshot.fingerprint),
            conditional=scoped.conditional(tool.name),
        )

    def authorize(self, session: LiveSession, item: Offered, arguments: Mapping[str, Any]) -> tuple[str, ...]:
        """Whether the caller may make this call with these arguments (blocking: a fraction of a ms).
        Returns the permits that allow it; raises `CallDenied` for a tool (as an unknown one),
        `ItemDenied` for a prompt or a resource, `ToolNotFound` for a tool it cannot call anyway."""
        record = session.record
        if item.kind == "tool":
            tool = self.resolve(session, item.name).name
            subject = session.current.version.by_name[tool]
            decision = self._access.decide(record, tool_item(subject), arguments)
            if not decision.allowed:
                self._access.denied(record, tool_item(subject), decision.policies)
                raise CallDenied(item.name, self._closest(session, item.name), decision.policies)
            return decision.policies
        asked = offered_item(item)
        decision = self._access.decide(record, asked, arguments)
        if not decision.allowed:
            self._access.denied(record, asked, decision.policies)
            raise ItemDenied(item.kind, item.name, decision.policies)
        return decision.policies

    def _down_reason(self, session: LiveSession, name: str) -> str:
        """Why a name the session's current version lacks cannot be called now, if a down backend has
        it (and the caller may use it: of a tool it may not, it learns nothing)."""
        key = name_key(name)
        for backend_id in sorted(session.record.accepted):
            state = self._registry.states.get(backend_id)
            if state is None or state.advertised or state.listing is None:
                continue
            for definition in state.listing.tools:
                own = str(definition.get("name", ""))
                if key in (name_key(own), name_key(f"{backend_id}_{own}")) and self._may_see(
                    session, own, backend_id, definition
                ):
                    return (
                        f"{name} belongs to backend {backend_id}, which is {state.status} right now: "
                        "it cannot be called until the backend recovers"
                    )
        return ""

    def _may_see(
        self, session: LiveSession, own: str, backend_id: str, definition: Mapping[str, Any]
    ) -> bool:
        """Whether the caller may use a tool of a down backend, under either name it may go by."""
        if self._access.authorizer is None:
            return True
        annotations = definition.get("annotations")
        hints = annotations if isinstance(annotations, Mapping) else None
        items = [Item.tool(name, backend_id, hints) for name in (own, f"{backend_id}_{own}")]
        seen = self._access.authorizer.visibility(self._access.principal(session.record), Catalog(items))
        return any(seen.of(item).visible for item in items)
