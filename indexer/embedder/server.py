"""An inference server speaking the OpenAI-compatible embeddings API: TEI, Infinity, vLLM, Ollama.

Texts are posted to `<url>/embeddings` (`url` is the API's base URL as OpenAI's clients take it,
e.g. `http://tei:8080/v1`) in batches of `batch_size`, each request within `timeout` seconds. Every
answer is checked before a vector of it is used: one vector per text, each index once, the
dimension the server gave at connection, finite numbers, not all zero; and the model it names must
be the model it named at connection. So a model swapped behind the same URL is refused rather than
mixed with the vectors cached under the other one's name: `identity` is the served model's name as
the server gives it (with the dimension), read at `connect` and checked on every answer. Each
failure raises `ServerUnavailable`, whose message says what was wrong; the indexer then answers from
the lexical arm until the server is back (indexer/retrieval/outage.py).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
import numpy as np

from indexer.embedder.base import EmbedderError, EmbedderUnavailable, Vectors, normalise

MAX_ANSWER_BYTES = 64 * 1024 * 1024  # an answer larger than this is garbage, whatever it holds
PROBE_TEXT = "tool search"  # what `connect` and the outage checks embed


class ServerUnavailable(EmbedderUnavailable):
    """The embedding server is down, too slow, or answered something that is not the vectors asked for."""


@dataclass(frozen=True)
class ServerSettings:
    """Where the server is and how it is asked (the `indexer.embedder` mapping of the configuration)."""

    url: str  # the API's base URL; texts go to <url>/embeddings
    model: str  # the model asked for
    api_key: str | None = None  # sent as a bearer token
    batch_size: int = 32
    timeout: float = 30.0  # seconds for one request
    max_tokens: int = 256  # tokens the served model reads of one text

    @property
    def endpoint(self) -> str:
        return f"{self.url.rstrip('/')}/embeddings"


class ServerEmbedder:
    """Embeds by asking an OpenAI-compatible server; `connect` first, which learns the model and dimension.

    `count_tokens` counts what the served model reads of a text: the project's model folder's
    tokenizer when it is the same model, else an estimate. Safe to call from several threads: the
    HTTP client's pool is shared.
    """

    kind = "server"  # what the status says embeds

    def __init__(self, settings: ServerSettings, count_tokens: Callable[[str], int]) -> None:
        if settings.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.settings = settings
        self._count_tokens = count_tokens
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        # no proxy from the environment: the server is named in the configuration, reached as named
        self._client = httpx2.Client(
            headers=headers, timeout=settings.timeout, trust_env=False, follow_redirects=False
        )
        self._lock = threading.Lock()
        self._served: str | None = None  # the model the server said it serves, at `connect`
        self._dimension = 0

    def connect(self) -> None:
        """Ask the server once: the model it serves and the dimension of its vectors are taken from its
        answer, and every later answer must match them. Raises `ServerUnavailable` saying why not."""
        served, vectors = self._request([PROBE_TEXT], self.settings.timeout, expected=None)
        with self._lock:
            self._served, self._dimension = served, int(vectors.shape[1])

    @property
    def served_model(self) -> str:
        """The model the server said it serves (its own name for it)."""
        if self._served is None:
            raise EmbedderError("the embedding server has not been asked yet: call connect() first")
        return self._served

    @property
    def connected(self) -> bool:
        return self._served is not None

    @property
    def identity(self) -> str:
        """`openai-server:<served model>:<dimension>`: the model the server names, never its URL, so
        replicas of one server share every vector, and two models never do."""
        return f"openai-server:{self.served_model}:{self._dimension}"

    @property
    def dimension(self) -> int:
        """The length of the vectors the server gave at `connect`."""
        if not self.connected:
            raise EmbedderError("the embedding server has not been asked yet: call connect() first")
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    def count_tokens(self, text: str) -> int:
        return self._count_tokens(text)

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts` in requests of `batch_size`: (n, dimension) float32, L2-normalised."""
        return self.embed_within(texts, self.settings.timeout)

    def embed_within(self, texts: Sequence[str], timeout: float) -> Vectors:
        """`embed`, each request within `timeout` seconds."""
        expected = self.served_model
        out = np.empty((len(texts), self._dimension), dtype=np.float32)
        size = self.settings.batch_size
        for start in range(0, len(texts), size):
            _, vectors = self._request(texts[start : start + size], timeout, expected)
            out[start : start + size] = vectors
        return out

    def _request(self, texts: Sequence[str], timeout: float, expected: str | None) -> tuple[str, Vectors]:
        """One request: the model the answer names, and its vectors in the texts' order."""
        if not texts:
            return expected or "", np.zeros((0, self._dimension), dtype=np.float32)
        body = {"model": self.settings.model, "input": list(texts), "encoding_format": "float"}
        where = "the embedding server"
        try:
            with self._client.stream("POST", self.settings.endpoint, json=body, timeout=timeout) as answer:
                raw = _read_bounded(answer)
        except httpx2.TimeoutException:
            raise ServerUnavailable(f"{where} did not answer within {timeout:g}s") from None
        except httpx2.HTTPError as exc:
            raise ServerUnavailable(f"{where} is unreachable: {_error_name(exc)}") from None
        if answer.status_code != 200:
            hint = _status_hint(answer.status_code)
            raise ServerUnavailable(f"{where} answered HTTP {answer.status_code}: {_snippet(raw)}{hint}")
        try:
            document = json.loads(raw)
        except ValueError:
            raise ServerUnavailable(f"{where} answered something that is not JSON: {_snippet(raw)}") from None
        served, vectors = read_answer(document, len(texts), self._dimension or None, where)
        named = served or self.settings.model  # a server that names no model serves the one asked for
        if expected is not None and named != expected:
            raise ServerUnavailable(
                f"{where} now serves model {named!r}, not {expected!r}, whose vectors this indexer holds: "
                f"restart the indexer to embed with {named!r}, or serve {expected!r} again"
            )
        return named, vectors

    def close(self) -> None:
        self._client.close()


def read_answer(document: Any, count: int, dimension: int | None, where: str) -> tuple[str, Vectors]:
    """The model an embeddings answer names and its `count` vectors in input order, normalised.

    Raises `ServerUnavailable` for anything but one vector per text, each index once, every vector
    of `dimension` (when known) finite numbers and not all zero.
    """
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise ServerUnavailable(f"{where} answered JSON without a list of embeddings (`data`)")
    rows: list[list[float] | None] = [None] * count
    for item in document["data"]:
        index = item.get("index") if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < count or rows[index] is not None:
            raise ServerUnavailable(f"{where} answered an embedding with a missing, repeated or wrong index")
        if not isinstance(vector, list) or not vector:
            raise ServerUnavailable(f"{where} answered an embedding that is not a list of numbers")
        rows[index] = vector
    if any(row is None for row in rows):
        got = sum(row is not None for row in rows)
        raise ServerUnavailable(f"{where} answered {got} embeddings for {count} texts")
    width = dimension or len(rows[0] or ())
    if any(len(row or ()) != width for row in rows):
        lengths = sorted({len(row or ()) for row in rows})
        raise ServerUnavailable(f"{where} answered vectors of dimension {lengths}, not {width}")
    try:
        parsed = np.asarray(rows)  # numbers only: a string among them makes another kind of array
    except (TypeError, ValueError):
        parsed = np.asarray([])
    if parsed.dtype.kind not in "fi" or parsed.ndim != 2:
        raise ServerUnavailable(f"{where} answered an embedding that is not a list of numbers")
    with np.errstate(over="ignore", invalid="ignore"):
        array = parsed.astype(np.float32)
        norms = np.linalg.norm(array, axis=1)
    if not np.isfinite(array).all() or not np.all(norms > 0) or not all(map(math.isfinite, norms)):
        raise ServerUnavailable(f"{where} answered vectors that are not finite, or all zero")
    model = document.get("model")
    return (model if isinstance(model, str) else ""), normalise(array)


def _read_bounded(answer: httpx2.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in answer.iter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise ServerUnavailable(f"embedding server answered more than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _snippet(raw: bytes) -> str:
    text = raw[:200].decode("utf-8", "replace").replace("\n", " ").strip()
    return text or "(empty)"


def _status_hint(status: int) -> str:
    if status in (401, 403):
        return " (check the API key: indexer.embedder.api_key_env)"
    if status == 404:
        return " (check indexer.embedder.url, the API's base URL, and indexer.embedder.model)"
    return ""


def _error_name(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
