"""The training corpus: public tool-use requests labelled with the tools that serve them, as vectors.

`toolsearch/data/train/` holds it (README, SOURCES.md and each source's licence there): `tools.jsonl`
in the catalog format and `pairs.jsonl` of `{"id", "source", "query", "relevant": [tool ids]}`.
Each tool is read exactly as the indexer reads it (`indexer.retrieval.text.document_texts`: its
views, its backend's name included), each request as the indexer embeds a whole query
(`query_text`), so what is measured over these vectors holds for the ones find_tool compares.

Pairs fall in two parts by a hash of their id (`corpus_part`): about a tenth is the check part,
kept apart from anything fitted to the rest; the match bands (`calibrate_bands`) are calibrated on
it. Nothing of the evaluation sets is in the corpus (its README).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from commands.retrieval.scoring import EvalError, load_queries
from indexer.retrieval.bands import Bands
from indexer.retrieval.documents import FloatArray
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.text import document_texts, query_text
from toolsearch.catalog import CatalogError, CatalogTool, load_catalog

CHECK_PERCENT = 10
QUERY_BLOCK = 64  # requests scored at once: a block's (requests, tools, views) floats stay small


class CorpusError(ValueError):
    """Raised when a corpus file cannot be read, or a pair names a tool the corpus lacks."""


def corpus_part(pair_id: str) -> str:
    """ "check" for about a tenth of the pairs (by a hash of the id alone), "train" for the rest."""
    bucket = int.from_bytes(hashlib.sha256(pair_id.encode()).digest()[:8], "big") % 100
    return "check" if bucket < CHECK_PERCENT else "train"


@dataclass(frozen=True)
class Pair:
    """One labelled request: its text, its source dataset and the positions of its tools."""

    id: str
    source: str
    query: str
    relevant: tuple[int, ...]  # positions in CorpusVectors' tools


@dataclass(frozen=True)
class CorpusVectors:
    """The corpus embedded: every tool's views, every request's whole-query vector."""

    tool_ids: tuple[str, ...]
    tool_sources: tuple[str, ...]
    tool_names: tuple[str, ...]  # the tool's name lower-cased: one source may hold several of a name
    views: npt.NDArray[np.float32]  # (tools, most views, dimension); missing views are zero rows
    view_mask: npt.NDArray[np.bool_]  # (tools, most views): which views exist
    pairs: tuple[Pair, ...]
    queries: npt.NDArray[np.float32]  # (pairs, dimension)
    digest: str  # sha256 over both corpus files, to name the corpus a figure was measured on


def corpus_digest(folder: Path) -> str:
    """A sha256 over the corpus's two files, in order."""
    digest = hashlib.sha256()
    for name in ("tools.jsonl", "pairs.jsonl"):
        try:
            digest.update((folder / name).read_bytes())
        except OSError as exc:
            raise CorpusError(f"cannot read {folder / name} ({exc.strerror})") from None
    return digest.hexdigest()


def _read_pairs(path: Path, known: dict[str, int]) -> list[Pair]:
    """The labelled requests of `path` (the evaluation sets' format, with a source), tools by position."""
    try:
        labelled = load_queries(path)
    except EvalError as exc:
        raise CorpusError(str(exc)) from None
    pairs = []
    for request in labelled:
        if missing := [tool for tool in request.relevant if tool not in known]:
            raise CorpusError(f"{path}: pair {request.id} names tools the corpus lacks: {missing[:3]}")
        if not request.relevant or not request.source:
            raise CorpusError(f"{path}: pair {request.id} needs a source and at least one relevant tool")
        pairs.append(
            Pair(request.id, request.source, request.query, tuple(known[tool] for tool in request.relevant))
        )
    return pairs


@dataclass(frozen=True)
class Corpus:
    """The corpus as read: its tools in file order, its pairs, and its digest."""

    tools: tuple[CatalogTool, ...]
    pairs: tuple[Pair, ...]
    digest: str  # sha256 over both files, to name the corpus a figure was measured on

    def backend(self, position: int) -> str:
        """The backend name the indexer would give tool `position`: its server's slug."""
        tool = self.tools[position]
        return tool.server_slug[:64] if tool.server else ""


def read_corpus(folder: Path) -> Corpus:
    """Read `folder`'s tools.jsonl and pairs.jsonl; raises CorpusError naming the file and line."""
    try:
        tools = load_catalog(folder / "tools.jsonl")
    except CatalogError as exc:
        raise CorpusError(str(exc)) from None
    known = {tool.id: position for position, tool in enumerate(tools)}
    pairs = _read_pairs(folder / "pairs.jsonl", known)
    return Corpus(tuple(tools), tuple(pairs), corpus_digest(folder))


def embed_corpus(
    corpus: Corpus, embeddings: Embeddings, count_tokens: Callable[[str], int], max_tokens: int
) -> CorpusVectors:
    """Embed the corpus with `embeddings` (cached like any document)."""
    views = [
        document_texts(tool.definition(), corpus.backend(position), count_tokens, max_tokens)[0]
        for position, tool in enumerate(corpus.tools)
    ]
    widest = max(len(texts) for texts in views)
    flat = embeddings.embed_documents([text for texts in views for text in texts])
    array = np.zeros((len(views), widest, embeddings.dimension), dtype=np.float32)
    mask = np.zeros((len(views), widest), dtype=bool)
    start = 0
    for row, texts in enumerate(views):
        array[row, : len(texts)] = flat[start : start + len(texts)]
        mask[row, : len(texts)] = True
        start += len(texts)
    queries = embeddings.embed_documents([query_text(pair.query) for pair in corpus.pairs])
    return CorpusVectors(
        tool_ids=tuple(tool.id for tool in corpus.tools),
        tool_sources=tuple(tool.id.split("::", 1)[0] for tool in corpus.tools),
        tool_names=tuple(tool.name.lower() for tool in corpus.tools),
        views=array,
        view_mask=mask,
        pairs=corpus.pairs,
        queries=queries,
        digest=corpus.digest,
    )


def sources(pairs: Sequence[Pair]) -> list[str]:
    """The pairs' sources, each once, in the order first met."""
    return list(dict.fromkeys(pair.source for pair in pairs))


def similarities(corpus: CorpusVectors, rows: Sequence[int], queries: npt.NDArray[np.float32]) -> FloatArray:
    """(rows, tools): each tool's best view's cosine with each row's query vector, as `Hit.match`."""
    tools, views, dimension = corpus.views.shape
    flat = corpus.views.reshape(tools * views, dimension)
    out = np.empty((len(rows), tools), dtype=np.float32)
    for start in range(0, len(rows), QUERY_BLOCK):
        block = queries[list(rows[start : start + QUERY_BLOCK])]
        raw = (block @ flat.T).reshape(len(block), tools, views)
        out[start : start + len(block)] = np.where(corpus.view_mask[None], raw, -np.inf).max(axis=2)
    return out


def calibrate_bands(corpus: CorpusVectors, queries: npt.NDArray[np.float32] | None = None) -> Bands:
    """The match bands for these query vectors (default: the corpus's own), from its check part.

    `strong`: the best tool of another source's catalog (one that cannot serve the request; each
    source apart, so catalogs of 28 to 4,076 tools count) reaches it for one request in twenty.
    `possible`: a tenth of the requests' right tools fall under it, but never above what the best
    tool of another source's catalog reaches for half the requests. A model trained on the corpus's
    other nine tenths brings its right tools closer on these requests than on a catalog it never
    saw, so the tenth alone would call a right tool weak far more often there; half of unrelated
    catalogs' best tools is a cut that training moves far less. `queries` has one row per pair, in
    the corpus's order: the same requests embedded otherwise (another model's query vectors).
    """
    vectors = corpus.queries if queries is None else queries
    if vectors.shape != corpus.queries.shape:
        raise CorpusError(
            f"{vectors.shape[0]} query vectors of {vectors.shape[1]} dimensions for "
            f"{len(corpus.pairs)} pairs of {corpus.queries.shape[1]}: one per pair, in order"
        )
    rows = [i for i, p in enumerate(corpus.pairs) if corpus_part(p.id) == "check"]
    if len(set(corpus.tool_sources)) < 2 or not rows:
        raise CorpusError("calibrating bands needs check pairs and tools of at least two sources")
    similarity = similarities(corpus, rows, vectors)
    owner = np.array(corpus.tool_sources)
    catalogs = {source: owner == source for source in dict.fromkeys(corpus.tool_sources)}
    right: list[float] = []
    foreign: list[float] = []
    for line, row in enumerate(rows):
        pair = corpus.pairs[row]
        right.extend(float(similarity[line, tool]) for tool in pair.relevant)
        foreign.extend(
            float(similarity[line, where].max()) for s, where in catalogs.items() if s != pair.source
        )
    strong = float(np.quantile(foreign, 0.95))
    possible = min(float(np.quantile(right, 0.10)), float(np.quantile(foreign, 0.5)), strong)
    return Bands(strong=round(strong, 3), possible=round(possible, 3))
