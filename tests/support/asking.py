"""A stack whose one extra backend is the asking server (tests/support/asking_server.py), and,
when asked for, a second router in front of the same indexer.

    async with asking_stack(tmp_path, timeout=5) as stack: ...
    async with asking_replicas(tmp_path, timeout=5) as (stack, other_mcp_url): ...
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from commands.ports import free_port
from tests.support.processes import port_accepts, start_process
from tests.support.routers import LightStack, another_router, light_stack
from tests.support.waits import wait_for

ASKING_SERVER = [sys.executable, "-m", "tests.support.asking_server"]  # run from the checkout's root
ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def asking_stack(
    folder: Path, timeout: float, indexer: dict[str, Any] | None = None
) -> AsyncIterator[LightStack]:
    """A light stack whose backend `asking` (call `timeout` seconds) is the asking server; `indexer`
    adds to the indexer's section."""
    port = free_port()
    server = await asyncio.to_thread(start_process, [*ASKING_SERVER, str(port)], None, cwd=ROOT)
    try:
        await wait_for(lambda: port_accepts(port) or server.returncode is not None)
        backend = {"id": "asking", "url": f"http://127.0.0.1:{port}/mcp/", "timeout": timeout}
        async with light_stack(folder, backends=[backend], indexer=indexer) as stack:
            yield stack
    finally:
        server.stop()


@asynccontextmanager
async def asking_replicas(
    folder: Path, timeout: float, indexer: dict[str, Any] | None = None
) -> AsyncIterator[tuple[LightStack, str]]:
    """`asking_stack`, and a second router's MCP URL."""
    async with asking_stack(folder, timeout, indexer) as stack:
        second, second_url = await asyncio.to_thread(another_router, stack, "second", {})
        try:
            yield stack, f"{second_url}/mcp"
        finally:
            second.stop()
