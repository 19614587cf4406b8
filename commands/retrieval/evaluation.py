"""`toolsearch eval`: retrieval quality of the indexer's own search over a catalog and labelled queries.

The catalog is named the way the indexer names it (`indexer.tools.advertise`) and indexed in the
indexer's two steps (`tool_documents`, then `index_documents`, which the indexer's `Builder` runs
too; `commands.retrieval.eval_catalog`), each server of the catalog file a backend named by its slug
(tools without a server form one unnamed backend); queries are embedded in batches and answered one
by one as find_tool answers: the first stage (`SearchIndex.search`), then, for `reranked`, the
second (`indexer.retrieval.second_stage`). The metrics and the two splits of each set are
`commands.retrieval.scoring`'s; abstention, of the answers find_tool gives, is
`commands.retrieval.abstention`'s. A peer's row (`--method fastmcp-bm25`, and with `--all`): FastMCP's BM25
search transform over the same catalog and queries (`commands.retrieval.fastmcp_peer`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from commands.retrieval.abstention import Abstentions, abstains_without, answerer
from commands.retrieval.eval_catalog import EvalCatalog
from commands.retrieval.scoring import (
    DEPTH,
    METRICS,
    PEER,
    PROGRESS_AFTER,
    SPLITS,
    EvalError,
    EvalQuery,
    EvalReport,
    check_labels,
    load_queries,
    progress_bar,
    scored,
    split_of,
)
from indexer.embedder import DEFAULT_EMBEDDER, EVAL_KINDS, Embedder
from indexer.retrieval.bands import UNTRAINED_BANDS, Bands, model_bands
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.query import Query
from indexer.retrieval.search import Method, SearchIndex, SearchSettings
from indexer.retrieval.second_stage import Judged, SecondStage, read_stage, shipped_stage
from indexer.retrieval.text import query_texts
from indexer.retrieval.verdict import verdict
from indexer.state.disk import disk_embeddings
from toolsearch.answers import compact_definition, estimate_tokens, render_answer
from toolsearch.catalog import EVAL_DATA, CatalogTool, load_catalog
from toolsearch.found import Found, FoundTool, TokenMetrics
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME, TUNED_MODEL_NAME
from toolsearch.sessions import VersionRef

# what eval measures: the first stage's methods, and the hybrid one followed by the second stage
EvalMethod = Method | Literal["reranked"]
FIRST_STAGE: tuple[Method, ...] = get_args(Method)
METHODS: tuple[EvalMethod, ...] = (*FIRST_STAGE, "reranked")
ANSWERS = "answers"  # --method answers: find_tool's answers without the second stage and with it
SHIPPED_SETS = {  # name -> (catalog, queries)
    name: (EVAL_DATA / folder / "tools.jsonl", EVAL_DATA / folder / queries)
    for name, folder, queries in (
        ("stabletoolbench", "stabletoolbench", "queries.jsonl"),
        ("metatool multi", "metatool", "queries_multi.jsonl"),
        ("metatool single", "metatool", "queries.jsonl"),
        ("mcpbench", "mcpbench", "queries.jsonl"),
        ("mcpbench deps", "mcpbench", "queries_deps.jsonl"),
    )
}
QUERY_BATCH = 64
ANSWER_LIMIT = 8  # tools in an answer whose tokens are counted: indexer.search.default_limit's default
_METRICS = TokenMetrics(0, 0, 0.0)  # a stand-in of its size
NO_VERSION = VersionRef(0, "")


def build_index(
    tools: Sequence[CatalogTool], embeddings: Embeddings, settings: SearchSettings
) -> tuple[SearchIndex, list[str]]:
    """The indexer's index over a catalog, each server a backend; returns it and the tool ids by position."""
    catalog = EvalCatalog(tools, embeddings, settings)
    return catalog.full, catalog.ids


def answer_tokens(
    judged: Sequence[Judged], by_id: Mapping[str, CatalogTool], ids: Sequence[str]
) -> tuple[int, int]:
    """Estimated tokens of the find_tool answer of these tools, full and compact (`toolsearch.answers`)."""
    counts = []
    for compact in (False, True):
        entries = []
        for judgement in judged:
            tool = by_id[ids[judgement.hit.position]]
            definition = compact_definition(tool.definition()) if compact else tool.definition()
            text = json.dumps(definition, ensure_ascii=False, separators=(",", ":"), sort_keys=not compact)
            entries.append(FoundTool(tool.name, tool.server_slug[:64], text, "", "", judgement.band))
        _, rendered = render_answer(Found(NO_VERSION, tuple(entries), (), _METRICS), compact)
        counts.append(estimate_tokens(rendered))
    return counts[0], counts[1]


def _embedded(
    embedder: Embedder, queries: Sequence[EvalQuery], show: bool, name: str
) -> tuple[list[Query], float]:
    """Each query with its needs' vectors, embedded in batches, and the seconds that took."""
    texts = [query_texts(q.query) for q in queries]
    started = time.perf_counter()
    vectors: list[np.ndarray] = []
    with progress_bar(len(queries), f"embedding {name or 'queries'}", show) as bar:
        for start in range(0, len(texts), QUERY_BATCH):
            batch = texts[start : start + QUERY_BATCH]
            flat = embedder.embed([text for group in batch for text in group])
            offsets = np.cumsum([0, *map(len, batch)])
            vectors.extend(flat[a:b] for a, b in itertools.pairwise(offsets))
            bar.update(len(batch))
    asked = [Query.embedded(q.query, vector) for q, vector in zip(queries, vectors, strict=True)]
    return asked, time.perf_counter() - started


def evaluate_methods(
    tools: Sequence[CatalogTool],
    queries: Sequence[EvalQuery],
    embedder: Embedder,
    methods: Sequence[EvalMethod] = FIRST_STAGE,
    settings: SearchSettings | None = None,
    cache_dir: Path | None = None,
    progress: bool | None = None,
    name: str = "",
    bands: Bands = UNTRAINED_BANDS,
    stage: SecondStage | None = None,
) -> list[EvalReport]:
    """One report per method; documents are embedded once (cached in `cache_dir`), queries once.

    `hybrid` is the first stage as find_tool runs it without a second stage, its answers banded by
    the model's `bands`; `reranked` the same with `stage` after it. Both also report abstention
    (`commands.retrieval.abstention`); their "search ms" is the whole answer's, second stage included.
    """
    check_labels(tools, queries)
    if "reranked" in methods and stage is None:
        raise EvalError("the reranked method needs a second stage")
    settings = settings or SearchSettings()
    store = disk_embeddings(cache_dir, embedder.identity, embedder.dimension)
    catalog = EvalCatalog(tools, Embeddings(embedder, store), settings)
    show = len(queries) >= PROGRESS_AFTER if progress is None else progress
    asked, embed_seconds = _embedded(embedder, queries, show, name)
    by_id = {tool.id: tool for tool in tools}
    ids = catalog.ids
    runs = {method: _Tally() for method in methods}
    answers = {method: answerer(stage if method == "reranked" else None, bands) for method in methods}
    # queries outer, methods inner: a query's catalog without its servers is built once for every method
    with progress_bar(len(queries), f"searching {name or 'queries'}", show) as bar:
        for query, question in zip(queries, asked, strict=True):
            for method, run in runs.items():
                began = time.perf_counter()
                if method in ("hybrid", "reranked"):
                    judged = answers[method](catalog.full, question, DEPTH)
                    hits = [j.hit for j in judged]
                else:
                    hits = catalog.full.search(question, DEPTH, "dense" if method == "dense" else "lexical")
                run.timings.append(time.perf_counter() - began)
                run.rankings[query.id] = [ids[hit.position] for hit in hits]
                if method in ("hybrid", "reranked"):
                    # the answer of find_tool's default limit: the first of these when the second
                    # stage reads at least DEPTH candidates, as the shipped one does
                    shown = judged[:ANSWER_LIMIT]
                    present = verdict(question, shown).nothing_fits
                    absent = abstains_without(catalog, query, question, answers[method], ANSWER_LIMIT)
                    run.counts.add(split_of(query.id), present, absent)
                    full, compact = answer_tokens(shown, by_id, ids)
                    run.tokens[0] += full
                    run.tokens[1] += compact
            bar.update(1)
    return [_report(method, run, tools, queries, embed_seconds, name) for method, run in runs.items()]


@dataclass
class _Tally:
    """What one method's run over a set gathers, query by query."""

    timings: list[float] = field(default_factory=list)
    rankings: dict[str, list[str]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    counts: Abstentions = field(default_factory=lambda: Abstentions({}, {}))


def _report(
    method: EvalMethod,
    run: _Tally,
    tools: Sequence[CatalogTool],
    queries: Sequence[EvalQuery],
    embed_seconds: float,
    name: str,
) -> EvalReport:
    report = scored(method, tools, queries, run.rankings, embed_seconds + sum(run.timings), run.timings, name)
    if method not in ("hybrid", "reranked"):
        return report
    count = max(len(queries), 1)
    tokens_each: dict[str, float] = {
        "full": round(run.tokens[0] / count),
        "compact": round(run.tokens[1] / count),
    }
    abstention, false_abstention = run.counts.rates()
    return replace(
        report, answer_tokens=tokens_each, abstention=abstention, false_abstention=false_abstention
    )


def evaluate(
    tools: Sequence[CatalogTool],
    queries: Sequence[EvalQuery],
    embedder: Embedder,
    method: EvalMethod = "hybrid",
    settings: SearchSettings | None = None,
    cache_dir: Path | None = None,
    progress: bool | None = None,
) -> EvalReport:
    """The figures of one method over one catalog and query set."""
    return evaluate_methods(tools, queries, embedder, (method,), settings, cache_dir, progress)[0]


def _table(reports: Sequence[EvalReport]) -> str:
    """One row per set, split and method: the tune split first, then the held-apart one.

    "abstain" and "false abst." are of the answers (hybrid, reranked): percent of them that said
    nothing fits without what serves the query, and with it there.
    """
    header = ["set", "split", "model", "method", "tools", "queries", *METRICS, "abstain", "false abst."]
    header += ["q/s", "search ms"]

    def rate(figures: dict[str, float], split: str) -> str:
        return f"{figures[split]:.1f}" if split in figures else "-"

    rows = [
        [r.name or "-", split, r.model or "-", r.method, str(r.tools), str(r.split_queries[split])]
        + [f"{r.splits[split][m]:.1f}" for m in METRICS]
        + [rate(r.abstention, split), rate(r.false_abstention, split)]
        + [f"{r.queries_per_second:.0f}", f"{r.search_ms_median:.2f}"]
        for name in dict.fromkeys(r.name for r in reports)
        for split in SPLITS
        for r in reports
        if r.name == name and split in r.splits
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.rjust(width) if i >= 4 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch eval`."""
    parser = subparsers.add_parser(
        "eval",
        help="measure retrieval quality over a catalog and labelled queries",
        description="Run the indexer's search over a catalog file and labelled queries and print "
        "R@1, R@5, R@8, R@10, nDCG@10, MRR@10, completeness@5 (percent) and throughput.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--catalog", type=Path, help="the catalog file (JSON Lines of MCP tools)")
    source.add_argument("--all", action="store_true", help="run the shipped sets and print one table")
    parser.add_argument("--queries", type=Path, help="the labelled queries (JSON Lines); with --catalog")
    parser.add_argument(
        "--method",
        choices=[*METHODS, PEER, ANSWERS, "all"],
        help=f"search method (default: hybrid; with --all, every method): hybrid, dense and lexical are the "
        "first stage's; reranked is hybrid then the second stage shipped for the model; answers runs hybrid "
        f"and reranked; {PEER} is a peer's: FastMCP's BM25 search transform over the same catalog (the "
        "bench extra installs fastmcp)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--model",
        type=Path,
        action="append",
        help=f"a sentence-transformers model folder; repeat it to compare models row by row (default: "
        f"models/{TUNED_MODEL_NAME}, which find_tool serves, and with --all models/{BASE_MODEL_NAME} too)",
    )
    parser.add_argument(
        "--embedder",
        choices=EVAL_KINDS,
        default=DEFAULT_EMBEDDER,
        help=f"what embeds the texts, as indexer.embedder (default: {DEFAULT_EMBEDDER}); onnx-int8 "
        "measures the int8 export of `toolsearch model prepare --int8`, which is not served",
    )
    parser.add_argument(
        "--stage",
        type=Path,
        help="a second stage's folder (`toolsearch model train --stage second-stage` writes one), for the "
        "reranked method (default: the one shipped for each model)",
    )
    parser.add_argument("--limit-queries", type=int, metavar="N", help="only the first N queries of each set")
    parser.add_argument(
        "--split",
        choices=["both", *SPLITS],
        default="both",
        help="which queries of each set to run: the tune split, the held-apart one, or both (default), "
        "each reported apart",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".toolsearch") / "cache",
        help="embedding cache for tool texts (default: .toolsearch/cache)",
    )
    parser.set_defaults(func=run_cli)


def _queries(path: Path, args: argparse.Namespace) -> list[EvalQuery]:
    """A set's labelled queries, as `--split` and `--limit-queries` choose them."""
    queries = load_queries(path)
    if args.split != "both":
        queries = [q for q in queries if split_of(q.id) == args.split]
    return queries[: args.limit_queries]


def _peer_reports(
    sets: Mapping[str, tuple[Path, Path]], args: argparse.Namespace, required: bool
) -> list[EvalReport]:
    """The peer's row of each set; without fastmcp installed, an error if asked for, else a note."""
    try:
        from commands.retrieval.fastmcp_peer import evaluate_peer
    except ImportError:
        message = f"the {PEER} row needs fastmcp (the bench extra: pip install 'toolsearch[bench]')"
        if required:
            raise EvalError(message) from None
        print(f"toolsearch eval: {message}; left out", file=sys.stderr)
        return []
    return [
        evaluate_peer(load_catalog(catalog), _queries(queries_file, args), name)
        for name, (catalog, queries_file) in sets.items()
    ]


def _stage(args: argparse.Namespace, identity: str, methods: Sequence[EvalMethod]) -> SecondStage | None:
    """The second stage the reranked method runs after the first for the embedder `identity`; None
    (and a note) when none ships for it, unless `--stage` names one, which must fit it."""
    if "reranked" not in methods:
        return None
    if args.stage is None:
        stage = shipped_stage(identity)
        if stage is None:
            print(f"toolsearch eval: no second stage ships for {identity}: no reranked row", file=sys.stderr)
        return stage
    stage = read_stage(args.stage)
    if stage.identity != identity:
        raise EvalError(
            f"the second stage in {args.stage} reads {stage.identity}'s vectors, not {identity}'s"
        )
    return stage


def run_cli(args: argparse.Namespace) -> int:
    """Run `toolsearch eval`; returns the exit code."""
    from indexer.embedder import EmbedderError, load_embedder
    from toolsearch.catalog import CatalogError

    if args.catalog is not None and args.queries is None:
        print("toolsearch eval: --catalog needs --queries", file=sys.stderr)
        return 2
    if args.limit_queries is not None and args.limit_queries < 1:
        print("toolsearch eval: --limit-queries must be at least 1", file=sys.stderr)
        return 2
    chosen = args.method or ("all" if args.all else "hybrid")
    methods = METHODS if chosen == "all" else tuple(m for m in METHODS if m == chosen)
    if chosen == ANSWERS:
        methods = ("hybrid", "reranked")
    sets = SHIPPED_SETS if args.all else {args.catalog.parent.name: (args.catalog, args.queries)}
    models = args.model or [Path("models") / TUNED_MODEL_NAME]
    if args.all and not args.model:
        models.append(Path("models") / BASE_MODEL_NAME)
    identities = []
    try:
        reports: list[EvalReport] = []
        for model in models if methods else []:
            embedder = load_embedder(args.embedder, model)
            identities.append(embedder.identity)
            stage = _stage(args, embedder.identity, methods)
            runs = tuple(m for m in methods if m != "reranked" or stage is not None)
            for name, (catalog, queries_file) in sets.items():
                made = evaluate_methods(
                    load_catalog(catalog),
                    _queries(queries_file, args),
                    embedder,
                    runs,
                    bands=model_bands(model),
                    stage=stage,
                    cache_dir=args.cache_dir,
                    name=name,
                )
                reports += [replace(report, model=model.name) for report in made]
        if chosen in ("all", PEER):
            reports += _peer_reports(sets, args, required=chosen == PEER)
    except (EmbedderError, CatalogError, EvalError) as exc:
        print(f"toolsearch eval: {exc}", file=sys.stderr)
        return 1
    if args.json:
        fields = (
            "name",
            "model",
            "method",
            "tools",
            "queries",
            "metrics",
            "splits",
            "split_queries",
            "answer_tokens",
            "abstention",
            "false_abstention",
            "queries_per_second",
            "search_ms_median",
        )
        out = [
            {key: asdict(report)[key] for key in fields}
            | {"embedder": None if report.method == PEER else args.embedder}  # the peer embeds nothing
            for report in reports
        ]
        print(json.dumps(out if args.all else out[0] if len(out) == 1 else out, indent=2))
    else:
        if identities:
            print(f"embedder {args.embedder}: {', '.join(identities)}")
        print(_table(reports))
    return 0
