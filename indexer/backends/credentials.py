"""Per-caller backends listed with a session's own credentials: at creation, and again on rebuilds.

A passthrough or token_exchange backend's tools depend on the caller, so each session lists it with
the bearer token it stored at creation (a token_exchange backend with the token exchanged for it,
indexer/backends/backend_tokens.py). What a listing attempt means (DESIGN "Identity and credentials"):

- `listed`: the backend accepted the token; its tools join the session's catalog.
- `rejected`: HTTP 401, no token for a backend that needs one, or a token endpoint that refused to
  exchange the token (`invalid_grant`). At creation the backend is left out (rejected at creation);
  on a background rebuild it ends an authenticated session, whose client then reconnects with fresh
  credentials.
- `forbidden`: HTTP 403, or a token endpoint that refused the caller this backend
  (`invalid_target`). Never a reason to end a session (a fresh token of the same caller would get
  it too); the backend is left out.
- `unavailable`: anything else, our own failures included (a token endpoint that is down, slow, or
  refuses our client); the session keeps what it had and the backend is tried again at the next
  rebuild.

A listing is interned by its digest (`indexer.state.listings`): the sessions whose tokens see the same
tools hold one `Listing`, and so share one catalog and one version. Verdicts are not interned: each
session keeps its own rejected backends.

Who lists with what, and keeps what (docs/auth.md): an authenticated principal (one with an issuer)
lists with its token and keeps it, as the router verified it. An anonymous session has none. An
implied session of a principal without an issuer is shared by every such caller, so it lists with
none and keeps none: one caller's token must never decide the tools another sees. An unverified
token holder's own session lists with the token, but keeps it only if a passthrough backend may be
listed with it again and it is at most `MAX_UNVERIFIED_TOKEN_BYTES` long: anyone can send any
token, and a session must not make us hold what nothing needs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.errors import BackendError, BackendRejected, NoCallerToken
from indexer.state.listings import Listing, intern_backends, intern_listing
from toolsearch.outgoing import per_caller
from toolsearch.sessions import Principal

logger = logging.getLogger(__name__)

ANONYMOUS = Principal("", "")
# the longest unverified token a session keeps: a JWT with many claims is 1-2 kB
MAX_UNVERIFIED_TOKEN_BYTES = 4096
Verdict = Literal["listed", "rejected", "forbidden", "unavailable"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of listing one passthrough backend with one token."""

    verdict: Verdict
    epoch: int  # the backend's epoch when the attempt started
    listing: Listing | None = None


def authenticated(principal: Principal) -> bool:
    """Whether a principal was verified by the router: only those have an issuer."""
    return bool(principal.issuer)


def listing_token(principal: Principal, token: str | None, implied: bool) -> str | None:
    """The credentials a new session lists its passthrough backends with."""
    if principal == ANONYMOUS or (implied and not authenticated(principal)):
        return None
    return token


def kept_token(principal: Principal, token: str | None, relisted: bool) -> str | None:
    """What a new session keeps of the token it listed with, for the relistings of its rebuilds.

    `relisted`: whether a passthrough backend the session kept may be listed with it again. An
    unverified token beyond the bound is not kept: those backends are left out once they relist.
    """
    if token is None or authenticated(principal):
        return token
    if not relisted or len(token.encode()) > MAX_UNVERIFIED_TOKEN_BYTES:
        return None
    return token


Listable = tuple[tuple[str, int], ...]  # advertised per-caller backends, each with its health epoch


def listable(registry: Registry) -> Listable:
    """The advertised per-caller backends and their health epochs now: what a session may list again.

    Found once per rebuild pass: a pass over 10,000 sessions then checks a few backends per session,
    not every backend of the registry (8 million checks with 800 backends).
    """
    return tuple(
        (backend_id, state.health.epoch)
        for backend_id, state in registry.states.items()
        if per_caller(state.config.auth) and state.advertised
    )


def due_for_listing(listable: Listable, accepted: frozenset[str], listed_epochs: dict[str, int]) -> list[str]:
    """The backends of `listable` (found once per pass) a session should list again.

    Those it never listed (down, or failing, when it tried) and those that became advertised again
    since it last listed them: a backend that recovered may have other tools, or refuse the token now.
    """
    return [
        backend_id
        for backend_id, epoch in listable
        if backend_id in accepted and listed_epochs.get(backend_id) != epoch
    ]


async def list_per_caller(
    lister: BackendLister, backend_ids: Sequence[str], token: str | None, principal: Principal
) -> dict[str, Attempt]:
    """List each backend with `principal`'s `token`, concurrently; never raises for a backend's failure."""

    async def attempt(backend_id: str) -> Attempt:
        state = lister.registry.get(backend_id)
        epoch = state.health.epoch
        try:
            listing = await lister.list_backend(state.config, token, principal=principal)
        except NoCallerToken:
            return Attempt("rejected", epoch)
        except BackendRejected as exc:
            return Attempt("rejected" if exc.status == 401 else "forbidden", epoch)
        except BackendError as exc:
            logger.info("backend %s not listed with a session's credentials: %s", backend_id, exc.reason)
            return Attempt("unavailable", epoch)
        except Exception:
            # A fault of our own is never the backend rejecting anyone: retried at the next rebuild.
            logger.exception("listing backend %s with a session's credentials failed", backend_id)
            return Attempt("unavailable", epoch)
        return Attempt("listed", epoch, intern_listing(listing))

    attempts = await asyncio.gather(*(attempt(b) for b in backend_ids))
    return dict(zip(backend_ids, attempts, strict=True))


async def list_at_creation(
    lister: BackendLister, backend_ids: Sequence[str], token: str | None, principal: Principal
) -> tuple[dict[str, Listing], dict[str, int], frozenset[str]]:
    """List per-caller backends as a new session does: (listings, their epochs, rejected ones).

    A backend that refuses the token (401, 403, or no token) is rejected at creation: left out for
    the session's life. One that is down is kept, and listed once it answers again.
    """
    attempts = await list_per_caller(lister, backend_ids, token, principal)
    listed = {b: a for b, a in attempts.items() if a.listing is not None}
    rejected = intern_backends(b for b, a in attempts.items() if a.verdict in ("rejected", "forbidden"))
    own = {b: a.listing for b, a in listed.items() if a.listing is not None}
    return own, {b: a.epoch for b, a in listed.items()}, rejected


def record(
    attempts: Mapping[str, Attempt], listings: dict[str, Listing], epochs: dict[str, int]
) -> frozenset[str]:
    """Keep what a relisting learned in a session's listings; returns the backends that rejected it."""
    rejected: set[str] = set()
    for backend_id, attempt in attempts.items():
        if attempt.verdict == "unavailable":
            continue  # keeps what it had, and is tried again at the next rebuild
        epochs[backend_id] = attempt.epoch
        if attempt.listing is not None:
            listings[backend_id] = attempt.listing
            continue
        listings.pop(backend_id, None)  # left out until the backend recovers again
        if attempt.verdict == "rejected":
            rejected.add(backend_id)
    return frozenset(rejected)
