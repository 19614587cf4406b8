"""What each tool and each server brings to an index, whatever the rest of the catalog: terms and vectors.

A tool's document depends on its definition and backend alone, and a server's on its tools and what
it says of itself, so a build over tools seen before reuses them (the indexer's `Builder` memoises
them per tool) instead of deriving the text, counting tokens and looking the embeddings up again.
`indexer.search` concatenates them into an index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from indexer.retrieval.text import (
    document_chunks,
    document_texts,
    estimate_word_pieces,
    lexical_tokens,
    server_text,
)

FloatArray = npt.NDArray[np.float32]  # vectors and scores alike


@dataclass(frozen=True, eq=False)
class ToolDocument:
    """What one tool brings to an index whatever the rest of the catalog: its BM25 terms and view vectors.

    It depends on the tool's definition and backend alone, so a build over tools seen before reuses
    it instead of deriving the text, counting tokens and looking the embeddings up again.
    """

    terms: tuple[str, ...]
    vectors: FloatArray  # one read-only row per view (`document_views`)


def tool_documents(
    definitions: Sequence[Mapping[str, Any]],
    backends: Sequence[str],
    embed_documents: Callable[[Sequence[str]], np.ndarray],
    count_tokens: Callable[[str], int] = estimate_word_pieces,
    max_tokens: int = 256,
) -> list[ToolDocument]:
    """Each tool's terms and view vectors, the views of all of them embedded in one call.

    `count_tokens` and `max_tokens` are the embedder's, so that views are cut to what it reads.
    """
    counts: dict[str, int] = {}

    def count(text: str) -> int:
        # chunking counts some texts twice (a text, then the same words joined again): once is enough
        known = counts.get(text)
        if known is None:
            known = counts[text] = count_tokens(text)
        return known

    texts = [document_texts(d, b, count, max_tokens) for d, b in zip(definitions, backends, strict=True)]
    vectors = np.asarray(embed_documents([view for views, _ in texts for view in views]), np.float32)
    documents: list[ToolDocument] = []
    start = 0
    for views, lexical in texts:
        # a copy per tool: a view into the shared array would keep every other tool's rows alive
        rows = vectors[start : start + len(views)].copy()
        rows.flags.writeable = False
        start += len(views)
        documents.append(ToolDocument(tuple(lexical_tokens([lexical])), rows))
    return documents


@dataclass(frozen=True, eq=False)
class ServerDocument:
    """One backend read as a unit (`server_text`): its BM25 terms and view vectors."""

    backend: str
    terms: tuple[str, ...]
    vectors: FloatArray  # one read-only row per view


def server_documents(
    definitions: Sequence[Mapping[str, Any]],
    backends: Sequence[str],
    embed_documents: Callable[[Sequence[str]], np.ndarray],
    about: Mapping[str, str] | None = None,
    count_tokens: Callable[[str], int] = estimate_word_pieces,
    max_tokens: int = 256,
) -> list[ServerDocument]:
    """Each distinct backend's document: its text cut into views the model reads whole, embedded at once.

    `about[backend]` is what the server says of itself (its title, description, instructions), when
    known. The terms are the server's text's own, not its tools' whole texts: BM25 over a server
    then weighs what the server is for, not how long its parameter lists are.
    """
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for definition, backend in zip(definitions, backends, strict=True):
        grouped.setdefault(backend, []).append(definition)
    texts = {b: server_text(b, tools, (about or {}).get(b, "")) for b, tools in sorted(grouped.items())}
    views = {b: document_chunks(text, head, count_tokens, max_tokens) for b, (head, text) in texts.items()}
    vectors = np.asarray(embed_documents([v for chunks in views.values() for v in chunks]), np.float32)
    out: list[ServerDocument] = []
    start = 0
    for backend, chunks in views.items():
        rows = vectors[start : start + len(chunks)].copy()
        rows.flags.writeable = False
        start += len(chunks)
        out.append(ServerDocument(backend, tuple(lexical_tokens([texts[backend][1]])), rows))
    return out
