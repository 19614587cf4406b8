"""A result that did not run in the backend session earlier calls ran in says so.

A backend session can end under a client session: the server restarted and forgot it, a
per_session process behind the bridge was reaped for idleness or exited. The router then opens a new
one and sends the request again in it (router/upstream/calls/backends.py), which keeps the call working,
but whatever earlier calls set up in the old session (a counter, an open page, a login) is gone. And
a caller whose session others share keeps no backend session at all (router/upstream/
session_keeping.py): each of its calls starts from nothing. An agent that does not know acts on
state that does not exist, so the result tells it, twice:

- for the agent, a last text block of a tool result, `[toolsearch] backend counter forgot its
  session (HTTP 404): this call ran in a new session there; what earlier calls set up in the old
  one is gone.`;
- for programs, an entry in the result's `_meta` (a tool result's, and any other request's):
  `"toolsearch/backendSession": {"backend": "counter", "replaced": true, "reason": "..."}`, or
  `{"backend": ..., "kept": false, "reason": ...}`.

A backend that issues no session id keeps nothing per session, so a call to it is never noted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

META_KEY = "toolsearch/backendSession"
UNKEPT_REASON = (
    "callers without a session of their own (protocol 2026-07-28, not authenticated) share nothing"
)


@dataclass(frozen=True, slots=True)
class SessionNote:
    """What a result says of the backend session it ran in: a text for the agent, a `_meta` entry."""

    text: str
    meta: dict[str, Any] = field(default_factory=dict)


def replaced(backend_id: str, reason: str) -> SessionNote:
    """The backend session earlier calls ran in was gone (`reason`), and a new one replaced it."""
    return SessionNote(
        f"[toolsearch] backend {backend_id} {reason}: this call ran in a new session there; what "
        "earlier calls set up in the old one is gone.",
        {"backend": backend_id, "replaced": True, "reason": reason},
    )


def unkept(backend_id: str) -> SessionNote:
    """The call ran in a backend session of its own, ended after it: the caller keeps none."""
    return SessionNote(
        f"[toolsearch] backend {backend_id}: this call ran in a session of its own, ended after it, "
        f"since {UNKEPT_REASON}; nothing it set up there is kept for the next call. To keep state "
        "between calls, connect with the initialize handshake (a session of your own) or with "
        "credentials.",
        {"backend": backend_id, "kept": False, "reason": UNKEPT_REASON},
    )


def noted_call(result: dict[str, Any], note: SessionNote | None) -> dict[str, Any]:
    """A tool result (as the wire has it) with the note's text as its last block and its entry in
    `_meta`; everything else the backend sent is left as it came."""
    if note is None:
        return result
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    return {**noted_result(result, note), "content": [*blocks, {"type": "text", "text": note.text}]}


def noted_result(result: dict[str, Any], note: SessionNote | None) -> dict[str, Any]:
    """Another request's result (as the wire has it) with the note's entry in `_meta`."""
    if note is None:
        return result
    meta = result.get("_meta")
    kept = meta if isinstance(meta, dict) else {}
    return {**result, "_meta": {**kept, META_KEY: note.meta}}
