"""Visibility, fast: which items of a catalog a principal may see, asking Cedar of a few only.

For each kind of item (tools: `call_tool`; prompts: `get_prompt`; resources: `read_resource`):

1. The rules that can apply to the principal are kept: Cedar evaluates the whole policy with the
   resource unknown (partial evaluation), and a rule whose residual has a conjunct that is literally
   `false` can apply to no resource (false and an error both mean "does not apply").
2. Each kept permit is asked once per view it has of the items (views.py), each kept forbid once per
   view of the items some permit gives: a forbid matters to nothing else.
3. A rule is asked alone, as a call without arguments would ask it; one that reads the arguments is
   asked by partial evaluation with each argument it reads unknown (reads.py), and may answer "the
   arguments decide".
4. An item's verdict is Cedar's own combination of its rules' answers: denied by a forbid that
   applies; else allowed when a permit applies and no forbid waits on the arguments; else
   conditional when a permit applies or waits on them; else denied, no policy permitting it.

Answers are kept per catalog, rule and caller as the rule reads callers (views.py), so a second
caller asks only what its differences call for. Where a rule cannot tell callers apart by more than
their groups and claims, the caller is asked about under a stand-in name, and so is an item no rule
names: Cedar's partial evaluation reads names written as Cedar text, and not every name can be.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import cedarpy
import numpy as np
import numpy.typing as npt

from indexer.authorization.entities import uid_of
from indexer.authorization.expressions import Uid
from indexer.authorization.policies import Policy, Rule
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.sets import RuleSets
from indexer.authorization.verdicts import DENIED_BY_DEFAULT, Seen, Verdict
from indexer.authorization.views import (
    ARGUMENTS,
    NO,
    OUTSIDE,
    UNASKED,
    YES,
    Prepared,
    PreparedItem,
    unique_rows,
)
from indexer.authorization.vocabulary import ACTION, ACTIONS, CLAIM, CLAIM_SET, CLIENT, Kind, action_entities

logger = logging.getLogger(__name__)

STAND_IN = "~caller"  # the principal's name when its subject cannot change an answer
Pending = tuple[Rule, list[PreparedItem], npt.NDArray[np.int32], npt.NDArray[np.int8]]


def cedar_text(uid: Uid) -> str:
    """A uid as Cedar text, escaped as Cedar writes it (what its partial evaluation parses)."""
    kind, name = uid
    return f'{kind}::"{"".join(_escaped(c) for c in name)}"'


def _escaped(char: str) -> str:
    special = {"\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", "'": "\\'", '"': '\\"', "\0": "\\0"}
    if char in special:
        return special[char]
    return char if char.isprintable() else f"\\u{{{ord(char):x}}}"


def unknown(name: str) -> dict[str, Any]:
    return {"__extn": {"fn": "unknown", "arg": name}}


class Asker:
    """One principal's visibility questions under one policy."""

    def __init__(self, policy: Policy, sets: RuleSets, principal: PolicyPrincipal) -> None:
        self._policy = policy
        self._sets = sets
        self._subject = principal.subject
        self._uid: Uid = (CLIENT, principal.subject if policy.subject_read else STAND_IN)
        entity = policy.entities.merged({**principal.entity(), "uid": {"type": CLIENT, "id": self._uid[1]}})
        parents = [uid for parent in entity["parents"] if (uid := uid_of(parent)) is not None]
        self._ancestors = policy.entities.ancestors(parents)
        self._base = [entity, *action_entities(), *policy.entities.others([self._uid])]
        self._claims = dict(principal.attributes)
        self._arguments = {name: unknown(name) for rule in policy.rules for name in rule.reads.arguments}

    def seen(self, prepared: Prepared) -> list[Seen]:
        """Every item's verdict, in the catalog's order."""
        seen = [DENIED_BY_DEFAULT] * len(prepared.catalog)
        for kind, items in prepared.by_kind.items():
            for item, verdict in zip(items.items, self._kind(prepared, kind), strict=True):
                seen[item.index] = verdict
        return seen

    def survivors(self, kind: Kind) -> tuple[Rule, ...]:
        """The rules that may apply to this principal for some item of the kind (step 1)."""
        request = {
            "principal": cedar_text(self._uid),
            "action": cedar_text((ACTION, ACTIONS[kind])),
            "context": {**self._claims, **self._arguments},
        }
        answer = cedarpy.is_authorized_partial(request, self._sets.visible, self._entities([]))
        if not answer.residuals and answer.diagnostics.errors:
            logger.warning(
                "authorization: keeping every policy for a caller: %s", answer.diagnostics.errors[0]
            )
            return self._policy.rules
        return tuple(rule for rule in self._policy.rules if not never_applies(answer.residuals.get(rule.id)))

    def caller(self, rule: Rule) -> str:
        """The principal as one rule reads it: callers alike in this are alike to the rule."""
        reads = rule.reads
        claims = {
            name: value
            for name, value in self._claims.items()
            if name.removeprefix(CLAIM_SET if name.startswith(CLAIM_SET) else CLAIM) in reads.claims
        }
        subject = self._subject if reads.principal_whole else ""
        return json.dumps([subject, sorted(self._ancestors & reads.entities), claims], sort_keys=True)

    def _kind(self, prepared: Prepared, kind: Kind) -> list[Seen]:
        rules = self.survivors(kind)
        permits = [rule for rule in rules if rule.effect == "permit"]
        forbids = [rule for rule in rules if rule.effect == "forbid"]
        count = len(prepared.by_kind[kind].items)
        if not permits:
            return [DENIED_BY_DEFAULT] * count
        given = self._answered(prepared, kind, permits, np.ones(count, dtype=np.bool_))
        some = (given != NO).any(axis=1)
        taken = self._answered(prepared, kind, forbids, some) if forbids else np.zeros((count, 0), np.int8)
        signatures, _, inverse = unique_rows(np.concatenate([given, taken], axis=1))
        verdicts = [
            self._verdict(row[: len(permits)], permits, row[len(permits) :], forbids) for row in signatures
        ]
        return [verdicts[index] for index in inverse]

    def _verdict(
        self, given: Sequence[int], permits: Sequence[Rule], taken: Sequence[int], forbids: Sequence[Rule]
    ) -> Seen:
        """Cedar's combination of the rules' answers on one item (step 4)."""
        if applying := [rule for rule, answer in zip(forbids, taken, strict=True) if answer == YES]:
            return Seen(Verdict.DENIED, self._labels(applying))
        permitting = [rule for rule, answer in zip(permits, given, strict=True) if answer == YES]
        waiting = [
            r
            for r, a in [*zip(permits, given, strict=True), *zip(forbids, taken, strict=True)]
            if a == ARGUMENTS
        ]
        if permitting and not [rule for rule in waiting if rule.effect == "forbid"]:
            return Seen(Verdict.ALLOWED, self._labels(permitting))
        if permitting or any(rule.effect == "permit" for rule in waiting):
            return Seen(Verdict.CONDITIONAL, self._labels(waiting))
        return DENIED_BY_DEFAULT

    def _answered(
        self, prepared: Prepared, kind: Kind, rules: Sequence[Rule], wanted: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.int8]:
        """Each rule's answer on each wanted item (NO elsewhere), asking Cedar what is not kept (step 2)."""
        pending: list[Pending] = []
        columns = []
        for rule in rules:
            view = prepared.view(kind, rule)
            answers = prepared.answers(kind, rule, self.caller(rule))
            needed = np.unique(view.views[wanted & (view.views != OUTSIDE)])
            unasked = needed[answers[needed] == UNASKED]
            if unasked.size:
                pending.append(
                    (rule, [view.representatives[v] for v in unasked], unasked.astype(np.int32), answers)
                )
            columns.append((view.views, answers))
        self._ask(kind, pending)
        matrix = np.zeros((len(wanted), len(rules)), dtype=np.int8)
        for position, (views, answers) in enumerate(columns):
            inside = wanted & (views != OUTSIDE)
            matrix[inside, position] = answers[views[inside]]
        return matrix

    def _ask(self, kind: Kind, pending: Sequence[Pending]) -> None:
        """Ask Cedar each rule's unasked views, alone (step 3)."""
        for rule, items, views, answers in pending:
            if rule.reads.arguments:
                answers[views] = [self._partial(kind, rule, item) for item in items]
        batched = [p for p in pending if not p[0].reads.arguments]
        if not batched:
            return
        # every item in one entity set, unless what one holds could matter to a question of another
        alone = self._policy.entities.reach_items or any(p[0].reads.item_attributes for p in batched)
        sets = [] if alone else self._entity_sets([item for _, items, _, _ in batched for item in items])
        for rule, items, views, answers in batched:
            if alone:
                groups = [([n], self._entities([item.entity], [item.uid])) for n, item in enumerate(items)]
            else:
                groups = [([n for n, item in enumerate(items) if item.index in held], e) for held, e in sets]
            for members, entities in groups:
                if members:
                    asked = self._batch(kind, rule, [items[n] for n in members], entities)
                    answers[views[members]] = asked

    def _batch(
        self, kind: Kind, rule: Rule, items: Sequence[PreparedItem], entities: cedarpy.Entities
    ) -> list[int]:
        """One rule asked of items as calls without arguments would ask it."""
        principal = {"type": CLIENT, "id": self._uid[1]}
        action = {"type": ACTION, "id": ACTIONS[kind]}
        requests = [
            {
                "principal": principal,
                "action": action,
                "resource": dict(item.entity["uid"]),
                "context": self._claims,
            }
            for item in items
        ]
        answers = cedarpy.is_authorized_batch(requests, self._sets.of([rule]), entities)
        return [YES if rule.id in answer.diagnostics.reasons else NO for answer in answers]

    def _entity_sets(self, items: Sequence[PreparedItem]) -> list[tuple[set[int], cedarpy.Entities]]:
        """As few entity sets as hold these items with each uid once (two URIs may sanitize alike),
        each with the catalog positions of the items it holds."""
        rounds: list[dict[Uid, PreparedItem]] = []
        for item in items:
            target = next((r for r in rounds if r.get(item.uid, item) is item), None)
            if target is None:
                rounds.append(target := {})
            target[item.uid] = item
        return [
            ({i.index for i in r.values()}, self._entities([i.entity for i in r.values()], list(r)))
            for r in rounds
        ]

    def _partial(self, kind: Kind, rule: Rule, prepared: PreparedItem) -> int:
        """A rule that reads the arguments, asked with them unknown."""
        named = prepared.uid in rule.reads.entities or rule.reads.resource_whole
        uid = prepared.uid if named else (prepared.uid[0], f"~item~{prepared.index}")
        request = {
            "principal": cedar_text(self._uid),
            "action": cedar_text((ACTION, ACTIONS[kind])),
            "resource": cedar_text(uid),
            "context": {**self._claims, **self._arguments},
        }
        entities = self._entities([{**prepared.entity, "uid": {"type": uid[0], "id": uid[1]}}], [uid])
        answer = cedarpy.is_authorized_partial(request, self._sets.of([rule]), entities)
        if rule.id in answer.diagnostics.reasons:
            return YES
        if rule.id in answer.diagnostics.nontrivial_residuals and not never_applies(
            answer.residuals.get(rule.id)
        ):
            return ARGUMENTS
        if answer.decision is cedarpy.Decision.NoDecision and answer.diagnostics.errors:
            # Cedar could not read the question: a forbid then applies and a permit does not
            logger.warning("authorization: %s: %s", prepared.item.name, answer.diagnostics.errors[0])
            return YES if rule.effect == "forbid" else NO
        return NO

    def _labels(self, rules: Sequence[Rule]) -> tuple[str, ...]:
        return tuple(sorted({rule.label for rule in rules}))

    def _entities(self, items: Sequence[Mapping[str, Any]], uids: Sequence[Uid] = ()) -> cedarpy.Entities:
        replaced = set(uids)  # the file's entity of an item is merged into the item's own
        others = [entity for entity in self._base if _uid(entity) not in replaced]
        return cedarpy.Entities.from_json_str(json.dumps([*others, *items]))


def _uid(entity: Mapping[str, Any]) -> Uid:
    return entity["uid"]["type"], entity["uid"]["id"]


def never_applies(residual: Mapping[str, Any] | None) -> bool:
    """Whether a residual policy can apply to no resource: a condition with a conjunct that is
    literally false (or an `unless` that is literally true)."""
    if residual is None:
        return False
    for condition in residual.get("conditions", []):
        literal = condition["kind"] == "unless"
        if any(
            part == {"Value": literal} for part in _conjuncts(condition["body"], "||" if literal else "&&")
        ):
            return True
    return False


def _conjuncts(node: Mapping[str, Any], operator: str) -> list[Mapping[str, Any]]:
    if operator in node:
        body = node[operator]
        return [*_conjuncts(body["left"], operator), *_conjuncts(body["right"], operator)]
    return [node]
