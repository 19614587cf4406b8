"""`toolsearch bands`: whether find_tool's match bands can be trusted, measured on the shipped sets.

Two failures matter to an agent. A right tool called weak: the answer says to do without a tool
when one was there. A wrong tool called strong: the agent calls it. The first is measured over
each set's own catalog (every relevant tool of every query, wherever it ranks); the second over a
catalog that cannot serve the request, each set's queries against the other sets' catalogs, where
the best hit is wrong by construction and should be weak, or at most possible.

`--calibrate` also embeds the training corpus and prints the bands its check part gives
(`commands.retrieval.corpus.calibrate_bands`), beside the ones the indexer serves
(`indexer.retrieval.bands.model_bands`).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commands.retrieval.corpus import CorpusError, calibrate_bands, embed_corpus, read_corpus
from commands.retrieval.evaluation import SHIPPED_SETS, build_index
from commands.retrieval.scoring import EvalError, EvalQuery, load_queries, split_of
from indexer.embedder import DEFAULT_EMBEDDER, EVAL_KINDS, Embedder, EmbedderError, load_embedder
from indexer.retrieval.bands import Bands, match_band, model_bands
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.query import Query
from indexer.retrieval.search import SearchIndex, SearchSettings
from indexer.retrieval.text import query_texts
from indexer.state.disk import disk_embeddings
from toolsearch.catalog import TRAIN_DATA, CatalogError, load_catalog
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME

BANDS_QUERIES = 1000  # per set: enough for a rate to a point, without 20,000 metatool queries
# one catalog per set: metatool's two query files share one catalog, as do mcpbench's
CATALOG_OF = {
    "stabletoolbench": "stabletoolbench",
    "metatool multi": "metatool",
    "metatool single": "metatool",
    "mcpbench": "mcpbench",
    "mcpbench deps": "mcpbench",
}


@dataclass(frozen=True)
class BandRates:
    """Percentages of one set's queries under one set of bands."""

    name: str
    right_weak: dict[str, float]  # per split: share of the relevant tools called weak
    foreign_strong: float  # the set's queries over the other sets' catalogs: best hit called strong
    foreign_weak: float  # the same: best hit called weak (the answer says nothing here fits)


def _queries(embedder: Embedder, queries: Sequence[EvalQuery]) -> list[Query]:
    """Each query with the vectors of its needs, embedded in one batch as eval does."""
    texts = [query_texts(q.query) for q in queries]
    flat = embedder.embed([text for group in texts for text in group])
    offsets = np.cumsum([0, *map(len, texts)])
    return [
        Query.embedded(q.query, flat[a:b])
        for q, (a, b) in zip(queries, itertools.pairwise(offsets), strict=True)
    ]


def measure_bands(
    embedder: Embedder, cache_dir: Path | None, bands: Bands, limit: int | None = None
) -> list[BandRates]:
    """The band rates of every shipped set, over its first `limit` queries."""
    store = disk_embeddings(cache_dir, embedder.identity, embedder.dimension)
    embeddings = Embeddings(embedder, store)
    indexes: dict[str, tuple[SearchIndex, list[str]]] = {}
    for name, (catalog, _) in SHIPPED_SETS.items():
        if CATALOG_OF[name] not in indexes:
            indexes[CATALOG_OF[name]] = build_index(load_catalog(catalog), embeddings, SearchSettings())
    out = []
    for name, (_, queries_file) in SHIPPED_SETS.items():
        queries = load_queries(queries_file)[:limit]
        out.append(_rates(name, queries, _queries(embedder, queries), indexes, bands))
    return out


def _rates(
    name: str,
    labelled: Sequence[EvalQuery],
    queries: Sequence[Query],
    indexes: Mapping[str, tuple[SearchIndex, list[str]]],
    bands: Bands,
) -> BandRates:
    index, ids = indexes[CATALOG_OF[name]]
    position = {tool: p for p, tool in enumerate(ids)}
    weak: dict[str, list[bool]] = {}
    strong_abroad: list[bool] = []
    weak_abroad: list[bool] = []
    for labels, query in zip(labelled, queries, strict=True):
        similarity = index.similarities(query)
        weak.setdefault(split_of(labels.id), []).extend(
            match_band(float(similarity[position[tool]]), bands) == "weak" for tool in labels.relevant
        )
        for other, (foreign, _) in indexes.items():
            if other == CATALOG_OF[name]:
                continue
            band = match_band(foreign.search(query, 1)[0].match, bands)
            strong_abroad.append(band == "strong")
            weak_abroad.append(band == "weak")
    return BandRates(
        name=name,
        right_weak={split: round(100 * float(np.mean(v)), 1) for split, v in weak.items()},
        foreign_strong=round(100 * float(np.mean(strong_abroad)), 1),
        foreign_weak=round(100 * float(np.mean(weak_abroad)), 1),
    )


def bands_table(rates: Sequence[BandRates]) -> str:
    """One line per set, in percent."""
    lines = ["set               right tool weak (tune / held-apart)  other catalogs: best strong / weak"]
    for r in rates:
        right = f"{r.right_weak.get('tune', 0.0):.1f} / {r.right_weak.get('held-apart', 0.0):.1f}"
        lines.append(f"{r.name:17} {right:>35}  {r.foreign_strong:>18.1f} / {r.foreign_weak:.1f}")
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch bands`."""
    parser = subparsers.add_parser(
        "bands",
        help="measure find_tool's match bands on the shipped sets",
        description="How often each shipped set's right tools are called weak, and how often the best "
        "tool of the other sets' catalogs (which cannot serve the request) is called strong or weak, "
        "under the bands the indexer serves.",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=Path("models") / TUNED_MODEL_NAME,
        help=f"the model folder, measured under its own bands (default: models/{TUNED_MODEL_NAME})",
    )
    parser.add_argument("--embedder", choices=EVAL_KINDS, default=DEFAULT_EMBEDDER)
    parser.add_argument(
        "--limit-queries",
        type=int,
        default=BANDS_QUERIES,
        metavar="N",
        help=f"the first N queries of each set (default {BANDS_QUERIES})",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="also embed the training corpus and print the bands its check part gives (minutes)",
    )
    parser.add_argument("--cache-dir", type=Path, default=Path(".toolsearch") / "cache")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="measure the embedder a configuration file names (indexer.embedder and indexer.model), "
        "an inference server included, under the bands the indexer would serve it with",
    )
    parser.set_defaults(func=run_cli)


def _configured(path: Path) -> tuple[Embedder, Bands]:
    """The embedder of a configuration file, asked once if it is a server, and the bands it is served with."""
    from indexer.api.embedding import served_bands, server_embedder
    from toolsearch.config import load_config
    from toolsearch.sections.indexer_settings import EmbeddingServer

    section = load_config(path, os.environ).indexer
    embedder: Embedder
    if isinstance(section.embedder, EmbeddingServer):
        server = server_embedder(section.embedder, section.model, os.environ)
        server.connect()
        embedder = server
    else:
        embedder = load_embedder(section.embedder, section.model, section.model_threads)
    return embedder, served_bands(section, embedder)


def run_cli(args: argparse.Namespace) -> int:
    """Run `toolsearch bands`; returns the exit code."""
    from toolsearch.config import ConfigError

    if args.limit_queries < 1:
        print("toolsearch bands: --limit-queries must be at least 1", file=sys.stderr)
        return 2
    try:
        if args.config is not None:
            embedder, bands = _configured(args.config)
        else:
            embedder = load_embedder(args.embedder, args.model)
            bands = model_bands(args.model)
        if args.calibrate:
            store = disk_embeddings(args.cache_dir, embedder.identity, embedder.dimension)
            corpus = embed_corpus(
                read_corpus(TRAIN_DATA),
                Embeddings(embedder, store),
                embedder.count_tokens,
                embedder.max_tokens,
            )
            print(f"served bands {bands}; the corpus check part gives {calibrate_bands(corpus)}")
        rates = measure_bands(embedder, args.cache_dir, bands, args.limit_queries)
    except (EmbedderError, CatalogError, EvalError, CorpusError, ConfigError) as exc:
        print(f"toolsearch bands: {exc}", file=sys.stderr)
        return 1
    print(bands_table(rates))
    return 0
