"""Sessions and their stored credentials, in process: a real catalog server, real tokens, a fake embedder.

The indexer's parts run in the test's event loop, so the sessions, their stored tokens and the
listings made for them can be inspected directly. Cocktails requires a JWT (its backend uses
passthrough auth); the other servers do not. Waits are on conditions with bounded timeouts.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from commands.catalog_server import CatalogServerSettings
from indexer.api.process import IndexerProcess
from indexer.backends.credentials import ANONYMOUS, list_at_creation
from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.embedder.fake import FakeEmbedder
from indexer.errors import BackendRejected, BackendUnavailable
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import Builder, VersionPool
from indexer.retrieval.search import SearchSettings
from indexer.sessions.catalogs import Catalogs
from indexer.sessions.manager import SessionManager
from indexer.sessions.views import LiveSession
from indexer.state import SessionRecord
from indexer.state.listings import Listing, digest_of, intern_listing
from tests.support.catalogs import small_catalog
from tests.support.in_process import catalog_server_in_process
from tests.support.indexers import running_indexer
from tests.support.tokens import hs256
from tests.support.waits import wait_for
from toolsearch.config import Config, parse_config
from toolsearch.sections.backend_settings import Backend, BackendAuth
from toolsearch.sections.indexer_settings import Naming
from toolsearch.sessions import Principal

WAIT = 15.0  # seconds any condition below may take at most
SECRET = "a-test-secret-that-is-long-enough-for-hs256"
PROTECTED = "Cocktails"
WEATHER = "AI_Weather_by_Meteosource"
ALICE = Principal("https://issuer.test", "alice")
TOKEN_HOLDER = Principal("", "unverified-bearer")  # what an anonymous router calls a caller with a token
# a down backend answers 503 at once; the timeout only keeps a loaded machine from failing a healthy one
HEALTH = {"interval": 0.1, "timeout": 10.0, "unhealthy_after": 1}
ENDED = "ended session: backends rejected its stored credentials"


class Catalog:
    def __init__(self, url: str, path: Path) -> None:
        self.url, self.path = url, path

    def control(self, slug: str, action: str) -> None:
        httpx2.post(f"{self.url}/control/servers/{slug}/{action}", timeout=5).raise_for_status()

    def config(self, backends: list[dict[str, Any]] | None = None) -> Config:
        raw = {
            "indexer": {"health": HEALTH, "cache_dir": str(self.path.parent / "cache")},
            "catalog_servers": [
                {"catalog": str(self.path), "listen": self.url[7:], "require_jwt": [PROTECTED]}
            ],
            "backends": backends or [],
        }
        return parse_config(raw, self.path)

    def refuses(self, token: str) -> bool:
        """Whether the protected server answers 401 to `token` now."""
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        url = f"{self.url}/servers/{PROTECTED}/mcp"
        return httpx2.post(url, json=ping, headers=headers, timeout=5).status_code == 401


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    path = tmp_path_factory.mktemp("credentials") / "catalog.jsonl"
    small_catalog(path)
    settings = CatalogServerSettings(require_jwt=frozenset({PROTECTED}), jwt_secret=SECRET, control=True)
    with catalog_server_in_process(path, settings) as url:
        yield Catalog(url, path)


@asynccontextmanager
async def running(
    catalog: Catalog, backends: list[dict[str, Any]] | None = None, secrets: dict[str, str] | None = None
) -> AsyncIterator[IndexerProcess]:
    try:
        async with running_indexer(catalog.config(backends), secrets or {}) as indexer:
            yield indexer
    finally:
        for slug in (PROTECTED, WEATHER):
            catalog.control(slug, "up")


token = functools.partial(hs256, SECRET)


async def expired(catalog: Catalog, short: str) -> None:
    """Wait until the catalog server refuses a short-lived token (it checks `exp` itself)."""
    async with asyncio.timeout(WAIT):
        while True:
            if await asyncio.to_thread(catalog.refuses, short):
                return
            await asyncio.sleep(0.1)


async def flip(indexer: IndexerProcess, catalog: Catalog, slug: str) -> None:
    """Take a backend down and up again, and wait until sessions were rebuilt after its recovery."""
    rebuilder, registry = indexer.rebuilder, indexer.registry
    assert rebuilder is not None
    for action, advertised in (("down", False), ("up", True)):
        passes = rebuilder.passes
        catalog.control(slug, action)
        await wait_for(
            lambda a=advertised, p=passes: registry.get(slug).advertised == a and rebuilder.passes > p
        )
    await wait_for(lambda: not rebuilder.pending)


def alive(indexer: IndexerProcess, session: LiveSession) -> bool:
    return session.id in {s.id for s in indexer.sessions.sessions()}


async def test_anonymous_sessions_and_shared_implied_sessions_store_no_token(catalog: Catalog) -> None:
    async with running(catalog) as indexer:
        anonymous = await indexer.sessions.open(ANONYMOUS, token())
        shared = await indexer.sessions.open(TOKEN_HOLDER, token("first"), implied=True)
        assert await indexer.sessions.open(TOKEN_HOLDER, token("second"), implied=True) is shared
        for session in (anonymous, shared):
            assert session.record.token is None and session.record.rejected_at_creation == {PROTECTED}
            assert PROTECTED not in session.current.version.backends
        # a token holder's own (handshake) session keeps its token: nobody else's requests reach it
        own = await indexer.sessions.open(TOKEN_HOLDER, token("third"))
        alice = await indexer.sessions.open(ALICE, token(), implied=True)
        bob = await indexer.sessions.open(Principal("https://issuer.test", "bob"), token("bob"), implied=True)
        assert len({own.id, alice.id, bob.id, shared.id}) == 4
        for session in (own, alice, bob):
            assert session.record.token is not None and PROTECTED in session.current.version.backends
        assert "token=" not in repr(alice)


async def test_a_passthrough_backend_is_relisted_when_it_recovers_and_not_for_other_changes(
    catalog: Catalog,
) -> None:
    async with running(catalog) as indexer:
        listed: list[str] = []
        list_backend = indexer.lister.list_backend

        async def counting(
            backend: Any, token: str | None = None, timeout: float | None = None, principal: Any = None
        ) -> Any:
            if token is not None:
                listed.append(backend.id)
            return await list_backend(backend, token, timeout, principal)

        indexer.lister.list_backend = counting  # type: ignore[method-assign]
        alice = await indexer.sessions.open(ALICE, token())
        assert listed == [PROTECTED]
        await flip(indexer, catalog, WEATHER)
        assert listed == [PROTECTED]  # nothing about Cocktails changed: its listing stands
        await flip(indexer, catalog, PROTECTED)
        assert listed == [PROTECTED, PROTECTED]
        assert alive(indexer, alice) and PROTECTED in alice.current.version.backends


async def test_a_failed_end_keeps_the_version_and_is_retried_at_the_next_rebuild(
    catalog: Catalog, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(catalog) as indexer:
        short = token(expires_in=4)
        session = await indexer.sessions.open(ALICE, short)
        await expired(catalog, short)
        # the store fails once to forget it: the rebuild pass ends the session through the manager
        delete = indexer.state.sessions.delete
        failures: list[str] = []

        async def failing_once(target: SessionRecord) -> None:
            if not failures:
                failures.append(target.id)
                raise RuntimeError("the session store is unreachable")
            await delete(target)

        monkeypatch.setattr(indexer.state.sessions, "delete", failing_once)
        with caplog.at_level(logging.WARNING, logger="indexer.sessions.versions"):
            await flip(indexer, catalog, PROTECTED)
            assert failures == [session.id] and alive(indexer, session)
            assert session.record.ending == {PROTECTED}
            assert (
                session.record.swaps[-1].reason == f"backend {PROTECTED} unhealthy"
            )  # the recovery swapped nothing
            await flip(indexer, catalog, WEATHER)
            assert not alive(indexer, session)
        ended = [r for r in caplog.records if r.getMessage().startswith(ENDED)]
        assert [r.getMessage() for r in ended] == [f"{ENDED}: {PROTECTED}"]
        assert ended[0].levelno == logging.WARNING and short not in caplog.text


async def test_a_token_holder_session_outlives_a_rejection_and_loses_only_that_backend(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(catalog) as indexer:
        short = token(expires_in=4)
        holder = await indexer.sessions.open(TOKEN_HOLDER, short)
        assert PROTECTED in holder.current.version.backends
        await expired(catalog, short)
        with caplog.at_level(logging.WARNING, logger="indexer.sessions.versions"):
            await flip(indexer, catalog, PROTECTED)
        assert alive(indexer, holder) and ENDED not in caplog.text
        assert PROTECTED not in holder.current.version.backends
        assert WEATHER in holder.current.version.backends


async def test_a_header_backend_is_listed_once_with_the_secret_from_the_environment(catalog: Catalog) -> None:
    keyed = {
        "id": "cocktails_by_key",
        "url": f"{catalog.url}/servers/{PROTECTED}/mcp",
        "auth": {"type": "header", "value_env": "COCKTAILS_KEY"},
    }
    async with running(catalog, [keyed], {"COCKTAILS_KEY": f"Bearer {token('service')}"}) as indexer:
        state = indexer.registry.get("cocktails_by_key")
        assert state.status == "healthy" and state.listing is not None and len(state.listing.tools) == 3
        anonymous = await indexer.sessions.open(ANONYMOUS, None)
        assert "cocktails_by_key" in anonymous.current.version.backends  # the service's key, not the caller's
    async with running(catalog, [keyed], {}) as indexer:
        assert indexer.registry.get("cocktails_by_key").status == "unauthenticated"


# In-process units: a lister whose passthrough backend answers by the caller's team, no server.


class TeamLister(BackendLister):
    """Lists the passthrough backend `team` with the tools of the token's team ("<team>-<n>").

    Every walk makes fresh objects, as a real one does; `denied-*` gets 401 and `barred-*` 403.
    """

    def __init__(self) -> None:
        team = Backend(id="team", url="http://127.0.0.1:9/team", auth=BackendAuth(type="passthrough"))
        super().__init__(Registry([Backend(id="nba", url="http://127.0.0.1:9/nba"), team]), {}, timeout=5.0)
        self.registry.record_listing("nba", Listing(({"name": "get_players"},), "2025-11-25", 0.0))
        self.registry.record_answer("team", 0.01, "healthy")

    async def list_backend(
        self,
        backend: Backend,
        token: str | None = None,
        timeout: float | None = None,
        principal: Principal | None = None,
    ) -> Listing:
        await self.headers(backend, token)  # no token: NoCallerToken, as for a real backend
        team = (token or "").split("-")[0]
        if team in ("denied", "barred"):
            raise BackendRejected(backend.id, 401 if team == "denied" else 403)
        names = ("search_docs", f"{team}_report")
        return Listing(tuple({"name": name} for name in names), "2025-11-25", 0.01)


def team_manager() -> tuple[TeamLister, VersionPool, SessionManager]:
    lister = TeamLister()
    embedder = FakeEmbedder()
    embed = Embeddings(embedder).embed_documents
    pool = VersionPool(Builder(embed, embedder.count_tokens, embedder.max_tokens, SearchSettings()))
    return lister, pool, SessionManager(lister, pool, Naming())


def member(team: str, n: int) -> Principal:
    return Principal("https://issuer.test", f"{team}{n}")


async def test_sessions_of_one_team_share_one_listing_and_one_catalog() -> None:
    lister, pool, manager = team_manager()
    sessions = [await manager.open(member("alpha", n), f"alpha-{n}") for n in range(3)]
    first = sessions[0]
    assert {t.name for t in first.current.version.tools} == {"get_players", "search_docs", "alpha_report"}
    for session in sessions[1:]:
        assert session.record.own_listings["team"] is first.record.own_listings["team"]
        assert (
            session.current.version is first.current.version
            and session.record.catalog is first.record.catalog
        )
    assert pool.builds == 1
    # the memo is keyed by digests: a team's listings give one catalog, not one per session
    catalogs = Catalogs(lister.registry, pool, Naming())
    own = [(await list_at_creation(lister, ["team"], f"alpha-{n}", member("alpha", n)))[0] for n in range(2)]
    assert catalogs.current({"nba", "team"}, own[0]) is catalogs.current({"nba", "team"}, own[1])


async def test_equal_listings_made_apart_are_one_catalog() -> None:
    lister, pool, _ = team_manager()
    catalogs = Catalogs(lister.registry, pool, Naming())
    apart = [Listing(({"name": "search_docs"},), "2025-11-25", latency) for latency in (0.1, 0.2)]
    assert apart[0] is not apart[1]
    assert catalogs.current({"nba", "team"}, {"team": apart[0]}) is catalogs.current(
        {"nba", "team"}, {"team": apart[1]}
    )


async def test_a_caller_whose_token_sees_other_tools_gets_another_catalog() -> None:
    _, pool, manager = team_manager()
    alpha = await manager.open(member("alpha", 1), "alpha-1")
    beta = await manager.open(member("beta", 1), "beta-1")
    assert alpha.record.own_listings["team"] is not beta.record.own_listings["team"]
    assert alpha.record.catalog != beta.record.catalog and alpha.current.version is not beta.current.version
    assert beta.current.version.resolve("beta_report") and not alpha.current.version.resolve("beta_report")
    assert pool.builds == 2


async def test_a_rejected_listing_stays_with_the_caller_it_rejected() -> None:
    _, _, manager = team_manager()
    alpha = await manager.open(member("alpha", 1), "alpha-1")
    denied = await manager.open(member("denied", 1), "denied-1")
    barred = await manager.open(member("barred", 1), "barred-1")
    again = await manager.open(member("alpha", 2), "alpha-2")
    for refused in (denied, barred):
        assert refused.record.rejected_at_creation == {"team"} and "team" not in refused.record.accepted
        assert refused.current.version.backends == {"nba"} and not refused.record.own_listings
    for session in (alpha, again):
        assert not session.record.rejected_at_creation and session.current.version.backends == {"nba", "team"}
    assert again.current.version is alpha.current.version


async def test_a_health_change_moves_a_team_s_sessions_to_one_new_version() -> None:
    lister, pool, manager = team_manager()
    sessions = [await manager.open(member("alpha", n), f"alpha-{n}") for n in range(3)]
    lister.registry.record_failure("nba", BackendUnavailable("nba", "down"), "unhealthy")
    assert await manager.versions.rebuild_all("backend nba unhealthy") == 3
    assert pool.builds == 2
    assert all(s.current.version is sessions[0].current.version for s in sessions)
    assert sessions[0].current.version.backends == {"team"}


def test_an_interned_listing_lives_only_while_something_holds_it() -> None:
    made = Listing(({"name": "only_here"},), "2025-11-25", 0.0)
    held = intern_listing(made)
    assert intern_listing(Listing(made.tools, "2025-11-25", 0.5)) is held
    assert digest_of(held) == digest_of(made)
    table = weakref.ref(held)
    del held
    gc.collect()
    assert table() is None
