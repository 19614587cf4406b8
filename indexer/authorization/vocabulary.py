"""The names a policy may use, ToolHive's: entity types, actions, attributes, and values made Cedar's.

ToolHive's authorization policy reference (docs.stacklok.com/toolhive/reference/authz-policy-reference)
fixes the vocabulary, so that a policy written for ToolHive runs here unchanged: the caller is
`Client::"<sub>"` with every JWT claim as a `claim_<key>` attribute, in groups `THVGroup::"<g>"`;
actions `call_tool`, `get_prompt` and `read_resource`; resources `Tool::"<name>"`,
`Prompt::"<name>"` and `Resource::"<sanitized uri>"`, each a child of its server's `MCP::"<id>"`,
with the call's arguments as `arg_<key>`. What this module adds to ToolHive's is said where it is.

JSON values become Cedar values as ToolHive converts them: strings, booleans, integers as Longs,
floats as decimals (four places, cut toward zero), arrays as sets, objects as records, nothing below
ten levels of nesting; what has no Cedar form (null, a number out of range) is left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["tool", "prompt", "resource"]

CLIENT = "Client"
GROUP = "THVGroup"
SERVER = "MCP"
ACTION = "Action"
RESOURCE_TYPES: dict[Kind, str] = {"tool": "Tool", "prompt": "Prompt", "resource": "Resource"}
ACTIONS: dict[Kind, str] = {"tool": "call_tool", "prompt": "get_prompt", "resource": "read_resource"}
# ToolHive's `operation` and `feature` attributes of each kind of resource
OPERATIONS: dict[Kind, str] = {"tool": "call", "prompt": "get", "resource": "read"}
ENTITY_TYPES = frozenset({CLIENT, GROUP, SERVER, ACTION, *RESOURCE_TYPES.values()})
# ToolHive's list actions exist in its code but no request ever asks them: lists are filtered by the
# three above, here as there, so a policy naming one is refused rather than silently never applied
LIST_ACTIONS = frozenset({"list_tools", "list_prompts", "list_resources"})

CLAIM = "claim_"
CLAIM_SET = "claimset_"  # a multi-valued claim's elements (authorization.multi_valued_claims)
ARGUMENT = "arg_"
PRESENT = "_present"  # arg_<key>_present: an argument whose value has no Cedar form (object, array, null)

# the tool annotations a policy may read, present only when the server set them
HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
BACKEND = "backend"  # the backend's id: not ToolHive's (there, one authorizer serves one server)
RESOURCE_ATTRIBUTES = frozenset({"name", "operation", "feature", "uri", BACKEND, *HINTS})
ACTION_ATTRIBUTES = frozenset({"operation"})  # ToolHive's action entities carry their own name

# ToolHive's group claims, tried in turn after the configured one: the first present is used
DEFAULT_GROUP_CLAIMS = ("groups", "roles", "cognito:groups")
MAX_DEPTH = 10  # ToolHive's bound on nested claims: an upstream token is not ours to trust deeply
# keys Cedar's JSON reads as an entity reference or an extension value: a claim must not forge one
RESERVED_KEYS = frozenset({"__entity", "__extn", "__expr"})
_LONG = 2**63
_DECIMAL_SCALE = 10_000
_URI_REPLACED = str.maketrans({c: "_" for c in ":/\\?&=# ."})


def sanitize_uri(uri: str) -> str:
    """A resource URI as ToolHive makes it an entity id: `:/\\?&=#.` and space become `_`."""
    return uri.translate(_URI_REPLACED)


def cedar_value(value: Any, depth: int = 0) -> Any:
    """A JSON value in Cedar's JSON form, or None when it has none (the attribute is then left out)."""
    if depth > MAX_DEPTH or value is None:
        return None
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if -_LONG <= value < _LONG else None
    if isinstance(value, float):
        return _decimal(value)
    if isinstance(value, list | tuple):
        elements = (cedar_value(element, depth + 1) for element in value)
        return [element for element in elements if element is not None]
    if isinstance(value, Mapping):
        return cedar_record(value, depth + 1)
    return None


def cedar_record(values: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    """An object's fields as a Cedar record: those without a Cedar form, or with a reserved key, left out."""
    record = {}
    for key, value in values.items():
        if not isinstance(key, str) or key in RESERVED_KEYS:
            continue
        converted = cedar_value(value, depth)
        if converted is not None:
            record[key] = converted
    return record


def _decimal(value: float) -> dict[str, Any] | None:
    # as cedar-go's NewDecimalFromFloat: four places, the rest cut off toward zero
    if not math.isfinite(value):
        return None
    scaled = math.trunc(value * _DECIMAL_SCALE)
    if not -_LONG <= scaled < _LONG:
        return None
    sign = "-" if scaled < 0 else ""
    whole, fraction = divmod(abs(scaled), _DECIMAL_SCALE)
    return {"__extn": {"fn": "decimal", "arg": f"{sign}{whole}.{fraction:04d}"}}


def argument_attributes(arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """A call's arguments as ToolHive presents them: `arg_<key>` for a string, boolean or number (left
    out when out of Cedar's range), `arg_<key>_present: true` for anything else (object, array, null)."""
    attributes: dict[str, Any] = {}
    for key, value in (arguments or {}).items():
        if not isinstance(value, bool | str | int | float):
            attributes[f"{ARGUMENT}{key}{PRESENT}"] = True
        elif (converted := cedar_value(value)) is not None:
            attributes[f"{ARGUMENT}{key}"] = converted
    return attributes


def action_uid(kind: Kind) -> dict[str, str]:
    return {"type": ACTION, "id": ACTIONS[kind]}


def action_entities() -> list[dict[str, Any]]:
    """The three action entities, each with its `operation` attribute as ToolHive makes them."""
    return [
        {"uid": action_uid(kind), "attrs": {"operation": ACTIONS[kind]}, "parents": []} for kind in ACTIONS
    ]
