"""Answering find_tool: embed the query, search the session's current version, say how well it matched.

Each tool found carries its server (the backend id, and the server's own title and description
from its initialize result) and a match band: the second stage's (a trained fit model reading the first
stage's best candidates again, `indexer.retrieval.second_stage`) when the indexer runs one, else the
first stage's cosine. An answer also names the session's backends that are down or rejected its
credentials; one whose every match is weak says plainly that nothing here fits, so that a model
does not keep looking for a tool that cannot be had right now, and one that serves some needs of a
task and not others says which (`indexer.retrieval.verdict`). Empty answers say why.

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
from indexer.retrieval.allowed import Scoped
from indexer.retrieval.bands import UNTRAINED_BANDS, Bands
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import IndexVersion, VersionPool
from indexer.retrieval.query import Need, Query
from indexer.retrieval.second_stage import Judged, SecondStage, first_stage
from indexer.retrieval.text import query_texts
from indexer.retrieval.verdict import nothing_fits_note, partial_note, verdict
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
        stage: SecondStage | None = None,
    ) -> None:
        self._embeddings = embeddings
        self._bands = bands  # calibrated for the model that embeds the queries: each model has its own
        self._stage = stage  # the second stage, when the indexer runs one: its chances band the tools
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

    def _judged(self, version: Scoped, query: Query, limit: int, lexical: bool) -> list[Judged]:
        """The answer's tools: the first stage's best, then the second stage's reading when it runs;
        `lexical` when the query has no vectors, so only words were matched.

        The second stage reads beyond `limit` (`SecondStage.candidates`): a few numpy products over
        vectors the version holds, microseconds, so it runs where the first stage does.
        """
        if lexical:  # no similarity was measured, for the bands or for the second stage to read
            found = version.find_hits(query, limit, "lexical")
            return [Judged(hit, hit.match, lexical_band(hit.match)) for _, hit in found]
        index = version.version.search_index
        if self._stage is None or index is None:
            return first_stage([hit for _, hit in version.find_hits(query, limit)], self._bands)
        hits = [hit for _, hit in version.find_hits(query, self._stage.candidates(limit))]
        return self._stage.judge(index, query, hits, limit)

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
        scoped = snapshot.scoped  # the shared version, cut to what the caller may use inside the search
        version = snapshot.version
        tools: list[FoundTool] = []
        empty_reason = note = ""
        lexical = ""  # why the answer comes from the lexical arm alone, when it does
        if not scoped.tools:
            empty_reason = self._empty_reason(session)
        elif not query.strip() and not any(k.strip() for k in keywords):
            empty_reason = "the query is empty: describe the task in tool_description"
        else:
            # the whole query, then each sentence of a long one; concurrent queries share model calls
            texts = query_texts(query, keywords)
            needs, lexical = await self._needs(version, texts)
            asked = Query(query, tuple(keywords), needs)
            with tracer.start_as_current_span("search") as span:
                judged = self._judged(scoped, asked, limit, lexical=bool(lexical))
                span.set_attributes(
                    {
                        "toolsearch.index_version": f"v{snapshot.number}/{snapshot.fingerprint[:12]}",
                        "toolsearch.hits": len(judged),
                        "toolsearch.lexical_only": bool(lexical),
                    }
                )
            found = verdict(asked, judged)
            note = nothing_fits_note() if found.nothing_fits else partial_note(asked, found)
            for judgement in judged:
                hit = judgement.hit
                tool = version.tools[hit.position]
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
                        match=judgement.band,
                        relevance=judgement.fit,
                    )
                )
            if not judged:
                empty_reason = "no tool matched the query closely enough: describe the task differently"
        unavailable = self._unavailable(session)
        if lexical:
            note = lexical_note(lexical, unavailable)
        elif note:
            note += unavailable_said(unavailable)
        baseline = scoped.baseline_tokens
        returned = sum(estimate_tokens(t.definition_json) for t in tools)
        savings = round(100.0 * (1 - returned / baseline), 2) if baseline else 0.0
        return Found(
            version=VersionRef(snapshot.number, snapshot.fingerprint),
            tools=tuple(tools),
            unavailable=tuple(unavailable),
            token_metrics=TokenMetrics(baseline, returned, savings),
            empty_reason=empty_reason,
            note=note,
        )
