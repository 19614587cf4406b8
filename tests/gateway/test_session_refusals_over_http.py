"""What a client is told at the session bounds, over HTTP: a full indexer answers 503 with Retry-After
and a JSON-RPC error naming the limit and how to free room (a principal at its own cap, 429); an
expired session answers 404 exactly as a session id never issued does.

A router served from the test's process in front of an indexer in the test's loop (the fake
embedder, no backends, the memory state with a short time to live and a cap of two sessions). Waits
are on conditions with bounded timeouts.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx2
import yaml

from commands.ports import free_port
from indexer.api.process import IndexerProcess
from indexer.api.server import create_server
from router.error_answers import http_answer
from router.errors import SessionsFull, TooManySessions
from router.link.indexer_errors import translate
from tests.support.clients import until
from tests.support.in_process import hosted_beside, serve_router
from tests.support.indexers import running_indexer
from tests.support.stack import HEADERS, INITIALIZE
from toolsearch.config import load_config

TTL = 5  # seconds: long enough to open the sessions the cap needs on a busy machine
WAIT = 30.0  # seconds any condition may take at most
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


@asynccontextmanager
async def front_door(folder: Path, indexer: dict[str, Any]) -> AsyncIterator[tuple[str, IndexerProcess]]:
    """An anonymous router on loopback before an indexer in the test's loop; yields the MCP URL and it."""
    indexer_port, router_port = free_port(), free_port()
    config = {
        "router": {"listen": f"127.0.0.1:{router_port}", "indexer": [f"127.0.0.1:{indexer_port}"]},
        "indexer": {
            "listen": f"127.0.0.1:{indexer_port}",
            "cache_dir": str(folder / "cache"),
            "health": {"enabled": False},
            **indexer,
        },
    }
    path = folder / "toolsearch.yaml"
    path.write_text(yaml.safe_dump(config))
    async with AsyncExitStack() as cleanup:
        process = await cleanup.enter_async_context(running_indexer(load_config(path), {}))
        server, _ = await create_server(process)
        await server.start()
        cleanup.push_async_callback(server.stop, 0)
        secrets = dict(os.environ)
        listen = f"127.0.0.1:{router_port}"
        serve = functools.partial(serve_router, load_config(path, secrets), listen, secrets)
        await cleanup.enter_async_context(hosted_beside(serve))
        yield f"http://127.0.0.1:{router_port}/mcp", process


async def post(url: str, body: dict[str, Any], session: str = "") -> httpx2.Response:
    headers = {**HEADERS, **({"Mcp-Session-Id": session} if session else {})}
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        return await http.post(url, json=body, headers=headers)


async def initialize(url: str) -> str:
    response = await post(url, INITIALIZE)
    assert response.status_code == 200, response.text
    return str(response.headers["mcp-session-id"])


async def test_a_full_indexer_answers_503_and_an_expired_session_404_like_an_unknown_one(
    tmp_path: Path,
) -> None:
    async with front_door(tmp_path, {"session_ttl": TTL, "max_sessions": 2}) as (url, indexer):
        first, second = await initialize(url), await initialize(url)
        refused = await post(url, INITIALIZE)
        assert refused.status_code == 503, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= TTL
        error = refused.json()["error"]
        assert "the indexer holds 2 sessions, the most indexer.max_sessions allows" in error["message"]
        assert "DELETE /mcp" in error["message"] and "Traceback" not in refused.text
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            closed = await http.delete(url, headers={**HEADERS, "Mcp-Session-Id": first})
        assert closed.status_code == 200
        third = await initialize(url)  # a closed session gave its place back at once

        unknown = await post(url, LIST, "u" * 32)
        assert unknown.status_code == 404

        async def expired() -> bool:  # asked of the indexer: a request would be a use, renewing it
            return not await indexer.sessions.records()

        await until(expired, "the unused sessions expire", WAIT)
        gone = await post(url, LIST, second)
        assert (gone.status_code, gone.json()) == (unknown.status_code, unknown.json())
        assert (await post(url, LIST, third)).status_code == 404  # idle as long: gone too
        await initialize(url)  # the expired ones gave their places back
        await initialize(url)


def _exhausted(kind: str, retry_after: str) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("toolsearch-error", kind), ("toolsearch-retry-after", retry_after))
    return grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), trailing, "full")


def test_each_cap_has_its_status_and_the_indexers_retry_hint_becomes_retry_after() -> None:
    everyone = translate(_exhausted("sessions-full", "40"))
    assert isinstance(everyone, SessionsFull) and everyone.retry_after == 40
    answer = http_answer(everyone, request_id=7)
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "40")
    assert json.loads(bytes(answer.body))["error"]["message"] == "too many sessions: full"
    own = http_answer(translate(_exhausted("too-many-sessions", "12")), request_id=7)
    assert (own.status_code, own.headers["retry-after"]) == (429, "12")
    garbled = translate(_exhausted("too-many-sessions", "soon"))
    assert isinstance(garbled, TooManySessions) and garbled.retry_after == 1
