"""Cedar's sets of some of a policy's rules, as visibility asks them, built once and kept (bounded).

Callers in the same groups keep the same rules (visibility.py, step 1), so a handful of sets serve
every caller; a set is built from the rules' JSON forms, in which they keep their ids (`policy<n>`),
so Cedar's reasons still name them.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import cedarpy

from indexer.authorization.policies import Policy, Rule

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")
DEFAULT_BOUND = 256  # sets, or partitions, kept: far more than distinct groups of callers usually make


class Bounded(Generic[Key, Value]):
    """A thread-safe map that forgets its least recently used entries beyond `bound`."""

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._entries: OrderedDict[Key, Value] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key) -> Value | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Key, value: Value) -> Value:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._bound:
                self._entries.popitem(last=False)
        return value

    def get_or_make(self, key: Key, make: Callable[[], Value]) -> Value:
        """The kept value, or one made now (outside the lock: two threads may both make it)."""
        found = self.get(key)
        return found if found is not None else self.put(key, make())


def rule_set(rules: Sequence[Rule]) -> cedarpy.PolicySet:
    """Cedar's set of these rules in their visibility form, each keeping its id."""
    forms = {
        "staticPolicies": {rule.id: rule.visible for rule in rules},
        "templates": {},
        "templateLinks": [],
    }
    return cedarpy.PolicySet.from_json_str(json.dumps(forms))


class RuleSets:
    """The sets of one policy's rules that visibility asks with."""

    def __init__(self, policy: Policy, bound: int = DEFAULT_BOUND) -> None:
        self.policy = policy
        self.visible = rule_set(policy.rules)  # every rule: what step 1 asks
        self._sets: Bounded[tuple[str, ...], cedarpy.PolicySet] = Bounded(bound)

    def of(self, rules: Sequence[Rule]) -> cedarpy.PolicySet:
        key = tuple(rule.id for rule in rules)
        if len(rules) == len(self.policy.rules):
            return self.visible
        return self._sets.get_or_make(key, lambda: rule_set(rules))
