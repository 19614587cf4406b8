"""The first starts of the bridge's servers, and when the bridge stops waiting for the slowest.

The bridge's readiness (`/readyz`) waits for every server's first start by the rule the indexer
shares (toolsearch/readiness.py): until the first is done, then as long again, and at least
`MIN_GRACE` seconds more. A request for a server whose first start is still pending waits for it
until that same moment, and is answered at once from then on ("still starting"), rather than after
the server's whole `start_timeout`: the bridge has stopped waiting for that server, and whatever
asks it (the indexer's first listing, a health probe) must not wait for it a second time. The
server goes on starting, and is served as soon as it answers.
"""

from __future__ import annotations

from typing import Protocol

import anyio

from toolsearch.readiness import cut_at, waited_enough


class Starting(Protocol):
    """A server the bridge keeps, as its first start goes (bridge/keeping/supervisor.py)."""

    @property
    def backend_id(self) -> str: ...

    @property
    def tried_at(self) -> float | None: ...  # when its first start succeeded or failed (anyio's clock)


class FirstStarts:
    """The servers whose first starts readiness follows, from the moment the bridge starts them."""

    def __init__(self) -> None:
        self._servers: list[Starting] = []
        self._since: float | None = None  # when the bridge started its servers (anyio's clock)

    def add(self, server: Starting) -> None:
        self._servers.append(server)

    def begin(self) -> None:
        """The bridge starts its servers now."""
        self._since = anyio.current_time()

    def starting(self) -> list[str]:
        """The backends whose first start is not done yet."""
        return [s.backend_id for s in self._servers if s.tried_at is None]

    def ready(self) -> bool:
        """Whether the bridge has waited long enough for its servers' first starts."""
        since = self._since if self._since is not None else anyio.current_time()
        return waited_enough(anyio.current_time() - since, self._done_at(since), len(self.starting()))

    def cut(self) -> float | None:
        """When (anyio's clock) first starts still pending are waited for no longer; None while no
        server has started yet (nothing is ready: waiting costs the others nothing)."""
        if self._since is None or not (done_at := self._done_at(self._since)):
            return None
        return self._since + cut_at(done_at)

    def slowest_done(self) -> float:
        """Seconds the slowest first start that is done took."""
        return max(self._done_at(self._since), default=0.0) if self._since is not None else 0.0

    def _done_at(self, since: float) -> list[float]:
        return [s.tried_at - since for s in self._servers if s.tried_at is not None]
