"""The meta-tools' arguments, checked: what find_tool and call_tool were given, or why it is wrong.

A wrong argument is a mistake the model can correct, so each `InvalidRequest` names the field, what
was sent, and what to send instead; `router/handlers/meta_tools.py` turns it into a tool result with
`isError`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.errors import InvalidRequest


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}
    return names.get(type(value), "an array" if isinstance(value, list) else "null")


def _keywords(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for v in values if v.strip())


@dataclass(frozen=True, slots=True)
class FindToolArgs:
    """find_tool's arguments, checked."""

    description: str
    keywords: tuple[str, ...]
    limit: int  # 0: the indexer's default
    compact: bool | None = None  # None: the configured default


@dataclass(frozen=True, slots=True)
class CallToolArgs:
    """call_tool's arguments, checked."""

    name: str
    parameters: dict[str, Any]


def parse_find_tool(arguments: Mapping[str, Any] | None, max_limit: int) -> FindToolArgs:
    """Check find_tool's arguments; raises `InvalidRequest` naming the field and how to fix it."""
    arguments = arguments or {}
    description = arguments.get("tool_description")
    if not isinstance(description, str) or not description.strip():
        got = "it is missing" if description is None else f"got {_json_type(description)}"
        if isinstance(description, str):
            got = "it is empty"
        raise InvalidRequest(
            f"find_tool needs tool_description, a non-empty string saying in plain words what the tool "
            f"should do ({got})."
        )
    raw_keywords = arguments.get("tool_keywords")
    if raw_keywords is None:
        keywords: tuple[str, ...] = ()
    elif isinstance(raw_keywords, str):
        keywords = _keywords([raw_keywords])
    elif isinstance(raw_keywords, list) and all(isinstance(k, str) for k in raw_keywords):
        keywords = _keywords(raw_keywords)
    else:
        raise InvalidRequest(
            f'tool_keywords must be an array of strings, e.g. ["weather", "forecast"] '
            f"(got {_json_type(raw_keywords)}). Leave it out if you have no keywords."
        )
    raw_limit = arguments.get("limit")
    limit = 0
    if raw_limit is not None:
        if isinstance(raw_limit, float) and raw_limit.is_integer():
            raw_limit = int(raw_limit)
        if isinstance(raw_limit, bool) or not isinstance(raw_limit, int) or not 1 <= raw_limit <= max_limit:
            shown = (
                json.dumps(raw_limit) if isinstance(raw_limit, int | float | str) else _json_type(raw_limit)
            )
            raise InvalidRequest(
                f"limit must be an integer from 1 to {max_limit} (got {shown}). Leave it out for the default."
            )
        limit = raw_limit
    raw_compact = arguments.get("compact")
    if raw_compact is not None and not isinstance(raw_compact, bool):
        raise InvalidRequest(
            f"compact must be true or false (got {_json_type(raw_compact)}). Leave it out for the default."
        )
    return FindToolArgs(description, keywords, limit, raw_compact)


def parse_call_tool(arguments: Mapping[str, Any] | None, max_bytes: int = 0) -> CallToolArgs:
    """Check call_tool's arguments; raises `InvalidRequest` naming the field and how to fix it.

    Lenient where the intent is plain: `parameters` may be left out (no arguments) or sent as a
    JSON string of an object, and `tool_name` may sit inside `parameters`. With `max_bytes`,
    `parameters` longer than that as compact JSON are refused before anything is resolved.
    """
    arguments = arguments or {}
    parameters = arguments.get("parameters")
    if parameters is None:
        parameters = {}
    elif isinstance(parameters, str):
        with contextlib.suppress(ValueError):
            parameters = json.loads(parameters)
    if not isinstance(parameters, dict):
        raise InvalidRequest(
            f'parameters must be an object holding the tool\'s arguments, e.g. {{"city": "Paris"}} '
            f"(got {_json_type(parameters)}). Send {{}} for a tool that takes no arguments."
        )
    name = arguments.get("tool_name")
    if name is None and isinstance(parameters.get("tool_name"), str):
        parameters = dict(parameters)
        name = parameters.pop("tool_name")
    if not isinstance(name, str) or not name.strip():
        got = "it is missing" if name is None else f"got {_json_type(name)}"
        raise InvalidRequest(f"call_tool needs tool_name, the name of a tool find_tool returned ({got}).")
    if max_bytes:
        size = len(json.dumps(parameters, separators=(",", ":"), ensure_ascii=False).encode())
        if size > max_bytes:
            raise InvalidRequest(
                f"parameters are too large: {size} bytes of JSON, and the limit is {max_bytes} bytes "
                "(router.max_arguments_bytes). Send less data in one call."
            )
    return CallToolArgs(name.strip(), parameters)
