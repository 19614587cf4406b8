"""What a policy reads of the principal, the resource and the call, so that visibility can be asked
of a few items rather than of all, and asked before any call's arguments are known.

Two items the policies cannot tell apart get the same answer: same entity type, same named
ancestors, same values of every resource attribute the policies read, and neither named by a policy.
A policy tells items apart only through what it reads of `resource`: an attribute (`.name`,
`has readOnlyHint`), its type (`is Tool`), or a comparison with named entities (`resource ==
Tool::"x"`, `resource in MCP::"github"`, `resource in [...]`, `[...].contains(resource)`). Any other
use (`resource == principal.claim_x`, a tag) and every item is its own.

For visibility, the arguments are unknown: `arg_<k>` (on the resource or in the context) reads the
context's unknown `arg_<k>`, and `has arg_<k>` an unknown boolean of its own, so that a condition on
arguments is left to the call rather than decided by a guess.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from indexer.authorization.comparisons import Comparisons, compared_attributes
from indexer.authorization.expressions import (
    SCOPES,
    Expression,
    Uid,
    bodies,
    entities_in,
    literal_entities,
    scope_entities,
    var,
    walk,
)
from indexer.authorization.vocabulary import ARGUMENT, CLAIM, CLAIM_SET, CLIENT, RESOURCE_TYPES

PRESENCE = "has "  # the prefix of the unknown that stands for `has arg_<k>` (no policy can name it)


@dataclass(frozen=True, slots=True)
class Reads:
    """What one policy reads (arguments aside, each a property of the item or of the caller)."""

    resource_attributes: frozenset[str] = frozenset()
    resource_whole: bool = False  # the resource used otherwise: every item is its own
    claims: frozenset[str] = frozenset()  # claim names read, without their prefix
    principal_whole: bool = False  # the principal used as an entity, not by its claims: its subject counts
    arguments: frozenset[str] = frozenset()  # the unknowns it reads: arg_<k>, and "has arg_<k>"
    entities: frozenset[Uid] = frozenset()  # the entities it names
    # reads an attribute of a named tool, prompt or resource: what another item holds, not the resource
    item_attributes: bool = False
    # the resource attributes it only compares with literals or patterns (comparisons.py)
    comparisons: tuple[tuple[str, Comparisons], ...] = ()


def reads_of(policy: Mapping[str, Any]) -> Reads:
    """What a policy (its JSON form) reads."""
    attributes: set[str] = set()
    claims: set[str] = set()
    arguments: set[str] = set()
    named: set[Uid] = {uid for scope in SCOPES for uid in scope_entities(policy[scope])}
    resource_whole = principal_whole = item_attributes = False
    for body in bodies(policy):
        for node, parent in walk(body):
            if "Value" in node:
                named |= set(entities_in(node["Value"]))
                item_attributes |= _item_literal(node) and _attribute_read(parent, node)[1] is not None
            if (variable := var(node)) is None:
                continue
            operator, read = _attribute_read(parent, node)
            if read is None:
                if not _names_only(parent, node):
                    resource_whole |= variable == "resource"
                    principal_whole |= variable == "principal"
            elif read.startswith(ARGUMENT) and variable in ("resource", "context"):
                arguments.add(read if operator == "." else PRESENCE + read)
            elif read.startswith(CLAIM_SET) and variable in ("principal", "context"):
                claims.add(read.removeprefix(CLAIM_SET))
            elif read.startswith(CLAIM) and variable in ("principal", "context"):
                claims.add(read.removeprefix(CLAIM))
            elif variable == "resource":
                attributes.add(read)
    # a named caller: its subject decides, and the entities file may give it parents of its own
    principal_whole |= any(kind == CLIENT for kind, _ in named)
    return Reads(
        frozenset(attributes),
        resource_whole,
        frozenset(claims),
        principal_whole,
        frozenset(arguments),
        frozenset(named),
        item_attributes,
        tuple(sorted(compared_attributes(policy).items())),
    )


def _item_literal(node: Expression) -> bool:
    value = node["Value"]
    return isinstance(value, Mapping) and value.get("__entity", {}).get("type") in RESOURCE_TYPES.values()


def _attribute_read(parent: Expression | None, node: Expression) -> tuple[str, str | None]:
    """How and which attribute `parent` reads of `node` (`node.attr`, `node has attr`), or ("", None)."""
    for operator in (".", "has"):
        if parent is not None and operator in parent and parent[operator]["left"] is node:
            return operator, str(parent[operator]["attr"])
    return "", None


def _names_only(parent: Expression | None, node: Expression) -> bool:
    """Whether `parent` uses `node` only by its type or against named entities."""
    if parent is None:
        return False
    ((operator, body),) = parent.items()
    if operator == "is":
        return body["left"] is node and ("in" not in body or literal_entities(body["in"]) is not None)
    if operator in ("==", "!="):
        other = body["right"] if body["left"] is node else body["left"]
        return literal_entities(other) is not None
    if operator == "in":
        return body["left"] is node and literal_entities(body["right"]) is not None
    if operator == "contains":
        return body["right"] is node and literal_entities(body["left"]) is not None
    return False


def for_visibility(policy: Mapping[str, Any]) -> dict[str, Any]:
    """A policy whose argument reads read the context's unknowns instead (module docstring)."""
    rewritten = copy.deepcopy(dict(policy))
    for condition in rewritten.get("conditions", []):
        condition["body"] = _rewritten(condition["body"])
    return rewritten


def _rewritten(node: Expression) -> Expression:
    for operator in (".", "has"):
        body = node.get(operator)
        if (
            body is not None
            and var(body["left"]) in ("resource", "context")
            and body["attr"].startswith(ARGUMENT)
        ):
            name = body["attr"] if operator == "." else PRESENCE + body["attr"]
            return {".": {"left": {"Var": "context"}, "attr": name}}
    ((operator, body),) = node.items()
    if operator in ("Value", "Var", "Slot", "unknown"):
        return node
    if isinstance(body, list):
        return {operator: [_rewritten(child) for child in body]}
    if operator == "Record":
        return {operator: {key: _rewritten(child) for key, child in body.items()}}
    if operator == "if-then-else":
        return {operator: {key: _rewritten(child) for key, child in body.items()}}
    keys = ("left", "right", "arg", "in")
    return {operator: {key: _rewritten(value) if key in keys else value for key, value in body.items()}}
