"""Answering find_tool: embed the query, search the session's current version, say how well it matched.

Each tool found carries its server (the backend id, and the server's own title and description
from its initialize result) and a match band. An answer also names the session's backends that are
down or rejected its credentials, and one whose every match is weak says plainly that nothing here
fits, so that a model does not keep looking for a tool that cannot be had right now. Empty answers
say why.

The answer is a `Found` (toolsearch/found.py), the value both sides of the link know:
indexer/api/messages.py turns it into the wire's `FindToolsResponse`, so the search stays free of
protobuf.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from indexer.backends.registry import Registry
from indexer.embedder.base import EmbedderUnavailable
from indexer.errors import InvalidRequest
from indexer.retrieval.bands import UNTRAINED_BANDS, Bands, match_band
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import IndexVersion, VersionPool
from indexer.retrieval.query import Need, Query
from indexer.retrieval.search import Method
from indexer.retrieval.text import query_texts
from indexer.sessions.views import LiveSession
from indexer.state.listings import ServerInfo
from indexer.traces import tracer
from toolsearch.answers import SERVER_DESCRIPTION_CHARS, compact_definition, estimate_tokens, trim
from toolsearch.found import Found, FoundTool, TokenMetrics, UnavailableBackend
from toolsearch.sections.indexer_settings import Search
from toolsearch.sessions import VersionRef

MAX_KEYWORDS = 32


def server_title(info: ServerInfo) -> str:
    """A server's own name for itself: its title, else its name."""
    return info.title or info.name


def server_description(info: ServerInfo) -> str:
    """What a server says it is for: its description, else the start of its instructions."""
    return trim(info.description or info.instructions, SERVER_DESCRIPTION_CHARS)


def lexical_band(match: float) -> str:
    """The band of a hit found by words alone: an exact name is strong; for the rest no similarity was
    measured, so none is called strong or weak."""
    return "strong" if match >= 1.0 else "possible"


def lexical_note(reason: str, unavailable: Sequence[UnavailableBackend]) -> str:
    """What an answer from the lexical arm alone says: why, and what that means for the matches."""
    note = (
        f"Matched by words alone: the embedding model is unavailable right now ({reason}). These tools "
        "share words with the task; how closely each fits was not measured. Describe the task with the "
        "words a tool would use, or try again shortly."
    )
    return note + unavailable_said(unavailable)


def unavailable_said(unavailable: Sequence[UnavailableBackend]) -> str:
    """What a note adds about the session's backends that cannot be used now ("" when none)."""
    if not unavailable:
        return ""
    named = ", ".join(f"{u.backend_id} ({u.status})" for u in unavailable)
    return f" Unavailable right now, so their tools cannot be found or called: {named}."


class Finder:
    """Searches sessions' versions; holds the query embedder, its match bands and the search settings."""

    def __init__(
        self,
        embeddings: Embeddings,
        registry: Registry,
        pool: VersionPool,
        search: Search,
        bands: Bands = UNTRAINED_BANDS,
    ) -> None:
        self._embeddings = embeddings
        self._bands = bands  # calibrated for the model that embeds the queries: each model has its own
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

    @staticmethod
    def _weak_note(unavailable: Sequence[UnavailableBackend]) -> str:
        note = (
            "Nothing here fits this task: no tool matches it strongly, or even possibly; the tools "
            "below are only the closest and probably cannot do it. Do without a tool, or describe the "
            "task differently."
        )
        return note + unavailable_said(unavailable)

    def _unavailable(self, session: LiveSession) -> list[UnavailableBackend]:
        """The session's backends whose tools cannot be found now: down, or refusing its credentials."""
        out = []
        accepted = session.record.accepted
        for backend_id in sorted(b for b in self._registry.unadvertised if b in accepted):
            state = self._registry.states.get(backend_id)
            if state is not None:
                info = state.listing.server if state.listing is not None else ServerInfo()
                out.append(UnavailableBackend(backend_id, state.status, server_title(info)))
        out.extend(
            UnavailableBackend(backend_id, "rejected")
            for backend_id in sorted(session.record.rejected_at_creation)
        )
        return out

    async def _needs(self, version: IndexVersion, texts: list[str]) -> tuple[tuple[Need, ...], str]:
        """Each query text with its vector; or, when the embedder cannot give them now (or the version
        was built without vectors), the whole query with a zero placeholder and the reason why."""
        reason = ""
        if version.dense:
            try:
                with tracer.start_as_current_span("embed query") as span:
                    span.set_attribute("toolsearch.texts", len(texts))  # how many, never what
                    rows = await self._embeddings.embed_query_texts(texts)
                # each text with its own vector: the search scores every need with both arms
                return tuple(Need(text, row) for text, row in zip(texts, rows, strict=True)), ""
            except EmbedderUnavailable as exc:
                reason = str(exc)
        else:
            outage = self._embeddings.outage
            reason = (outage.reason if outage is not None else "") or (
                "the embedding model was unavailable when this catalog was indexed; its vectors are "
                "being computed"
            )
        if self._embeddings.outage is not None:
            self._embeddings.outage.answered_lexically()
        placeholder = np.zeros(version.dimension, dtype=np.float32)
        return (Need(texts[0], placeholder),), reason

    async def find(
        self, session: LiveSession, query: str, keywords: Sequence[str], limit: int, compact: bool = False
    ) -> Found:
        """The best tools of the session's current version for a query; `compact` trims definitions."""
        limit = self._check(query, keywords, limit)
        snapshot = session.current  # read once: the whole answer comes from this version
        version = snapshot.version
        tools: list[FoundTool] = []
        empty_reason = ""
        lexical = ""  # why the answer comes from the lexical arm alone, when it does
        if not version.tools:
            empty_reason = self._empty_reason(session)
        elif not query.strip() and not any(k.strip() for k in keywords):
            empty_reason = "the query is empty: describe the task in tool_description"
        else:
            # the whole query, then each sentence of a long one; concurrent queries share model calls
            texts = query_texts(query, keywords)
            needs, lexical = await self._needs(version, texts)
            with tracer.start_as_current_span("search") as span:
                method: Method = "lexical" if lexical else "hybrid"
                hits = version.find_hits(Query(query, tuple(keywords), needs), limit, method)
                span.set_attributes(
                    {
                        "toolsearch.index_version": f"v{snapshot.number}/{version.fingerprint[:12]}",
                        "toolsearch.hits": len(hits),
                        "toolsearch.lexical_only": bool(lexical),
                    }
                )
            for tool, hit in hits:
                info = version.server(tool.backend_id)
                definition_json = tool.definition_json
                if compact:
                    definition_json = json.dumps(
                        compact_definition(json.loads(definition_json)),
                        ensure_ascii=False,
                        separators=(",", ":"),
                    )
                tools.append(
                    FoundTool(
                        name=tool.name,
                        backend_id=tool.backend_id,
                        definition_json=definition_json,
                        score=hit.score,
                        server_title=server_title(info),
                        server_description=server_description(info),
                        match=lexical_band(hit.match) if lexical else match_band(hit.match, self._bands),
                        relevance=hit.match,
                    )
                )
            if not hits:
                empty_reason = "no tool matched the query closely enough: describe the task differently"
        unavailable = self._unavailable(session)
        weak = tools and all(tool.match == "weak" for tool in tools)
        note = self._weak_note(unavailable) if weak else ""
        if lexical:
            note = lexical_note(lexical, unavailable)
        baseline = version.baseline_tokens
        returned = sum(estimate_tokens(t.definition_json) for t in tools)
        savings = round(100.0 * (1 - returned / baseline), 2) if baseline else 0.0
        return Found(
            version=VersionRef(snapshot.number, version.fingerprint),
            tools=tuple(tools),
            unavailable=tuple(unavailable),
            token_metrics=TokenMetrics(baseline, returned, savings),
            empty_reason=empty_reason,
            note=note,
        )
