"""Call time: whether a principal may call a tool (get a prompt, read a resource) with these arguments.

Asked of Cedar exactly as ToolHive asks it, with the whole policy as written: the principal with its
claims and groups, the item with its attributes and the call's `arg_<key>`s, a context holding the
claims and the arguments, and the entities file's entities merged in. What no policy permits is
denied; a policy that fails to evaluate (a missing attribute read without `has`) does not apply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import cedarpy

from indexer.authorization.catalog import Item
from indexer.authorization.expressions import Uid
from indexer.authorization.policies import Policy
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.verdicts import Decision
from indexer.authorization.vocabulary import ACTION, ACTIONS, CLIENT, action_entities, argument_attributes

_POLICY_ID = re.compile(r"`(policy\d+)`")


def decide(
    policy: Policy, principal: PolicyPrincipal, item: Item, arguments: Mapping[str, Any] | None = None
) -> Decision:
    """The decision on one call, with the policies that made it."""
    made: list[Uid] = [(CLIENT, principal.subject), item.uid]
    entities = [
        policy.entities.merged(principal.entity()),
        policy.entities.merged(item.entity(arguments)),
        *action_entities(),
        *policy.entities.others(made),
    ]
    request = {
        "principal": principal.uid,
        "action": {"type": ACTION, "id": ACTIONS[item.kind]},
        "resource": {"type": item.uid[0], "id": item.uid[1]},
        "context": {**principal.attributes, **argument_attributes(arguments)},
    }
    answer = cedarpy.is_authorized(request, policy.policy_set, json.dumps(entities))
    reasons = answer.diagnostics.reasons
    errors = tuple(_named(policy, error) for error in answer.diagnostics.errors)
    if answer.allowed:
        return Decision(True, _labels(policy, reasons), errors)
    forbids = [reason for reason in reasons if policy.by_id[reason].effect == "forbid"]
    return Decision(False, _labels(policy, forbids), errors)


def _labels(policy: Policy, ids: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({policy.label(policy_id) for policy_id in ids}))


def _named(policy: Policy, error: str) -> str:
    """Cedar's error with its policy ids replaced by the policies' labels."""
    return _POLICY_ID.sub(lambda match: f"`{policy.label(match.group(1))}`", error)
