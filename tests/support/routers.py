"""A router in front of an indexer the test serves from its own event loop: a stack in a second.

    async with light_stack(tmp_path, router={"max_connections": 5}) as stack:
        ...  # stack.mcp_url, stack.catalog_url, stack.indexer (IndexerProcess)

The indexer runs in the test's loop with the fake embedder (tests/support/indexers.py), so no model
is loaded, and may be stopped and started again (`stack.indexers`); the catalog server and the
router are served from the test's process too, on a loop of their own (tests/support/in_process.py);
`router_beside` adds a second router there. A test about the router as a process (its log, its
memory, its signals) asks for `router_process=True` and has it as `stack.router`. The test must not block
its loop while the router needs the indexer: it awaits its requests (httpx2.AsyncClient) or runs
blocking clients in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sse_starlette.sse import AppStatus

from commands.catalog_server import DEFAULT_SECRET_ENV, CatalogServerSettings
from commands.ports import free_port
from indexer.api.process import IndexerProcess
from indexer.api.server import create_server
from router.frontdoor.server import RouterServer
from tests.support.catalogs import small_catalog
from tests.support.in_process import hosted_beside, serve_catalog, serve_router
from tests.support.indexers import running_indexer
from tests.support.processes import Proc, start_process
from tests.support.stack import CLI, EMBEDDING_CACHE
from toolsearch.config import Config, load_config


class IndexerInLoop:
    """The indexer of a configuration, served on its port from the test's loop; it may be stopped
    and started again there, a new indexer that knows nothing of the last one (the memory state)."""

    def __init__(self, config: Config, secrets: Mapping[str, str]) -> None:
        self.config, self.secrets = config, secrets
        self._served = AsyncExitStack()
        self._current: IndexerProcess | None = None

    @property
    def current(self) -> IndexerProcess:
        assert self._current is not None, "the indexer is stopped"
        return self._current

    async def start(self) -> IndexerProcess:
        indexer = await self._served.enter_async_context(running_indexer(self.config, self.secrets))
        grpc_server, _ = await create_server(indexer)
        await grpc_server.start()
        self._served.push_async_callback(grpc_server.stop, 0)
        self._current = indexer
        return indexer

    async def stop(self) -> None:
        """Its port closes, its calls end, and whatever it kept is gone."""
        self._current = None
        await self._served.aclose()


@dataclass
class LightStack:
    config_path: Path
    catalog_url: str
    router_url: str
    router_proc: Proc | None  # None: the router is served in process
    indexers: IndexerInLoop
    router_server: RouterServer | None = None  # the router served in process, if it is

    @property
    def indexer(self) -> IndexerProcess:
        return self.indexers.current

    @property
    def mcp_url(self) -> str:
        return f"{self.router_url}/mcp"

    @property
    def router(self) -> Proc:
        """The router's process, for a stack asked for with `router_process=True`."""
        assert self.router_proc is not None, "the router runs in process: ask for router_process=True"
        return self.router_proc

    def begin_stop(self) -> None:
        """The router begins to stop as SIGTERM makes it: the signal to its process, or what uvicorn
        does with it (`handle_exit`) to the router served in process, but for sse_starlette's flag,
        which is the process's: it would end every event stream served here (the backends' too) for
        the rest of the run."""
        if self.router_proc is not None:
            self.router_proc.send_signal(signal.SIGTERM)
            return
        assert self.router_server is not None
        AppStatus.disable_automatic_graceful_drain()
        try:
            self.router_server.handle_exit(signal.SIGTERM, None)
        finally:
            AppStatus.enable_automatic_graceful_drain_mode()


def start_router(
    config_path: Path, port: int, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
) -> Proc:
    """`toolsearch router` on 127.0.0.1:`port`, ready once /healthz answers (the indexer may be down)."""
    return start_process(
        [*CLI, "router", "--config", str(config_path), *args],
        f"http://127.0.0.1:{port}/healthz",
        timeout=60,
        env={"TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}", **(env or {})},
    )


@asynccontextmanager
async def light_stack(
    folder: Path,
    router: Mapping[str, Any] | None = None,
    catalog: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    require_jwt: tuple[str, ...] = (),
    router_args: Sequence[str] = (),
    backends: Sequence[Mapping[str, Any]] = (),
    indexer: Mapping[str, Any] | None = None,
    router_process: bool = False,
    authorization: Mapping[str, Any] | None = None,
) -> AsyncIterator[LightStack]:
    """A catalog server (with test controls) of three small servers, an indexer, and a router.

    `router` adds to the router section, `catalog` to the catalog server's entry (e.g.
    `backend_max_response_bytes`); `env` goes to the processes and gives the indexer its secrets;
    `require_jwt` names the catalog servers that demand a JWT (secret in `env`); `backends` are
    more backends beside the catalog server's, `indexer` adds to the indexer section; `router_args` go
    to `toolsearch router` (e.g. `--log-format json`) and make it a process, as `router_process` does;
    `authorization` is the configuration's section of that name (a policy file beside the config).
    """
    small_catalog(folder / "catalog.jsonl")
    catalog_port, indexer_port, router_port = free_port(), free_port(), free_port()
    server: dict[str, Any] = {
        "catalog": str(folder / "catalog.jsonl"),
        "listen": f"127.0.0.1:{catalog_port}",
        "require_jwt": list(require_jwt),
        **(catalog or {}),
    }
    config: dict[str, Any] = {
        "router": {
            "listen": f"127.0.0.1:{router_port}",
            "indexer": [f"127.0.0.1:{indexer_port}"],
            **(router or {}),
        },
        "indexer": {
            "listen": f"127.0.0.1:{indexer_port}",
            "cache_dir": str(EMBEDDING_CACHE),
            "discovery_timeout": 10.0,
            "health": {"enabled": False},
            **(indexer or {}),
        },
        "catalog_servers": [server],
        "backends": [dict(b) for b in backends],
    }
    if authorization is not None:
        config["authorization"] = dict(authorization)
    path = folder / "toolsearch.yaml"
    path.write_text(yaml.safe_dump(config))
    secrets = {**os.environ, **(env or {})}
    settings = CatalogServerSettings(
        require_jwt=frozenset(require_jwt),
        jwt_secret=secrets.get(DEFAULT_SECRET_ENV) if require_jwt else None,
        control=True,
    )
    async with AsyncExitStack() as cleanup:
        catalog_listen = server["listen"]
        await cleanup.enter_async_context(
            hosted_beside(functools.partial(serve_catalog, Path(server["catalog"]), catalog_listen, settings))
        )
        indexers = IndexerInLoop(load_config(path), dict(env or {}))
        await indexers.start()
        cleanup.push_async_callback(indexers.stop)
        proc, served = None, []
        if router_process or router_args:
            proc = await asyncio.to_thread(start_router, path, router_port, env, router_args)
            cleanup.callback(proc.stop)
        else:
            listen = f"127.0.0.1:{router_port}"

            async def start(parts: AsyncExitStack) -> None:
                served.append(await serve_router(load_config(path, secrets), listen, secrets, parts))

            await cleanup.enter_async_context(hosted_beside(start))
        catalog_url, router_url = f"http://127.0.0.1:{catalog_port}", f"http://127.0.0.1:{router_port}"
        yield LightStack(path, catalog_url, router_url, proc, indexers, served[0] if served else None)


def _router_config(stack: LightStack, settings: Mapping[str, Any], name: str = "") -> tuple[Path, int]:
    """A configuration file beside the stack's (`name`.yaml, else named for the port), for one more
    router with its `router` section changed by `settings`, on a port of its own."""
    config = yaml.safe_load(stack.config_path.read_text())
    port = free_port()
    config["router"] = {**config["router"], **settings, "listen": f"127.0.0.1:{port}"}
    path = stack.config_path.with_name(f"{name or f'router-{port}'}.yaml")
    path.write_text(yaml.safe_dump(config))
    return path, port


@asynccontextmanager
async def router_beside(
    stack: LightStack, settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> AsyncIterator[str]:
    """One more router in front of the stack's indexer, served from the test's process (a replica: it
    shares nothing with the first but the indexer); yields its base URL."""
    path, port = _router_config(stack, settings or {})
    secrets = {**os.environ, **(env or {})}
    start = functools.partial(serve_router, load_config(path, secrets), f"127.0.0.1:{port}", secrets)
    async with hosted_beside(start):
        yield f"http://127.0.0.1:{port}"


def another_router(
    stack: LightStack, name: str, settings: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> tuple[Proc, str]:
    """One more router in front of the stack's indexer, its `router` section changed by `settings`.

    Returns the process (the caller stops it) and its base URL. Blocking: call it in a thread.
    """
    path, port = _router_config(stack, settings, name)
    return start_router(path, port, env), f"http://127.0.0.1:{port}"
