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

A resolution is a `ResolvedTool` (toolsearch/targets.py), the value both sides of the link know:
indexer/api/messages.py turns it into the wire's `ResolveToolResponse`.
"""

from __future__ import annotations

from indexer.api.finder import server_title
from indexer.backends.registry import Registry
from indexer.errors import ToolNotFound
from indexer.retrieval.names import by_own_name, closest_tools
from indexer.retrieval.text import name_key
from indexer.sessions.views import LiveSession
from toolsearch.sessions import VersionRef
from toolsearch.targets import ResolvedTool


class ToolResolver:
    """Resolves tool names in a session's current version against the registry's backends."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def resolve(self, session: LiveSession, name: str) -> ResolvedTool:
        """The tool `name` means in the session and how to call it; raises `ToolNotFound`."""
        found = self.resolved(session, name)
        if found is not None:
            return found
        version = session.current.version
        close = [
            (t.name, t.backend_id, server_title(version.server(t.backend_id)))
            for t in closest_tools(name, version.tools)
        ]
        raise ToolNotFound(name, close, self._down_reason(session, name))

    def resolved(self, session: LiveSession, name: str) -> ResolvedTool | None:
        """As `resolve`, with None for a name that means no tool (the caller asks `resolve` why)."""
        snapshot = session.current
        tool = snapshot.version.resolve(name) or by_own_name(snapshot.version.tools, name)
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
            version=VersionRef(snapshot.number, snapshot.version.fingerprint),
        )

    def _down_reason(self, session: LiveSession, name: str) -> str:
        """Why a name the session's current version lacks cannot be called now, if a down backend has it."""
        key = name_key(name)
        for backend_id in sorted(session.record.accepted):
            state = self._registry.states.get(backend_id)
            if state is None or state.advertised or state.listing is None:
                continue
            for definition in state.listing.tools:
                own = str(definition.get("name", ""))
                if key in (name_key(own), name_key(f"{backend_id}_{own}")):
                    return (
                        f"{name} belongs to backend {backend_id}, which is {state.status} right now: "
                        "it cannot be called until the backend recovers"
                    )
        return ""
