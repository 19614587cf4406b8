"""find_tool's answer as the client reads it: the tools, whose each one is and how well it matched.

The indexer picks the tools and says how each matched; the router renders the answer with
`render_answer`, the same JSON as `structuredContent` and as text. `toolsearch eval` renders with it
too, to count what an answer costs a model. A compact definition (`compact_definition`) keeps what a
call needs, the name and the whole input schema, and trims the rest.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

CHARS_PER_TOKEN = 4  # as indexer.tools estimates a definition's cost: an estimate, not a bill
COMPACT_DESCRIPTION_CHARS = 200  # of a tool's description in a compact answer
COMPACT_SERVER_CHARS = 100  # of a server's description in a compact answer
SERVER_DESCRIPTION_CHARS = 300  # of a server's description in a full answer
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_SPACE = re.compile(r"\s+")


def trim(text: str, limit: int) -> str:
    """`text` on one line, cut at a sentence end within `limit` characters, else at a word, with "…"."""
    text = _SPACE.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[:limit]
    ends = [m.start() for m in _SENTENCE_END.finditer(cut + " ")]
    if ends and ends[-1] >= limit // 3:
        return cut[: ends[-1]].rstrip()
    return cut.rsplit(" ", 1)[0].rstrip(" ,;:") + "…"


def compact_definition(definition: Mapping[str, Any]) -> dict[str, Any]:
    """What a call needs of a tool: its name, its whole input schema, and its description trimmed.

    The title stays only when it says more than the name; the output schema, annotations, icons and
    `_meta` go, and so does every null: none of them changes what arguments a call takes.
    """
    out: dict[str, Any] = {"name": definition.get("name")}
    title = definition.get("title")
    name = str(definition.get("name", ""))
    if isinstance(title, str) and _words(title) != _words(name):
        out["title"] = title
    description = definition.get("description")
    if isinstance(description, str) and description.strip():
        out["description"] = trim(description, COMPACT_DESCRIPTION_CHARS)
    schema = definition.get("inputSchema")
    out["inputSchema"] = schema if isinstance(schema, Mapping) else {"type": "object"}
    return out


def _words(name: str) -> str:
    return " ".join(
        re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace("-", " ").lower().split()
    )


@dataclass(frozen=True, slots=True)
class AnswerTool:
    """One tool of an answer: its definition as JSON text, its backend, and its match band."""

    definition_json: str
    backend_id: str
    match: str


@dataclass(frozen=True, slots=True)
class AnswerServer:
    """A server named in an answer: its own title and what it says it is for."""

    title: str = ""
    description: str = ""


@dataclass
class Answer:
    """The parts of a find_tool answer, as the indexer sent them."""

    tools: Sequence[AnswerTool]
    servers: Mapping[str, AnswerServer]
    token_metrics: Mapping[str, Any]
    message: str = ""  # why nothing was found, or that every match is weak (nothing fits)
    unavailable: Sequence[Mapping[str, str]] = field(default_factory=list)
    compact: bool = False


def _server_entry(server: AnswerServer, compact: bool) -> dict[str, str]:
    entry: dict[str, str] = {}
    if server.title:
        entry["title"] = server.title
    if server.description:
        limit = COMPACT_SERVER_CHARS if compact else SERVER_DESCRIPTION_CHARS
        entry["description"] = trim(server.description, limit)
    return entry


def render_answer(answer: Answer) -> tuple[dict[str, Any], str]:
    """The answer's structured content and the same JSON as text.

    `tools` holds the MCP definitions as they are, so a client can use each as it would a listed
    tool; `found` says of each, in the same order, its server (the backend id) and its match band,
    and `servers` describes each server named once, rather than in every tool it owns.
    """
    definitions = [tool.definition_json for tool in answer.tools]
    parsed = [orjson.loads(d) for d in definitions]  # once: the structured tools, and their names
    found = [
        {"name": definition.get("name"), "server": tool.backend_id, "match": tool.match}
        for definition, tool in zip(parsed, answer.tools, strict=True)
    ]
    named = dict.fromkeys(tool.backend_id for tool in answer.tools)
    servers = {
        backend: entry
        for backend in named
        if (entry := _server_entry(answer.servers.get(backend, AnswerServer()), answer.compact))
    }
    structured: dict[str, Any] = {"tools": parsed}
    # the definitions arrive as JSON text: join them rather than encode them a second time
    text = '{"tools": [' + ", ".join(definitions) + "]"
    if found:
        structured["found"] = found
        text += ', "found": ' + json.dumps(found, ensure_ascii=False)
    if servers:
        structured["servers"] = servers
        text += ', "servers": ' + json.dumps(servers, ensure_ascii=False)
    structured["token_metrics"] = dict(answer.token_metrics)
    text += ', "token_metrics": ' + json.dumps(structured["token_metrics"])
    if answer.message:
        structured["message"] = answer.message
        text += ', "message": ' + json.dumps(answer.message, ensure_ascii=False)
    if answer.unavailable:
        structured["unavailable"] = [dict(u) for u in answer.unavailable]
        text += ', "unavailable": ' + json.dumps(structured["unavailable"], ensure_ascii=False)
    return structured, text + "}"


def estimate_tokens(text: str) -> int:
    """Estimated tokens a text costs in a client model's context (`CHARS_PER_TOKEN`)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
