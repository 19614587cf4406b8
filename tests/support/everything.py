"""server-everything over Streamable HTTP as a backend of a light stack, and what its log says.

It keeps state per session and logs each session it opens and ends and each POST it receives,
which is how tests count what reaches it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from commands.ports import free_port
from tests.support.bridges import EVERYTHING
from tests.support.processes import Proc, port_accepts, start_process
from tests.support.routers import LightStack, light_stack
from tests.support.waits import WAIT

_OPENED = re.compile(r"Session initialized with ID: (\S+)")
_ENDED = re.compile(r"Received session termination request for session (\S+)")


class Everything:
    """server-everything over Streamable HTTP on one port, which a test may restart on that port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.proc = self._start()

    def _start(self) -> Proc:
        proc = start_process(["node", str(EVERYTHING), "streamableHttp"], None, env={"PORT": str(self.port)})
        deadline = time.monotonic() + WAIT
        while not port_accepts(self.port):
            if proc.returncode is not None or time.monotonic() > deadline:
                proc.stop()
                raise RuntimeError(f"server-everything did not listen on {self.port}:\n{proc.output()}")
            time.sleep(0.05)
        return proc

    def restart(self) -> None:
        """Stop it and start it again on the same port: every session it had is forgotten."""
        self.proc.stop()
        self.proc = self._start()

    def start(self) -> None:
        """Start it again on its port after `stop`."""
        self.proc = self._start()

    def live_sessions(self) -> set[str]:
        """The sessions it has opened and not ended since it started, from its log."""
        output = self.proc.output()
        return set(_OPENED.findall(output)) - set(_ENDED.findall(output))

    def posts(self) -> int:
        """How many MCP POSTs it has received since it started."""
        return self.proc.output().count("Received MCP POST request")

    def stop(self) -> None:
        self.proc.stop()


@asynccontextmanager
async def stack_with_everything(
    folder: Path, **settings: Any
) -> AsyncIterator[tuple[LightStack, Everything]]:
    everything = await asyncio.to_thread(Everything, free_port())
    try:
        async with light_stack(
            folder, backends=[{"id": "everything", "url": everything.url}], **settings
        ) as stack:
            yield stack, everything
    finally:
        everything.stop()
