"""Loopback ports for the stacks that `toolsearch bench` and the tests start, each handed out once.

Binding port 0 and closing the socket gives a port nothing listens on now, but the kernel may give
the same port to the next bind to port 0, or to an outgoing connection's local end, before the
part meant to listen there has started: two parts of one stack then meet on one port (a router's
readiness check answered by an indexer's HTTP/2). So ports come from below the kernel's ephemeral
range, where no outgoing connection is given one, and each is handed out once per process, after a
bind shows nothing holds it. Each process starts at its own place in the range (from its process
id), so two runs on one machine seldom look at the same ports, and a port one of them holds is
skipped by the bind.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 15000  # below the ports well-known services use, above the registered ones most listen on
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default, where the range cannot be read


def ephemeral_low(source: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (the ports outgoing connections get)."""
    try:
        return int(source.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def bindable(host: str, port: int) -> bool:
    """Whether a TCP socket can bind `host:port` now (nothing listens on it, nothing is connected from it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortRange:
    """Ports `low` to `high - 1`, handed out in turn from `start`, each at most once."""

    def __init__(self, low: int, high: int, start: int, free: Callable[[str, int], bool] = bindable) -> None:
        if high - low < 1:
            raise ValueError(f"an empty port range: {low} to {high}")
        self.low = low
        self.high = high
        self._next = low + (start - low) % (high - low)
        self._lock = threading.Lock()  # tests take ports from worker threads too
        self._left = high - low
        self._free = free

    def take(self, host: str = "127.0.0.1") -> int:
        """The next port of the range that `host` can bind now; RuntimeError once the range is spent."""
        with self._lock:
            while self._left > 0:
                port = self._next
                self._next = self.low if port + 1 >= self.high else port + 1
                self._left -= 1
                if self._free(host, port):
                    return port
        raise RuntimeError(f"no free port left between {self.low} and {self.high - 1}")


class Ports:
    """This process's ports: the whole range below the ephemeral one, or one slice of it."""

    def __init__(self, source: Path = EPHEMERAL_RANGE) -> None:
        high = ephemeral_low(source)
        self.low = LOWEST if high - LOWEST >= 1000 else 1024
        self.high = high
        self.range = PortRange(self.low, self.high, start=self.low + os.getpid() * 97)

    def share(self, index: int, count: int) -> None:
        """Take ports from slice `index` of `count` equal slices only: for processes run side by
        side (the test runner's workers), so that no two of them ever hand out one port."""
        if not 0 <= index < count:
            raise ValueError(f"slice {index} of {count} does not exist")
        width = (self.high - self.low) // count
        low = self.low + index * width
        # from this process's own place in its slice, as in the whole range
        self.range = PortRange(low, low + width, start=low + os.getpid() * 97)

    def take(self, host: str = "127.0.0.1") -> int:
        """The next free port of this process's range or slice."""
        return self.range.take(host)


PORTS = Ports()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing holds now and this process has not handed out before."""
    return PORTS.take(host)
