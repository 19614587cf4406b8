"""One question put to several backends at once: bounded, each under its own deadline, none fatal.

A listing of resources or prompts asks every reachable backend that offers them. A backend that
fails (refuses, times out, answers with an error, rejects the credentials) is logged, once per
question, in one line without a traceback, and left out of the answer: the others' entries still
reach the client, as a down backend's tools leave find_tool's answers without failing them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

import anyio

from router.errors import BackendError
from toolsearch.targets import ReachableTarget

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONCURRENCY = 8  # backends asked at once by one client request


class Answered(NamedTuple, Generic[T]):
    """What one backend answered."""

    backend: ReachableTarget
    value: T


def deadline(backend: ReachableTarget, requests: int = 1) -> float:
    """How long one backend may take over a question of `requests` requests (each under its timeout)."""
    return backend.target.timeout_seconds * max(requests, 1)


async def ask_each(
    backends: Sequence[ReachableTarget],
    ask: Callable[[ReachableTarget], Awaitable[T]],
    what: str,
    requests: int = 1,
) -> list[Answered[T]]:
    """`ask` every backend, `CONCURRENCY` at a time; the answers of those that answered, in order.

    Each backend gets `deadline(backend, requests)` in all (its requests are bounded one by one as
    well). A failure is logged as `what` (e.g. "resources/list") and skipped.
    """
    found: list[Answered[T] | None] = [None] * len(backends)
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def one(position: int, backend: ReachableTarget) -> None:
        async with limiter:
            within = deadline(backend, requests)
            try:
                with anyio.fail_after(within):
                    found[position] = Answered(backend, await ask(backend))
            except TimeoutError:
                logger.warning(
                    "%s: backend %s did not answer within %gs, left out", what, backend.backend_id, within
                )
            except BackendError as exc:
                logger.warning("%s: %s, left out", what, exc)
            except Exception as exc:  # never fatal to the others: this backend's entries are left out
                logger.warning(
                    "%s: backend %s failed (%s: %s), left out",
                    what,
                    backend.backend_id,
                    type(exc).__name__,
                    exc,
                )

    async with anyio.create_task_group() as group:
        for position, backend in enumerate(backends):
            group.start_soon(one, position, backend)
    return [answer for answer in found if answer is not None]
