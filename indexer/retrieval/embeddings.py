"""The embedding cache (memory, then a store) and query micro-batching in front of an `Embedder`.

Vectors are keyed by sha256(identity + "\\0" + text), so a cache never mixes models or weights, and
a health flip or a restart re-embeds nothing already seen.

The second tier is an `EmbeddingStore` of the state backend (`indexer.state`): a SQLite file per
model in `cache_dir` for one indexer, or Redis, shared by replicas. Whichever it is, every vector
read back is checked (the model's dimension, unit norm) and a bad one is re-embedded and
overwritten; a store that cannot be used leaves the cache running from memory.

Model calls are serialised by a gate that lets a waiting query go before the next chunk of a large
document batch, so `find_tool` latency stays low while an index builds; the chunks are smaller while
queries come (indexer/retrieval/model_gate.py). A large batch (a cold start over a big catalog) logs
its progress every few seconds at INFO.

Queries that arrive together share model calls: a query's texts go to the model together, and the
queries that arrive while a call is in flight go together in the next one (up to `QueryPath.batch`
texts), so a lone query never waits for company and a busy indexer makes fewer, larger calls.

An embedder that can be away (an inference server) comes with an `Outage` (indexer/retrieval/outage.py):
a call that meets `EmbedderUnavailable` opens it, and while it is open no call is tried, every call
raising `EmbedderUnavailable` at once, so a find_tool answers from the lexical arm without waiting.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from indexer.embedder.base import Embedder, EmbedderError, EmbedderUnavailable, Vectors
from indexer.retrieval.model_gate import (
    BUSY_DOCUMENT_CHARS,
    DOCUMENT_CHARS,
    QUERIES_RECENT,
    ModelGate,
    padded_chunks,
)
from indexer.retrieval.outage import Outage
from indexer.state.base import EmbeddingStore

_log = logging.getLogger(__name__)

QUERY_BATCH = 64  # query texts per model call: more only delays the first of them
# A query call's padded size (texts x the longest, in characters) at most, beyond its first query.
# Unbounded (64 texts), 32 task instructions sent at once were embedded at a third of the rate one
# query a call gave, one-line requests at 0.6 of it: a large call costs more a text on a CPU
# (docs/performance.md, "Queries batched"). Bounded, the rate is one query a call's or better.
QUERY_CHARS = 1024


PROGRESS_EVERY = 5.0  # seconds between progress lines while a large batch of documents is embedded


class _Progress:
    """Progress lines of one document batch: texts done, of how many, and the rate so far.

    A line every `every` seconds while the model works, and a last one when a batch that logged
    any is done; a batch finished within the first interval (most rebuilds) logs nothing.
    """

    def __init__(self, total: int, every: float) -> None:
        self.total = total
        self.every = every
        self.done = 0
        self.lines = 0
        self.started = time.monotonic()
        self._next = self.started + every

    def advance(self, texts: int) -> None:
        self.done += texts
        now = time.monotonic()
        if now >= self._next and self.done < self.total:
            self._next = now + self.every
            self._say(now)

    def finish(self) -> None:
        if self.lines:
            self._say(time.monotonic())

    def _say(self, now: float) -> None:
        self.lines += 1
        took = max(now - self.started, 1e-9)
        _log.info(
            "embedding: %d of %d texts (%.0f%%), %.0f texts/s, %.0fs so far",
            self.done,
            self.total,
            100 * self.done / self.total,
            self.done / took,
            took,
        )


@dataclass(frozen=True)
class QueryPath:
    """How query texts reach the model, and whether the embedder can be away.

    `items`: query vectors kept (an LRU by text). `batch`: query texts in one model call at most, and
    `chars` its padded size at most (texts x the longest, in characters: a call costs about that, and
    on a CPU a large one costs more a text, not less); `coalesce` off: one query a call. A query's
    texts always go together, in one call, whatever its size. `embed`: the call for query texts (the
    embedder's `embed` by default; a server's within the query deadline). `outage`: for an embedder
    that can be away (an inference server), which document builds heed too.
    """

    items: int = 4096
    batch: int = QUERY_BATCH
    chars: int = QUERY_CHARS
    coalesce: bool = True
    embed: Callable[[Sequence[str]], Vectors] | None = None
    outage: Outage | None = None

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError("a query batch holds at least 1 text")


class Embeddings:
    """Cached, batched access to an embedder: documents from threads, queries from the event loop.

    `embed_documents` is blocking (run it in a worker thread); `embed_query` is a coroutine whose
    model calls run in one dedicated thread. The coroutine side belongs to one event loop. The second
    tier is `store` (the cache closes it), or none.
    """

    def __init__(
        self,
        embedder: Embedder,
        store: EmbeddingStore | None = None,
        memory_items: int = 200_000,
        *,
        document_batch: int = 64,
        document_chars: int = DOCUMENT_CHARS,
        busy_document_chars: int = BUSY_DOCUMENT_CHARS,
        queries_recent: float = QUERIES_RECENT,
        progress_every: float = PROGRESS_EVERY,
        queries: QueryPath = QueryPath(),
    ) -> None:
        if document_batch < 1:
            raise ValueError("document_batch must be at least 1")
        if document_chars < 1 or busy_document_chars < 1:
            raise ValueError("document_chars and busy_document_chars must be at least 1")
        self.embedder = embedder
        self._identity = embedder.identity.encode() + b"\0"
        self._dimension = embedder.dimension
        self._memory_items = memory_items
        self._query_items = queries.items
        self._document_batch = document_batch
        self._document_chars = document_chars
        self._busy_document_chars = busy_document_chars
        self._progress_every = progress_every
        self._lock = threading.Lock()
        self._memory: OrderedDict[bytes, Vectors] = OrderedDict()
        self._store = store
        self._gate = ModelGate(queries_recent)
        self._queries: OrderedDict[str, Vectors] = OrderedDict()
        self._query_batch = queries.batch
        self._query_chars = queries.chars
        self._coalesce = queries.coalesce
        self._query_embed = queries.embed or embedder.embed
        self._outage = queries.outage
        self._units: deque[list[str]] = deque()  # queries waiting for the model: their uncached texts
        self._pending: dict[str, asyncio.Future[Vectors]] = {}
        self._in_flight: dict[str, asyncio.Future[Vectors]] = {}
        self._runner: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-query")
        self.model_calls = 0  # embedder.embed calls
        self.texts_embedded = 0  # texts passed to embedder.embed
        self.cache_hits = 0  # distinct texts answered without the model (documents and queries)
        self.cache_misses = 0  # distinct texts that needed the model

    @property
    def identity(self) -> str:
        """The embedder's identity, which every cache key includes."""
        return self.embedder.identity

    @property
    def dimension(self) -> int:
        """The length of every vector returned."""
        return self._dimension

    @property
    def outage(self) -> Outage | None:
        """The embedder's availability, when it can be away (an inference server)."""
        return self._outage

    def key(self, text: str) -> bytes:
        """The cache key of `text` under this embedder: sha256(identity + NUL + text)."""
        return hashlib.sha256(self._identity + text.encode("utf-8", "surrogatepass")).digest()

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, (n, dimension) float32; only texts never seen before reach the model.

        Blocking. Misses are embedded longest first in chunks of at most `document_batch` texts and
        `document_chars` padded characters (`busy_document_chars` while queries come; a text longer
        than that is a chunk alone), each stored as it comes, so an interrupted build keeps what it
        paid for and a query waits one chunk at most.
        """
        keys = [self.key(text) for text in texts]
        unique = dict(zip(keys, texts, strict=True))
        found: dict[bytes, Vectors] = {}
        with self._lock:
            for key in unique:
                vector = self._memory.get(key)
                if vector is not None:
                    self._memory.move_to_end(key)
                    found[key] = vector
        if self._store is not None and len(found) < len(unique):
            stored = self._store.get([key for key in unique if key not in found])
            rejected = 0
            for key, blob in stored.items():
                vector = self._from_blob(blob)
                if vector is None:
                    rejected += 1
                else:
                    found[key] = vector
            if rejected:
                _log.warning("embedding cache: %d stored vectors were malformed; re-embedding them", rejected)
            self._remember({key: found[key] for key in stored if key in found})
        missing = [key for key in unique if key not in found]
        with self._lock:
            self.cache_hits += len(unique) - len(missing)
            self.cache_misses += len(missing)
        lengths = [len(unique[key]) for key in missing]
        progress = _Progress(len(missing), self._progress_every)
        for rows in padded_chunks(lengths, self._document_batch, self._chunk_chars):
            chunk = [missing[row] for row in rows]
            vectors = self._embed([unique[key] for key in chunk], query=False)
            fresh = {key: self._frozen(vector) for key, vector in zip(chunk, vectors, strict=True)}
            found.update(fresh)
            self._remember(fresh)
            if self._store is not None:
                self._store.put([(key, vector.tobytes()) for key, vector in fresh.items()])
            progress.advance(len(chunk))
        progress.finish()
        result: Vectors = np.empty((len(texts), self._dimension), dtype=np.float32)
        for row, key in enumerate(keys):
            result[row] = found[key]
        return result

    async def embed_query(self, text: str) -> Vectors:
        """The (dimension,) vector of one query text; see `embed_query_texts`."""
        (vector,) = await self.embed_query_texts([text])
        return vector

    async def embed_query_texts(self, texts: Sequence[str]) -> list[Vectors]:
        """The vectors of one query's texts (`query_texts`), each from the LRU or from a model call.

        The query's texts not cached go to the model together. When no model call is in flight one
        starts at once, so a lone query waits for nothing; queries arriving meanwhile are gathered
        into the next call, up to the `QueryPath`'s `batch` texts (with batching off, one query a call). So a
        query waits at most for the call in flight, then its own. Raises `EmbedderUnavailable` when
        the embedder cannot answer now (its outage is open, or the call failed so).
        """
        outage = self._outage
        if outage is not None and outage.down and any(text not in self._queries for text in texts):
            raise outage.error()  # no call while it is away: the lexical arm answers at once
        futures: list[asyncio.Future[Vectors]] = []
        unit: list[str] = []
        for text in texts:
            cached = self._queries.get(text)
            if cached is not None:
                self._queries.move_to_end(text)
                self._count_lookup(hit=True)
                future = asyncio.get_running_loop().create_future()
                future.set_result(cached)
                futures.append(future)
                continue
            shared = self._in_flight.get(text) or self._pending.get(text)
            self._count_lookup(hit=shared is not None)
            if shared is None:
                shared = asyncio.get_running_loop().create_future()
                shared.add_done_callback(_retrieve)
                self._pending[text] = shared
                unit.append(text)
            futures.append(shared)
        if unit:
            self._units.append(unit)
            if self._runner is None or self._runner.done():
                self._runner = asyncio.create_task(self._run_queries(), name="embed-queries")
        # shielded: one waiter's cancellation must not cancel the answer others wait for
        return [await asyncio.shield(future) for future in futures]

    def _next_batch(self) -> dict[str, asyncio.Future[Vectors]]:
        """The next model call's texts: whole queries in their order of arrival, up to the batch's
        texts (at least one query), or one query alone when batching across queries is off."""
        texts: list[str] = []
        longest = 0
        while self._units:
            unit = self._units[0]
            widest = max(longest, *map(len, unit))
            padded = (len(texts) + len(unit)) * widest  # what the call costs: every text padded to it
            if texts and (
                not self._coalesce or len(texts) + len(unit) > self._query_batch or padded > self._query_chars
            ):
                break
            self._units.popleft()
            texts += unit
            longest = widest
        return {text: self._pending.pop(text) for text in texts}

    async def _run_queries(self) -> None:
        loop = asyncio.get_running_loop()
        while self._units:
            batch = self._next_batch()
            self._in_flight = batch
            try:
                vectors = await loop.run_in_executor(self._executor, self._embed, list(batch), True)
            except asyncio.CancelledError:
                for future in itertools.chain(batch.values(), self._pending.values()):
                    future.cancel()
                self._pending.clear()
                self._units.clear()
                raise
            except Exception as exc:
                for future in batch.values():
                    if not future.done():
                        future.set_exception(exc)
                continue
            finally:
                self._in_flight = {}
            for (text, future), vector in zip(batch.items(), vectors, strict=True):
                frozen = self._frozen(vector)
                self._queries[text] = frozen
                if not future.done():
                    future.set_result(frozen)
            while len(self._queries) > self._query_items:
                self._queries.popitem(last=False)

    def _chunk_chars(self) -> int:
        """The padded size of the next document chunk: small while queries come."""
        return self._busy_document_chars if self._gate.queries_coming() else self._document_chars

    def _embed(self, texts: list[str], query: bool) -> Vectors:
        outage = self._outage
        with self._gate.hold(query):
            if outage is not None and outage.down:
                raise outage.error()  # a call waiting for the gate when the outage began
            try:
                vectors = (self._query_embed if query else self.embedder.embed)(texts)
            except EmbedderUnavailable as exc:
                if outage is not None:
                    outage.failed(exc)
                raise
        with self._lock:
            self.model_calls += 1
            self.texts_embedded += len(texts)
        array = np.asarray(vectors, dtype=np.float32)
        if array.shape != (len(texts), self._dimension):
            raise EmbedderError(
                f"embedder {self.embedder.identity} returned shape {array.shape} "
                f"for {len(texts)} texts of dimension {self._dimension}"
            )
        if not _unit_rows(array).all():
            raise EmbedderError(
                f"embedder {self.embedder.identity} returned vectors that are not unit length"
            )
        return array

    def _from_blob(self, blob: bytes) -> Vectors | None:
        if not isinstance(blob, bytes) or len(blob) != self._dimension * 4:
            return None
        vector = np.frombuffer(blob, dtype=np.float32)
        return vector if _unit_rows(vector[None, :])[0] else None  # read-only: a view of bytes

    @staticmethod
    def _frozen(vector: Vectors) -> Vectors:
        # a copy, so one cached row does not pin its whole batch; read-only, since callers share it
        row = np.array(vector, dtype=np.float32)
        row.flags.writeable = False
        return row

    def _remember(self, vectors: dict[bytes, Vectors]) -> None:
        if self._memory_items <= 0 or not vectors:
            return
        with self._lock:
            self._memory.update(vectors)
            for key in vectors:
                self._memory.move_to_end(key)
            while len(self._memory) > self._memory_items:
                self._memory.popitem(last=False)

    def _count_lookup(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self.cache_hits += 1
            else:
                self.cache_misses += 1

    def close(self) -> None:
        """Stop the query thread, close the store (everything embedded is already committed) and the
        embedder's connections, if it holds any (an inference server's client)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            self._store.close()
        closer = getattr(self.embedder, "close", None)
        if callable(closer):
            closer()


def _unit_rows(array: Vectors) -> npt.NDArray[np.bool_]:
    """Which rows are finite and of unit length: what every stored or returned vector must be."""
    with np.errstate(all="ignore"):
        norms = np.einsum("ij,ij->i", array, array)
    unit: npt.NDArray[np.bool_] = np.isfinite(norms) & (np.abs(norms - 1.0) < 1e-3)
    return unit


def _retrieve(future: asyncio.Future[Vectors]) -> None:
    # marks the exception as seen when every waiter has gone, so asyncio does not log it as lost
    if not future.cancelled():
        future.exception()
