"""`toolsearch eval`: retrieval quality of the indexer's own search over a catalog and labelled queries.

The catalog is named the way the indexer names it (`indexer.tools.advertise`) and indexed in the
indexer's two steps (`indexer.search.build_tool_index`: `tool_documents`, then `index_documents`,
which the indexer's `Builder` runs too), each server of the catalog file a backend named by its slug
(tools without a server form one unnamed backend); queries are embedded in batches and searched
one by one with `SearchIndex.search`. The metrics and the two splits of each set are
`commands.retrieval.scoring`'s. A peer's row (`--method fastmcp-bm25`, and with `--all`): FastMCP's BM25
search transform over the same catalog and queries (`commands.retrieval.fastmcp_peer`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, get_args

import numpy as np

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
from indexer.retrieval.bands import match_band
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, Method, SearchIndex, SearchSettings, build_tool_index
from indexer.retrieval.text import query_texts
from indexer.retrieval.tools import advertise
from indexer.state.disk import disk_embeddings
from toolsearch.answers import compact_definition, estimate_tokens, render_answer
from toolsearch.catalog import EVAL_DATA, CatalogTool, load_catalog
from toolsearch.found import Found, FoundTool, TokenMetrics
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME, TUNED_MODEL_NAME
from toolsearch.sessions import VersionRef

METHODS: tuple[Method, ...] = get_args(Method)
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
    listings: dict[str, list[dict[str, Any]]] = {}
    owner: dict[tuple[str, str], str] = {}
    for tool in tools:
        backend = tool.server_slug[:64] if tool.server else ""
        listings.setdefault(backend, []).append(tool.definition())
        owner[(backend, tool.name)] = tool.id
    advertised = advertise(listings)
    embedder = embeddings.embedder
    index = build_tool_index(
        definitions=[t.definition for t in advertised],
        backends=[t.backend_id for t in advertised],
        names=[t.name for t in advertised],
        aliases=[
            sorted({t.original_name, f"{t.backend_id}_{t.original_name}"} - {t.name}) for t in advertised
        ],
        embed_documents=embeddings.embed_documents,
        settings=settings,
        count_tokens=embedder.count_tokens,
        max_tokens=embedder.max_tokens,
    )
    return index, [owner[(t.backend_id, t.original_name)] for t in advertised]


def answer_tokens(
    hits: Sequence[Hit], by_id: Mapping[str, CatalogTool], ids: Sequence[str]
) -> tuple[int, int]:
    """Estimated tokens of the find_tool answer these hits make, full and compact (`toolsearch.answers`)."""
    counts = []
    for compact in (False, True):
        entries = []
        for hit in hits:
            tool = by_id[ids[hit.position]]
            definition = compact_definition(tool.definition()) if compact else tool.definition()
            text = json.dumps(definition, ensure_ascii=False, separators=(",", ":"), sort_keys=not compact)
            entries.append(FoundTool(tool.name, tool.server_slug[:64], text, "", "", match_band(hit.match)))
        _, rendered = render_answer(Found(NO_VERSION, tuple(entries), (), _METRICS), compact)
        counts.append(estimate_tokens(rendered))
    return counts[0], counts[1]


def evaluate_methods(
    tools: Sequence[CatalogTool],
    queries: Sequence[EvalQuery],
    embedder: Embedder,
    methods: Sequence[Method] = METHODS,
    settings: SearchSettings | None = None,
    cache_dir: Path | None = None,
    progress: bool | None = None,
    name: str = "",
) -> list[EvalReport]:
    """One report per method; documents are embedded once (cached in `cache_dir`), queries once."""
    check_labels(tools, queries)
    settings = settings or SearchSettings()
    store = disk_embeddings(cache_dir, embedder.identity, embedder.dimension)
    index, ids = build_index(tools, Embeddings(embedder, store), settings)
    show = len(queries) >= PROGRESS_AFTER if progress is None else progress
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
    embed_seconds = time.perf_counter() - started
    reports = []
    by_id = {tool.id: tool for tool in tools}
    for method in methods:
        timings: list[float] = []
        rankings: dict[str, list[str]] = {}
        tokens = [0, 0]
        with progress_bar(len(queries), f"searching {name or ''} ({method})".replace("  ", " "), show) as bar:
            for query, vector in zip(queries, vectors, strict=True):
                began = time.perf_counter()
                hits = index.search(Query.embedded(query.query, vector), DEPTH, method)
                timings.append(time.perf_counter() - began)
                rankings[query.id] = [ids[hit.position] for hit in hits]
                if method == "hybrid":
                    full, compact = answer_tokens(hits[:ANSWER_LIMIT], by_id, ids)
                    tokens[0] += full
                    tokens[1] += compact
                bar.update(1)
        report = scored(method, tools, queries, rankings, embed_seconds + sum(timings), timings, name)
        if method == "hybrid":
            count = max(len(queries), 1)
            tokens_each: dict[str, float] = {
                "full": round(tokens[0] / count),
                "compact": round(tokens[1] / count),
            }
            report = replace(report, answer_tokens=tokens_each)
        reports.append(report)
    return reports


def evaluate(
    tools: Sequence[CatalogTool],
    queries: Sequence[EvalQuery],
    embedder: Embedder,
    method: Method = "hybrid",
    settings: SearchSettings | None = None,
    cache_dir: Path | None = None,
    progress: bool | None = None,
) -> EvalReport:
    """The figures of one method over one catalog and query set."""
    return evaluate_methods(tools, queries, embedder, (method,), settings, cache_dir, progress)[0]


def _table(reports: Sequence[EvalReport]) -> str:
    """One row per set, split and method: the tune split first, then the held-apart one."""
    header = ["set", "split", "model", "method", "tools", "queries", *METRICS, "q/s", "search ms"]
    rows = [
        [r.name or "-", split, r.model or "-", r.method, str(r.tools), str(r.split_queries[split])]
        + [f"{r.splits[split][m]:.1f}" for m in METRICS]
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
        choices=[*METHODS, PEER, "all"],
        help=f"search method (default: hybrid; with --all, every method); {PEER} is a peer's: FastMCP's "
        "BM25 search transform over the same catalog (the bench extra installs fastmcp)",
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
            for name, (catalog, queries_file) in sets.items():
                made = evaluate_methods(
                    load_catalog(catalog),
                    _queries(queries_file, args),
                    embedder,
                    methods,
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
