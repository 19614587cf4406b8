"""A query as the search reads it: the words asked, the keywords, and each need with its vector.

A query is embedded as its whole text, then each of its needs when it states several
(`query_texts`). The search scores every need with both arms, so each need's text and its vector
travel together in a `Need`: nothing relies on row i of a stacked matrix being need i. The finder
embeds the texts and pairs them itself; a caller holding the vectors of `query_texts` in order
(eval, the benchmarks, the tests) pairs them with `Query.embedded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from indexer.retrieval.documents import FloatArray
from indexer.retrieval.text import query_texts


@dataclass(frozen=True, eq=False, slots=True)
class Need:
    """One text of a query, as embedded, and its vector (shape (d,))."""

    text: str
    vector: npt.NDArray[np.floating]


@dataclass(frozen=True, eq=False, slots=True)
class Query:
    """What a search is asked: the query as typed, its keywords, and its needs, whole query first.

    `needs[0]` is the whole query (`query_text`: the text, else the keywords); any further needs are
    the sentences and steps `query_needs` finds, each scored on its own and mixed in.
    """

    text: str  # as the caller typed it: the lexical arm and exact names read it whole
    keywords: tuple[str, ...]
    needs: tuple[Need, ...]

    def __post_init__(self) -> None:
        if not self.needs:
            raise ValueError("a query needs at least its whole text's vector")

    @classmethod
    def embedded(cls, text: str, vectors: npt.ArrayLike, keywords: Sequence[str] = ()) -> Query:
        """A query from the vectors of its `query_texts`, in order: shape (d,) or (m, d).

        Vectors of the whole query alone (one row) make a query of its whole text alone, even when
        the text states several needs: such a caller is answered from the whole query. Any other
        count that is not one vector per text is refused, rather than a need read with another's
        vector.
        """
        texts = query_texts(text, keywords)
        rows = np.atleast_2d(np.asarray(vectors))
        if rows.shape[0] == 1:
            texts = texts[:1]
        elif rows.shape[0] != len(texts):
            raise ValueError(f"{rows.shape[0]} vectors for the {len(texts)} texts query_texts gives")
        needs = tuple(Need(need, row) for need, row in zip(texts, rows, strict=True))
        return cls(text, tuple(keywords), needs)

    @property
    def texts(self) -> list[str]:
        return [need.text for need in self.needs]

    def matrix(self) -> FloatArray:
        """The needs' vectors stacked in their order, as FAISS reads them (contiguous float32)."""
        return np.ascontiguousarray(np.vstack([need.vector for need in self.needs]), dtype=np.float32)
