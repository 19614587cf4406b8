"""A sentence-transformers model loaded from a local folder, on CPU, never reaching a model hub."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedder.base import EmbedderError, Vectors
from indexer.embedder.batching import default_threads, padding_batches
from indexer.embedder.files import folder_digest

__all__ = [
    "PARALLEL_CHARS",
    "SentenceTransformerEmbedder",
    "default_threads",
    "folder_digest",
    "padding_batches",
]

# A batch of fewer characters runs on one thread: for one query, waking a second thread costs as
# much as it saves (measured: 17.4 ms on one thread, 18.9 on two), while a batch of eight takes 30%
# less time on two.
PARALLEL_CHARS = 600


class SentenceTransformerEmbedder:
    """Embeds with a sentence-transformers model folder on CPU.

    Loading hashes the folder for `identity` (about a third of a second for a 90 MB model) so that
    cached vectors are keyed by the actual weights, not by a folder name. Model calls are serialised:
    on a CPU, two concurrent calls only compete for the same cores. `threads` is torch's thread
    count for a batch of `PARALLEL_CHARS` characters or more (default: `default_threads()`); a smaller
    batch runs on one thread. Torch's count is process-wide: the model is its only user here.
    `batch_size` is texts per forward pass.
    """

    kind = "torch"  # what the status says embeds

    def __init__(self, model_dir: Path, batch_size: int = 64, threads: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not model_dir.is_dir():
            raise EmbedderError(f"model directory {model_dir} not found: run `toolsearch model prepare`")
        if not (model_dir / "modules.json").is_file() and not (model_dir / "config.json").is_file():
            raise EmbedderError(
                f"model directory {model_dir} is not a sentence-transformers model (no modules.json "
                "or config.json): run `toolsearch model prepare`, or configure another folder"
            )
        self._batch_size = batch_size
        self._threads = max(1, threads if threads is not None else default_threads())
        self._model = _load(model_dir, self._threads)
        self._running_threads = self._threads  # torch's count now: set again only when it changes
        self._lock = threading.Lock()
        # a private copy for counting: a fast tokenizer raises "Already borrowed" when one thread
        # changes its truncation settings while another encodes with it
        self._counter = copy.deepcopy(self._model.tokenizer)
        self._counter_lock = threading.Lock()
        dimension = self._model.get_embedding_dimension()
        if not dimension:
            raise EmbedderError(f"model in {model_dir} does not say its embedding dimension")
        self._dimension = int(dimension)
        self._max_tokens = int(self._model.max_seq_length)
        self._identity = f"sentence-transformers:{model_dir.resolve().name}:{folder_digest(model_dir)[:16]}"

    @property
    def identity(self) -> str:
        """`sentence-transformers:<folder name>:<first 16 hex of the folder digest>`."""
        return self._identity

    @property
    def dimension(self) -> int:
        """The model's embedding dimension (384 for all-MiniLM-L6-v2)."""
        return self._dimension

    @property
    def max_tokens(self) -> int:
        """The model's max_seq_length, special tokens included (256 for all-MiniLM-L6-v2)."""
        return self._max_tokens

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts`: (n, dimension) float32, L2-normalised.

        Texts go to the model in batches of like length (`padding_batches`), at most `batch_size`
        each: a forward pass pads every text to its batch's longest, so one batch of a long query and
        short sentences would mostly compute padding.
        """
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        array = np.empty((len(texts), self._dimension), dtype=np.float32)
        try:
            with self._lock:
                lengths = [len(text) for text in texts]
                for rows in padding_batches(lengths, self._batch_size):
                    self._use_threads(
                        1 if sum(lengths[row] for row in rows) < PARALLEL_CHARS else self._threads
                    )
                    vectors = self._model.encode(
                        [texts[row] for row in rows],
                        batch_size=self._batch_size,
                        normalize_embeddings=True,
                        convert_to_numpy=True,
                        show_progress_bar=False,
                    )
                    array[rows] = np.asarray(vectors, dtype=np.float32).reshape(len(rows), -1)
        except Exception as exc:
            raise EmbedderError(f"embedding {len(texts)} texts failed: {exc}") from exc
        return array

    def _use_threads(self, count: int) -> None:
        """Set torch's thread count for the next forward pass (under the model lock)."""
        if count != self._running_threads:
            import torch  # loaded with the model already

            torch.set_num_threads(count)
            self._running_threads = count

    def count_tokens(self, text: str) -> int:
        """Word pieces of `text` including the special tokens the model adds, untruncated."""
        with self._counter_lock:
            encoded = self._counter(text, add_special_tokens=True, truncation=False, verbose=False)
        return len(encoded["input_ids"])


def _load(model_dir: Path, threads: int) -> Any:
    """Load the folder with torch limited to `threads`, offline and without progress bars."""
    try:
        import torch
        import transformers.utils.logging
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbedderError(f"sentence-transformers is not installed: {exc}") from exc
    # process-wide, and what every later model call uses, whichever thread makes it
    torch.set_num_threads(max(1, threads))
    progress: Any = transformers.utils.logging  # untyped
    bars = progress.is_progress_bar_enabled()
    progress.disable_progress_bar()
    try:
        # local_files_only: a folder path must never turn into a hub lookup
        return SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    except Exception as exc:
        raise EmbedderError(f"cannot load the model in {model_dir}: {exc}") from exc
    finally:
        if bars:
            progress.enable_progress_bar()
