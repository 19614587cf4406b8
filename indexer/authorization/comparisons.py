"""How a rule reads a resource attribute: compared with literals, matched with patterns, or read whole.

`resource.backend == "github"` tells items apart only by whether their backend is "github";
`resource.name like "*_read*"` only by whether their name matches. When every read of an attribute
in a rule is such a comparison (`==` or `!=` with a literal, `like`), items whose values give the same
outcomes share a view (views.py), and a rule on 811 backends' tools is asked twice, not 811 times.
The outcomes are Cedar's: `==` of values of two types is false, `like` of anything but a string an
error, `*` in a pattern any run of characters. Any other read (`<`, `.contains`, a comparison with
another attribute) makes the whole value count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from indexer.authorization.expressions import Expression, bodies, var, walk

ABSENT = ("absent",)  # an attribute the item lacks


@dataclass(frozen=True, slots=True)
class Comparisons:
    """What a rule compares one attribute with: literals (each as type and JSON text) and patterns."""

    literals: tuple[tuple[str, str], ...] = ()
    patterns: tuple[str, ...] = ()  # each a regular expression that matches as the `like` does

    def outcome(self, value: Any) -> Any:
        """A value reduced to what the rule can tell of it: equal to which literal, matching which pattern."""
        if value is ABSENT:
            return value
        typed = _typed(value)
        equal = tuple(typed == literal for literal in self.literals)
        if not isinstance(value, str):
            return equal, None  # `like` on anything but a string is an error, whatever it is
        return equal, tuple(re.fullmatch(pattern, value, re.DOTALL) is not None for pattern in self.patterns)


def _typed(value: Any) -> tuple[str, str]:
    return type(value).__name__, json.dumps(value, sort_keys=True)


def compared_attributes(policy: Mapping[str, Any]) -> dict[str, Comparisons]:
    """The resource attributes a rule reads only by comparisons, with what it compares them with."""
    literals: dict[str, set[tuple[str, str]]] = {}
    patterns: dict[str, set[str]] = {}
    accounted: set[int] = set()  # the reads that are part of a comparison, by identity
    reads: dict[int, str] = {}
    for body in bodies(policy):
        for node, _ in walk(body):
            if (name := _resource_attribute(node)) is not None:
                reads[id(node)] = name
            ((operator, part),) = node.items()
            if operator in ("==", "!=") and isinstance(part, Mapping):
                for side, other in ((part["left"], part["right"]), (part["right"], part["left"])):
                    name = _resource_attribute(side)
                    if name is not None and "Value" in other and _scalar(other["Value"]):
                        literals.setdefault(name, set()).add(_typed(other["Value"]))
                        accounted.add(id(side))
            elif operator == "like" and (name := _resource_attribute(part["left"])) is not None:
                patterns.setdefault(name, set()).add(_regex(part["pattern"]))
                accounted.add(id(part["left"]))
    whole = {name for node_id, name in reads.items() if node_id not in accounted}
    return {
        name: Comparisons(tuple(sorted(literals.get(name, ()))), tuple(sorted(patterns.get(name, ()))))
        for name in set(reads.values()) - whole
    }


def _resource_attribute(node: Expression) -> str | None:
    body = node.get(".")
    return str(body["attr"]) if body is not None and var(body["left"]) == "resource" else None


def _scalar(value: Any) -> bool:
    return isinstance(value, str | bool | int) or (isinstance(value, Mapping) and "__entity" in value)


def _regex(pattern: Sequence[Any]) -> str:
    """A `like` pattern (Cedar's JSON form: literals and wildcards) as a regular expression."""
    return "".join(".*" if element == "Wildcard" else re.escape(element["Literal"]) for element in pattern)
