"""The `Embedder` protocol: what the index needs from an embedding model, whichever it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class EmbedderError(Exception):
    """Raised when an embedding model cannot be loaded, or fails to embed texts."""


class EmbedderUnavailable(EmbedderError):
    """The embedder cannot embed now but may later: an inference server down, too slow, or answering
    garbage. The message says which; the indexer answers from the lexical arm meanwhile."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors. Implementations must be safe to call from several threads."""

    @property
    def identity(self) -> str:
        """Names the model and its weights, e.g. `sentence-transformers:all-MiniLM-L6-v2:<digest>`.

        Part of every cache key: two embedders with the same identity must give the same vectors.
        """
        ...

    @property
    def dimension(self) -> int:
        """The length of every vector `embed` returns."""
        ...

    @property
    def max_tokens(self) -> int:
        """How many tokens the model reads of one text; the rest is ignored."""
        ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts`: an (n, dimension) float32 array of L2-normalised rows. Blocking, CPU-bound."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many tokens the model would read of `text` without truncation, comparable to max_tokens."""
        ...


def normalise(vectors: npt.ArrayLike) -> Vectors:
    """Rows scaled to unit L2 norm, as float32; all-zero rows stay zero."""
    array = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    result: Vectors = np.zeros_like(array)
    np.divide(array, norms, out=result, where=norms > 0)
    return result
