"""A handshake-era call's stream as the indexer keeps it for its client to resume, as both sides
know it (docs/gateway.md, "Streams a client resumes").

The router that runs a streamed call keeps its events in the indexer as it writes them
(`EventsToKeep`, router/frontdoor/streams/stream_log.py) and reads them back for a client that
resumes the stream on any replica (`KeptEvents`, router/frontdoor/streams/resumed_streams.py); the
indexer stores them by session (indexer/state/stream_events.py). Each side's edge of the link turns
these values into its messages and back, so neither names protobuf.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

MAX_EVENTS = 1000  # events of one stream the indexer keeps
MAX_EVENT_BYTES = 1024 * 1024  # bytes of one event it keeps


class StreamEnd(enum.Enum):
    OPEN = "open"
    DONE = "done"  # the stream's last event is kept
    BROKEN = "broken"  # an event could not be kept: the stream cannot be resumed whole


@dataclass(frozen=True, slots=True)
class EventsToKeep:
    """One keep of a session's stream: `events` (whole SSE events, ids included) numbered from
    `first_seq`, the stream's end if it came, and how long the record lives past this keep."""

    session_id: str
    stream_id: str
    first_seq: int
    events: Sequence[str]
    end: StreamEnd
    ttl: float  # seconds
    request_id: str  # the JSON-RPC id of the call the stream answers, as JSON


@dataclass(frozen=True, slots=True)
class KeptEvents:
    """The events kept after the one a read asked for, in order, and how the stream ended (`OPEN`
    unless these reach its last event)."""

    events: tuple[str, ...]
    end: StreamEnd
    request_id: str  # the JSON-RPC id of the call the stream answers, as JSON
