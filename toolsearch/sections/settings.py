"""What every section of the configuration file is made of: a frozen model and the checks of its values.

A section refuses keys it does not know (`extra="forbid"`), so a misspelt key is an error naming it
rather than a setting silently ignored; the value checks are shared by the sections that take the
same kind of value (a listen address, a URL, a Host or Origin pattern).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

BackendId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
# What one backend answer may weigh: a tool result (router) or a tools/list page (indexer).
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# Seconds one request to a backend may take, unless its configuration says otherwise.
DEFAULT_BACKEND_TIMEOUT = 30.0


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT, got {value!r}")
    return value


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def check_fixed_port(value: str) -> str:
    # a listener that probes and scrapes are pointed at: its port is known before it starts
    if port_of(check_listen(value)) == 0:
        raise ValueError(f"needs a fixed port (probes and scrapers are pointed at it), got {value!r}")
    return value


def check_http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def check_host_pattern(value: str) -> str:
    # HOST, HOST:PORT, HOST:* or [IPv6]:PORT as a Host header carries it; "*" turns the check off
    if value == "*":
        return value
    bare_ipv6 = value.count(":") > 1 and not value.startswith("[")  # an IPv6 address needs brackets
    if not value or bare_ipv6 or any(c in value for c in "/ \t@?#"):
        raise ValueError(f"must be HOST, HOST:PORT or HOST:* (as in a Host header), got {value!r}")
    return value.lower()


def check_origin_pattern(value: str) -> str:
    # scheme://HOST[:PORT] or scheme://HOST:* as browsers send it, "null", or "*" for any origin
    if value in ("*", "null"):
        return value
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
        raise ValueError(f"must be an origin like http://HOST:PORT (no path), got {value!r}")
    return value.lower()


def check_pinned(value: str) -> str:
    backend, sep, tool = value.partition("/")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", backend) or not tool or "/" in tool:
        raise ValueError(f'must be "BACKEND/TOOL" or "BACKEND/*", got {value!r}')
    return value


def check_indexer_address(value: str) -> str:
    # dns:///HOST:PORT (or dns://AUTHORITY/HOST:PORT) asks gRPC to resolve every A record and balance
    if value.startswith("dns:"):
        rest = value.removeprefix("dns:")
        if not rest.startswith("//") or "/" not in rest[2:]:
            raise ValueError(f"must be HOST:PORT or dns:///HOST:PORT, got {value!r}")
        check_listen(rest[2:].partition("/")[2])
        return value
    return check_listen(value)
