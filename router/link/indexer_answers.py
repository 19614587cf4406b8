"""The indexer's search, pinning, stream and status answers read into the router's values, once.

FindTools becomes a `Found` (toolsearch/found.py), PinnedTools the definitions it lists,
ReadStreamEvents the `KeptEvents` (toolsearch/kept_streams.py), and Status the plain data the status
page shows (router/observe/status_page.py), which names no session or principal and leaves backend
URLs out (one may carry a key in its query). Above the link, the router sees no protobuf.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from toolsearch.found import Found, FoundTool, TokenMetrics, UnavailableBackend
from toolsearch.kept_streams import KeptEvents, StreamEnd
from toolsearch.sessions import VersionRef
from toolsearch.v1 import indexer_pb2 as pb

RECENT_SWAPS = 20  # swap lines shown, newest first


def found(answer: pb.FindToolsResponse) -> Found:
    """A search's answer; a tool the indexer did not grade counts as a possible match."""
    metrics = answer.token_metrics
    return Found(
        version=VersionRef(answer.version.number, answer.version.fingerprint),
        tools=tuple(
            FoundTool(
                name=t.name,
                backend_id=t.backend_id,
                definition_json=t.definition_json,
                server_title=t.server_title,
                server_description=t.server_description,
                match=t.match or "possible",
                score=t.score,
                relevance=t.relevance,
            )
            for t in answer.tools
        ),
        unavailable=tuple(UnavailableBackend(u.id, u.status, u.server_title) for u in answer.unavailable),
        token_metrics=TokenMetrics(
            metrics.baseline_tokens, metrics.returned_tokens, round(metrics.savings_percent, 2)
        ),
        empty_reason=answer.empty_reason,
        note=answer.note,
    )


STREAM_ENDS = {
    StreamEnd.OPEN: pb.STREAM_END_OPEN,
    StreamEnd.DONE: pb.STREAM_END_DONE,
    StreamEnd.BROKEN: pb.STREAM_END_BROKEN,
}


def kept_events(answer: pb.ReadStreamEventsResponse) -> KeptEvents | None:
    """A stream's kept events, None when none is kept; an end this router does not know is a break."""
    if not answer.found:
        return None
    ends = {wire: end for end, wire in STREAM_ENDS.items()}
    return KeptEvents(tuple(answer.events), ends.get(answer.end, StreamEnd.BROKEN), answer.request_id_json)


def pinned_definitions(answer: pb.PinnedToolsResponse) -> list[str]:
    """The pinned tools' MCP definitions (JSON), under their advertised names."""
    return [tool.definition_json for tool in answer.tools]


def iso_time(unix: float) -> str:
    """A moment as the status views show it: UTC, ISO 8601, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _swaps(sessions: Iterable[pb.SessionStatus]) -> list[dict[str, Any]]:
    """The sessions' recent swaps grouped by (reason, new version, second): one line with a count."""
    grouped: dict[tuple[str, str, int], int] = {}
    for session in sessions:
        for swap in session.swaps:
            key = (swap.reason, swap.current.fingerprint, int(swap.at_unix))
            grouped[key] = grouped.get(key, 0) + 1
    newest = sorted(grouped.items(), key=lambda item: item[0][2], reverse=True)[:RECENT_SWAPS]
    return [
        {"at": iso_time(at), "reason": reason, "fingerprint": fingerprint, "sessions": count}
        for (reason, fingerprint, at), count in newest
    ]


def status_view(status: pb.StatusResponse) -> dict[str, Any]:
    """The part of a Status answer the status page shows, as plain data."""
    counters = status.embedding
    return {
        "model": status.model,
        "embedding": {
            "model_calls": counters.model_calls,
            "texts_embedded": counters.texts_embedded,
            "cache_hits": counters.cache_hits,
            "embedder": counters.embedder,
            "unavailable": counters.unavailable,
            "unavailable_reason": counters.unavailable_reason,
            "unavailable_since": iso_time(counters.unavailable_since_unix) if counters.unavailable else None,
            "outages": counters.outages,
            "lexical_answers": counters.lexical_answers,
        },
        "backends": [
            {
                "id": b.id,
                "status": b.status,
                "tools": b.tool_count,
                "latency_ms": round(b.latency_ms, 1),
                "last_error": b.last_error,
                "consecutive_failures": b.consecutive_failures,
                "circuit": b.circuit,
            }
            for b in status.backends
        ],
        "versions": [
            {"fingerprint": v.fingerprint, "tools": v.tool_count, "sessions": v.sessions}
            for v in sorted(status.versions, key=lambda v: v.sessions, reverse=True)
        ],
        "sessions": len(status.sessions),
        "swaps": _swaps(status.sessions),
    }
