"""The whole stack inside the test's process: catalog server, indexer and router on one event loop.

    with in_process_stack(tmp_path) as stack:  # a Stack: stack.mcp_url, stack.control("x", "down")
        ...

What `running_stack` starts as three processes runs here as their apps and services, on loopback
ports, on an event loop in a thread of its own: the test keeps its blocking or async clients, and
nothing is imported or loaded twice. The indexer serves the real model, loaded once per test process.
Only what needs a process is missing: `procs` is empty, there are no signals and no process output to
read. Tests about those stay in the system tier and use `running_stack`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from commands.catalog_server import DEFAULT_SECRET_ENV, CatalogServerSettings, create_app
from commands.ports import free_port
from indexer.api.embedding import configured_embedder
from indexer.api.process import IndexerProcess
from indexer.api.server import serving
from indexer.embedder import Embedder, load_embedder
from router.frontdoor.app import create_app as create_router_app
from router.frontdoor.auth import configured_authenticator
from router.frontdoor.server import RouterServer, router_server
from router.frontdoor.streams.held import Stopping
from tests.support.stack import DEMO_CATALOG, Stack, planned_stack
from toolsearch.catalog import load_catalog
from toolsearch.config import Config, load_config
from toolsearch.sections.indexer_settings import EmbeddingServer
from toolsearch.transport import channel_security, server_security

T = TypeVar("T")
START_TIMEOUT = 120.0  # seconds: a catalog the shared embedding cache lacks is embedded first
STOP_TIMEOUT = 30.0


@functools.cache
def _embedder(kind: str, model: Path, threads: int | None) -> Embedder:
    """One embedder per model for the test process: every in-process stack's indexer shares it."""
    return load_embedder(kind, model, threads)


class _LoopThread:
    """An event loop running in a daemon thread; `run` waits for a coroutine to finish on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="in-process-stack", daemon=True)

    def __enter__(self) -> _LoopThread:
        self._thread.start()
        return self

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        # as asyncio.run ends: what the parts left running (a library's watcher task) is cancelled
        # and awaited, so nothing is destroyed pending when the loop closes
        with contextlib.suppress(TimeoutError):
            self.run(_cancel_the_rest(), STOP_TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_TIMEOUT)
        self.loop.close()


async def _cancel_the_rest() -> None:
    rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=STOP_TIMEOUT)
    await asyncio.get_running_loop().shutdown_asyncgens()


async def _serve(server: uvicorn.Server, parts: AsyncExitStack) -> None:
    """Start `server` on the running loop, its stop pushed on `parts`; returns once it listens."""
    task = asyncio.create_task(server.serve())

    async def stop() -> None:
        server.should_exit = True
        await task

    parts.push_async_callback(stop)
    while not server.started:
        if task.done():  # it could not bind or its app's start-up failed: say why
            task.result()
            raise RuntimeError("the in-process server stopped before it served")
        await asyncio.sleep(0.01)


async def serve_app(app: Any, listen: str, parts: AsyncExitStack) -> str:
    """Any ASGI app on `listen` (HOST:PORT), its stop pushed on `parts`; returns its base URL."""
    host, _, port = listen.rpartition(":")
    config = uvicorn.Config(app, host, int(port), log_config=None, timeout_graceful_shutdown=1)
    await _serve(uvicorn.Server(config), parts)
    return f"http://{listen}"


@asynccontextmanager
async def app_beside(app: Any) -> AsyncIterator[str]:
    """Any ASGI app on a free loopback port, served beside the test's loop; yields its base URL."""
    listen = f"127.0.0.1:{free_port()}"
    async with hosted_beside(functools.partial(serve_app, app, listen)):
        yield f"http://{listen}"


async def serve_catalog(
    catalog: Path, listen: str, settings: CatalogServerSettings, parts: AsyncExitStack
) -> None:
    """`toolsearch catalog-server`'s app on `listen`, its stop pushed on `parts`."""
    host, _, port = listen.rpartition(":")
    # as the command: calls a test left hanging get 5 s when it stops
    config = uvicorn.Config(
        create_app(load_catalog(catalog), settings),
        host,
        int(port),
        log_config=None,
        timeout_graceful_shutdown=5,
    )
    await _serve(uvicorn.Server(config), parts)


async def _start(
    config: Config,
    catalog: Path,
    routers: Sequence[str],
    allowed_subjects: Sequence[str] | None,
    secrets: Mapping[str, str],
    parts: AsyncExitStack,
) -> None:
    """The catalog server, the indexer and a router per `routers` address, started in that order."""
    require_jwt = frozenset(config.catalog_servers[0].require_jwt)
    settings = CatalogServerSettings(
        require_jwt=require_jwt,
        jwt_secret=secrets.get(DEFAULT_SECRET_ENV) if require_jwt else None,
        allowed_subjects=None if allowed_subjects is None else frozenset(allowed_subjects),
        control=True,
    )
    await serve_catalog(catalog, config.catalog_servers[0].listen, settings, parts)

    choice = config.indexer.embedder
    if isinstance(choice, EmbeddingServer):  # an inference server: asked as `toolsearch indexer` asks it
        embedder = await configured_embedder(config.indexer, secrets)
    else:
        embedder = await asyncio.to_thread(
            _embedder, choice, config.indexer.model, config.indexer.model_threads
        )
    indexer = IndexerProcess.build(config, embedder, secrets)
    await indexer.start()
    parts.push_async_callback(indexer.close)
    security = server_security(config.indexer, secrets)
    await parts.enter_async_context(serving(indexer, config.indexer.shutdown_grace, security=security))

    for listen in routers:
        await serve_router(config, listen, secrets, parts)


async def serve_router(
    config: Config, listen: str, secrets: Mapping[str, str], parts: AsyncExitStack
) -> RouterServer:
    """`toolsearch router` of `config` on `listen`: its authenticator, link and front door.

    Returns its server, whose `handle_exit(signal.SIGTERM, None)` is what the signal would do to the
    process: the router begins to stop (`LightStack.begin_stop` says how without ending the event
    streams of every server in this process). Its stop on `parts` begins the same way.
    """
    settings = config.router.model_copy(update={"listen": listen})
    stopping = Stopping()
    app = create_router_app(
        config,
        secrets,
        configured_authenticator(settings.auth, secrets),
        indexer_security=channel_security(settings, secrets),
        stopping=stopping,
    )
    server = router_server(app, settings, "warning", "json", stopping)
    await _serve(server, parts)
    parts.callback(stopping.set)  # before the server's own stop: as SIGTERM, the held streams end first
    return server


@contextmanager
def in_process_stack(
    workdir: Path,
    catalog: Path = DEMO_CATALOG,
    routers: int = 1,
    extra: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    backend_timeout: float = 30.0,
    require_jwt: Sequence[str] = (),
    allowed_subjects: Sequence[str] | None = None,
) -> Iterator[Stack]:
    """`running_stack`'s one catalog server, indexer and router, served from this process.

    `env` is what the processes would have had in their environment: overrides of the configuration
    (TOOLSEARCH_*) and secrets; `allowed_subjects` are the only JWT subjects the catalog server lets in.
    """
    stack = planned_stack(workdir, catalog, routers, extra, env, backend_timeout, require_jwt)
    secrets = {**os.environ, **(env or {})}
    config = load_config(stack.config_path, secrets)
    listens = [url.removeprefix("http://") for url in stack.router_urls]
    with hosted(functools.partial(_start, config, catalog, listens, allowed_subjects, secrets)):
        yield stack


@contextmanager
def catalog_server_in_process(catalog: Path, settings: CatalogServerSettings) -> Iterator[str]:
    """`toolsearch catalog-server` of `catalog` served from this process; yields its base URL."""
    listen = f"127.0.0.1:{free_port()}"
    with hosted(functools.partial(serve_catalog, catalog, listen, settings)):
        yield f"http://{listen}"


Start = Callable[[AsyncExitStack], Coroutine[Any, Any, object]]  # starts parts, pushing their stops


@contextmanager
def hosted(start: Start) -> Iterator[None]:
    """What `start` starts, on a loop of its own; stopped in reverse after."""
    with _LoopThread() as thread:
        parts = AsyncExitStack()
        try:
            thread.run(start(parts), START_TIMEOUT)
            yield
        finally:
            thread.run(parts.aclose(), STOP_TIMEOUT)


@asynccontextmanager
async def hosted_beside(start: Start) -> AsyncIterator[None]:
    """`hosted`, entered from a test's event loop, which goes on running (its parts may be needed)."""
    with _LoopThread() as thread:
        parts = AsyncExitStack()
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(start(parts), thread.loop))
            yield
        finally:
            async with asyncio.timeout(STOP_TIMEOUT):
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(parts.aclose(), thread.loop))
