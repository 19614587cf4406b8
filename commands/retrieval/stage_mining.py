"""What the second stage learns from: each corpus request's first-stage candidates, found by the model it
will read, as find_tool finds them, and the features of each pair (`indexer.retrieval.fit`).

Every source of the training corpus (`commands.retrieval.corpus`) is a catalog of its own, indexed as
the indexer indexes one (`commands.retrieval.eval_catalog`; without the server lift, as one source's
2,276 "servers" are one tool each). For each request the candidates are read three ways:

- **present**: the first stage's best over its own source's catalog; the request's relevant tools
  (wherever the first stage ranked them) are the positives, the others the hard negatives;
- **absent**: the same candidates less the servers of the relevant tools (less the tools themselves
  in a one-server source), as abstention's construction takes them out (`commands.retrieval.abstention`):
  what the first stage offers when nothing fits;
- **foreign**: the first stage's best over another source's catalog, which cannot serve it.

A candidate that shares a relevant tool's name is left out of the negatives (BFCL defines `multiply`
six times).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from commands.retrieval.corpus import Corpus, corpus_part
from commands.retrieval.eval_catalog import EvalCatalog
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.fit import pair_features
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, SearchSettings
from indexer.retrieval.text import query_texts

CANDIDATES = 30  # of the first stage's, per request and catalog
PRESENT, ABSENT, FOREIGN = 10, 8, 8  # candidates of each kind read: the second stage's depth, answers of 8
QUERY_BATCH = 64
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Mined:
    """One request's pairs: features (rows) and labels of its positives and of each kind of candidate,
    and its present candidates' first-stage scores (to measure an order mixing the two)."""

    pair_id: str
    source: str
    part: str  # "train" or "check" (`corpus_part`)
    positives: FloatArray
    present: FloatArray  # the first PRESENT candidates, best first
    present_labels: npt.NDArray[np.bool_]
    present_scores: FloatArray
    wanted: int  # how many relevant tools the request has
    absent: FloatArray
    foreign: FloatArray
    negatives: FloatArray  # the present ones that are no positive and share no relevant tool's name


def chosen_pairs(corpus: Corpus, train_per_source: int, check_per_source: int) -> list[str]:
    """The pairs to mine: at most so many of each source's train and check parts, the first by a
    hash of their id (the same in every run, whatever the file's order)."""
    parts: dict[tuple[str, str], list[str]] = {}
    for pair in corpus.pairs:
        parts.setdefault((pair.source, corpus_part(pair.id)), []).append(pair.id)
    chosen = []
    for (_, part), ids in parts.items():
        cap = check_per_source if part == "check" else train_per_source
        chosen += sorted(ids, key=lambda i: hashlib.sha256(i.encode()).digest())[:cap]
    return chosen


def _catalogs(corpus: Corpus, embeddings: Embeddings) -> dict[str, tuple[EvalCatalog, dict[int, int]]]:
    """Each source's catalog, and the position in it of each of its tools' corpus position."""
    by_source: dict[str, list[int]] = {}
    for position, tool in enumerate(corpus.tools):
        by_source.setdefault(tool.id.split("::", 1)[0], []).append(position)
    settings = SearchSettings(server_weight=0.0)
    out = {}
    for source, positions in by_source.items():
        catalog = EvalCatalog([corpus.tools[p] for p in positions], embeddings, settings)
        of_id = {corpus.tools[p].id: p for p in positions}
        out[source] = (catalog, {of_id[tool_id]: local for local, tool_id in enumerate(catalog.ids)})
    return out


def mine(corpus: Corpus, embeddings: Embeddings, seed: int, pairs: Sequence[str]) -> list[Mined]:
    """The mined pairs of the corpus pairs `pairs` (ids), with the model `embeddings` embeds with."""
    catalogs = _catalogs(corpus, embeddings)
    wanted_ids = set(pairs)
    chosen = [p for p in corpus.pairs if p.id in wanted_ids]
    texts = [query_texts(pair.query) for pair in chosen]
    flat = embeddings.embed_documents([text for group in texts for text in group])
    offsets = np.cumsum([0, *map(len, texts)])
    draw = random.Random(seed)
    sources = sorted(catalogs)
    names = [tool.name.lower() for tool in corpus.tools]
    out = []
    for pair, (a, b) in zip(chosen, itertools.pairwise(offsets), strict=True):
        query = Query.embedded(pair.query, flat[a:b])
        catalog, local = catalogs[pair.source]
        index = catalog.full
        relevant = {local[tool] for tool in pair.relevant}
        own = {names[tool] for tool in pair.relevant}
        similarity, needs = index.matches(query)
        positives = [Hit(p, 0.0, float(similarity[p]), int(needs[p])) for p in sorted(relevant)]
        present = index.search(query, CANDIDATES)
        servers = {catalog.backends[p] for p in relevant}
        if catalog.several_servers:
            absent = [h for h in present if catalog.backends[h.position] not in servers]
        else:
            absent = [h for h in present if h.position not in relevant]
        negatives = [
            h
            for h in present[:PRESENT]
            if h.position not in relevant and str(catalog.definitions[h.position]["name"]).lower() not in own
        ]
        foreign_catalog, _ = catalogs[draw.choice([s for s in sources if s != pair.source])]
        foreign = foreign_catalog.full.search(query, FOREIGN)
        out.append(
            Mined(
                pair_id=pair.id,
                source=pair.source,
                part=corpus_part(pair.id),
                positives=pair_features(index, query, positives),
                present=pair_features(index, query, present[:PRESENT]),
                present_labels=np.asarray([h.position in relevant for h in present[:PRESENT]]),
                present_scores=np.asarray([h.score for h in present[:PRESENT]], dtype=np.float32),
                wanted=len(relevant),
                absent=pair_features(index, query, absent[:ABSENT]),
                foreign=pair_features(foreign_catalog.full, query, foreign),
                negatives=pair_features(index, query, negatives),
            )
        )
    return out
