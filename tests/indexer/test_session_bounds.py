"""Sessions are bounded with the memory state: idle ones expire, their number is capped, and an
unverified caller's token is kept only when something needs it, and only so long.

In process, with the fake embedder, a lister whose backends answer without a network, and a
clock the test moves, so expiry is exact and nothing waits for time to pass; the one test of
memory being freed runs on real time, with a short time to live and a bounded wait.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import httpx2
import pytest

from indexer.backends.backend_sessions import BackendSessionEnder
from indexer.backends.credentials import ANONYMOUS, MAX_UNVERIFIED_TOKEN_BYTES
from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.embedder.fake import FakeEmbedder
from indexer.errors import (
    BackendRejected,
    BackendUnavailable,
    InvalidRequest,
    NoCallerToken,
    SessionNotFound,
    SessionsFull,
    TooManySessions,
)
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import Builder, VersionPool
from indexer.retrieval.search import SearchSettings
from indexer.sessions.manager import SessionManager
from indexer.state import LocalSessions
from indexer.state.listings import Listing
from tests.support.clients import until
from tests.support.waits import wait_for
from toolsearch.sections.backend_settings import Backend, BackendAuth
from toolsearch.sections.indexer_settings import Naming
from toolsearch.sessions import BackendSession, Principal

TTL = 60.0
ALICE = Principal("https://issuer.test", "alice")
BOB = Principal("https://issuer.test", "bob")
TOKEN_HOLDER = Principal("", "unverified-bearer")  # what an anonymous router calls a caller with a token
UNKNOWN = "u" * 32


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class LocalLister(BackendLister):
    """Backends listed without a network: `mail` (passthrough) answers any token but `denied-...`."""

    def __init__(self, passthrough: bool = True) -> None:
        backends = [Backend(id="weather", url="http://127.0.0.1:9/weather")]
        if passthrough:
            backends.append(
                Backend(id="mail", url="http://127.0.0.1:9/mail", auth=BackendAuth(type="passthrough"))
            )
        super().__init__(Registry(backends), {}, timeout=5.0)
        self.registry.record_listing("weather", Listing(({"name": "get_forecast"},), "2025-11-25", 0.0))
        if passthrough:
            self.registry.record_answer("mail", 0.0, "healthy")  # listed per caller, never for everyone
        self.tokens: list[str | None] = []  # the tokens passthrough listings were made with

    async def list_backend(
        self,
        backend: Backend,
        token: str | None = None,
        timeout: float | None = None,
        principal: Principal | None = None,
    ) -> Listing:
        self.tokens.append(token)
        if token is None:
            raise NoCallerToken(f"backend {backend.id} requires the caller's bearer token")
        if token.startswith("denied"):
            raise BackendRejected(backend.id, 401)
        return Listing(({"name": "send_mail"},), "2025-11-25", 0.0)


def manager(
    store: LocalSessions,
    lister: BackendLister | None = None,
    sessions: int = 0,
    per_principal: int = 0,
    ender: BackendSessionEnder | None = None,
) -> SessionManager:
    embedder = FakeEmbedder()
    embed = Embeddings(embedder).embed_documents
    pool = VersionPool(Builder(embed, embedder.count_tokens, embedder.max_tokens, SearchSettings()))
    return SessionManager(
        lister or LocalLister(),
        pool,
        Naming(),
        max_per_principal=per_principal,
        store=store,
        max_sessions=sessions,
        ender=ender,
    )


async def refused(sessions: SessionManager, principal: Principal) -> TooManySessions:
    with pytest.raises(TooManySessions) as caught:
        await sessions.open(principal, None)
    return caught.value


async def test_an_idle_session_expires_and_is_then_unknown_while_one_in_use_lives_on() -> None:
    clock = Clock()
    store = LocalSessions(TTL, clock)
    sessions = manager(store)
    idle, used = await sessions.open(ANONYMOUS, None), await sessions.open(ANONYMOUS, None)
    for _ in range(3):  # each use renews the time to live: 3 x 40 s is past it, but never 60 s unused
        clock.advance(40)
        assert (await sessions.get(used.id, ANONYMOUS)) is used
    with pytest.raises(SessionNotFound) as expired:
        await sessions.get(idle.id, ANONYMOUS)
    with pytest.raises(SessionNotFound) as unknown:
        await sessions.get(UNKNOWN, ANONYMOUS)
    # the same error, the same words: an expired id is not told from one never issued
    assert str(expired.value).replace(idle.id[:8], "ID") == str(unknown.value).replace(UNKNOWN[:8], "ID")
    assert [r.id for r in await sessions.records()] == [used.id] and len(store) == 1
    clock.advance(TTL)
    assert await sessions.records() == [] and len(store) == 0


async def test_an_expired_session_frees_what_it_held() -> None:
    store = LocalSessions(ttl=1.0)  # real time: the handles' clock is the process's own
    sessions = manager(store)
    opened = [await sessions.open(ANONYMOUS, None) for _ in range(200)]
    held = [weakref.ref(s.record) for s in opened]  # and the handles: counted by len(sessions)
    del opened

    async def freed() -> bool:
        with pytest.raises(SessionNotFound):
            await sessions.get(UNKNOWN, ANONYMOUS)  # any request drops what has expired
        gc.collect()
        return not any(ref() is not None for ref in held)

    await until(freed, "the expired sessions' records are freed", 15)
    assert len(store) == 0 and len(sessions) == 0


async def test_the_cap_on_every_session_counts_anonymous_callers_and_frees_by_close_or_expiry() -> None:
    clock = Clock()
    sessions = manager(LocalSessions(TTL, clock), sessions=3, per_principal=10)
    first = await sessions.open(ANONYMOUS, None)
    clock.advance(10)
    await sessions.open(TOKEN_HOLDER, "a-token")
    implied = await sessions.open(ALICE, "alice-token", implied=True)
    full = await refused(sessions, BOB)
    assert isinstance(full, SessionsFull)
    assert "the indexer holds 3 sessions, the most indexer.max_sessions allows" in str(full)
    assert "DELETE /mcp" in str(full) and "expires in 50s unless used" in str(full)
    assert full.retry_after == 50  # when the least recently used one expires, unless used
    assert isinstance(await refused(sessions, ANONYMOUS), SessionsFull)
    # a principal's implied session needs no room: it is the one it has
    assert await sessions.open(ALICE, "alice-token", implied=True) is implied
    await sessions.close(first.id, ANONYMOUS)
    await sessions.open(BOB, None)
    clock.advance(TTL)  # every one expires unused: all the room is back
    assert len([await sessions.open(ANONYMOUS, None) for _ in range(3)]) == 3


async def test_the_cap_on_one_principal_counts_authenticated_ones_and_refuses_before_listing() -> None:
    clock = Clock()
    lister = LocalLister()
    sessions = manager(LocalSessions(TTL, clock), lister, sessions=100, per_principal=2)
    oldest = await sessions.open(ALICE, "alice-token")
    clock.advance(30)
    await sessions.open(ALICE, "alice-token")
    clock.advance(20)
    await sessions.get(oldest.id, ALICE)  # used: the other is now the least recently used
    listed = len(lister.tokens)
    full = await refused(sessions, ALICE)
    assert not isinstance(full, SessionsFull) and len(lister.tokens) == listed  # nothing listed
    assert "this caller holds 2 sessions, the most indexer.max_sessions_per_principal allows" in str(full)
    assert full.retry_after == 40 and "DELETE /mcp" in str(full)
    await sessions.open(BOB, "bob-token")  # another principal is not affected
    for _ in range(5):  # many callers under one principal each: the per-principal cap is not theirs
        await sessions.open(ANONYMOUS, None)
        await sessions.open(TOKEN_HOLDER, "a-token")
    # a burst: every open passes the early check, the creations decide, and exactly two fit
    carol = Principal("https://issuer.test", "carol")
    answers = await asyncio.gather(*(sessions.open(carol, "t") for _ in range(6)), return_exceptions=True)
    assert sorted(type(a).__name__ for a in answers) == ["LiveSession"] * 2 + ["TooManySessions"] * 4


async def test_an_open_sent_again_under_its_proposed_id_answers_the_session_the_first_opened() -> None:
    sessions = manager(LocalSessions(TTL, Clock()), sessions=100, per_principal=2)
    proposed = "p" * 32
    first = await sessions.open(ALICE, "alice-token", session_id=proposed)
    again = await sessions.open(ALICE, "alice-token", session_id=proposed)  # a router's second attempt
    assert first.id == again.id == proposed
    await sessions.open(ALICE, "alice-token")  # the one session counts once: there is room for another
    await refused(sessions, ALICE)
    with pytest.raises(InvalidRequest, match="session_id is taken"):
        await sessions.open(BOB, None, session_id=proposed)
    for bad in ("short", "x" * 65, "p" * 31 + "/"):
        with pytest.raises(InvalidRequest, match="22 to 64 characters"):
            await sessions.open(BOB, None, session_id=bad)


@pytest.mark.parametrize(
    ("principal", "token", "passthrough", "kept"),
    [
        (TOKEN_HOLDER, "a-token", True, True),  # a passthrough backend took it and will list it again
        (TOKEN_HOLDER, "a-token", False, False),  # nothing would ever use it again
        (TOKEN_HOLDER, "denied-token", True, False),  # refused at creation: never listed again
        (TOKEN_HOLDER, "x" * (MAX_UNVERIFIED_TOKEN_BYTES + 1), True, False),  # too long to keep
        (ALICE, "x" * (MAX_UNVERIFIED_TOKEN_BYTES + 1), True, True),  # verified by the router: kept
        (ANONYMOUS, "a-token", True, False),  # nobody: listed with nothing
    ],
)
async def test_an_unverified_token_is_kept_only_while_a_backend_needs_it_and_within_its_bound(
    principal: Principal, token: str, passthrough: bool, kept: bool
) -> None:
    lister = LocalLister(passthrough)
    sessions = manager(LocalSessions(TTL), lister)
    session = await sessions.open(principal, token)
    assert (session.record.token == token) is kept
    assert session.record.token is None or kept
    if passthrough and principal != ANONYMOUS:
        assert lister.tokens == [token]  # listed at creation with the token it came with, whatever it keeps


async def test_a_long_unverified_token_lists_at_creation_and_its_backend_leaves_at_a_relisting() -> None:
    lister = LocalLister()
    sessions = manager(LocalSessions(TTL), lister)
    long = "x" * (MAX_UNVERIFIED_TOKEN_BYTES + 1)
    session = await sessions.open(TOKEN_HOLDER, long)
    assert "mail" in session.current.version.backends and session.record.token is None
    # the backend goes down and comes back: it is listed again with what the session kept (nothing)
    lister.registry.record_failure("mail", BackendUnavailable("mail", "down"), "unhealthy")
    await sessions.versions.rebuild_all("backend mail unhealthy")
    lister.registry.record_answer("mail", 0.0, "healthy")
    await sessions.versions.rebuild_all("backend mail healthy")
    assert lister.tokens[-1] is None and "mail" not in session.current.version.backends
    assert (await sessions.get(session.id, TOKEN_HOLDER)) is session  # left out, never ended


async def test_a_sessions_backend_sessions_are_ended_when_it_is_closed_or_expires() -> None:
    clock = Clock()
    store = LocalSessions(TTL, clock)
    deletes: list[tuple[str, str, str | None]] = []

    def backend(request: httpx2.Request) -> httpx2.Response:
        deletes.append((request.method, str(request.url), request.headers.get("mcp-session-id")))
        return httpx2.Response(200)

    lister = LocalLister(passthrough=False)
    ender = BackendSessionEnder(lister, httpx2.MockTransport(backend), store.take_expired, poll=3600)
    sessions = manager(store, lister, ender=ender)
    ender.start()
    try:
        closed, expiring = await sessions.open(ANONYMOUS, None), await sessions.open(ANONYMOUS, None)
        kept = BackendSession("backend-1", "2025-11-25")
        assert await sessions.set_backend_session(closed.id, ANONYMOUS, "weather", "", kept) == kept
        # a second one opened at the same time, by another router, comes second: the first is kept
        late = BackendSession("backend-2", "2025-11-25")
        assert await sessions.set_backend_session(closed.id, ANONYMOUS, "weather", "", late) == kept
        other = BackendSession("backend-3", "2025-11-25")
        await sessions.set_backend_session(expiring.id, ANONYMOUS, "weather", "", other)
        clock.advance(TTL / 2)
        await sessions.get(closed.id, ANONYMOUS)  # a use: only `expiring` expires below

        await sessions.close(closed.id, ANONYMOUS)
        await wait_for(lambda: len(deletes) == 1)
        assert deletes == [("DELETE", "http://127.0.0.1:9/weather", "backend-1")]
        clock.advance(TTL / 2 + 1)
        ender.end_expired()
        await wait_for(lambda: len(deletes) == 2)
        assert deletes[1] == ("DELETE", "http://127.0.0.1:9/weather", "backend-3")
        assert ender.ended == 2
    finally:
        await ender.close()
