"""Waiting on a condition with a bound: tests never sleep for a fixed time and hope."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

WAIT = 15.0  # seconds a condition may take at most on a busy 2-core machine


async def wait_for(condition: Callable[[], bool], within: float = WAIT, poll: float = 0.02) -> None:
    """Yield to the loop until `condition()` holds; TimeoutError after `within` seconds.

    Polled: the conditions are plain attributes of in-process objects, with no event to await.
    """
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(poll)
