"""The indexer's gRPC server around an `IndexerProcess` (`toolsearch indexer` runs `serve`).

`serve` stacks the HTTP endpoint of the probes and metrics (indexer/api/probes.py), the indexer's
parts (indexer/api/process.py) and the gRPC server on one exit stack; the server's health says
NOT_SERVING, and `/readyz` 503, before the server stops, so that a balancer watching it sends no new
calls while the calls in flight drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from indexer.api.access import SharedSecretGuard
from indexer.api.embedding import configured_embedder
from indexer.api.metrics import IndexerMetrics, metrics_reader
from indexer.api.process import IndexerProcess
from indexer.api.service import IndexerService
from indexer.traces import RpcSpans
from toolsearch.config import Config, ConfigError, load_config
from toolsearch.transport import ServerSecurity, server_security
from toolsearch.v1 import indexer_pb2, indexer_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = indexer_pb2.DESCRIPTOR.services_by_name["Indexer"].full_name


async def create_server(
    indexer: IndexerProcess,
    listen: str | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    security: ServerSecurity | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A gRPC server with the indexer, health and reflection services; binds, does not start.

    `security` protects the port (toolsearch/transport.py): TLS credentials, a shared secret.
    """
    server, port, _ = await _bound_server(indexer, listen, interceptors, security)
    return server, port


@contextlib.asynccontextmanager
async def serving(
    indexer: IndexerProcess,
    grace: float,
    listen: str | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    security: ServerSecurity | None = None,
) -> AsyncIterator[int]:
    """The gRPC server of `create_server`, started; yields its port.

    On exit its health says NOT_SERVING first, so a balancer watching it (a client's health
    check, a load balancer) stops sending new calls; then the server refuses new calls and lets
    the ones in flight finish within `grace` seconds (long polls answer at once). Watches in flight
    hear the NOT_SERVING.
    """
    server, port, health = await _bound_server(indexer, listen, interceptors, security)
    try:
        await server.start()
        yield port
    finally:
        await health.enter_graceful_shutdown()
        indexer.sessions.waits.close()  # long polls answer now: they would hold the drain otherwise
        await server.stop(grace)


async def _bound_server(
    indexer: IndexerProcess,
    listen: str | None,
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    security: ServerSecurity | None,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    security = security or ServerSecurity()
    if security.secret is not None:
        interceptors = [*interceptors, SharedSecretGuard(security.secret)]
    age = indexer.config.indexer.connection_max_age
    options: list[tuple[str, int]] = [("grpc.so_reuseport", 0)]
    if age > 0:
        # a connection closed now and then (GOAWAY: calls in flight finish) makes each router resolve
        # dns:/// again, so replicas an autoscaler adds take calls within `connection_max_age`
        options += [
            ("grpc.max_connection_age_ms", int(age * 1000)),
            ("grpc.max_connection_age_grace_ms", 60_000),
        ]
    server = grpc.aio.server(options=options, interceptors=list(interceptors) or None)
    service = IndexerService(
        indexer.sessions,
        indexer.registry,
        indexer.finder,
        indexer.embeddings,
        indexer.config.indexer.naming,
        indexer.lister.backend_tokens,
        indexer.tools_changed,
        indexer.state.rounds,
        indexer.state.streams,
    )
    indexer_pb2_grpc.add_IndexerServicer_to_server(service, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, reflection.SERVICE_NAME, "grpc.health.v1.Health"), server
    )
    address = listen or indexer.config.indexer.listen
    if security.credentials is not None:
        port = server.add_secure_port(address, security.credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {listen or indexer.config.indexer.listen}")
    # SERVING from the start: the server is only started once the indexer is ready
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health


async def _reload_from(indexer: IndexerProcess, path: Path, env: Mapping[str, str]) -> None:
    """Reread the configuration file and apply it; a bad file is reported and changes nothing."""
    try:
        config = await asyncio.to_thread(load_config, path, env)
    except ConfigError as exc:
        logger.error("config reload ignored: %s", exc)
        return
    await indexer.reload(config)


async def serve(config: Config, secrets: Mapping[str, str], config_path: Path | None = None) -> None:
    """Run the indexer until SIGTERM or SIGINT, then drain in-flight calls; SIGHUP rereads `config_path`."""
    security = server_security(config.indexer, secrets)  # before the slow start: a bad secret fails fast
    embedder = await configured_embedder(config.indexer, secrets)
    indexer = IndexerProcess.build(config, embedder, secrets)
    # One stack for the process: each part's stop is pushed as it starts, so a failed start stops
    # what came before it, and a signal unwinds in reverse: reloads cancelled, /readyz 503, the server
    # drained (NOT_SERVING first), the indexer's parts closed, the probes' endpoint closed last.
    async with contextlib.AsyncExitStack() as stack:
        loop = asyncio.get_running_loop()
        parts = (indexer.sessions, indexer.pool, indexer.registry, indexer.embeddings)
        metrics = IndexerMetrics(metrics_reader(*parts, loop))
        probes = None
        if config.indexer.health_listen:
            # up before the slow start: /readyz says "starting" (503) meanwhile, /healthz answers
            probes = metrics.serve(config.indexer.health_listen, loop)
            stack.push_async_callback(asyncio.to_thread, probes.close)  # waits for its serving thread
        await indexer.start()
        stack.push_async_callback(indexer.close)
        # What start-up loaded lives as long as the process (torch, the model, the warm-up's versions):
        # frozen, a full collection no longer walks it, which took up to a second in the middle of a
        # re-index or a request.
        gc.freeze()
        interceptors = [RpcSpans(), metrics.interceptor()]  # the span outermost: the log context runs in it
        port = await stack.enter_async_context(
            serving(indexer, config.indexer.shutdown_grace, interceptors=interceptors, security=security)
        )
        if probes is not None:
            probes.ready = True
            stack.callback(setattr, probes, "ready", False)  # unready first as the stop begins
        host = config.indexer.listen.rpartition(":")[0]
        print(f"indexer listening on {host}:{port}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reloads: set[asyncio.Task[None]] = set()  # held so a running reload is not garbage-collected

        @stack.callback
        def cancel_reloads() -> None:
            for task in list(reloads):
                task.cancel()

        if config_path is not None:

            def on_hangup() -> None:
                task = loop.create_task(_reload_from(indexer, config_path, secrets), name="config-reload")
                reloads.add(task)
                task.add_done_callback(reloads.discard)

            loop.add_signal_handler(signal.SIGHUP, on_hangup)
        await stop.wait()
