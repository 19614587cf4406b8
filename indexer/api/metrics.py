"""The indexer's Prometheus metrics, served over HTTP on `indexer.health_listen` when it is set
(indexer/api/probes.py: the port the probes ask too).

Most families are read at scrape time from the parts that keep the numbers anyway (sessions, the
version pool, the embedding counters, the backend registry), so serving requests costs nothing
extra. The scrape runs on the exporter's thread while those parts belong to the event loop, so the
reading itself is scheduled onto the loop (`metrics_reader`) and the thread only formats the copy.

`RpcObserver`, a server interceptor, times every unary call by method and status code (FindTools is
find_tool's search) and binds the call's log context: the router's request id from the
`x-request-id` metadata and the first characters of the request's session id.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from indexer.api.probes import ProbeEndpoint
from indexer.backends.registry import Registry
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import VersionPool
from indexer.sessions.manager import SessionManager
from indexer.state.backends import STATUSES
from toolsearch.logs import REQUEST_ID_HEADER, bound
from toolsearch.tracing import rpc_name

logger = logging.getLogger(__name__)

FINGERPRINT_CHARS = 12  # enough to tell live versions apart; the full one is in `toolsearch status`
READING_TIMEOUT = 5.0  # seconds a scrape waits for the event loop
_RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class MetricsReading:
    """The numbers of one scrape, copied on the event loop."""

    sessions: int
    version_sessions: dict[str, int]  # live version fingerprint -> sessions whose current it is
    versions_built: int
    cache_hits: int
    cache_misses: int
    model_calls: int
    texts_embedded: int
    backends: dict[str, str]  # backend id -> status
    embedding_unavailable: bool = False  # an inference server down: find_tool answers lexically
    lexical_answers: int = 0
    denials: dict[tuple[str, str], int] | None = None  # (action, policy label) -> calls denied


def take_reading(
    sessions: SessionManager, pool: VersionPool, registry: Registry, embeddings: Embeddings
) -> MetricsReading:
    """Copy the numbers; call it on the event loop that owns the parts."""
    held: dict[str, int] = {version.fingerprint: 0 for version in pool.versions()}
    for session in sessions.sessions():
        key = session.current.version.fingerprint  # the shared index: allowed sets are masks over it
        held[key] = held.get(key, 0) + 1
    return MetricsReading(
        sessions=len(sessions),
        version_sessions=held,
        versions_built=pool.builds,
        cache_hits=embeddings.cache_hits,
        cache_misses=embeddings.cache_misses,
        model_calls=embeddings.model_calls,
        texts_embedded=embeddings.texts_embedded,
        backends={backend_id: state.status for backend_id, state in registry.states.items()},
        embedding_unavailable=embeddings.outage is not None and embeddings.outage.down,
        lexical_answers=embeddings.outage.lexical_answers if embeddings.outage is not None else 0,
        denials=dict(sessions.access.denials),
    )


def metrics_reader(
    sessions: SessionManager,
    pool: VersionPool,
    registry: Registry,
    embeddings: Embeddings,
    loop: asyncio.AbstractEventLoop,
) -> Callable[[], MetricsReading]:
    """A function any thread may call: it takes the reading on `loop` and waits for it."""

    async def take() -> MetricsReading:
        return take_reading(sessions, pool, registry, embeddings)

    def read() -> MetricsReading:
        return asyncio.run_coroutine_threadsafe(take(), loop).result(READING_TIMEOUT)

    return read


class _ReadingCollector(Collector):
    """The scrape-time families, from one reading per scrape."""

    def __init__(self, read: Callable[[], MetricsReading]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        try:
            now = self._read()
        except TimeoutError:
            # a busy loop delays one scrape's gauges; it must not fail the whole scrape
            logger.warning("metrics: the event loop did not answer within %ss", READING_TIMEOUT)
            return
        yield GaugeMetricFamily("toolsearch_indexer_sessions", "Sessions open", value=now.sessions)
        yield GaugeMetricFamily(
            "toolsearch_indexer_index_versions", "Index versions alive", value=len(now.version_sessions)
        )
        shared = sum(1 for count in now.version_sessions.values() if count > 1)
        yield GaugeMetricFamily(
            "toolsearch_indexer_index_versions_shared", "Index versions current for 2+ sessions", value=shared
        )
        per_version = GaugeMetricFamily(
            "toolsearch_indexer_index_version_sessions",
            "Sessions whose current index version this is, per live version",
            labels=["fingerprint"],
        )
        for fingerprint, count in sorted(now.version_sessions.items()):
            per_version.add_metric([fingerprint[:FINGERPRINT_CHARS]], count)
        yield per_version
        counters = (
            ("toolsearch_indexer_index_versions_built", "Index versions built", now.versions_built),
            ("toolsearch_indexer_embedding_cache_hits", "Texts embedded from the cache", now.cache_hits),
            ("toolsearch_indexer_embedding_cache_misses", "Texts that needed the model", now.cache_misses),
            ("toolsearch_indexer_embedding_model_calls", "Calls of the embedding model", now.model_calls),
            ("toolsearch_indexer_embedding_texts", "Texts passed to the model", now.texts_embedded),
            (
                "toolsearch_indexer_lexical_answers",
                "find_tool answers from the lexical arm alone (the embedder unavailable)",
                now.lexical_answers,
            ),
        )
        for name, documentation, value in counters:
            yield CounterMetricFamily(name, documentation, value=value)
        yield GaugeMetricFamily(
            "toolsearch_indexer_embedding_unavailable",
            "1 while the embedder (an inference server) cannot embed",
            value=1.0 if now.embedding_unavailable else 0.0,
        )
        denied = CounterMetricFamily(
            "toolsearch_indexer_authorization_denials",
            "Calls the authorization policy denied, by action and the policy that decided "
            '("" when no policy permits it)',
            labels=["action", "policy"],
        )
        for (action, policy), count in sorted((now.denials or {}).items()):
            denied.add_metric([action, policy], count)
        yield denied
        health = GaugeMetricFamily(
            "toolsearch_indexer_backend_status",
            "1 for each backend's current health status, 0 for the others",
            labels=["backend", "status"],
        )
        for backend_id, current in sorted(now.backends.items()):
            for status in STATUSES:
                health.add_metric([backend_id, status], 1.0 if status == current else 0.0)
        yield health


def _code_name(code: Any) -> str:
    return code.name if isinstance(code, grpc.StatusCode) else "OK"


class RpcObserver(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Times each unary call by method and status code, and binds its log context."""

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        inner = getattr(handler, "unary_unary", None)
        if inner is None or not inspect.iscoroutinefunction(inner):
            return handler  # streams (reflection) and unknown methods pass untouched
        method = rpc_name(handler_call_details.method)
        metadata = dict(handler_call_details.invocation_metadata or ())
        request_id = str(metadata.get(REQUEST_ID_HEADER, ""))
        histogram = self._histogram

        async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            code = "UNKNOWN"
            with bound(request=request_id, session=str(getattr(request, "session_id", "") or "")):
                try:
                    response = await inner(request, context)
                    code = _code_name(context.code())
                    return response
                except grpc.aio.AbortError:
                    code = _code_name(context.code())
                    raise
                finally:
                    histogram.labels(method, code).observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            observed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class IndexerMetrics:
    """The indexer's registry: the RPC histogram and the scrape-time families of `read`."""

    def __init__(self, read: Callable[[], MetricsReading]) -> None:
        self.registry = CollectorRegistry()
        self.rpc_seconds = Histogram(
            "toolsearch_indexer_rpc_duration_seconds",
            "gRPC call latency by method (FindTools: find_tool's search) and status code",
            ["method", "code"],
            buckets=_RPC_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_ReadingCollector(read))

    def interceptor(self) -> RpcObserver:
        return RpcObserver(self.rpc_seconds)

    def serve(self, listen: str, loop: asyncio.AbstractEventLoop) -> ProbeEndpoint:
        """Start serving `/metrics`, `/healthz` and `/readyz` on `listen` (HOST:PORT, port 0 for any
        free one); `loop` is the one whose answers `/healthz` waits for (indexer/api/probes.py)."""
        return ProbeEndpoint(listen, self.registry, loop)
