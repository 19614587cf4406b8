"""Index versions following backend health, in process: a real catalog server, the fake embedder.

The indexer's parts run in the test's event loop (`IndexerProcess.build` with `FakeEmbedder`), so
sessions, the version pool and the embedding counters can be inspected directly; the backends are a
real catalog server, served from the test's process too, driven through its control API.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest

from commands.catalog_server import CatalogServerSettings
from indexer.api.process import IndexerProcess
from indexer.api.resolution import ToolResolver
from indexer.backends.credentials import ANONYMOUS
from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.embedder.fake import FakeEmbedder
from indexer.errors import BackendUnavailable, ToolNotFound
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import Builder, IndexVersion, VersionPool, build_version, fingerprint
from indexer.retrieval.query import Query
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.text import query_texts
from indexer.retrieval.tools import Tool, advertise
from indexer.sessions.manager import SessionManager
from indexer.state.listings import Listing
from tests.support.catalogs import small_catalog
from tests.support.in_process import catalog_server_in_process
from tests.support.indexers import running_indexer
from tests.support.tokens import hs256
from tests.support.waits import wait_for
from toolsearch.config import Config, parse_config
from toolsearch.sections.backend_settings import Backend
from toolsearch.sections.indexer_settings import Naming
from toolsearch.sessions import Principal

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
SECRET_ENV = "TOOLSEARCH_CATALOG_JWT_SECRET"
WEATHER = "AI_Weather_by_Meteosource"
# a down backend answers 503 at once; the timeout only keeps a loaded machine from failing a healthy one
FAST_HEALTH = {"interval": 0.1, "timeout": 10.0, "unhealthy_after": 1}
# probes an hour apart: a probe seen during a test is one asked for
SLOW_HEALTH = {"interval": 3600.0, "timeout": 10.0, "unhealthy_after": 1}


class Catalog:
    """A catalog server with its control API, and the tools of each server."""

    def __init__(self, url: str, tools: dict[str, set[str]], path: Path) -> None:
        self.url, self.tools, self.path = url, tools, path

    def control(self, slug: str, action: str) -> None:
        httpx2.post(f"{self.url}/control/servers/{slug}/{action}", timeout=5).raise_for_status()

    def config(self, health: dict[str, Any], **server: Any) -> Config:
        raw = {
            "indexer": {"health": health, "cache_dir": str(self.path.parent / "cache")},
            "catalog_servers": [{"catalog": str(self.path), "listen": self.url[7:], **server}],
        }
        return parse_config(raw, self.path)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    path = tmp_path_factory.mktemp("versions") / "catalog.jsonl"
    tools = small_catalog(path)
    settings = CatalogServerSettings(require_jwt=frozenset({"Cocktails"}), jwt_secret=SECRET, control=True)
    with catalog_server_in_process(path, settings) as url:
        yield Catalog(url, tools, path)


@pytest.fixture
def up_again(catalog: Catalog) -> Iterator[None]:
    """Every server is up again after the test, whatever it did."""
    yield
    for slug in catalog.tools:
        catalog.control(slug, "up")


def running(config: Config) -> contextlib.AbstractAsyncContextManager[IndexerProcess]:
    return running_indexer(config, {SECRET_ENV: SECRET})


token = functools.partial(hs256, SECRET)


def our_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(("health-probe", "index-fan-out"))]


async def test_a_thousand_sessions_share_one_index_and_follow_a_flip_with_no_embedding(
    catalog: Catalog, up_again: None
) -> None:
    async with running(catalog.config(FAST_HEALTH)) as indexer:
        sessions = [await indexer.sessions.open(ANONYMOUS, None) for _ in range(1000)]
        first = sessions[0].current.version
        assert all(s.current.version is first for s in sessions)
        assert indexer.pool.builds == 1 and len(indexer.pool) == 1
        model_calls = indexer.embeddings.model_calls

        catalog.control(WEATHER, "down")
        await wait_for(lambda: all(s.current.number == 2 for s in sessions))
        second = sessions[0].current.version
        assert WEATHER not in second.backends and second.fingerprint != first.fingerprint
        assert all(s.current.version is second for s in sessions)
        assert indexer.pool.builds == 2
        assert indexer.embeddings.model_calls == model_calls
        assert [s.record.swaps[-1].reason for s in sessions[:2]] == [f"backend {WEATHER} unhealthy"] * 2
        first_fingerprint, second_fingerprint = first.fingerprint, second.fingerprint
        del first, second
        gc.collect()
        # nothing but the startup warm-up (if any) holds the first version: swaps keep only references
        retained = indexer.pool.lookup(first_fingerprint) is not None
        alive = {v.fingerprint for v in indexer.pool.versions()}
        assert alive == {second_fingerprint} | ({first_fingerprint} if retained else set())

        catalog.control(WEATHER, "up")
        await wait_for(lambda: all(s.current.number == 3 for s in sessions))
        third = sessions[0].current.version
        assert third.fingerprint == first_fingerprint and WEATHER in third.backends
        assert all(s.current.version is third for s in sessions)
        assert indexer.pool.builds == (2 if retained else 3)  # rebuilt, if at all, from cached embeddings
        assert indexer.embeddings.model_calls == model_calls
        assert sessions[0].record.swaps[-1].reason == f"backend {WEATHER} recovered"
        assert indexer.rebuilder is not None and indexer.rebuilder.passes == 2
        gc.collect()
        assert {v.fingerprint for v in indexer.pool.versions()} == {first_fingerprint}  # the second freed


async def test_with_monitoring_off_sessions_keep_their_tools_and_no_probe_runs(
    catalog: Catalog, up_again: None
) -> None:
    async with running(catalog.config({"enabled": False, "interval": 0.05})) as indexer:
        session = await indexer.sessions.open(ANONYMOUS, None)
        assert indexer.monitor is None
        assert not [t for t in our_tasks() if t.get_name().startswith("health-probe")]
        catalog.control(WEATHER, "down")
        # the backend really is down, and nothing that could notice it exists
        backend = indexer.registry.get(WEATHER).config
        with pytest.raises(BackendUnavailable):
            await indexer.lister.list_backend(backend, timeout=2.0)
        assert not our_tasks()
        assert indexer.registry.get(WEATHER).status == "healthy"
        assert session.current.number == 1 and WEATHER in session.current.version.backends
    assert not our_tasks()


async def test_a_backend_said_to_have_changed_its_tools_is_probed_long_before_its_turn(
    catalog: Catalog, up_again: None
) -> None:
    async with running(catalog.config(SLOW_HEALTH)) as indexer:
        catalog.control(WEATHER, "down")  # what the probe finds shows it ran
        await indexer.tools_changed(WEATHER)
        await wait_for(lambda: indexer.registry.get(WEATHER).status == "unhealthy")
        assert indexer.registry.get("Free_NBA").status == "healthy"


async def test_a_session_opened_while_a_passthrough_backend_is_down_gains_it_on_recovery(
    catalog: Catalog, up_again: None
) -> None:
    config = catalog.config(FAST_HEALTH, require_jwt=["Cocktails"])
    catalog.control("Cocktails", "down")
    async with running(config) as indexer:
        assert indexer.registry.get("Cocktails").status == "unhealthy"
        good = await indexer.sessions.open(Principal("issuer", "alice"), token())
        stale = await indexer.sessions.open(Principal("issuer", "bob"), token(expires_in=-60))
        assert "Cocktails" not in good.current.version.backends

        catalog.control("Cocktails", "up")
        await wait_for(lambda: good.current.number == 2)
        assert "Cocktails" in good.current.version.backends
        assert good.record.swaps[-1].reason == "backend Cocktails recovered"
        # the stored token is refused now: that session ends, so its client reconnects
        assert indexer.sessions.sessions() == [good]
        assert stale.id not in {s.id for s in indexer.sessions.sessions()}
        assert indexer.registry.get("Cocktails").status in ("degraded", "healthy")


async def test_a_changed_tool_list_reaches_live_sessions_and_embeds_only_the_new_tool(
    catalog: Catalog, up_again: None
) -> None:
    async with running(catalog.config(FAST_HEALTH)) as indexer:
        session = await indexer.sessions.open(ANONYMOUS, None)
        listing = indexer.registry.get("Free_NBA").listing
        assert listing is not None
        embedded = indexer.embeddings.texts_embedded
        referees = {"name": "Get_All_Referees", "description": "List the referees of the season."}
        tools_url = f"{catalog.url}/control/servers/Free_NBA/tools"
        httpx2.post(tools_url, json=[*listing.tools, referees], timeout=5).raise_for_status()
        try:
            await wait_for(lambda: session.current.number == 2)
            assert session.current.version.resolve("Get_All_Referees") is not None
            assert session.record.swaps[-1].reason == "backend Free_NBA tool list changed"
            # the new tool's text(s) only: every other tool's embedding comes from the cache
            assert 0 < indexer.embeddings.texts_embedded - embedded < len(listing.tools)
        finally:
            httpx2.post(tools_url, json=list(listing.tools), timeout=5).raise_for_status()


async def test_a_config_reload_adds_and_removes_backends_of_live_sessions(catalog: Catalog) -> None:
    everything = catalog.config(FAST_HEALTH, require_jwt=["Cocktails"])
    by_id = {b.id: b for b in everything.backends}
    before = everything.model_copy(update={"backends": [by_id["Free_NBA"], by_id[WEATHER]]})
    after = everything.model_copy(update={"backends": [by_id[WEATHER], by_id["Cocktails"]]})
    async with running(before) as indexer:
        alice = await indexer.sessions.open(Principal("issuer", "alice"), token())
        anonymous = await indexer.sessions.open(ANONYMOUS, None)
        assert alice.current.version.backends == {"Free_NBA", WEATHER}
        await indexer.reload(after)
        await wait_for(lambda: alice.current.number == 2 and anonymous.current.number == 2)
        # a passthrough backend added by a reload is listed with each session's token, as at creation
        assert alice.current.version.backends == {WEATHER, "Cocktails"}
        assert anonymous.current.version.backends == {WEATHER}
        assert anonymous.record.rejected_at_creation == {"Cocktails"}
        assert alice.record.swaps[-1].reason == "config reload: added Cocktails; removed Free_NBA"
        assert set(indexer.registry.states) == {WEATHER, "Cocktails"}
        assert indexer.monitor is not None and sorted(indexer.monitor.tracked) == [WEATHER, "Cocktails"]


async def test_ten_thousand_sessions_sharing_a_catalog_swap_to_the_versions_already_built(
    catalog: Catalog,
) -> None:
    # what the swaps cost is the bench's (part 5, re-index of 10,000 sessions): here, that each pass
    # moves every session and builds nothing
    async with running(catalog.config({"enabled": False})) as indexer:
        registry, manager = indexer.registry, indexer.sessions
        sessions = [await manager.open(ANONYMOUS, None) for _ in range(10_000)]
        listing = registry.get(WEATHER).listing
        assert listing is not None
        both = [sessions[0].current.version]
        registry.record_failure(WEATHER, BackendUnavailable(WEATHER, "down"), "unhealthy")
        await indexer.versions.rebuild_all(f"backend {WEATHER} unhealthy")
        both.append(sessions[0].current.version)
        builds = indexer.pool.builds
        for status, version in (("healthy", 0), ("unhealthy", 1), ("healthy", 0), ("unhealthy", 1)):
            if status == "healthy":
                registry.record_listing(WEATHER, listing)
            else:
                registry.record_failure(WEATHER, BackendUnavailable(WEATHER, "down"), "unhealthy")
            assert await indexer.versions.rebuild_all(f"backend {WEATHER} {status}") == 10_000
            assert all(s.current.version is both[version] for s in sessions)
        assert indexer.pool.builds == builds


class GatedPool(VersionPool):
    """A version pool whose next lookup waits until the test opens the gate."""

    gate: asyncio.Event | None = None

    async def get(self, tools: Sequence[Tool], key: str | None = None) -> IndexVersion:
        if (gate := self.gate) is not None:
            self.gate = None
            await gate.wait()
        return await super().get(tools, key)


async def test_a_session_opened_during_a_health_change_catches_up_with_it() -> None:
    backends = [Backend(id=b, url=f"http://127.0.0.1:9/{b}") for b in ("nba", "weather")]
    registry = Registry(backends)
    for backend in backends:
        registry.record_listing(backend.id, Listing(({"name": f"{backend.id}_tool"},), "2025-11-25", 0.0))
    embedder = FakeEmbedder()
    embeddings = Embeddings(embedder)
    builder = Builder(
        embeddings.embed_documents, embedder.count_tokens, embedder.max_tokens, SearchSettings()
    )
    pool = GatedPool(builder)
    manager = SessionManager(BackendLister(registry, {}, timeout=5.0), pool, Naming())
    gate = pool.gate = asyncio.Event()
    opening = asyncio.create_task(manager.open(ANONYMOUS, None))
    await wait_for(lambda: pool.gate is None)  # the new session's version is being looked up
    registry.record_failure("weather", BackendUnavailable("weather", "down"), "unhealthy")
    assert await manager.versions.rebuild_all("backend weather unhealthy") == 0  # not registered yet: missed
    gate.set()
    session = await opening
    assert session.current.version.backends == {"nba"}
    assert [swap.reason for swap in session.record.swaps] == [
        "created",
        "backends changed while the session opened",
    ]


class CountingEmbedder(FakeEmbedder):
    """The fake embedder, with the texts it was asked to count and embed recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.counted: list[str] = []
        self.embedded: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.embedded += texts
        return super().embed(texts)

    def count_tokens(self, text: str) -> int:
        self.counted.append(text)
        return super().count_tokens(text)


def builder_of(embedder: FakeEmbedder, max_tokens: int = 16) -> Builder:
    return Builder(embedder.embed, embedder.count_tokens, max_tokens, SearchSettings())


LISTINGS = {
    "nba": [
        {"name": "get_players", "description": "All players of a team, with their positions and numbers"},
        {"name": "get_games", "description": "Games of a season", "inputSchema": {"properties": {}}},
    ],
    "weather": [{"name": "forecast", "description": "Weather forecast for a city for the next seven days"}],
    "maps": [{"name": "forecast", "description": "Traffic forecast along a route"}],
}


def answers(version: IndexVersion) -> list[list[tuple[str, float]]]:
    queries = ["forecast for a city", "basketball players of a team", "traffic. then the weather"]
    embedder = FakeEmbedder()
    return [
        [(t.name, s) for t, s in version.find(Query.embedded(q, embedder.embed(query_texts(q))), 4)]
        for q in queries
    ]


def test_a_rebuild_over_tools_seen_before_derives_nothing_again() -> None:
    embedder = CountingEmbedder()
    builder = builder_of(embedder)
    everything = build_version(advertise(LISTINGS), builder)
    derived, counted, embedded = builder.documents.derived, len(embedder.counted), len(embedder.embedded)
    assert derived == 4 and counted and embedded
    # nba goes down, then comes back: the same tools under the same names
    fewer = build_version(advertise({b: t for b, t in LISTINGS.items() if b != "nba"}), builder)
    again = build_version(advertise(LISTINGS), builder)
    assert (builder.documents.derived, len(embedder.counted), len(embedder.embedded)) == (
        derived,
        counted,
        embedded,
    )
    assert again.fingerprint == everything.fingerprint
    # what a builder that never saw these tools makes of them
    for version in (fewer, again):
        fresh = build_version(version.tools, builder_of(FakeEmbedder()))
        assert version.fingerprint == fresh.fingerprint
        assert answers(version) == answers(fresh)


def test_a_tool_renamed_by_a_collision_is_derived_again() -> None:
    builder = builder_of(FakeEmbedder())
    everything = build_version(advertise(LISTINGS), builder)  # the forecasts are prefixed: maps_forecast
    held = build_version(advertise({b: t for b, t in LISTINGS.items() if b != "weather"}), builder)
    assert held.resolve("forecast") is not None
    assert builder.documents.derived == 5  # its advertised definition changed: maps' forecast only
    assert everything.resolve("maps_forecast") is not None


def test_a_prefixed_name_and_the_same_name_listed_as_is_are_different_tool_sets() -> None:
    def tool(name: str) -> dict[str, Any]:
        return {"name": name, "description": "Look a thing up.", "inputSchema": {"type": "object"}}

    prefixed = advertise({"a": [tool("x")], "b": [tool("x")]})  # a_x calls a's x
    as_listed = advertise({"a": [tool("a_x")], "b": [tool("b_x")]})  # a_x calls a's a_x
    assert [t.name for t in prefixed] == [t.name for t in as_listed] == ["a_x", "b_x"]
    assert fingerprint(prefixed) != fingerprint(as_listed)


def test_a_tool_no_version_holds_is_forgotten() -> None:
    builder = builder_of(FakeEmbedder())
    version = build_version(advertise(LISTINGS), builder)
    assert len(builder.documents) == 4
    del version
    gc.collect()
    assert len(builder.documents) == 0
    build_version(advertise(LISTINGS), builder)
    assert builder.documents.derived == 8


async def test_sessions_with_the_same_backends_share_one_set_of_them() -> None:
    backends = [Backend(id=b, url=f"http://127.0.0.1:9/{b}") for b in ("nba", "weather")]
    registry = Registry(backends)
    for backend in backends:
        registry.record_listing(backend.id, Listing(({"name": f"{backend.id}_tool"},), "2025-11-25", 0.0))
    lister = BackendLister(registry, {}, timeout=5.0)
    manager = SessionManager(lister, VersionPool(builder_of(FakeEmbedder())), Naming())
    first, second = [await manager.open(ANONYMOUS, None) for _ in range(2)]
    assert first.record.accepted == {"nba", "weather"} and first.record.accepted is second.record.accepted
    await manager.versions.remove_backends(["weather"])
    assert first.record.accepted == {"nba"} and first.record.accepted is second.record.accepted


async def test_a_tool_whose_backend_just_went_down_is_refused_before_the_swap_with_the_reason(
    catalog: Catalog,
) -> None:
    async with running(catalog.config({"enabled": False})) as indexer:
        session = await indexer.sessions.open(ANONYMOUS, None)
        name = next(t.name for t in session.current.version.tools if t.backend_id == WEATHER)
        resolver = ToolResolver(indexer.registry)
        assert resolver.resolve(session, name).backend_id == WEATHER
        # health has spoken; the rebuild that drops the backend's tools has not run yet
        indexer.registry.record_failure(WEATHER, BackendUnavailable(WEATHER, "down"), "unhealthy")
        assert any(t.backend_id == WEATHER for t in session.current.version.tools)
        with pytest.raises(ToolNotFound) as refused:
            resolver.resolve(session, name)
        assert f"belongs to backend {WEATHER}, which is unhealthy right now" in refused.value.reason
