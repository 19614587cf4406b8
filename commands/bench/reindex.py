"""Re-index: from a backend's health change to every session on the new index version.

It runs on an indexer started in this process (see `embedding.restart_in_process`) against the real
catalog server, with health probing off: the benchmark records a verdict and announces it exactly as
the health monitor does (`Registry.record_failure` / `record_listing`, then `Rebuilder.request`), and
the indexer's own fan-out (debounce, then `SessionVersions.rebuild_all`) does the rest. Each session
count is measured twice: a backend going down (a tool set no version holds yet: one build from cached
embeddings) and the same backend recovering (back to the version the warm-up still holds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from indexer.api.process import IndexerProcess
from indexer.backends.credentials import ANONYMOUS
from indexer.errors import BackendUnavailable
from indexer.upkeep.rebuilds import DEBOUNCE_SECONDS

OPEN_BATCH = 200  # sessions opened at once while filling up to a count


async def _fill(indexer: IndexerProcess, count: int) -> float:
    """Open anonymous sessions until `count` exist; returns the seconds it took."""
    started = time.perf_counter()
    sessions = indexer.sessions
    while len(sessions) < count:
        batch = min(OPEN_BATCH, count - len(sessions))
        await asyncio.gather(*(sessions.open(ANONYMOUS, None) for _ in range(batch)))
    return time.perf_counter() - started


async def _flip(indexer: IndexerProcess, backend_id: str, down: bool) -> dict[str, Any]:
    registry, sessions, rebuilder = indexer.registry, indexer.sessions, indexer.rebuilder
    embeddings, pool = indexer.embeddings, indexer.pool
    calls, texts, builds = embeddings.model_calls, embeddings.texts_embedded, pool.builds
    before = {s.id: s.current.number for s in sessions.sessions()}
    state = registry.get(backend_id)
    started_wall, started = time.time(), time.perf_counter()
    if down:
        registry.record_failure(
            backend_id, BackendUnavailable(backend_id, "taken down by the benchmark"), "unhealthy"
        )
        reason = f"backend {backend_id} unhealthy"
    else:
        assert state.listing is not None
        registry.record_listing(backend_id, state.listing, "healthy")
        reason = f"backend {backend_id} recovered"
    rebuilder.request(reason)
    await rebuilder.idle()
    settled = time.perf_counter() - started
    current = sessions.sessions()
    fingerprints = {s.current.version.fingerprint for s in current}
    moved = [
        s for s in current if s.current.number == before[s.id] + 1 and s.record.swaps[-1].reason == reason
    ]
    if len(moved) != len(current) or len(fingerprints) != 1:
        raise RuntimeError(
            f"{len(current) - len(moved)} of {len(current)} sessions did not move to one new version"
        )
    last_swap = max(s.record.swaps[-1].at for s in current) - started_wall
    return {
        "change": "down" if down else "recovered",
        "seconds_to_last_swap": round(last_swap, 4),
        "seconds_to_fan_out_done": round(settled, 4),
        "debounce_seconds": DEBOUNCE_SECONDS,
        "sessions_moved": len(moved),
        "versions_built": pool.builds - builds,
        "model_calls": embeddings.model_calls - calls,
        "texts_embedded": embeddings.texts_embedded - texts,
        "tools_after": len(current[0].current.version.tools),
    }


async def reindex(
    indexer: IndexerProcess, counts: Sequence[int], progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """For each session count (ascending): fill up, take one backend down, then bring it back."""
    backend_id = next(
        b for b, s in indexer.registry.states.items() if s.config.auth.type == "none" and s.advertised
    )
    results = []
    for count in sorted(counts):
        opened = await _fill(indexer, count)
        progress(f"re-index: {count} sessions open ({opened:.1f}s); taking backend {backend_id} down and up")
        down = await _flip(indexer, backend_id, down=True)
        up = await _flip(indexer, backend_id, down=False)
        results.append({"sessions": count, "open_seconds": round(opened, 3), "flips": [down, up]})
    return results
