"""The bounds one router's client connections share (router/frontdoor/connections.py applies them).

`FrontDoor` holds the settings, what they share at run time (the connections lingering, the idle
ones, the longest idle first) and the burst logs of what they refuse; `ConnectionLog` is uvicorn's
logger of one connection, writing its per-request warnings to those burst logs. `raise_fd_limit` makes room
for `max_connections` in the process's file-descriptor limit at start.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.frontdoor.bursts import BurstLog
from toolsearch.sections.router_settings import Router
from toolsearch.sections.settings import port_of

logger = logging.getLogger(__name__)

FD_RESERVE = 512  # descriptors kept for backend and indexer connections, logs and files


class Idle(Protocol):
    """An idle connection, which can be closed to make room."""

    def give_up(self) -> None: ...


@dataclass
class FrontDoor:
    """The bounds one server's connections share, and the burst logs of what they refuse."""

    max_connections: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    health_port: int | None = None  # router.health_listen's: its connections are never refused
    lingering: int = 0
    # idle connections between requests, the longest idle first (a dict: ordered, and hashes protocols)
    idle: dict[Idle, None] = field(default_factory=dict)
    refused: BurstLog = field(init=False)
    cut: BurstLog = field(init=False)
    uvicorn_warnings: dict[str, BurstLog] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.refused = BurstLog(
            logger,
            f"refused connections beyond router.max_connections ({self.max_connections}) with 503",
            "raise router.max_connections if the clients are legitimate",
        )
        self.cut = BurstLog(
            logger,
            "closed connections whose request did not arrive in time (router.header_timeout "
            f"{self.header_timeout:g}s, router.body_timeout {self.body_timeout:g}s)",
            "a slow or stalled client, or a slowloris",
        )

    @classmethod
    def of(cls, settings: Router, max_connections: int | None = None) -> FrontDoor:
        return cls(
            max_connections=max_connections or settings.max_connections,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
            health_port=None if settings.health_listen is None else port_of(settings.health_listen),
        )

    def give_up_idle(self) -> bool:
        """Close the longest idle connection to make room for a new one; False when none is idle."""
        if not self.idle:
            return False
        next(iter(self.idle)).give_up()
        return True

    def warnings(self, message: str) -> BurstLog:
        """The burst log of one of uvicorn's per-request warnings."""
        if message not in self.uvicorn_warnings:
            self.uvicorn_warnings[message] = BurstLog(logger, message.rstrip("."), "uvicorn, per request")
        return self.uvicorn_warnings[message]

    def close(self) -> None:
        for log in (self.refused, self.cut, *self.uvicorn_warnings.values()):
            log.close()


class ConnectionLog:
    """uvicorn's logger for one connection, its per-request warnings logged once per burst."""

    def __init__(self, inner: logging.Logger, front: FrontDoor) -> None:
        self._inner = inner
        self._front = front

    def warning(self, message: str, *args: Any) -> None:
        self._front.warnings(message % args if args else message).note()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def raise_fd_limit(max_connections: int) -> int:
    """Make room for `max_connections` under the descriptor limit; returns how many fit."""
    wanted = max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fits = max(1, soft - FD_RESERVE)
    logger.warning(
        "router.max_connections %d lowered to %d: the file-descriptor limit is %d (raise `ulimit -n`)",
        max_connections,
        fits,
        soft,
    )
    return fits
