"""How document builds and queries share the one model: a gate, and chunks sized for who waits.

Model calls are serialised by `ModelGate`, which lets a waiting query go before the next chunk of a
large document batch, so `find_tool` latency stays low while an index builds. `padded_chunks` bounds
a chunk by its padded size in characters as well as by its count, and takes texts longest first, so
that chunk mates pad little. While queries come (one waits, or used the model within the last
second), chunks are a quarter of their size: a query then waits about 20 ms for the chunk in the
model instead of 75 (two threads), for about a quarter more model time per text; a build with
nobody searching keeps the large chunks (docs/performance.md, section 4).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

# a document chunk's padded size (texts x its longest, in characters): about 500 word pieces, about
# 75 ms of the model on two threads, which is as long as a waiting query can wait
DOCUMENT_CHARS = 2048
# while queries come: about 20 ms a chunk (a 2,048-character chunk costs about 75 ms, four of 512
# about 95 ms: the model's fixed cost per call)
BUSY_DOCUMENT_CHARS = 512
QUERIES_RECENT = 1.0  # seconds since a query last used the model during which queries count as coming


class ModelGate:
    """One model call at a time; a waiting query goes before the next document chunk."""

    def __init__(self, recent: float = QUERIES_RECENT) -> None:
        self._condition = threading.Condition()
        self._busy = False
        self._queries_waiting = 0
        self._recent = recent
        self._last_query: float | None = None  # time.monotonic() when a query last took the model

    @property
    def queries_waiting(self) -> int:
        """How many query calls are waiting for the model."""
        with self._condition:
            return self._queries_waiting

    def queries_coming(self) -> bool:
        """Whether a query waits for the model or took it within the last `recent` seconds."""
        with self._condition:
            last = self._last_query
            return self._queries_waiting > 0 or (last is not None and time.monotonic() - last < self._recent)

    @contextlib.contextmanager
    def hold(self, query: bool) -> Iterator[None]:
        """Wait for the model, then hold it for the body."""
        with self._condition:
            self._queries_waiting += query
            try:
                while self._busy or (not query and self._queries_waiting):
                    self._condition.wait()
            finally:
                self._queries_waiting -= query
            self._busy = True
            if query:
                self._last_query = time.monotonic()
        try:
            yield
        finally:
            with self._condition:
                self._busy = False
                self._condition.notify_all()


def padded_chunks(
    lengths: Sequence[int], max_items: int, max_padded: int | Callable[[], int]
) -> Iterator[list[int]]:
    """Positions of `lengths` in chunks, longest first, each chunk's count x its longest <= `max_padded`.

    A model call pads every text to the longest of its batch, so its cost is about count x longest;
    sorted, chunk mates are of like length and little is padding. A text longer than `max_padded`
    goes alone. At most `max_items` per chunk. A callable `max_padded` is asked as each chunk starts,
    so a chunk asked for later may be sized for what is happening then.
    """
    budget = max_padded if callable(max_padded) else lambda: max_padded
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    chunk: list[int] = []
    limit = 0
    for row in order:
        if chunk and (len(chunk) >= max_items or (len(chunk) + 1) * max(lengths[chunk[0]], 1) > limit):
            yield chunk
            chunk = []
        if not chunk:
            limit = budget()
        chunk.append(row)
    if chunk:
        yield chunk
