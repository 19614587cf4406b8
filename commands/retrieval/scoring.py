"""Labelled queries and how a ranking is scored against them, for `toolsearch eval` and its peer row.

Metrics are in percent: R@k (share of a query's relevant tools in the top k), nDCG@10 (binary
relevance), MRR@10 and completeness@5 (share of queries whose relevant tools are all in the top 5).
Each set's queries fall in two splits by a hash of the query id (`split_of`): about 30% are held
apart, never looked at while tuning, and the figures are reported per split as well as over all.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from toolsearch.catalog import CatalogTool

METRICS = ("R@1", "R@5", "R@8", "R@10", "nDCG@10", "MRR@10", "completeness@5")
DEPTH = 10  # the deepest rank any metric reads
PROGRESS_AFTER = 500  # queries: shorter runs need no progress bar
# FastMCP's BM25 search transform, a row beside the methods (commands.retrieval.fastmcp_peer)
PEER = "fastmcp-bm25"
Split = Literal["tune", "held-apart"]
SPLITS: tuple[Split, ...] = get_args(Split)
HELD_APART_PERCENT = 30


def split_of(query_id: str) -> Split:
    """The split a query belongs to, by a hash of its id alone: the same in every run and every order.

    Tuning looks at the "tune" split only; "held-apart" tells whether what was tuned carries to
    queries nobody looked at. A query id shared by two files of a set (mcpbench's two label sets of
    the same tasks) falls in the same split in both.
    """
    bucket = int.from_bytes(hashlib.sha256(query_id.encode()).digest()[:8], "big") % 100
    return "held-apart" if bucket < HELD_APART_PERCENT else "tune"


class EvalError(ValueError):
    """Raised when a queries file cannot be read or names tools the catalog lacks."""


@dataclass(frozen=True, slots=True)
class EvalQuery:
    """One labelled query: its text and the ids of the tools that answer it."""

    id: str
    query: str
    relevant: tuple[str, ...]
    source: str = ""  # the dataset it comes from, where the file says (the training corpus does)


@dataclass(frozen=True)
class EvalReport:
    """The figures of one method over one catalog and query set."""

    method: str
    tools: int
    queries: int
    metrics: dict[str, float]  # percent, keys as in METRICS
    queries_per_second: float  # query embedding (batched) and search, end to end
    search_ms_median: float  # one search, the query embedding excluded
    name: str = ""
    rankings: dict[str, list[str]] = field(default_factory=dict, repr=False, compare=False)
    # the same metrics over each split's queries alone, and how many queries each split has
    splits: dict[str, dict[str, float]] = field(default_factory=dict)
    split_queries: dict[str, int] = field(default_factory=dict)
    # hybrid only: mean estimated tokens of a find_tool answer of ANSWER_LIMIT tools, full and compact
    answer_tokens: dict[str, float] = field(default_factory=dict)
    model: str = ""  # the model folder's name
    # answers only (hybrid, reranked), per split, percent: answers that said nothing fits over the
    # catalog without what serves the query, and over the whole catalog (commands.retrieval.abstention)
    abstention: dict[str, float] = field(default_factory=dict)
    false_abstention: dict[str, float] = field(default_factory=dict)


def load_queries(path: Path) -> list[EvalQuery]:
    """Read a queries file: JSON Lines of {"id", "query", "relevant": [tool ids]}."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalError(f"{path}: cannot read queries ({exc.strerror})") from None
    queries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            relevant = tuple(map(str, raw["relevant"]))
            queries.append(EvalQuery(str(raw["id"]), str(raw["query"]), relevant, str(raw.get("source", ""))))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EvalError(f"{path}:{number}: not a labelled query ({exc})") from None
    return queries


def score_ranking(ranking: Sequence[str], relevant: Sequence[str]) -> dict[str, float]:
    """Every metric of one ranked list of tool ids, as fractions."""
    wanted = set(relevant)
    if not wanted:
        raise EvalError("a query needs at least one relevant tool")
    top = list(ranking[:DEPTH])
    found = [tool in wanted for tool in top]
    out = {f"R@{k}": len(wanted & set(top[:k])) / len(wanted) for k in (1, 5, 8, 10)}
    dcg = sum(1 / math.log2(rank + 2) for rank, hit in enumerate(found) if hit)
    ideal = sum(1 / math.log2(rank + 2) for rank in range(min(len(wanted), DEPTH)))
    out["nDCG@10"] = dcg / ideal
    out["MRR@10"] = next((1 / (rank + 1) for rank, hit in enumerate(found) if hit), 0.0)
    out["completeness@5"] = float(wanted <= set(top[:5]))
    return out


def check_labels(tools: Sequence[CatalogTool], queries: Sequence[EvalQuery]) -> None:
    """Fail when a query names a tool the catalog lacks."""
    known = {tool.id for tool in tools}
    for query in queries:
        if missing := set(query.relevant) - known:
            raise EvalError(f"query {query.id} names tools the catalog lacks: {sorted(missing)[:3]}")


def scored(
    method: str,
    tools: Sequence[CatalogTool],
    queries: Sequence[EvalQuery],
    rankings: dict[str, list[str]],
    seconds: float,
    timings: Sequence[float],
    name: str = "",
) -> EvalReport:
    """The report of one method's rankings: every metric over all queries and over each split.

    `seconds`: the whole run's time (query embedding included); `timings`: each search's own.
    """
    totals = dict.fromkeys(METRICS, 0.0)
    split_totals = {split: dict.fromkeys(METRICS, 0.0) for split in SPLITS}
    splits = [split_of(q.id) for q in queries]
    for query, split in zip(queries, splits, strict=True):
        for metric, value in score_ranking(rankings[query.id], query.relevant).items():
            totals[metric] += value
            split_totals[split][metric] += value
    count = max(len(queries), 1)
    sizes = {split: splits.count(split) for split in SPLITS}
    return EvalReport(
        method=method,
        tools=len(tools),
        queries=len(queries),
        metrics={metric: round(100 * total / count, 2) for metric, total in totals.items()},
        queries_per_second=round(len(queries) / max(seconds, 1e-9), 1),
        search_ms_median=round(1000 * float(np.median(timings)) if timings else 0.0, 3),
        name=name,
        rankings=rankings,
        splits={
            split: {m: round(100 * t / max(sizes[split], 1), 2) for m, t in split_totals[split].items()}
            for split in SPLITS
            if sizes[split]
        },
        split_queries={split: size for split, size in sizes.items() if size},
    )


def progress_bar(total: int, label: str, show: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the bench extra brings it; an indexer-only install evaluates without a bar
        return _NoBar()
    return tqdm(total=total, desc=label, disable=not show, file=sys.stderr, unit="q", leave=False)


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, count: int) -> None:
        return None
