"""A call's stream as the indexer keeps it for resumption, in the router's own values.

The front door keeps a handshake-era call's events while it writes them (router/frontdoor/
stream_log.py) and reads them back for a client that resumes the stream on any replica
(router/frontdoor/streams/resumed_streams.py); the indexer link turns these values into its messages and
back, so neither side names protobuf.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class StreamEnd(enum.Enum):
    OPEN = "open"
    DONE = "done"  # the stream's last event is kept
    BROKEN = "broken"  # an event could not be kept: the stream cannot be resumed whole


@dataclass(frozen=True, slots=True)
class KeptEvents:
    """The events kept after the one a read asked for, in order, and how the stream ended (`OPEN`
    unless these reach its last event)."""

    events: tuple[str, ...]
    end: StreamEnd
    request_id: str  # the JSON-RPC id of the call the stream answers, as JSON
