"""Cedar's JSON form of a policy (`cedarpy.policies_to_json_str`), walked: what the checks and the
reading of policies (checks.py, reads.py) share.

A policy is its effect, three scope constraints (`principal`, `action`, `resource`) and a list of
`when`/`unless` conditions whose bodies are expressions. An expression is a one-key object: `Value`
(a literal; `{"__entity": {...}}` in one is an entity), `Var`, `Slot`, an operator over `left` and
`right` (or `arg`), `.` and `has` over `left` and `attr`, `like`, `is`, `if-then-else`, `Set`,
`Record`, or an extension function over a list of arguments.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

Expression = Mapping[str, Any]
Uid = tuple[str, str]  # (entity type, id)
SCOPES = ("principal", "action", "resource")


def children(node: Expression) -> list[Expression]:
    """An expression's sub-expressions."""
    ((operator, body),) = node.items()
    if operator in ("Value", "Var", "Slot", "unknown"):
        return []
    if operator == "if-then-else":
        return [body["if"], body["then"], body["else"]]
    if operator == "Set":
        return list(body)
    if operator == "Record":
        return list(body.values())
    if isinstance(body, list):  # an extension function or method: its arguments
        return list(body)
    return [body[key] for key in ("left", "right", "arg", "in") if key in body]


def walk(
    node: Expression, parent: Expression | None = None
) -> Iterator[tuple[Expression, Expression | None]]:
    """Every expression under `node` (itself first) with the expression it is part of."""
    yield node, parent
    for child in children(node):
        yield from walk(child, node)


def bodies(policy: Mapping[str, Any]) -> list[Expression]:
    """The bodies of a policy's `when` and `unless` conditions."""
    return [condition["body"] for condition in policy.get("conditions", [])]


def var(node: Expression | None) -> str | None:
    """The variable an expression is (`principal`, `action`, `resource`, `context`), or None."""
    return node.get("Var") if node is not None and len(node) == 1 and "Var" in node else None


def entities_in(value: Any) -> Iterator[Uid]:
    """The entity references in a literal value (a set or record of them included)."""
    if isinstance(value, Mapping):
        if "__entity" in value:
            yield value["__entity"]["type"], value["__entity"]["id"]
            return
        for item in value.values():
            yield from entities_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from entities_in(item)


def literal_entities(node: Expression | None) -> list[Uid] | None:
    """The entities an expression names when it is nothing but entity literals (one, or a set of
    them), else None."""
    if node is None:
        return None
    if "Value" in node:
        value = node["Value"]
        return list(entities_in(value)) if isinstance(value, Mapping) and "__entity" in value else None
    if "Set" in node:
        named: list[Uid] = []
        for element in node["Set"]:
            if (uids := literal_entities(element)) is None:
                return None
            named += uids
        return named
    return None


def scope_entities(constraint: Mapping[str, Any]) -> Iterator[Uid]:
    """The entities a scope constraint names."""
    for entity in [constraint.get("entity"), *constraint.get("entities", [])]:
        if entity is not None:
            yield entity["type"], entity["id"]
    if isinstance(within := constraint.get("in"), Mapping) and "entity" in within:
        yield within["entity"]["type"], within["entity"]["id"]


def scope_types(constraint: Mapping[str, Any]) -> Iterator[str]:
    if "entity_type" in constraint:
        yield constraint["entity_type"]


def slot_in(policy: Mapping[str, Any]) -> str | None:
    """The slot (`?principal`, `?resource`) a template's scope holds, or None for a policy."""
    for scope in SCOPES:
        constraint = policy[scope]
        for part in (constraint, constraint.get("in")):
            if isinstance(part, Mapping) and "slot" in part:
                return str(part["slot"])
    return None
