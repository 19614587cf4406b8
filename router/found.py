"""What find_tool's search answered, as the handlers read it: one value per boundary, no protobuf.

The indexer's FindTools answer is read into a `Found` in the link (router/link/indexer_answers.py);
the meta-tool handler renders it for the agent without touching the wire message.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FoundTool:
    """One tool a search returned: its definition under the advertised name, and how it matched."""

    name: str
    backend_id: str
    definition_json: str  # the MCP tool definition, under the advertised name (compact if asked)
    server_title: str  # the server's own title or name ("" if none)
    server_description: str  # what the server says it is for ("" if nothing)
    match: str  # strong | possible | weak


@dataclass(frozen=True, slots=True)
class UnavailableBackend:
    """A backend of the session whose tools cannot be found or called right now, and why."""

    backend_id: str
    status: str  # unhealthy | degraded | unknown | unauthenticated | rejected
    server_title: str


@dataclass(frozen=True, slots=True)
class TokenMetrics:
    """What the answer saves against listing every tool: the agent sees these in the result."""

    baseline_tokens: int
    returned_tokens: int
    savings_percent: float


@dataclass(frozen=True, slots=True)
class Found:
    """A search's answer: the tools, the index version searched, and what to say beside them.

    `note` is set when every match is weak (nothing fits); `empty_reason` says why nothing came back.
    """

    tools: tuple[FoundTool, ...]
    version_number: int
    version_fingerprint: str
    token_metrics: TokenMetrics
    note: str
    empty_reason: str
    unavailable: tuple[UnavailableBackend, ...]
