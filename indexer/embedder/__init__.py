"""The swappable embedder: the `Embedder` protocol, ONNX Runtime and sentence-transformers ones, a fake.

`load_embedder(kind, model_dir, threads)` picks one by its configured name (`indexer.embedder`).
The model runtimes are imported lazily, so that importing this package (for the protocol, the fake
or the factory) loads neither torch nor onnxruntime.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexer.embedder.base import Embedder, EmbedderError, Vectors, normalise
from indexer.embedder.fake import FakeEmbedder

if TYPE_CHECKING:
    from indexer.embedder.onnx import OnnxEmbedder
    from indexer.embedder.sentence import SentenceTransformerEmbedder

# `indexer.embedder` values: the fp32 ONNX export in ONNX Runtime, sentence-transformers on torch
EMBEDDER_KINDS = ("onnx", "torch")
DEFAULT_EMBEDDER = "onnx"
# what `toolsearch eval` can also measure: the export's int8 quantization, not served because it lost
# more than half a point on a shipped set (docs/performance.md); made by `model prepare --int8`
EVAL_KINDS = (*EMBEDDER_KINDS, "onnx-int8")

__all__ = [
    "DEFAULT_EMBEDDER",
    "EMBEDDER_KINDS",
    "EVAL_KINDS",
    "Embedder",
    "EmbedderError",
    "FakeEmbedder",
    "OnnxEmbedder",
    "SentenceTransformerEmbedder",
    "Vectors",
    "load_embedder",
    "normalise",
]


def load_embedder(kind: str, model_dir: Path, threads: int | None = None) -> Embedder:
    """The embedder `kind` (one of EVAL_KINDS) over `model_dir`, with `threads` model threads.

    Raises EmbedderError for an unknown kind, a missing runtime, or a folder or export that does not
    load (each message says which and what to do).
    """
    if kind in ("onnx", "onnx-int8"):
        from indexer.embedder.onnx import OnnxEmbedder

        return OnnxEmbedder(model_dir, variant="fp32" if kind == "onnx" else "int8", threads=threads)
    if kind == "torch":
        from indexer.embedder.sentence import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(model_dir, threads=threads)
    raise EmbedderError(f"unknown embedder {kind!r}: one of {', '.join(EVAL_KINDS)}")


def __getattr__(name: str) -> Any:
    if name == "SentenceTransformerEmbedder":
        from indexer.embedder.sentence import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder
    if name == "OnnxEmbedder":
        from indexer.embedder.onnx import OnnxEmbedder

        return OnnxEmbedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
