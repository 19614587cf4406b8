"""What each rule sees of a catalog's items, so that a rule is asked once per view, not once per item.

A rule's answer on an item depends on the item only through what the rule reads of it (reads.py):
the attributes it reads, which of the entities it names are the item or above it, and whether the
item is in its resource scope at all. Items alike in all that share a view; one of them, asked,
answers for all. A rule that uses the resource otherwise gives each item a view of its own.

A catalog is prepared once per policy (`Prepared`): each item's entity merged with the entities
file's, every entity above it, each rule's views (computed when first needed) and, per caller as the
rule reads callers, the rule's answer on each view asked so far: whole catalogs are asked in a
handful of questions, and a second caller the rule cannot tell from the first asks none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.comparisons import ABSENT, Comparisons
from indexer.authorization.entities import StaticEntities, uid_of
from indexer.authorization.expressions import Uid
from indexer.authorization.policies import Rule
from indexer.authorization.sets import DEFAULT_BOUND, Bounded
from indexer.authorization.vocabulary import Kind

# a rule's answer on a view
UNASKED, NO, YES, ARGUMENTS = -1, 0, 1, 2  # ARGUMENTS: it depends on the call's arguments
OUTSIDE = -1  # the view of an item outside a rule's resource scope: the rule does not apply to it
ANSWERS_KEPT = 4096  # (rule, caller as the rule reads callers) pairs whose answers a catalog keeps

Answers = npt.NDArray[np.int8]


@dataclass(frozen=True)
class PreparedItem:
    """An item as the rules see it: its entity (the entities file's merged in) and its ancestors."""

    index: int  # in the catalog
    item: Item
    uid: Uid
    entity: Mapping[str, Any]
    ancestors: frozenset[Uid]  # every entity above it, itself not included

    def value(self, attribute: str) -> Any:
        """An attribute's value in a form that compares as Cedar compares (`True` is not `1`)."""
        value = self.entity["attrs"].get(attribute, ABSENT)
        if isinstance(value, str | bool | int):
            return type(value).__name__, value
        return value if value is ABSENT else json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class RuleView:
    """One rule's views of one kind's items."""

    views: npt.NDArray[np.int32]  # for the kind's n-th item: its view, or OUTSIDE
    representatives: tuple[PreparedItem, ...]  # one item of each view


class KindItems:
    """One kind's items, with the columns views are cut from, each made when first needed."""

    def __init__(self, items: Sequence[PreparedItem]) -> None:
        self.items = items
        self._positions: dict[Uid, list[int]] = {}  # each uid's items (two URIs may sanitize alike)
        self._below: dict[Uid, list[int]] = {}  # each entity's items: itself, and those under it
        for position, prepared in enumerate(items):
            self._positions.setdefault(prepared.uid, []).append(position)
            for uid in (prepared.uid, *prepared.ancestors):
                self._below.setdefault(uid, []).append(position)
        self._values: dict[tuple[str, Comparisons | None], npt.NDArray[np.int32]] = {}

    def value_codes(self, attribute: str, compared: Comparisons | None = None) -> npt.NDArray[np.int32]:
        """Each item's value of an attribute as a number, equal for values a rule cannot tell apart:
        equal values, or, when it only compares them (`compared`), values that compare alike."""
        if (codes := self._values.get((attribute, compared))) is None:
            numbered: dict[Any, int] = {}
            if compared is None:
                values = (p.value(attribute) for p in self.items)
            else:
                values = (compared.outcome(p.entity["attrs"].get(attribute, ABSENT)) for p in self.items)
            codes = np.fromiter(
                (numbered.setdefault(v, len(numbered)) for v in values), np.int32, len(self.items)
            )
            self._values[(attribute, compared)] = codes
        return codes

    def under(self, uid: Uid | None) -> npt.NDArray[np.bool_]:
        """Whether each item is the entity or below it (Cedar's `in`)."""
        column = np.zeros(len(self.items), dtype=np.bool_)
        column[self._below.get(uid, []) if uid is not None else []] = True
        return column

    def within(self, uids: frozenset[Uid]) -> npt.NDArray[np.int32]:
        """For each item, a number for which of these entities it is or is under (0: none of them)."""
        found: dict[int, list[Uid]] = {}
        for uid in sorted(uids):
            for position in self._below.get(uid, ()):
                found.setdefault(position, []).append(uid)
        numbered: dict[tuple[Uid, ...], int] = {(): 0}
        column = np.zeros(len(self.items), dtype=np.int32)
        for position, among in found.items():
            column[position] = numbered.setdefault(tuple(among), len(numbered))
        return column

    def named(self, uids: frozenset[Uid]) -> npt.NDArray[np.int32]:
        """For each item named among `uids`, its position; -1 for the others."""
        column = np.full(len(self.items), -1, dtype=np.int32)
        for uid in uids:
            for position in self._positions.get(uid, ()):
                column[position] = position
        return column

    def in_scope(self, constraint: Mapping[str, Any]) -> npt.NDArray[np.bool_]:
        """Whether a rule's resource constraint holds for each item (templates are refused at load)."""
        everything = np.ones(len(self.items), dtype=np.bool_)
        operator = constraint["op"]
        if operator == "All":
            return everything
        if operator == "==":
            uid = uid_of(constraint["entity"])
            return self.named(frozenset() if uid is None else frozenset({uid})) >= 0
        if operator == "in":
            return self.under(uid_of(constraint["entity"]))
        kind = everything if self.items and constraint["entity_type"] == self.items[0].uid[0] else ~everything
        within = constraint.get("in")
        return kind if within is None else kind & self.under(uid_of(within["entity"]))

    def view(self, rule: Rule) -> RuleView:
        """The rule's views: items alike in all the rule reads of them share one."""
        reads = rule.reads
        everyone = np.arange(len(self.items), dtype=np.int32)
        columns = [everyone if reads.resource_whole else self.named(reads.entities)]
        columns.append(self.within(reads.entities))
        compared = dict(reads.comparisons)
        columns += [self.value_codes(name, compared.get(name)) for name in sorted(reads.resource_attributes)]
        rows = np.flatnonzero(self.in_scope(rule.scope["resource"]))
        views = np.full(len(self.items), OUTSIDE, dtype=np.int32)
        if rows.size == 0:
            return RuleView(views, ())
        keys = np.stack([column[rows] for column in columns], axis=1)
        _, first, inverse = unique_rows(keys)
        views[rows] = inverse.reshape(-1)
        return RuleView(views, tuple(self.items[int(rows[index])] for index in first))


def unique_rows(
    matrix: npt.NDArray[Any],
) -> tuple[npt.NDArray[Any], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The distinct rows of a matrix, where each first is, and each row's distinct row: as
    `np.unique(axis=0)`, but comparing each row's bytes at once, which sorts many times faster."""
    rows = np.ascontiguousarray(matrix)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).reshape(-1)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return rows[first], first, inverse.reshape(-1)


class Prepared:
    """A catalog's items under one policy's entities file, by kind; each rule's views and answers."""

    def __init__(self, catalog: Catalog, entities: StaticEntities, bound: int = DEFAULT_BOUND) -> None:
        self.catalog = catalog
        by_kind: dict[Kind, list[PreparedItem]] = {}
        for index, item in enumerate(catalog.items):
            entity = entities.merged(item.entity())
            parents = [uid for parent in entity["parents"] if (uid := uid_of(parent)) is not None]
            prepared = PreparedItem(index, item, item.uid, entity, entities.ancestors(parents))
            by_kind.setdefault(item.kind, []).append(prepared)
        self.by_kind = {kind: KindItems(items) for kind, items in by_kind.items()}
        self._views: Bounded[tuple[Kind, str], RuleView] = Bounded(bound)
        self._answers: Bounded[tuple[Kind, str, str], Answers] = Bounded(ANSWERS_KEPT)

    def view(self, kind: Kind, rule: Rule) -> RuleView:
        return self._views.get_or_make((kind, rule.id), lambda: self.by_kind[kind].view(rule))

    def answers(self, kind: Kind, rule: Rule, caller: str) -> Answers:
        """The rule's answers on its views for callers it sees as `caller` (UNASKED until asked)."""
        size = len(self.view(kind, rule).representatives)
        unasked = lambda: np.full(size, UNASKED, dtype=np.int8)  # noqa: E731
        return self._answers.get_or_make((kind, rule.id, caller), unasked)
