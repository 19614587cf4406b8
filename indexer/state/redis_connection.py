"""How the indexer reaches Redis: one server by URL, or the primary that Redis Sentinel names.

    target = RedisTarget("redis+sentinel://s1:26379,s2:26379/toolsearch", password="...")
    client = target.async_client()  # asyncio, for sessions, health, the lease and events
    store = target.sync_client()  # blocking, for embeddings (called from worker threads)
    await target.check(client)  # at start: StateUnavailable naming the setting to fix

With Sentinel every new connection asks the sentinels which server is the primary now (all of them:
the majority's answer wins, `indexer.state.redis_sentinel`). A command
that finds its connection broken (the primary died) or refused as read-only (the old primary came
back as a replica) is retried once on a new connection, which asks the sentinels again; so every
replica of the indexer follows a promotion without a restart. Until the sentinels have promoted a
replica a command fails within its deadline, and the request that needed it is answered 503 with
Retry-After (docs/reliability.md, "Redis failover"). Asking the sentinels has its own short deadline
per sentinel, so sentinels that do not answer cost at most `SENTINEL_TIMEOUT` each.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from indexer.state.base import StateUnavailable
from indexer.state.redis_sentinel import SyncVotingSentinel, VotingSentinel
from toolsearch.sections.state_url import SENTINEL_SCHEME, SentinelAddress, parse_sentinel_url

TIMEOUT = 2.0  # seconds to connect, and for each answer
SENTINEL_TIMEOUT = 0.5  # seconds per sentinel asked where the primary is: they answer from memory
HEALTH_CHECK_INTERVAL = 30  # seconds a pooled connection may idle before a PING checks it


def redacted(url: str) -> str:
    """The URL without a password, for messages."""
    scheme, sep, rest = url.partition("://")
    _, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{host}" if sep else url


def client_name() -> str:
    """How this process shows in CLIENT LIST: which pod (host) and process holds a connection."""
    return f"toolsearch-indexer:{socket.gethostname()}:{os.getpid()}"


def _auth_problem(exc: Exception) -> bool:
    message = str(exc).upper()
    return isinstance(exc, AuthenticationError) or "WRONGPASS" in message or "NOAUTH" in message


@dataclass(frozen=True)
class RedisTarget:
    """A state URL with the passwords read from the environment at the entry point."""

    url: str
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def sentinel(self) -> SentinelAddress | None:
        return parse_sentinel_url(self.url) if self.url.startswith(SENTINEL_SCHEME) else None

    @property
    def description(self) -> str:
        address = self.sentinel
        return address.describe() if address is not None else redacted(self.url)

    def _server_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "socket_timeout": TIMEOUT,
            "socket_connect_timeout": TIMEOUT,
            "client_name": client_name(),
        }
        if self.password is not None:
            options["password"] = self.password
        return options

    def _sentinel_options(self, retry: Retry | SyncRetry) -> dict[str, Any]:
        options: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT,
            "socket_connect_timeout": SENTINEL_TIMEOUT,
            "client_name": client_name(),
            # no retry of its own: a sentinel that does not answer is passed over for the next one
            "retry": retry,
        }
        if self.sentinel_password is not None:
            options["password"] = self.sentinel_password
        return options

    def async_client(self) -> aredis.Redis:
        """An asyncio client with deadlines and one retry of a broken connection."""
        retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        address = self.sentinel
        if address is None:
            plain: aredis.Redis = aredis.Redis.from_url(
                self.url, **self._server_options(), retry=retry, health_check_interval=HEALTH_CHECK_INTERVAL
            )
            return plain
        sentinels = VotingSentinel(
            list(address.sentinels), sentinel_kwargs=self._sentinel_options(Retry(NoBackoff(), 0))
        )
        client: aredis.Redis = sentinels.master_for(
            address.service,
            db=address.db,
            retry=retry,
            health_check_interval=HEALTH_CHECK_INTERVAL,
            **self._server_options(),
        )
        return client

    def sync_client(self) -> redis.Redis:
        """A blocking client with the same deadlines, for code that runs in worker threads."""
        retry = SyncRetry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        address = self.sentinel
        if address is None:
            return redis.Redis.from_url(self.url, **self._server_options(), retry=retry)
        sentinels = SyncVotingSentinel(
            list(address.sentinels), sentinel_kwargs=self._sentinel_options(SyncRetry(NoBackoff(), 0))
        )
        client: redis.Redis = sentinels.master_for(
            address.service, db=address.db, retry=retry, **self._server_options()
        )
        return client

    async def check(self, client: aredis.Redis) -> None:
        """At start: the primary answers a PING, else StateUnavailable naming the setting to fix."""
        address = self.sentinel
        if address is not None:
            await self._check_sentinels(address)
        try:
            await client.ping()
        except (redis.RedisError, OSError) as exc:
            if _auth_problem(exc):
                raise StateUnavailable(
                    f"indexer.state_password_env: {self.description} refused the password "
                    f"({'none was given' if self.password is None else 'a wrong one'}); set the "
                    "variable it names to the Redis password"
                ) from None
            raise StateUnavailable(
                f"shared state unavailable while connecting to {self.description} ({type(exc).__name__}); "
                "check indexer.state"
            ) from None

    async def _check_sentinels(self, address: SentinelAddress) -> None:
        """Ask each sentinel for the service: none answering, a refused password, an unknown name."""
        answered, known = [], False
        for host, port in address.sentinels:
            node = aredis.Redis(host=host, port=port, **self._sentinel_options(Retry(NoBackoff(), 0)))
            try:
                masters = await node.sentinel_masters()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                continue
            except (ResponseError, redis.RedisError) as exc:
                if _auth_problem(exc):
                    raise StateUnavailable(
                        f"indexer.state_sentinel_password_env: the sentinel at {host}:{port} refused "
                        "the password; set the variable it names to the sentinels' password "
                        "(or unset the key when they have none)"
                    ) from None
                raise StateUnavailable(
                    f"indexer.state: {host}:{port} is not a Redis sentinel ({type(exc).__name__}: "
                    f"{exc}); list the sentinels' addresses, e.g. {address.describe()}"
                ) from None
            finally:
                await node.aclose()
            answered.append(f"{host}:{port}")
            known = known or address.service in masters
        if not answered:
            hosts = ", ".join(f"{host}:{port}" for host, port in address.sentinels)
            raise StateUnavailable(
                f"indexer.state: no sentinel answered at {hosts} within {SENTINEL_TIMEOUT:g} s each; "
                "check the sentinels' hosts and ports, and that they run"
            )
        if not known:
            raise StateUnavailable(
                f"indexer.state: the sentinels at {', '.join(answered)} watch no primary named "
                f"{address.service!r}; use the name of their `sentinel monitor` line"
            )


async def close_async_client(client: aredis.Redis) -> None:
    """Close `client`, and the clients of the sentinels it asks for the primary, if it has them
    (closing the client alone leaves theirs open until the garbage collector finds them)."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    await client.aclose()
    for node in getattr(manager, "sentinels", ()):
        await node.aclose()


def close_sync_client(client: redis.Redis) -> None:
    """`close_async_client` for a blocking client."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    client.close()
    for node in getattr(manager, "sentinels", ()):
        node.close()
