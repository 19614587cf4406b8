"""Which failed indexer calls are tried again, and on which indexer address.

An indexer replica that goes away (a restart, a scale-down, a crash) fails the calls sent to it in
a few ways, and each tells whether the call may have run there:

- CANCELLED: a stopping gRPC server drops the calls no handler has taken yet. The indexer never
  answers CANCELLED itself, and the router's own cancellations surface as asyncio's, never as a
  status: the call did not run.
- UNAVAILABLE "failed to connect to all addresses": there was no connection; nothing was sent.
- UNAVAILABLE with the indexer's `not-ready`: refused before anything was done.
- any other UNAVAILABLE (a connection lost mid-call, the end of a stop's grace period, the shared
  state not answering) and DEADLINE_EXCEEDED: the call may have run.

A call that did not run is tried on the next address whatever it does. One that may have run is
tried again only if running it twice is harmless (`idempotent`): the reads, ending a session, a
token exchange (the token kept for the principal, or one more), the implied session of a principal
(one per principal however many attempts), and opening a handshake session, whose id the router
proposes (every attempt the same), so that an attempt on another replica answers the session an
attempt that ran has opened instead of opening a second. Every call the router makes is harmless
twice today; `idempotent` stays so that one that is not says so. A call may run on at most `tries`
indexers in all, so a slow one costs at most that many timeouts; refusals, being immediate, do not
count.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

import grpc

from toolsearch.trailers import ERROR_KEY, ErrorKind

# gRPC's words when a call found no connection to send it on (pick_first and round_robin alike)
_NO_CONNECTION = "failed to connect to all addresses"
_REFUSED_KINDS = frozenset({ErrorKind.NOT_READY})  # the indexer's own refusals of work it did not start


class Failure(NamedTuple):
    """What a failed call means for trying it again."""

    retry: bool  # whether another address may be tried
    ran: bool  # whether it may have run on the indexer it was sent to


def error_kind(exc: grpc.aio.AioRpcError) -> str:
    """The indexer's own name for an error (its `toolsearch-error` trailer), or ''."""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KEY:
            return str(value)
    return ""


def failure_of(exc: grpc.aio.AioRpcError, idempotent: bool) -> Failure | None:
    """How a failed call may be tried again; None when the answer is the indexer's (not a failover)."""
    code = exc.code()
    if code == grpc.StatusCode.CANCELLED:
        return Failure(retry=True, ran=False)
    if code == grpc.StatusCode.UNAVAILABLE:
        never_sent = (exc.details() or "").startswith(_NO_CONNECTION)
        if never_sent or error_kind(exc) in _REFUSED_KINDS:
            return Failure(retry=True, ran=False)
        return Failure(retry=idempotent, ran=True)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Failure(retry=idempotent, ran=True)
    return None


def next_address(current: int, down: Sequence[bool], tried: Collection[int]) -> int:
    """The address to try next, round the list from `current`: one not tried yet before one tried,
    and one whose connection is not known to be `down` before one that is.

    So a dead address's immediate refusal never takes the place of the retry a call whose first
    attempt timed out on a live address is owed: that retry goes back to the live one.
    """
    ring = [(current + step) % len(down) for step in range(len(down))]
    return min(ring, key=lambda index: (index in tried, down[index]))  # ties: the ring's order
