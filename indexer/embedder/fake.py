"""A deterministic embedder for tests: hashed bag of words, no model, instant.

Texts that share words get close vectors and identical texts identical ones, so index and cache
logic can be tested in milliseconds. It counts its calls so tests can assert what reached "the model".
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence

import numpy as np

from indexer.embedder.base import Vectors, normalise

_WORD = re.compile(r"\w+")


class FakeEmbedder:
    """Hashes each lower-cased word into one of `dimension` buckets with a sign; rows are normalised."""

    kind = "fake"  # what the status says embeds

    def __init__(self, dimension: int = 64, max_tokens: int = 256) -> None:
        if dimension < 2:
            raise ValueError("dimension must be at least 2")
        self._dimension = dimension
        self._max_tokens = max_tokens
        self._lock = threading.Lock()
        self.calls = 0
        self.texts_embedded = 0

    @property
    def identity(self) -> str:
        """Names the fake and its dimension, so caches never mix it with a real model."""
        return f"fake:bag-of-words:{self._dimension}"

    @property
    def dimension(self) -> int:
        """The vector length given at construction."""
        return self._dimension

    @property
    def max_tokens(self) -> int:
        """The word count given at construction."""
        return self._max_tokens

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One normalised hashed bag-of-words row per text."""
        with self._lock:
            self.calls += 1
            self.texts_embedded += len(texts)
        rows = np.zeros((len(texts), self._dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower()) or [f"\0{text}"]  # no words: still a unit vector
            for word in words:
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                rows[row, value % self._dimension] += 1.0 if value >> 63 else -1.0
            if not rows[row].any():  # the words cancelled out
                rows[row, len(words) % self._dimension] = 1.0
        return normalise(rows)

    def count_tokens(self, text: str) -> int:
        """The number of words in `text`."""
        return len(_WORD.findall(text))
