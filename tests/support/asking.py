"""A stack whose one extra backend is the asking server (tests/support/asking_server.py), and,
when asked for, a second router in front of the same indexer: every part in the test's process.

    async with asking_stack(tmp_path, timeout=5) as stack: ...
    async with asking_replicas(tmp_path, timeout=5) as (stack, other_mcp_url): ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.support.asking_server import asking_app
from tests.support.in_process import app_beside
from tests.support.routers import LightStack, light_stack, router_beside


@asynccontextmanager
async def asking_stack(
    folder: Path, timeout: float, indexer: dict[str, Any] | None = None
) -> AsyncIterator[LightStack]:
    """A light stack whose backend `asking` (call `timeout` seconds) is a new asking server;
    `indexer` adds to the indexer's section."""
    async with app_beside(asking_app()) as url:
        backend = {"id": "asking", "url": f"{url}/mcp/", "timeout": timeout}
        async with light_stack(folder, backends=[backend], indexer=indexer) as stack:
            yield stack


@asynccontextmanager
async def asking_replicas(
    folder: Path, timeout: float, indexer: dict[str, Any] | None = None
) -> AsyncIterator[tuple[LightStack, str]]:
    """`asking_stack`, and a second router's MCP URL."""
    async with asking_stack(folder, timeout, indexer) as stack, router_beside(stack) as second_url:
        yield stack, f"{second_url}/mcp"
