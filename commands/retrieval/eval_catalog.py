"""A catalog file as the indexer would index it, and the same catalog with some tools taken out.

Each server of the file becomes a backend named by its slug (tools without a server form one
unnamed backend), tools are named as the indexer names them (`indexer.retrieval.tools.advertise`),
and each tool's and each server's document is derived once, as the indexer's `Builder` derives them
(`indexer.retrieval.documents`). An index over any part of the catalog then only concatenates them
and builds FAISS and BM25 (`index_documents`), so `toolsearch eval` can measure a catalog without a
query's tools (abstention) for every query without deriving or embedding anything again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from indexer.retrieval.documents import ServerDocument, server_documents, tool_documents
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.search import SearchIndex, SearchSettings, index_documents
from indexer.retrieval.tools import advertise
from toolsearch.catalog import CatalogTool

KEPT_INDEXES = 64  # indexes over parts of the catalog kept at once (queries sharing their tools share one)


class EvalCatalog:
    """The indexer's documents of a catalog's tools, and indexes over all of them or a part."""

    def __init__(
        self, tools: Sequence[CatalogTool], embeddings: Embeddings, settings: SearchSettings
    ) -> None:
        listings: dict[str, list[dict[str, Any]]] = {}
        owner: dict[tuple[str, str], str] = {}
        for tool in tools:
            backend = tool.server_slug[:64] if tool.server else ""
            listings.setdefault(backend, []).append(tool.definition())
            owner[(backend, tool.name)] = tool.id
        advertised = advertise(listings)
        embedder = embeddings.embedder
        self.settings = settings
        self.definitions = [t.definition for t in advertised]
        self.backends = [t.backend_id for t in advertised]
        self.names = [t.name for t in advertised]
        self.aliases = [
            sorted({t.original_name, f"{t.backend_id}_{t.original_name}"} - {t.name}) for t in advertised
        ]
        self.ids = [owner[(t.backend_id, t.original_name)] for t in advertised]  # tool ids by position
        self.position = {tool_id: position for position, tool_id in enumerate(self.ids)}
        self.documents = tool_documents(
            self.definitions,
            self.backends,
            embeddings.embed_documents,
            embedder.count_tokens,
            embedder.max_tokens,
        )
        self.servers: list[ServerDocument] = []
        if settings.server_weight and settings.backend_weight and len(set(self.backends)) > 1:
            self.servers = server_documents(
                self.definitions,
                self.backends,
                embeddings.embed_documents,
                None,
                embedder.count_tokens,
                embedder.max_tokens,
            )
        self.full = self._build(tuple(range(len(self.ids))))
        self._parts: OrderedDict[frozenset[int], tuple[SearchIndex, tuple[int, ...]]] = OrderedDict()

    @property
    def several_servers(self) -> bool:
        return len(set(self.backends)) > 1

    def without(self, removed: frozenset[int]) -> tuple[SearchIndex, tuple[int, ...]]:
        """An index over the catalog less the tools at `removed`, and the position in the catalog of
        each of its tools; the last `KEPT_INDEXES` are kept for queries that remove the same tools."""
        known = self._parts.get(removed)
        if known is not None:
            self._parts.move_to_end(removed)
            return known
        kept = tuple(p for p in range(len(self.ids)) if p not in removed)
        made = (self._build(kept), kept)
        self._parts[removed] = made
        while len(self._parts) > KEPT_INDEXES:
            self._parts.popitem(last=False)
        return made

    def _build(self, kept: tuple[int, ...]) -> SearchIndex:
        backends = {self.backends[p] for p in kept}
        return index_documents(
            [self.documents[p] for p in kept],
            [self.names[p] for p in kept],
            [self.aliases[p] for p in kept],
            self.settings,
            [self.backends[p] for p in kept],
            [s for s in self.servers if s.backend in backends] or None,
        )
