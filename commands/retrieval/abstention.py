"""Abstention: whether find_tool's answer says nothing fits when nothing does, and only then.

For every labelled query the answer find_tool would give (its default limit of tools, judged as the
indexer judges them: `indexer.retrieval.second_stage` and `indexer.retrieval.verdict`) is read
twice:

- over the catalog as it is: an answer that says nothing fits is a **false abstention**;
- over the catalog without what serves the query: an answer that says nothing fits is an
  **abstention**, and the share of such answers is the figure to raise. What serves a query is the
  servers of its relevant tools where the catalog has several servers, and the relevant tools
  themselves where it has one. A server's other tools mostly serve the same product (a weather
  server's current conditions beside its forecast), so leaving them in would leave a tool that
  serves the request; a catalog of one server has nothing coarser than a tool to take out.

An answer "says nothing fits" when every tool in it is weak, which is when its message says so.
The construction works on any catalog file and labelled queries (`toolsearch eval --catalog
--queries`); docs/retrieval.md, "Abstention", has the figures and what they miss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commands.retrieval.eval_catalog import EvalCatalog
from commands.retrieval.scoring import EvalQuery
from indexer.retrieval.bands import Bands
from indexer.retrieval.query import Query
from indexer.retrieval.search import SearchIndex
from indexer.retrieval.second_stage import Judged, SecondStage, first_stage
from indexer.retrieval.verdict import verdict

Answer = Callable[[SearchIndex, Query, int], list[Judged]]


def removed_for(catalog: EvalCatalog, query: EvalQuery) -> frozenset[int]:
    """The positions of what serves `query`: its tools' servers, or its tools in a one-server catalog."""
    relevant = {catalog.position[tool] for tool in query.relevant}
    if not catalog.several_servers:
        return frozenset(relevant)
    servers = {catalog.backends[p] for p in relevant}
    return frozenset(p for p, backend in enumerate(catalog.backends) if backend in servers)


def answerer(stage: SecondStage | None, bands: Bands) -> Answer:
    """How find_tool answers over an index: the first stage, then the second when there is one;
    the answer's `limit` tools, each judged."""

    def answer(index: SearchIndex, query: Query, limit: int) -> list[Judged]:
        if stage is None:
            return first_stage(index.search(query, limit), bands)
        return stage.judge(index, query, index.search(query, stage.candidates(limit)), limit)

    return answer


@dataclass
class Abstentions:
    """Counts of answers that said nothing fits, per split: over the whole catalog and without."""

    false: dict[str, list[bool]]
    true: dict[str, list[bool]]

    def add(self, split: str, present: bool, absent: bool) -> None:
        self.false.setdefault(split, []).append(present)
        self.true.setdefault(split, []).append(absent)

    def rates(self) -> tuple[dict[str, float], dict[str, float]]:
        """(abstention, false abstention) in percent, per split."""
        return (
            {split: round(100 * float(np.mean(v)), 2) for split, v in self.true.items()},
            {split: round(100 * float(np.mean(v)), 2) for split, v in self.false.items()},
        )


def abstains_without(
    catalog: EvalCatalog, query: EvalQuery, asked: Query, answer: Answer, limit: int
) -> bool:
    """Whether the answer over the catalog less what serves `query` says nothing fits."""
    removed = removed_for(catalog, query)
    if len(removed) == len(catalog.ids):
        return True  # nothing left: the indexer answers that this session has no tools
    index, _ = catalog.without(removed)
    return verdict(asked, answer(index, asked, limit)).nothing_fits
