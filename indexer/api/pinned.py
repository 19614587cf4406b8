"""The tools a session pins: what `router.pinned` lists beside the meta-tools, fixed for the session.

The router names the tools to pin as `BACKEND/TOOL` or `BACKEND/*` (a backend id and a tool's own
name at that backend) and asks the indexer (`PinnedTools`) for the session's tools that match. The
set comes from the last listing of every backend the session may use, down or not (a listing is
kept while its backend is down), so that a health change never changes it (docs/router.md). The
tools are named as the session's catalog names them (`indexer/sessions/catalogs.py`, `named_tools`):
the name a client sees in `tools/list` is the one find_tool shows and call_tool resolves.

The answer is a list of `Tool`, plain values: indexer/api/messages.py turns them into the wire's
`PinnedToolsResponse`.
"""

from __future__ import annotations

from collections.abc import Iterable

from indexer.backends.registry import Registry
from indexer.retrieval.tools import Tool
from indexer.sessions.catalogs import named_tools
from indexer.sessions.views import LiveSession
from indexer.state.listings import Listing
from toolsearch.sections.indexer_settings import Naming


def pinned(session: LiveSession, registry: Registry, patterns: Iterable[str], naming: Naming) -> list[Tool]:
    """The session's tools that `patterns` (`BACKEND/TOOL` or `BACKEND/*`) name, in catalog order."""
    wanted = [tuple(p.split("/", 1)) for p in patterns if "/" in p]
    listings: dict[str, Listing] = {}
    for backend_id in sorted(session.record.accepted):
        state = registry.states.get(backend_id)
        # the last listing, kept while the backend is down: health does not change the set
        listing = session.record.own_listings.get(backend_id) or (state.listing if state else None)
        if listing is not None:
            listings[backend_id] = listing
    return [
        tool
        for tool in named_tools(listings, naming)
        if any(backend == tool.backend_id and name in ("*", tool.original_name) for backend, name in wanted)
    ]
