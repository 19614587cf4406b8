"""`toolsearch eval`'s held-apart split: decided by the query id alone, about 30% of each set."""

from __future__ import annotations

import random

from commands.retrieval.evaluation import SHIPPED_SETS
from commands.retrieval.scoring import HELD_APART_PERCENT, load_queries, split_of


def test_the_split_depends_on_the_id_alone() -> None:
    ids = [f"query-{n}" for n in range(2000)]
    first = {i: split_of(i) for i in ids}
    shuffled = ids[:]
    random.Random(7).shuffle(shuffled)
    assert {i: split_of(i) for i in shuffled} == first
    share = sum(s == "held-apart" for s in first.values()) / len(ids)
    assert abs(share - HELD_APART_PERCENT / 100) < 0.04


def test_every_shipped_set_has_both_splits_and_shared_ids_agree() -> None:
    seen: dict[str, str] = {}
    for catalog, queries in SHIPPED_SETS.values():
        assert catalog.is_file()
        splits = [split_of(q.id) for q in load_queries(queries)]
        assert 0.2 < splits.count("held-apart") / len(splits) < 0.42
        for query in load_queries(queries):
            assert seen.setdefault(query.id, split_of(query.id)) == split_of(query.id)
    # mcpbench's two label sets share task ids, and so their splits
    _, plain = SHIPPED_SETS["mcpbench"]
    _, deps = SHIPPED_SETS["mcpbench deps"]
    assert {q.id for q in load_queries(plain)} & {q.id for q in load_queries(deps)}
