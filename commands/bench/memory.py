"""Indexer memory: resident set size idle, with one session, and with many sessions over 3 catalogs.

All of it is one real indexer process, read with psutil. Sessions are opened over gRPC with the
indexer's own stubs (what the router does on `initialize`, without the HTTP in front). A session's
catalog is decided by who it is, so the three catalogs are three kinds of caller: anonymous callers
see the public backends; callers with a token from one of two JWT-protected catalog servers also see
that server's tools, which the indexer lists with the caller's own token (passthrough), and are
refused by the other. So a third of the sessions share each catalog, as callers of three teams would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from commands.bench.common import rss_mb
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

IN_FLIGHT = 32  # OpenSession calls at once, about what a busy router sends
SETTLE_SECONDS = 2.0  # let the last allocations land before reading the RSS
_CHANNEL = [("grpc.max_receive_message_length", 512 * 1024 * 1024)]  # Status lists every session


async def _open_group(stub: Any, name: str, token: str | None, count: int) -> tuple[set[str], float]:
    """Open `count` sessions for one kind of caller; returns the versions they got and the seconds."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    fingerprints: set[str] = set()

    async def one(number: int) -> None:
        principal = pb.Principal(issuer="bench", subject=f"{name}-{number}") if token else pb.Principal()
        request = pb.OpenSessionRequest(
            principal=principal, credentials=pb.Credentials(bearer_token=token or "")
        )
        async with gate:
            reply = await stub.OpenSession(request, timeout=600)
        fingerprints.add(reply.version.fingerprint)

    started = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(count)))
    return fingerprints, time.perf_counter() - started


async def memory(
    address: str,
    pid: int,
    callers: Sequence[tuple[str, str | None]],
    total: int,
    query: str,
    progress: Callable[[str], None],
    idle_seconds: float,
) -> dict[str, Any]:
    """RSS idle, after one session and a find, and after `total` sessions spread over `callers`.

    Idle is read after `idle_seconds` of running, so that the health probes' rounds (which allocate
    too) are in the baseline and not counted against the sessions.
    """
    await asyncio.sleep(idle_seconds)
    idle = rss_mb(pid)
    result: dict[str, Any] = {"idle": idle, "sessions": total, "groups": []}
    async with grpc.aio.insecure_channel(address, options=_CHANNEL) as channel:
        stub = pb_grpc.IndexerStub(channel)
        opened = await stub.OpenSession(pb.OpenSessionRequest(), timeout=600)
        found = await stub.FindTools(
            pb.FindToolsRequest(session_id=opened.session_id, query=query), timeout=600
        )
        if not found.tools:
            raise RuntimeError(f"the first session found nothing: {found.empty_reason}")
        await asyncio.sleep(SETTLE_SECONDS)
        result["one_session"] = rss_mb(pid)
        counts = [total // len(callers) + (number < total % len(callers)) for number in range(len(callers))]
        fingerprints = {opened.version.fingerprint}
        for number, ((name, token), count) in enumerate(zip(callers, counts, strict=True)):
            # the first kind of caller already holds the session opened above
            got, seconds = await _open_group(stub, name, token, count - (number == 0))
            got |= {opened.version.fingerprint} if number == 0 else set()
            fingerprints |= got
            progress(f"memory: {count} sessions of {name} callers in {seconds:.1f}s")
            result["groups"].append(
                {"callers": name, "sessions": count, "versions": len(got), "open_seconds": round(seconds, 2)}
                | rss_mb(pid)
            )
        await asyncio.sleep(SETTLE_SECONDS)
        result["all_sessions"] = rss_mb(pid)
        status = await stub.Status(pb.StatusRequest(), timeout=600)
    result["distinct_catalogs"] = len(fingerprints)
    result["versions_alive"] = len(status.versions)
    result["sessions_alive"] = len(status.sessions)
    result["delta_rss_mb"] = round(result["all_sessions"]["rss_mb"] - idle["rss_mb"], 1)
    result["delta_uss_mb"] = round(result["all_sessions"]["uss_mb"] - idle["uss_mb"], 1)
    return result
