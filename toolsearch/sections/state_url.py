"""The indexer's state address: `memory`, a Redis URL, or Redis Sentinel.

    parse_state_url("redis+sentinel://s1:26379,s2:26379,s3:26379/toolsearch/0")
    # -> SentinelAddress(sentinels=(("s1", 26379), ...), service="toolsearch", db=0)

A Sentinel address names the sentinels, not the primary: the client asks them which server is the
primary now, and asks again when that server stops answering or refuses writes, so a promoted
replica is followed without a restart. Passwords never sit in this URL (it lives in a ConfigMap or a
configuration file); they come from the variables that `indexer.state_password_env` and
`indexer.state_sentinel_password_env` name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SENTINEL_SCHEME = "redis+sentinel://"
PLAIN_SCHEMES = ("redis://", "rediss://", "unix://")
DEFAULT_SENTINEL_PORT = 26379
_SERVICE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")
SENTINEL_FORM = "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB]"


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """Where the sentinels are, which primary they watch (its service name) and the database."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0

    def describe(self) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"{SENTINEL_SCHEME}{hosts}/{self.service}/{self.db}"


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The parts of a `redis+sentinel://` URL; ValueError saying what is wrong and the form expected."""
    rest = url.removeprefix(SENTINEL_SCHEME)
    if "@" in rest:
        raise ValueError(
            "a redis+sentinel:// URL carries no password: put it in a variable and name that "
            "variable in indexer.state_password_env"
        )
    hosts, _, path = rest.partition("/")
    parts = [p for p in path.split("/") if p] if path else []
    if not hosts or not parts or len(parts) > 2:
        raise ValueError(f"must be {SENTINEL_FORM}, got {url!r}")
    sentinels = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = item.strip(), str(DEFAULT_SENTINEL_PORT)
        if not _HOST.match(host) or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ValueError(f"sentinel {item!r} is not HOST:PORT (in {SENTINEL_FORM})")
        sentinels.append((host.strip("[]"), int(port)))
    service = parts[0]
    if not _SERVICE.match(service):
        raise ValueError(f"service name {service!r} must be 1-64 letters, digits or _.- (in {SENTINEL_FORM})")
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"database {db!r} must be a number (in {SENTINEL_FORM})")
    return SentinelAddress(tuple(sentinels), service, int(db))


def check_state_url(value: str) -> str:
    """`memory`, a redis://, rediss:// or unix:// URL, or a well-formed redis+sentinel:// URL."""
    if value == "memory" or value.startswith(PLAIN_SCHEMES):
        return value
    if value.startswith(SENTINEL_SCHEME):
        parse_sentinel_url(value)
        return value
    raise ValueError(f"must be 'memory', a redis:// URL or {SENTINEL_FORM}, got {value!r}")
