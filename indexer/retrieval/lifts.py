"""What the search's fusion is built from: z-scores over the catalog, every inner product of a
query with the stored vectors, and the two lifts a tool gets from its backend (the best score of
its siblings, and its server read as one unit).

indexer/retrieval/search.py says how they are weighed together; docs/retrieval.md measures them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import bm25s
import faiss
import numpy as np
import numpy.typing as npt

from indexer.retrieval.documents import FloatArray, ServerDocument
from indexer.retrieval.text import lexical_tokens

Mask = npt.NDArray[np.bool_]  # one entry per item: True for one that counts

BLOCK_VIEWS = 512  # vectors per block (768 kB at 384 dimensions): small enough to stay in cache


def standardise(scores: FloatArray, among: Mask | None = None) -> FloatArray:
    """Scores as z-scores over the catalog; all zeros when they do not vary (nothing to tell apart).

    `among`: over those items alone (mean and spread theirs), the others 0 (to be masked by the caller).
    """
    if among is not None:
        row: FloatArray = standardise_rows(scores[np.newaxis, :], among)[0]
        return row
    std = float(scores.std())
    if not np.isfinite(std) or std < 1e-9:
        return np.zeros_like(scores)
    standard: FloatArray = ((scores - scores.mean()) / std).astype(np.float32)
    return standard


def standardise_rows(scores: FloatArray, among: Mask | None = None) -> FloatArray:
    """`standardise` applied to each row of a (rows, items) matrix at once."""
    if among is not None:
        some: FloatArray = np.zeros(scores.shape, dtype=np.float32)
        some[:, among] = standardise_rows(scores[:, among])
        return some
    mean = scores.mean(axis=1, keepdims=True)
    std = scores.std(axis=1, keepdims=True)
    flat = ~np.isfinite(std) | (std < 1e-9)
    standard: FloatArray = np.where(flat, 0.0, (scores - mean) / np.where(flat, 1.0, std)).astype(np.float32)
    return standard


def run_starts(labels: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each run of equal labels starts in a sorted label array."""
    starts: npt.NDArray[np.int64] = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]]).astype(np.int64)
    return starts


class BackendLift:
    """Tools grouped by backend, for lifting the siblings of a backend's best-scoring tool."""

    def __init__(self, backends: Sequence[str], weight: float) -> None:
        labels = {backend: label for label, backend in enumerate(sorted(set(backends)))}
        self.of = np.array([labels[b] for b in backends], dtype=np.int64)
        self.order = np.argsort(self.of, kind="stable")
        self.starts = run_starts(self.of[self.order])
        self.weight = np.float32(weight)

    def lift(self, scores: FloatArray) -> FloatArray:
        """Add a share of each backend's best score to each of its tools."""
        best = np.maximum.reduceat(scores[self.order], self.starts)
        lifted: FloatArray = (scores + self.weight * best[self.of]).astype(np.float32, copy=False)
        return lifted


def inner_products(stored: FloatArray, queries: FloatArray) -> FloatArray:
    """Every query row's inner product with every stored vector: shape (rows, vectors).

    Fusion needs every tool's score, so the arm takes every inner product (a top-k search with
    k=ntotal would also sort them) with FAISS's single-threaded kernel over the stored vectors: a
    threaded BLAS product is faster on an idle machine but stalls on a busy one. Rows of a multi-row
    query read the vectors block by block, each block once from memory.
    """
    count, dimension = stored.shape
    by_view = np.empty((queries.shape[0], count), dtype=np.float32)
    step = count if queries.shape[0] == 1 else BLOCK_VIEWS
    for start in range(0, count, step):
        size = min(step, count - start)
        block = faiss.swig_ptr(stored[start : start + size])
        for row, query in enumerate(queries):
            faiss.fvec_inner_products_ny(  # type: ignore[attr-defined]  # the SWIG kernel has no stub
                faiss.swig_ptr(by_view[row, start:]), faiss.swig_ptr(query), block, dimension, size
            )
    return by_view


class ServerArm:
    """Each backend read as one unit, both arms over the servers' own texts, for the server lift."""

    def __init__(
        self, of: npt.NDArray[np.int64], vectors: FloatArray, owners: npt.NDArray[np.int64], terms: Any
    ) -> None:
        self.of = of  # tool -> server label
        order = np.argsort(owners, kind="stable")
        self.vectors = np.ascontiguousarray(vectors[order], dtype=np.float32)
        self.starts = run_starts(owners[order])
        self.lexical: Any = None
        self.vocabulary: dict[str, int] = {}
        if any(terms):
            self.lexical = bm25s.BM25(method="lucene")
            self.lexical.index(terms, show_progress=False)
            self.vocabulary = dict(self.lexical.vocab_dict)
        self.count = len(self.starts)

    def holding(self, tools: Mask) -> Mask:
        """The servers that hold at least one of `tools`."""
        held = np.zeros(self.count, dtype=np.bool_)
        held[self.of[tools]] = True
        return held

    def scores(
        self, queries: FloatArray, texts: Sequence[str], lexical_share: float, among: Mask | None = None
    ) -> FloatArray:
        """Per query row, each server's standardised score: dense (best view) and BM25, mixed;
        `among`: standardised over those servers alone (the others 0)."""
        dense = np.maximum.reduceat(inner_products(self.vectors, queries), self.starts, axis=1)
        lexical = np.zeros_like(dense)
        for row, text in enumerate(texts):
            terms = [self.vocabulary[t] for t in lexical_tokens([text]) if t in self.vocabulary]
            if terms and self.lexical is not None:
                lexical[row] = self.lexical.get_scores(terms)
        mixed: FloatArray = (1 - lexical_share) * standardise_rows(dense, among)
        return mixed + lexical_share * standardise_rows(lexical, among)


def server_arm(backends: Sequence[str], servers: Sequence[ServerDocument]) -> ServerArm:
    """The server arm over `servers`, one document per backend, for tools of `backends`."""
    label = {server.backend: position for position, server in enumerate(servers)}
    if missing := set(backends) - set(label):
        raise ValueError(f"no server document for backends {sorted(missing)[:3]}")
    vectors = np.concatenate([server.vectors for server in servers])
    owners = np.repeat(np.arange(len(servers)), [len(server.vectors) for server in servers])
    of = np.array([label[b] for b in backends], dtype=np.int64)
    return ServerArm(of, vectors, owners.astype(np.int64), [list(server.terms) for server in servers])
