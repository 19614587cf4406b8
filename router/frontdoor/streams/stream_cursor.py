"""A standalone stream's event ids: where the client's stream got to at each of its backends.

The router keeps nothing of a client's standalone stream (router/frontdoor/streams/standalone.py):
what it carries comes from the backends' own standalone streams, and a backend with an event store
keeps what it sends while nobody reads. So the id of each event the router writes says, for every
backend whose events came with ids, the mark of the last one passed on (its backend session's tag
and the backend's own event id: router/upstream/session_wide/backend_streams.py). A client whose connection
dropped sends the last id it read (`Last-Event-ID`) to any replica, which reads each backend's
stream from there: the backend sends what the client missed, then what comes next, as it would to
a client of its own. Nothing is kept by the router or the indexer for it, so any replica resumes any
stream; a backend whose events have no ids is read from now on, as before.

An id is `at1.` and the marks as JSON, base64url: at most `MAX_BACKENDS` backends, a mark of at
most `MAX_MARK` characters, and `MAX_ID` characters in all, well inside what the router takes in a
request's head. A mark past these bounds is not followed: the backend's earlier mark stays, so a
resumption sends some of its events twice rather than miss any (a backend with no earlier mark is
read from now on).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

PREFIX = "at1."
MAX_BACKENDS = 64  # backends one id names
MAX_MARK = 300  # characters of one backend's mark
MAX_ID = 4096  # characters of one event id, at most


def is_cursor(event_id: str) -> bool:
    """Whether a `Last-Event-ID` names a place in a standalone stream (else a call's stream)."""
    return event_id.strip().startswith(PREFIX)


class StreamCursor:
    """The marks of one standalone stream, by backend id, as its events were written."""

    def __init__(self, marks: Mapping[str, str] | None = None) -> None:
        self.marks = dict(marks or {})
        self._id = _encoded(self.marks)

    @classmethod
    def parse(cls, event_id: str) -> StreamCursor:
        """The cursor an event id of a standalone stream carries; `ValueError` saying what is wrong."""
        encoded = event_id.strip().removeprefix(PREFIX)
        if len(encoded) > MAX_ID:
            raise ValueError(f"it is longer than {MAX_ID} characters")
        try:
            marks = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except (ValueError, binascii.Error) as exc:
            raise ValueError("it is not base64url JSON") from exc
        if not isinstance(marks, dict) or len(marks) > MAX_BACKENDS:
            raise ValueError(f"it does not hold at most {MAX_BACKENDS} backends' places")
        if not all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_MARK for k, v in marks.items()
        ):
            raise ValueError("a backend's place in it is not a short string")
        return cls(marks)

    def moved(self, backend_id: str, mark: str) -> None:
        """A backend's event was passed on; `mark` is where its stream got to ("": no id to follow)."""
        if not mark or len(mark) > MAX_MARK or mark == self.marks.get(backend_id):
            return
        if backend_id not in self.marks and len(self.marks) >= MAX_BACKENDS:
            return
        moved = {**self.marks, backend_id: mark}
        encoded = _encoded(moved)
        if len(encoded) <= MAX_ID:
            self.marks, self._id = moved, encoded

    def event_id(self) -> str:
        """The id of an event written now ("" while no backend's events had ids)."""
        return self._id


def _encoded(marks: Mapping[str, str]) -> str:
    if not marks:
        return ""
    data = json.dumps(marks, separators=(",", ":"), sort_keys=True).encode()
    return PREFIX + base64.urlsafe_b64encode(data).decode().rstrip("=")
