"""The swappable embedder: the `Embedder` protocol, a sentence-transformers one and a fake for tests.

`SentenceTransformerEmbedder` is imported lazily, so that importing this package (for the protocol
or the fake) does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from indexer.embedder.base import Embedder, EmbedderError, Vectors, normalise
from indexer.embedder.fake import FakeEmbedder

if TYPE_CHECKING:
    from indexer.embedder.sentence import SentenceTransformerEmbedder

__all__ = [
    "Embedder",
    "EmbedderError",
    "FakeEmbedder",
    "SentenceTransformerEmbedder",
    "Vectors",
    "normalise",
]


def __getattr__(name: str) -> Any:
    if name == "SentenceTransformerEmbedder":
        from indexer.embedder.sentence import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
