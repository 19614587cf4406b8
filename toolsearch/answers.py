"""find_tool's answer as the client reads it: the tools, whose each one is and how well it matched.

The indexer picks the tools and says how each matched (a `Found`, toolsearch/found.py); the router
renders it with `render_answer`, the same JSON as `structuredContent` and as text. `toolsearch eval`
renders with it too, to count what an answer costs a model. A compact definition
(`compact_definition`) keeps what a call needs, the name and the whole input schema, and trims the
rest.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from toolsearch.found import Found, FoundTool, UnavailableBackend

# A rough count of what a text costs a model: about four characters a token for JSON-ish English.
# It is an estimate for the savings figure, not a bill; a real tokenizer would need the client's
# model, which neither the router nor the indexer knows.
CHARS_PER_TOKEN = 4
COMPACT_DESCRIPTION_CHARS = 200  # of a tool's description in a compact answer
COMPACT_SERVER_CHARS = 100  # of a server's description in a compact answer
SERVER_DESCRIPTION_CHARS = 300  # of a server's description in a full answer, as the indexer sends it
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


def _server_entry(tool: FoundTool, compact: bool) -> dict[str, str]:
    entry: dict[str, str] = {}
    if tool.server_title:
        entry["title"] = tool.server_title
    if tool.server_description:
        limit = COMPACT_SERVER_CHARS if compact else SERVER_DESCRIPTION_CHARS
        entry["description"] = trim(tool.server_description, limit)
    return entry


def _unavailable_entry(backend: UnavailableBackend) -> dict[str, str]:
    entry = {"backend": backend.backend_id, "status": backend.status}
    if backend.server_title:
        entry["title"] = backend.server_title
    return entry


def _message(found: Found) -> str:
    """Why nothing was found, or that every match is weak (nothing fits); "" when neither."""
    if not found.tools:
        return found.empty_reason or "no tool matched the description"
    return found.note


def render_answer(found: Found, compact: bool = False) -> tuple[dict[str, Any], str]:
    """A search's answer as the client reads it: its structured content and the same JSON as text.

    `tools` holds the MCP definitions as they are, so a client can use each as it would a listed
    tool; `found` says of each, in the same order, its server (the backend id) and its match band,
    and `servers` describes each server named once, rather than in every tool it owns.
    """
    definitions = [tool.definition_json for tool in found.tools]
    parsed = [orjson.loads(d) for d in definitions]  # once: the structured tools, and their names
    entries = [
        {"name": definition.get("name"), "server": tool.backend_id, "match": tool.match}
        for definition, tool in zip(parsed, found.tools, strict=True)
    ]
    named = {tool.backend_id: tool for tool in found.tools}  # each server as its tools describe it
    servers = {backend: entry for backend, tool in named.items() if (entry := _server_entry(tool, compact))}
    structured: dict[str, Any] = {"tools": parsed}
    # the definitions arrive as JSON text: join them rather than encode them a second time
    text = '{"tools": [' + ", ".join(definitions) + "]"
    if entries:
        structured["found"] = entries
        text += ', "found": ' + json.dumps(entries, ensure_ascii=False)
    if servers:
        structured["servers"] = servers
        text += ', "servers": ' + json.dumps(servers, ensure_ascii=False)
    metrics = found.token_metrics
    structured["token_metrics"] = {
        "baseline_tokens": metrics.baseline_tokens,
        "returned_tokens": metrics.returned_tokens,
        "savings_percent": metrics.savings_percent,
    }
    text += ', "token_metrics": ' + json.dumps(structured["token_metrics"])
    if message := _message(found):
        structured["message"] = message
        text += ', "message": ' + json.dumps(message, ensure_ascii=False)
    if found.unavailable:
        structured["unavailable"] = [_unavailable_entry(u) for u in found.unavailable]
        text += ', "unavailable": ' + json.dumps(structured["unavailable"], ensure_ascii=False)
    return structured, text + "}"


def estimate_tokens(text: str) -> int:
    """Estimated tokens a text costs in a client model's context (`CHARS_PER_TOKEN`)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
