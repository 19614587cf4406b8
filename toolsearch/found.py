"""What find_tool's search answered, as both sides of the link know it.

The indexer's finder answers a `Found` (indexer/api/finder.py), which indexer/api/messages.py writes
as the wire's `FindToolsResponse`; the router's link reads that back into a `Found`
(router/link/indexer_answers.py), and the meta-tool renders it for the agent
(`toolsearch.answers.render_answer`) without touching the wire message.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolsearch.sessions import VersionRef


@dataclass(frozen=True, slots=True)
class FoundTool:
    """One tool a search returned: its definition under the advertised name, its server, and how it
    matched."""

    name: str
    backend_id: str
    definition_json: str  # the MCP tool definition, under the advertised name (compact if asked)
    server_title: str  # the server's own title or name ("" if none)
    server_description: str  # what the server says it is for, trimmed ("" if nothing)
    match: str  # the band: strong | possible | weak
    score: float = 0.0  # what the search ranked it by
    relevance: float = 0.0  # the match the band was cut from (docs/retrieval.md)


@dataclass(frozen=True, slots=True)
class UnavailableBackend:
    """A backend of the session whose tools cannot be found or called right now, and why."""

    backend_id: str
    status: str  # unhealthy | degraded | unknown | unauthenticated | rejected
    server_title: str = ""


@dataclass(frozen=True, slots=True)
class TokenMetrics:
    """What the answer saves against listing every tool, in prompt tokens: the agent sees these."""

    baseline_tokens: int
    returned_tokens: int
    savings_percent: float


@dataclass(frozen=True, slots=True)
class Found:
    """A search's answer from one version of a session: the tools, or why there are none.

    `note` is set when every match is weak (nothing fits); `empty_reason` says why nothing came back.
    """

    version: VersionRef
    tools: tuple[FoundTool, ...]
    unavailable: tuple[UnavailableBackend, ...]
    token_metrics: TokenMetrics
    empty_reason: str = ""
    note: str = ""
