"""The vocabulary check: a policy naming an action, an entity type or an attribute that does not exist
is refused, since it could never apply as its author meant (a misspelt `readonlyHint` would
silently permit or forbid nothing).

What exists is ToolHive's vocabulary (vocabulary.py) and what the entities file adds: its entity
types and, on entities of a type, the attributes it gives them. Claims (`claim_<any>`) and arguments
(`arg_<any>`) are open families: any name is fine. Attributes are checked where the policy reads
them directly off `principal`, `resource`, `context`, `action` or a named entity; deeper reads (a
claim's own fields) are the claim's business. `context` is only read by its attributes: as a whole
it would hold the call's arguments, which the visibility of a tool cannot know.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from indexer.authorization.entities import StaticEntities
from indexer.authorization.expressions import (
    SCOPES,
    Expression,
    Uid,
    bodies,
    entities_in,
    scope_entities,
    scope_types,
    slot_in,
    var,
    walk,
)
from indexer.authorization.source import Token, find_attribute, find_entity_type, find_sequence
from indexer.authorization.vocabulary import (
    ACTION,
    ACTION_ATTRIBUTES,
    ACTIONS,
    ARGUMENT,
    CLAIM,
    CLAIM_SET,
    CLIENT,
    ENTITY_TYPES,
    LIST_ACTIONS,
    RESOURCE_ATTRIBUTES,
    RESOURCE_TYPES,
)

Locate = Callable[[Sequence[Token]], Token | None]


@dataclass(frozen=True)
class Problem:
    """What is wrong with a policy, and how to find the tokens it is about."""

    message: str
    locate: Locate


@dataclass(frozen=True)
class Vocabulary:
    """The names policies may use: ToolHive's, the configured claim sets, the entities file's."""

    claim_sets: frozenset[str]  # the claims of authorization.multi_valued_claims
    entities: StaticEntities

    def problem(self, policy: Mapping[str, Any]) -> Problem | None:
        """The first name in a policy (its JSON form) that does not exist, or None."""
        if (slot := slot_in(policy)) is not None:
            return Problem(
                f"{slot} makes this a template, which permits nothing until linked: name the entity instead",
                lambda tokens: find_sequence(tokens, "?", slot[1:]),
            )
        named: list[Uid] = []
        for scope in SCOPES:
            for kind in scope_types(policy[scope]):
                if problem := self._type(kind):
                    return problem
            named += scope_entities(policy[scope])
        for body in bodies(policy):
            for node, parent in walk(body):
                if "Value" in node:
                    named += entities_in(node["Value"])
                elif problem := self._node(node, parent):
                    return problem
        for uid in named:
            if problem := self._entity(uid):
                return problem
        return None

    def _node(self, node: Expression, parent: Expression | None) -> Problem | None:
        if "is" in node:
            return self._type(node["is"]["entity_type"])
        if "." in node or "has" in node:
            body = node.get(".") or node["has"]
            return self._attribute(body["left"], body["attr"])
        if var(node) == "context" and (parent is None or not ("." in parent or "has" in parent)):
            return Problem(
                "context is read by its attributes (context.claim_<claim>, context.arg_<key>), not whole",
                lambda tokens: find_sequence(tokens, "context"),
            )
        return None

    def _type(self, kind: str) -> Problem | None:
        known = ENTITY_TYPES | self.entities.types
        if kind in known:
            return None
        types = ", ".join(sorted(known))
        return Problem(
            f"unknown entity type {kind}{_close(kind, known)}: the types are {types}",
            lambda tokens: find_entity_type(tokens, kind),
        )

    def _entity(self, uid: Uid) -> Problem | None:
        kind, name = uid
        if problem := self._type(kind):
            return problem
        if kind != ACTION or name in ACTIONS.values():
            return None
        if name in LIST_ACTIONS:
            reason = "lists show what call_tool, get_prompt and read_resource permit; no policy is asked"
        else:
            reason = (
                f"the actions are call_tool, get_prompt and read_resource{_close(name, ACTIONS.values())}"
            )
        return Problem(
            f'unknown action Action::"{name}": {reason}',
            lambda tokens: find_sequence(tokens, ACTION, "::", name),
        )

    def _attribute(self, target: Expression, name: str) -> Problem | None:
        variable = var(target)
        literal = target.get("Value", {}).get("__entity") if "Value" in target else None
        if variable is None and not isinstance(literal, Mapping):
            return None  # a field of a claim, a record, an attribute's value: not the vocabulary's
        kind = variable or literal["type"]  # type: ignore[index]
        if variable is None and (problem := self._type(kind)):
            return problem
        families, names, about = self._attributes(kind)
        if name in names or any(name.startswith(prefix) for prefix in families):
            if not name.startswith(CLAIM_SET) or name.removeprefix(CLAIM_SET) in self.claim_sets:
                return None
            about = f"{CLAIM_SET}<claim> exists for the claims of authorization.multi_valued_claims only"
        who = variable or f"{kind}::{json.dumps(literal['id'])}"  # type: ignore[index]
        return Problem(
            f'unknown attribute "{name}" of {who}{_close(name, names)}: {about}',
            lambda tokens: find_attribute(tokens, name),
        )

    def _attributes(self, kind: str) -> tuple[tuple[str, ...], frozenset[str], str]:
        """The attribute families (prefixes), the single names and what to say of them, by what is read."""
        claims = f"a caller's attributes are its token's claims, {CLAIM}<claim>"
        if kind in ("principal", CLIENT):
            return (CLAIM, CLAIM_SET), self.entities.attributes_of([CLIENT]), claims
        if kind == "context":
            about = f"the context holds {CLAIM}<claim> and the call's arguments, {ARGUMENT}<argument>"
            return (CLAIM, CLAIM_SET, ARGUMENT), frozenset(), about
        if kind in ("action", ACTION):
            return (), ACTION_ATTRIBUTES, "an action's one attribute is operation"
        resources = RESOURCE_TYPES.values()
        if kind == "resource" or kind in resources:
            names = RESOURCE_ATTRIBUTES | self.entities.attributes_of(
                resources if kind == "resource" else [kind]
            )
            about = f"resources have {', '.join(sorted(names))}"
            if kind == "resource":
                return (ARGUMENT,), names, f"{about} and {ARGUMENT}<argument>"
            return (), names, f"{about} (arguments are read as resource.{ARGUMENT}<argument>)"
        names = self.entities.attributes_of([kind])
        return (), names, f"the entities file gives {kind} {', '.join(sorted(names)) or 'no attributes'}"


def _close(name: str, known: Any) -> str:
    matches = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {matches[0]}?)" if matches else ""
