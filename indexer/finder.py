"""Answering find_tool: embed the query, search the session's current version, explain empty answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from indexer.embeddings import Embeddings
from indexer.errors import InvalidRequest
from indexer.index import IndexVersion, VersionPool
from indexer.registry import Registry
from indexer.session_views import LiveSession
from indexer.text import query_texts
from toolsearch.config import Search
from toolsearch.v1 import indexer_pb2 as pb

MAX_KEYWORDS = 32


class Finder:
    """Searches sessions' versions; holds the query embedder and the operator's search settings."""

    def __init__(self, embeddings: Embeddings, registry: Registry, pool: VersionPool, search: Search) -> None:
        self._embeddings = embeddings
        self._registry = registry
        self._pool = pool
        self._search = search

    def versions(self) -> list[IndexVersion]:
        return self._pool.versions()

    def _check(self, query: str, keywords: Sequence[str], limit: int) -> int:
        if len(query) > self._search.max_query_chars:
            raise InvalidRequest(
                f"tool_description is {len(query)} characters; the limit is {self._search.max_query_chars}: "
                "describe the task in fewer words"
            )
        if len(keywords) > MAX_KEYWORDS or any(len(k) > 200 for k in keywords):
            raise InvalidRequest(
                f"tool_keywords takes at most {MAX_KEYWORDS} keywords of at most 200 characters"
            )
        if limit == 0:
            return self._search.default_limit
        if limit > self._search.max_limit:
            raise InvalidRequest(f"limit is {limit}; it must be between 1 and {self._search.max_limit}")
        return limit

    def _empty_reason(self, session: LiveSession) -> str:
        accepted = session.record.accepted
        if not accepted:
            return "this session has no tools: every backend rejected its credentials, or none is configured"
        advertised = [b for b in accepted if self._registry.get(b).advertised]
        if not advertised:
            return (
                f"no backend is healthy right now ({len(accepted)} configured for this session): "
                "try again shortly"
            )
        return "the healthy backends of this session offer no tools"

    async def find(
        self, session: LiveSession, query: str, keywords: Sequence[str], limit: int
    ) -> pb.FindToolsResponse:
        """The best tools of the session's current version for a query."""
        limit = self._check(query, keywords, limit)
        snapshot = session.current  # read once: the whole answer comes from this version
        version = snapshot.version
        response = pb.FindToolsResponse(
            version=pb.IndexVersionRef(number=snapshot.number, fingerprint=version.fingerprint)
        )
        baseline = version.baseline_tokens
        if not version.tools:
            response.empty_reason = self._empty_reason(session)
        elif not query.strip() and not any(k.strip() for k in keywords):
            response.empty_reason = "the query is empty: describe the task in tool_description"
        else:
            # the whole query, then each sentence of a long one; concurrent queries share model calls
            texts = query_texts(query, keywords)
            rows = await asyncio.gather(*(self._embeddings.embed_query(text) for text in texts))
            hits = version.find(query, np.vstack(rows), keywords, limit)
            for tool, score in hits:
                response.tools.append(
                    pb.FoundTool(
                        name=tool.name,
                        backend_id=tool.backend_id,
                        definition_json=tool.definition_json,
                        score=score,
                    )
                )
            if not hits:
                response.empty_reason = (
                    "no tool matched the query closely enough: describe the task differently"
                )
        returned = sum(version.by_name[t.name].tokens for t in response.tools)
        response.token_metrics.baseline_tokens = baseline
        response.token_metrics.returned_tokens = returned
        response.token_metrics.savings_percent = (
            round(100.0 * (1 - returned / baseline), 2) if baseline else 0.0
        )
        return response
