"""Hybrid retrieval over one index version: dense (FAISS) and lexical (BM25), fused by standardised score.

Each arm scores every tool: the dense arm as the best inner product between the query and the
tool's views (FAISS over normalised vectors), the lexical arm with BM25 (bm25s) over the tool text
plus any keywords. Each arm's scores are standardised over the catalog (z-scores) and combined with
the configured weights, so a tool far ahead in one arm stays ahead after fusion whatever the other
arm says, and every tool gets a score: the answer is always filled to `limit`. Exact names go first.

A caller's allowed set (`Allowed`, a mask over the tools) acts inside both arms, before anything is
standardised: the z-scores, the backend and server lifts, the exact names and the `limit` are all
over the tools it may use, as an index of its own over them would rank them, while the index itself
stays the catalog's, shared by every caller (docs/authorization.md, "Enforced inside the search").

A query that states several needs is scored need by need as well as whole: each need gets both arms
of its own, and a tool's score mixes the whole query's with its best need's. Where the catalog has
several backends, each server is also scored as a unit (its own text: name, what it says of itself,
a line per tool), and that score lifts its tools, as hierarchical server-then-tool routing does.
docs/retrieval.md has the measurements behind the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import bm25s
import faiss
import numpy as np
import numpy.typing as npt

from indexer.retrieval.documents import (
    FloatArray,
    ServerDocument,
    ToolDocument,
    server_documents,
    tool_documents,
)
from indexer.retrieval.lifts import (
    BackendLift,
    Mask,
    ServerArm,
    inner_products,
    run_starts,
    server_arm,
    standardise,
    standardise_rows,
)
from indexer.retrieval.query import Query
from indexer.retrieval.text import estimate_word_pieces, lexical_tokens, name_key

Method = Literal["hybrid", "dense", "lexical"]
MAX_NAME_CHARS = 200  # longer queries are descriptions, never looked up as names


@dataclass(frozen=True)
class SearchSettings:
    """How the arms are weighed; the defaults are tuned (docs/retrieval.md)."""

    dense_weight: float = 0.7
    lexical_weight: float = 0.3
    min_score: float | None = None  # hits below it are dropped, but never the best one
    sentence_weight: float = 0.6  # share of a multi-need query's score from its best need
    backend_weight: float = 0.2  # lift toward the tools of the backends that match best
    server_weight: float = (
        0.3  # lift by how well a tool's server, read as a unit, matches (with the backend lift)
    )
    server_lexical_share: float = 0.3  # of the server score, the share of BM25 over the server's text
    bm25_k1: float = 1.2
    bm25_b: float = 0.75


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: the tool's position in the index, its fused score, and how well it matches.

    `match` is the tool's best cosine similarity with the query or any of its needs (the best view):
    it depends on the query and the tool alone, not on the rest of the catalog, so a band means the
    same over 14 tools and over 2,000. An exact name is always strong (`match` 1). `need` is the
    position in `Query.needs` of the need the tool serves best, so that a second stage reads the
    tool beside the words it serves, and an answer can say which needs found a tool.
    """

    position: int
    score: float
    match: float = 0.0
    need: int = 0  # the query's need it serves best (`best_needs`; 0: the whole query, of one need)
    exact: bool = False  # named exactly by the query: first whatever any stage scores


class SearchIndex:
    """Both arms over one tool set. Immutable after `build`; safe to search from several threads."""

    def __init__(
        self,
        settings: SearchSettings,
        size: int,
        dense: Any,
        view_starts: npt.NDArray[np.int64],
        lexical: Any,
        exact: Mapping[str, tuple[int, ...]],
        backends: BackendLift | None,
        servers: ServerArm | None = None,
        terms: Sequence[Sequence[str]] = (),
    ) -> None:
        """Use `build`; this only stores what it made."""
        self.settings = settings
        self.size = size
        self._dense = dense
        # the vectors FAISS holds, as an array without a copy: valid as long as `dense` lives
        self._stored: FloatArray = faiss.rev_swig_ptr(dense.get_xb(), dense.ntotal * dense.d).reshape(
            dense.ntotal, dense.d
        )
        self._view_starts = view_starts
        self._lexical = lexical
        self._vocabulary: dict[str, int] = dict(lexical.vocab_dict) if lexical is not None else {}
        self._exact = exact
        self._backends = backends
        self._servers = servers
        self._terms = terms  # each tool's BM25 terms, for the second stage

    def views(self, position: int) -> FloatArray:
        """The view vectors of the tool at `position` (read-only rows of the index)."""
        starts = self._view_starts
        end = int(starts[position + 1]) if position + 1 < len(starts) else self._stored.shape[0]
        rows: FloatArray = self._stored[int(starts[position]) : end]
        return rows

    def terms(self, position: int) -> Sequence[str]:
        """The BM25 terms of the tool at `position`."""
        return self._terms[position]

    def known(self, terms: Iterable[str]) -> int:
        """How many of `terms` some tool of the index holds."""
        return sum(term in self._vocabulary for term in terms)

    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        names: Sequence[str],
        aliases: Sequence[Sequence[str]],
        vectors: np.ndarray,
        settings: SearchSettings,
        owners: np.ndarray | None = None,
        backends: Sequence[str] | None = None,
    ) -> SearchIndex:
        """Index tools: `texts[i]` (lexical text), `names[i]` and `aliases[i]` belong to tool i.

        `vectors` has one row per view; `owners[r]` is the tool of row r (default: one row per tool,
        in order). `backends[i]`, when given, is tool i's backend, for the backend lift.
        """
        terms = [lexical_tokens([text]) for text in texts]
        return cls.from_terms(terms, names, aliases, vectors, settings, owners, backends)

    @classmethod
    def from_terms(
        cls,
        terms: Sequence[Sequence[str]],
        names: Sequence[str],
        aliases: Sequence[Sequence[str]],
        vectors: np.ndarray,
        settings: SearchSettings,
        owners: np.ndarray | None = None,
        backends: Sequence[str] | None = None,
        servers: Sequence[ServerDocument] | None = None,
    ) -> SearchIndex:
        """Index tools whose BM25 terms are known already: `terms[i]` are tool i's (`lexical_tokens`).

        `servers`, when given with `backends`, are the servers' own documents (`server_documents`),
        one per distinct backend, for the server lift. The other arguments are as for `build`.
        """
        size = len(terms)
        if len(names) != size or len(aliases) != size or (backends is not None and len(backends) != size):
            raise ValueError("texts, names, aliases and backends must have one entry per tool")
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        rows = np.arange(size) if owners is None else np.asarray(owners, dtype=np.int64)
        if matrix.ndim != 2 or matrix.shape[0] != rows.shape[0]:
            raise ValueError(f"vectors has shape {matrix.shape}; expected one row per view ({rows.shape[0]})")
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        if size and not np.array_equal(rows[run_starts(rows)], np.arange(size)):
            raise ValueError("every tool needs at least one vector, and owners must be tool positions")
        dense = faiss.IndexFlatIP(matrix.shape[1])
        dense.add(matrix[order])
        lexical = None
        if any(terms):  # bm25s cannot index a corpus without a single term
            lexical = bm25s.BM25(k1=settings.bm25_k1, b=settings.bm25_b, method="lucene")
            lexical.index(terms, show_progress=False)
        exact: dict[str, list[int]] = {}
        for position, (name, others) in enumerate(zip(names, aliases, strict=True)):
            for key in {name_key(name), *(name_key(alias) for alias in others)} - {""}:
                exact.setdefault(key, []).append(position)
        grouped = None
        if backends is not None and settings.backend_weight and len(set(backends)) > 1:
            grouped = BackendLift(backends, settings.backend_weight)
        units = None
        if grouped is not None and servers and settings.server_weight:
            # the server arm is a backend-level signal like the lift: no backends, or no lift, none
            units = server_arm(backends or (), servers)
        return cls(
            settings,
            size,
            dense,
            run_starts(rows) if size else np.zeros(0, dtype=np.int64),
            lexical,
            {key: tuple(positions) for key, positions in exact.items()},
            grouped,
            units,
            terms,
        )

    def _query_rows(self, query: Query) -> FloatArray:
        """The query's need vectors, a row each in the needs' order, checked against the index."""
        queries = query.matrix()
        if queries.shape[1] != self._dense.d:
            raise ValueError(f"query vector has dimension {queries.shape[1]}; the index has {self._dense.d}")
        return queries

    def _dense_rows(self, queries: FloatArray) -> FloatArray:
        """Per query row and tool, the best inner product over the tool's views: shape (rows, tools)."""
        rows: FloatArray = np.maximum.reduceat(
            inner_products(self._stored, queries), self._view_starts, axis=1
        )
        return rows

    def similarities(self, query: Query) -> FloatArray:
        """Per tool, its best cosine with any need of the query: what `Hit.match` reports."""
        best: FloatArray = self._dense_rows(self._query_rows(query)).max(axis=0)
        return best

    def matches(self, query: Query) -> tuple[FloatArray, npt.NDArray[np.intp]]:
        """Per tool, its best cosine with any need of the query, and which need it serves (`best_needs`)."""
        rows = self._dense_rows(self._query_rows(query))
        return rows.max(axis=0), best_needs(rows)

    def dense_scores(self, query: Query) -> FloatArray:
        """Per tool, the best inner product over its views; for a query of several needs a mix of
        the whole query's score and the best need's."""
        rows = self._dense_rows(self._query_rows(query))
        whole: FloatArray = rows[0]
        if rows.shape[0] == 1:
            return whole
        share = np.float32(self.settings.sentence_weight)
        mixed: FloatArray = (np.float32(1.0) - share) * whole + share * rows[1:].max(axis=0)
        return mixed

    def lexical_scores(self, query: str, keywords: Sequence[str]) -> FloatArray:
        """BM25 of every tool for the query's terms and the keywords' terms."""
        terms = [self._vocabulary[t] for t in lexical_tokens([query, *keywords]) if t in self._vocabulary]
        if not terms or self._lexical is None:
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self._lexical.get_scores(terms), dtype=np.float32)

    def _fused_rows(
        self, query: Query, keywords: Sequence[str], allowed: Mask | None = None
    ) -> tuple[FloatArray, tuple[FloatArray, npt.NDArray[np.intp]]]:
        """Per need (the whole query, then each of the others), both arms standardised and weighed.

        A need gets a lexical arm of its own, and, with servers, the lift of each tool's server as
        that need reads it; the whole query's lexical arm reads the query as typed, with keywords.
        Also returns each tool's best cosine over the needs (`Hit.match`) and which need gave it,
        read off the dense rows already computed.
        """
        queries = self._query_rows(query)
        texts = query.texts
        dense = self._dense_rows(queries)
        settings = self.settings
        lexical = np.empty_like(dense)
        for row, text in enumerate(texts):
            lexical[row] = (
                self.lexical_scores(query.text, keywords) if row == 0 else self.lexical_scores(text, ())
            )
        fused: FloatArray = settings.dense_weight * standardise_rows(dense, allowed)
        fused += settings.lexical_weight * standardise_rows(lexical, allowed)
        if self._servers is not None:
            texts = [" ".join([query.text, *keywords]), *texts[1:]]
            servers = None if allowed is None else self._servers.holding(allowed)
            units = self._servers.scores(queries, texts, settings.server_lexical_share, servers)
            fused += np.float32(settings.server_weight) * units[:, self._servers.of]
        return fused, (dense.max(axis=0), best_needs(dense))

    def scores(self, query: Query, method: Method) -> FloatArray:
        """Every tool's score for a query under one method."""
        return self._scored(query, method)[0]

    def _scored(
        self, query: Query, method: Method, allowed: Mask | None = None
    ) -> tuple[FloatArray, tuple[FloatArray, npt.NDArray[np.intp]]]:
        """Every tool's score under one method, its best cosine with the query's needs, and that need;
        with `allowed`, scored over those tools alone (the others -inf)."""
        keywords = [k for k in query.keywords if k.strip()]
        if method == "dense":
            return _only(standardise(self.dense_scores(query), allowed), allowed), self.matches(query)
        if method == "lexical":
            lexical = standardise(self.lexical_scores(query.text, keywords), allowed)
            return _only(lexical, allowed), self.matches(query)
        if method != "hybrid":
            raise ValueError(f"unknown search method {method!r}")
        rows, similarity = self._fused_rows(query, keywords, allowed)
        fused: FloatArray = rows[0]
        if rows.shape[0] > 1:
            share = np.float32(self.settings.sentence_weight)
            fused = (np.float32(1.0) - share) * rows[0] + share * rows[1:].max(axis=0)
        fused = _only(fused, allowed)  # before the lift: it reads a backend's allowed tools alone
        return (fused if self._backends is None else self._backends.lift(fused)), similarity

    def search(
        self, query: Query, limit: int, method: Method = "hybrid", allowed: Mask | None = None
    ) -> list[Hit]:
        """The best `limit` tools, best first: tools named exactly by the query, then by score.

        `allowed`, when given, is the only tools the search sees (one entry per tool): the others are
        neither scored into the rest's standing nor named nor returned. Empty only for an empty
        catalog (or allowed set), an empty query (no words and no keywords) or `limit < 1`.
        """
        text = query.text
        size = self.size if allowed is None else int(np.count_nonzero(allowed))
        if not size or limit < 1 or (not text.strip() and not any(k.strip() for k in query.keywords)):
            return []
        scores, (similarity, need) = self._scored(query, method, allowed)
        named: tuple[int, ...] = ()
        if len(text) <= MAX_NAME_CHARS:
            named = self._exact.get(name_key(text), ())
            if allowed is not None:
                named = tuple(p for p in named if allowed[p])
        named = tuple(sorted(named, key=lambda p: (-scores[p], p)))[:limit]
        ranked = scores.copy()
        ranked[list(named)] = -np.inf
        wanted = min(limit, size) - len(named)
        best = np.arange(self.size)
        if 0 < wanted < self.size:
            best = np.argpartition(-ranked, wanted - 1)[:wanted]
        best = best[np.lexsort((best, -ranked[best]))][: max(wanted, 0)]
        top = float(scores.max())  # an allowed tool's: the others are -inf
        hits = [Hit(p, top + 1.0, 1.0, exact=True) for p in named]
        hits += [Hit(int(p), float(scores[p]), round(float(similarity[p]), 3), int(need[p])) for p in best]
        if self.settings.min_score is not None:
            kept = [h for h in hits if h.score >= self.settings.min_score]
            hits = kept or hits[:1]
        return hits


def _only(scores: FloatArray, allowed: Mask | None) -> FloatArray:
    """The scores of the allowed tools, the others -inf: never ranked, never a backend's best."""
    if allowed is None:
        return scores
    kept: FloatArray = np.where(allowed, scores, np.float32(-np.inf))
    return kept


def best_needs(rows: FloatArray) -> npt.NDArray[np.intp]:
    """Per tool, the need it serves best: of a query of several needs the closest one (1 on), of a
    query of one need the whole query (0). Rows are (needs, tools) cosines, the whole query first.

    The whole query's vector blends every need, so it names none: a tool closest to it is still
    told apart by which of the needs it is closest to.
    """
    if rows.shape[0] == 1:
        return np.zeros(rows.shape[1], dtype=np.intp)
    best: npt.NDArray[np.intp] = rows[1:].argmax(axis=0) + 1
    return best


def index_documents(
    documents: Sequence[ToolDocument],
    names: Sequence[str],
    aliases: Sequence[Sequence[str]],
    settings: SearchSettings,
    backends: Sequence[str] | None = None,
    servers: Sequence[ServerDocument] | None = None,
) -> SearchIndex:
    """An index over tools already derived: their vectors and terms concatenated, FAISS and BM25 built."""
    if not documents:
        raise ValueError("an index needs at least one tool")
    vectors = np.concatenate([document.vectors for document in documents])
    owners = np.repeat(np.arange(len(documents)), [len(document.vectors) for document in documents])
    terms = [document.terms for document in documents]
    return SearchIndex.from_terms(
        terms, names, aliases, vectors, settings, owners=owners, backends=backends, servers=servers
    )


def build_tool_index(
    definitions: Sequence[Mapping[str, Any]],
    backends: Sequence[str],
    names: Sequence[str],
    aliases: Sequence[Sequence[str]],
    embed_documents: Callable[[Sequence[str]], np.ndarray],
    settings: SearchSettings,
    count_tokens: Callable[[str], int] = estimate_word_pieces,
    max_tokens: int = 256,
    about: Mapping[str, str] | None = None,
) -> SearchIndex:
    """Text, views, embeddings and index for tools in one call: `tool_documents`, then `index_documents`.

    The indexer runs the same two steps through its `Builder` (`indexer.index`), which memoises the
    first per tool; `toolsearch eval` and the tests call this, so they measure what the indexer serves.

    `count_tokens` and `max_tokens` are the embedder's, so that views are cut to what it reads;
    `about[backend]` is what a server says of itself, for its server document.
    """
    if not definitions:  # nothing to concatenate: the empty index takes its dimension from the embedder
        return SearchIndex.build(
            [], names, aliases, np.asarray(embed_documents([])), settings, backends=backends
        )
    documents = tool_documents(definitions, backends, embed_documents, count_tokens, max_tokens)
    servers = None
    if settings.server_weight and settings.backend_weight and len(set(backends)) > 1:
        servers = server_documents(definitions, backends, embed_documents, about, count_tokens, max_tokens)
    return index_documents(documents, names, aliases, settings, backends, servers)
