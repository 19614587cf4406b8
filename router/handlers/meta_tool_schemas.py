"""What the two tools a client sees say of themselves: names, descriptions and schemas.

find_tool's input schema takes its limit's bounds from the indexer's search settings; call_tool's
is fixed. find_tool's output schema describes the answer `toolsearch/answers.py` renders.
"""

from __future__ import annotations

from typing import Any

from toolsearch.sections.indexer_settings import Search

FIND_TOOL = "find_tool"
CALL_TOOL = "call_tool"
CALL_TOOL_DESCRIPTION = (
    "Run a tool that find_tool returned: pass its name as tool_name and its arguments, matching the "
    "tool's inputSchema, as the parameters object."
)
CALL_TOOL_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tool_name": {"type": "string", "description": "The name of a tool find_tool returned."},
        "parameters": {
            "type": "object",
            "description": "The tool's arguments, as its inputSchema describes.",
        },
    },
    "required": ["tool_name", "parameters"],
}
FIND_TOOL_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tools": {
            "type": "array",
            "items": {"type": "object"},
            "description": "MCP tool definitions, each with its server (backend id) and match "
            "(strong, possible or weak).",
        },
        "servers": {
            "type": "object",
            "description": "Each server named in tools, by backend id: its own title and description.",
        },
        "unavailable": {
            "type": "array",
            "items": {"type": "object"},
            "description": "Backends down now or that rejected the credentials: their tools cannot be had.",
        },
        "token_metrics": {
            "type": "object",
            "properties": {
                "baseline_tokens": {"type": "integer"},
                "returned_tokens": {"type": "integer"},
                "savings_percent": {"type": "number"},
            },
        },
        "message": {
            "type": "string",
            "description": "Why no tool was returned, or that every match is weak: nothing here fits.",
        },
    },
    "required": ["tools", "token_metrics"],
}


def find_tool_input_schema(search: Search) -> dict[str, Any]:
    """find_tool's input schema; the limit bounds come from the indexer's search settings.

    A `compact` argument (true or false) is also accepted, over `indexer.search.compact`, but not
    advertised: the schema is what every client sees, and the operator's default is what most need.
    """
    return {
        "type": "object",
        "properties": {
            "tool_description": {"type": "string", "description": "What the tool should do, in plain words."},
            "tool_keywords": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Optional keywords: names, domains, technical terms.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": search.max_limit,
                "default": search.default_limit,
                "description": "The most tools to return.",
            },
        },
        "required": ["tool_description"],
    }


META_TOOLS = frozenset({FIND_TOOL, CALL_TOOL})
