"""The fast path of visibility answers exactly what plain Cedar answers, item by item.

Random policies (scopes, conditions on claims, groups, annotations, names, backends, patterns and
arguments, forbids among permits), random catalogs and random callers, drawn from fixed seeds. For
every caller and item, the engine's verdict (pruned rules, shared views, kept answers) is compared
with Cedar asked of that one item with every rule (the arguments unknown); and every verdict is
checked against real calls: an `allowed` item is permitted with any arguments, a `denied` one with
none.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import cedarpy
import pytest

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.policies import Policy
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.verdicts import Seen, Verdict
from indexer.authorization.visibility import cedar_text, never_applies, unknown
from indexer.authorization.vocabulary import ACTIONS, action_entities
from tests.support.policies import compiled

CASES = 60
STATIC = [
    {"uid": {"type": "THVGroup", "id": "g1"}, "parents": [{"type": "THVGroup", "id": "g0"}]},
    {"uid": {"type": "Tool", "id": "t1"}, "attrs": {"owner": "u1"}},
]
PRINCIPALS = ["principal", 'principal == Client::"u1"', 'principal in THVGroup::"g0"', "principal is Client"]
ACTION_SCOPES = [
    "action",
    'action == Action::"call_tool"',
    'action in [Action::"call_tool", Action::"get_prompt"]',
    'action == Action::"read_resource"',
]
RESOURCES = [
    "resource",
    'resource == Tool::"t1"',
    'resource in MCP::"b0"',
    "resource is Tool",
    'resource is Prompt in MCP::"b1"',
    'resource == Resource::"file____r0_txt"',
]
ATOMS = [
    "resource has readOnlyHint && resource.readOnlyHint",
    "resource.destructiveHint",
    'resource.backend == "b1"',
    'resource.backend != "b2"',
    'resource.name like "t*"',
    'resource.name like "*1"',
    'resource.name == "t3"',
    'resource.uri like "file:*"',
    'resource.uri == "file:///r0.txt"',
    'resource in MCP::"b2"',
    'resource == Tool::"t2"',
    '[Tool::"t0", Tool::"t4"].contains(resource)',
    'resource in [MCP::"b0", MCP::"b3"]',
    "resource.owner == principal.claim_sub",
    'principal.claim_team == "red"',
    "context.claim_level > 2",
    "principal has claim_team",
    'principal.claim_tags.contains("x")',
    'principal in THVGroup::"g2"',
    'principal == Client::"u2"',
    'context.arg_x == "v1"',
    "context has arg_limit && context.arg_limit > 100",
    'resource.arg_x like "v*"',
    "resource has arg_config_present",
    "context.arg_limit < 10",
    "principal.claim_level >= resource.arg_limit",
    "true",
    "false",
]
ARGUMENTS: list[dict[str, Any]] = [
    {},
    {"x": "v1"},
    {"x": "w", "limit": 500},
    {"limit": 5},
    {"config": {"a": 1}, "x": "v2"},
]


def _expression(draw: random.Random, depth: int) -> str:
    if depth == 0 or draw.random() < 0.4:
        return draw.choice(ATOMS)
    left, right = _expression(draw, depth - 1), _expression(draw, depth - 1)
    return draw.choice(
        [f"({left} && {right})", f"({left} || {right})", f"!({left})", f"(if {left} then {right} else true)"]
    )


def _policy(draw: random.Random) -> str:
    rules = []
    for n in range(draw.randint(1, 7)):
        effect = "forbid" if draw.random() < 0.3 else "permit"
        conditions = " ".join(
            f"{draw.choice(['when', 'unless'])} {{ {_expression(draw, 2)} }}"
            for _ in range(draw.randint(0, 2))
        )
        scope = f"{draw.choice(PRINCIPALS)}, {draw.choice(ACTION_SCOPES)}, {draw.choice(RESOURCES)}"
        rules.append(f'@id("r{n}") {effect}({scope}) {conditions};')
    return "\n".join(rules)


def _catalog(draw: random.Random) -> Catalog:
    items = []
    for n in range(draw.randint(4, 14)):
        hints = {h: draw.random() < 0.5 for h in ("readOnlyHint", "destructiveHint") if draw.random() < 0.6}
        items.append(Item.tool(draw.choice(["t", "get_t"]) + str(n), f"b{draw.randint(0, 3)}", hints))
    items += [Item.prompt(f"p{n}", f"b{draw.randint(0, 3)}") for n in range(draw.randint(0, 3))]
    items += [Item.resource(f"file:///r{n}.txt", f"b{draw.randint(0, 3)}") for n in range(draw.randint(0, 3))]
    if draw.random() < 0.3:  # a URI that sanitizes as another does
        items.append(Item.resource("file:///r0?txt", f"b{draw.randint(0, 3)}"))
    return Catalog(items)


def _principal(draw: random.Random, policy: Policy) -> PolicyPrincipal:
    if draw.random() < 0.15:
        return PolicyPrincipal.anonymous()
    subject = f"u{draw.randint(0, 2)}"
    claims: dict[str, Any] = {"sub": subject, "groups": draw.sample(["g0", "g1", "g2"], draw.randint(0, 2))}
    if draw.random() < 0.7:
        claims["team"] = draw.choice(["red", "blue"])
    claims["level"] = draw.randint(0, 5)
    claims["tags"] = draw.sample(["x", "y"], draw.randint(0, 2))
    return PolicyPrincipal.of(subject, claims, policy.settings)


def _rule_set(policy: Policy, effect: str) -> cedarpy.PolicySet:
    forms = {r.id: r.visible for r in policy.rules if r.effect == effect}
    return cedarpy.PolicySet.from_json_str(
        json.dumps({"staticPolicies": forms, "templates": {}, "templateLinks": []})
    )


def _plain(policy: Policy, principal: PolicyPrincipal, item: Item) -> Seen:
    """Cedar asked of one item with all the permits, then all the forbids (the arguments unknown),
    combined as Cedar combines them; a residual with a conjunct literally false is no residual
    (Cedar leaves `X && false` unfolded when X holds an unknown)."""
    arguments = {name: unknown(name) for rule in policy.rules for name in rule.reads.arguments}
    entities = json.dumps(
        [
            policy.entities.merged(principal.entity()),
            policy.entities.merged(item.entity()),
            *action_entities(),
            *policy.entities.others([("Client", principal.subject), item.uid]),
        ]
    )
    request = {
        "principal": cedar_text(("Client", principal.subject)),
        "action": cedar_text(("Action", ACTIONS[item.kind])),
        "resource": cedar_text(item.uid),
        "context": {**principal.attributes, **arguments},
    }
    answers = {
        effect: cedarpy.is_authorized_partial(request, _rule_set(policy, effect), entities)
        for effect in ("permit", "forbid")
    }
    applying = {effect: set(answer.diagnostics.reasons) for effect, answer in answers.items()}
    waiting = {
        effect: {i for i in answer.diagnostics.nontrivial_residuals if not never_applies(answer.residuals[i])}
        for effect, answer in answers.items()
    }
    labels = lambda ids: tuple(sorted({policy.label(i) for i in ids}))  # noqa: E731
    if not applying["permit"] and not waiting["permit"]:
        return Seen(Verdict.DENIED)  # no permit can apply: denied, whatever a forbid says
    if applying["forbid"]:
        return Seen(Verdict.DENIED, labels(applying["forbid"]))
    if applying["permit"] and not waiting["forbid"]:
        return Seen(Verdict.ALLOWED, labels(applying["permit"]))
    return Seen(Verdict.CONDITIONAL, labels(waiting["permit"] | waiting["forbid"]))


@pytest.mark.parametrize("seed", range(CASES))
def test_every_verdict_is_plain_cedars_and_holds_for_real_calls(seed: int, tmp_path: Path) -> None:
    draw = random.Random(seed)
    policy = compiled(_policy(draw), entities=STATIC, tmp=tmp_path)
    catalog = _catalog(draw)
    authorizer = Authorizer(policy)
    for _ in range(3):
        principal = _principal(draw, policy)
        visibility = authorizer.visibility(principal, catalog)
        for item, seen in visibility:
            assert seen == _plain(policy, principal, item), (item, policy.path)
            calls = {authorizer.decide(principal, item, arguments).allowed for arguments in ARGUMENTS}
            if seen.verdict is Verdict.ALLOWED:
                assert calls == {True}, item
            if seen.verdict is Verdict.DENIED:
                assert calls == {False}, item


def test_kept_answers_are_the_answers_asked_afresh(tmp_path: Path) -> None:
    draw = random.Random(1000)
    for _ in range(10):
        policy = compiled(_policy(draw), entities=STATIC, tmp=tmp_path)
        catalog = _catalog(draw)
        shared = Authorizer(policy)
        callers = [_principal(draw, policy) for _ in range(6)]
        for principal in callers * 2:  # the second round reads what the first kept
            fresh = Authorizer(policy).visibility(principal, catalog)
            assert shared.visibility(principal, catalog).seen == fresh.seen
