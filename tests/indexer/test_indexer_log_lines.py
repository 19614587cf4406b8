"""What the indexer says at INFO and what it keeps for DEBUG: status changes and progress, not probes."""

from __future__ import annotations

import logging

import pytest

from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.embedder import FakeEmbedder
from indexer.errors import BackendUnavailable
from indexer.retrieval.embeddings import Embeddings
from indexer.state.listings import Listing
from indexer.upkeep.health import HealthMonitor
from toolsearch.sections.backend_settings import Backend
from toolsearch.sections.indexer_settings import Health


def listing() -> Listing:
    return Listing(({"name": "tool", "inputSchema": {"type": "object"}},), "2025-11-25", 0.01)


class Probe:
    """A backend that answers, or fails with `error` when it is set."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    async def __call__(self, backend: Backend, timeout: float) -> Listing:
        if self.error is not None:
            raise self.error
        return listing()


class Rebuilds:
    def request(self, reason: str) -> None:
        pass


def monitor() -> tuple[HealthMonitor, Probe]:
    backend = Backend(id="a", url="http://127.0.0.1:9/a")
    registry = Registry([backend])
    registry.record_listing("a", listing())
    probe = Probe()
    lister = BackendLister(registry, {}, timeout=5.0)
    return HealthMonitor(lister, Health(unhealthy_after=1), Rebuilds(), probe=probe), probe


def lines(caplog: pytest.LogCaptureFixture, name: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == level]


async def test_a_probe_is_a_debug_line_and_only_a_change_of_status_is_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health, probe = monitor()
    caplog.set_level(logging.DEBUG, logger="indexer.upkeep.health")
    await health.check("a")
    await health.check("a")
    debug = lines(caplog, "indexer.upkeep.health", logging.DEBUG)
    assert len(debug) == 2 and all(line.startswith("probe of a: ok in ") for line in debug)
    assert lines(caplog, "indexer.upkeep.health", logging.INFO) == []
    probe.error = BackendUnavailable("a", "connection refused")
    await health.check("a")
    assert lines(caplog, "indexer.upkeep.health", logging.INFO) == [
        "backend a: healthy -> unhealthy: connection refused"
    ]
    assert lines(caplog, "indexer.upkeep.health", logging.DEBUG)[-1].endswith(
        "unhealthy (connection refused)"
    )
    probe.error = None
    await health.check("a")  # back, on probation for one interval
    await health.check("a")
    changes = lines(caplog, "indexer.upkeep.health", logging.INFO)[1:]
    assert [line.split(" ms")[0].rsplit(" ", 1)[0] for line in changes] == [
        "backend a: unhealthy -> degraded: answered in",
        "backend a: degraded -> healthy: answered in",
    ]
    assert changes[0].endswith(" ms, after failing: degraded for one interval")


def test_a_large_batch_logs_texts_done_and_rate_as_it_goes(caplog: pytest.LogCaptureFixture) -> None:
    # progress_every=0: a line after every chunk but the last, then the closing one
    cache = Embeddings(FakeEmbedder(), document_batch=50, progress_every=0.0)
    caplog.set_level(logging.INFO, logger="indexer.retrieval.embeddings")
    cache.embed_documents([f"tool number {n}" for n in range(200)])
    progress = lines(caplog, "indexer.retrieval.embeddings", logging.INFO)
    assert [line.split(" texts")[0] for line in progress] == [
        "embedding: 50 of 200",
        "embedding: 100 of 200",
        "embedding: 150 of 200",
        "embedding: 200 of 200",
    ]
    assert all("texts/s" in line for line in progress)
    assert "(100%)" in progress[-1]


def test_a_batch_done_within_the_interval_or_from_the_cache_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = Embeddings(FakeEmbedder(), document_batch=50, progress_every=0.0)
    texts = [f"tool number {n}" for n in range(120)]
    cache.embed_documents(texts)
    caplog.set_level(logging.INFO, logger="indexer.retrieval.embeddings")
    cache.embed_documents(texts)  # every vector from the cache: nothing to report
    assert lines(caplog, "indexer.retrieval.embeddings", logging.INFO) == []
    quiet = Embeddings(FakeEmbedder(), document_batch=50, progress_every=3600.0)
    quiet.embed_documents(texts)
    assert lines(caplog, "indexer.retrieval.embeddings", logging.INFO) == []
