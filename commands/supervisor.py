"""Supervising the processes `toolsearch up` starts: sessions of their own, and signals decided here.

Each part starts in a new session (its own process group, no controlling terminal), so Ctrl-C and
the terminal's hangup reach `up` alone. A part starts with SIGHUP ignored, so a stray one never
kills it (the indexer installs its reload handler over that), and, on Linux, with SIGTERM as its
parent-death signal, so even a SIGKILL of `up` orphans nothing.

A part is started without running anything in a copy of `up` between fork and exec: Python then
starts it with vfork, which copies nothing. A fork would copy gRPC's core, whose threads `up` runs
once it has asked the indexer whether it is ready; the core's fork handlers restart them in the copy,
and closing the copy's descriptors before exec makes them abort it (`pthread_create failed`,
`Check failed: wakeup_fd_->Wakeup().ok()`): the part died before it ran (docs/reliability.md,
"Starts that abort"). So the part sets its signals itself, first thing (`as_supervised_part`, from
`commands/cli.py`), SIGHUP held blocked from the spawn until it has. The signal handlers of `up`
only record what was asked; the waiting loops act on it:

- SIGINT, SIGTERM: `Stopped` is raised in the loop, and the caller stops everything.
- SIGHUP: when `up` had a controlling terminal and has lost it, the terminal closed: as SIGTERM.
  Otherwise a reload: the reload note is printed and SIGHUP is forwarded to every part started with
  `reloads=True`, once that part is ready. When SIGHUP was ignored at start (nohup), always a reload.
- A part that exits: `supervise` says which and how, and returns 1.

`stop` sends SIGTERM to every part's process group, newest first, then SIGKILL to what is left
after `STOP_TIMEOUT` seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from types import FrameType

STOP_TIMEOUT = 10.0
POLL = 0.2  # seconds between looks at the parts and at the signals that came
SUPERVISOR_ENV = "TOOLSEARCH_SUPERVISOR"  # in a part's environment: the pid of the `up` that started it
_PR_SET_PDEATHSIG = 1


class StartError(RuntimeError):
    """Raised when a part exits or is not ready in time."""


class Stopped(Exception):
    """Raised in the waiting loops once a stop was asked for (a signal, the terminal closing)."""


def as_supervised_part(environ: MutableMapping[str, str]) -> None:
    """What a part started by `up` does first: SIGHUP ignored, then unblocked (`up` spawned it
    blocked), and SIGTERM as its parent-death signal. Nothing for a process `up` did not start.

    `environ` is the process environment, from which the supervisor's pid is taken (no grandchild
    inherits it). A part whose `up` died before it asked for that signal stops as the signal would.
    """
    supervisor = environ.pop(SUPERVISOR_ENV, None)
    if supervisor is None:
        return
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    with contextlib.suppress(OSError, AttributeError):  # not Linux: no parent-death signal
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != int(supervisor):
            os.kill(os.getpid(), signal.SIGTERM)


def has_terminal() -> bool:
    """Whether this process has a controlling terminal (one that has hung up no longer counts)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def exit_status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"


def say(text: str) -> None:
    """A line on stderr, unless the terminal is gone."""
    with contextlib.suppress(OSError):
        print(f"toolsearch up: {text}", file=sys.stderr, flush=True)


def port_problem(part: str, key: str, listen: str) -> str | None:
    """Why `part` could not listen on `listen` (HOST:PORT, set by `key`) now; None when it could."""
    host, _, port = listen.rpartition(":")
    if port == "0":
        return None
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            probe.bind((host, int(port)))
    except socket.gaierror:
        return f"the {part} cannot listen on {listen}: unknown host {host} (check {key})"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (
                f"port {port} is in use: the {part} cannot listen on {listen}; stop what listens "
                f"there (an earlier toolsearch up?) or change {key}"
            )
        return f"the {part} cannot listen on {listen}: {exc.strerror} (check {key})"
    return None


@dataclass
class Part:
    name: str
    process: subprocess.Popen[bytes]
    reloads: bool  # it rereads its configuration on SIGHUP
    ready: bool = False
    reload_waiting: bool = False  # a reload was asked for before it was ready


class Supervisor:
    """The started parts, newest last, and what the signals asked for."""

    def __init__(self, ready_timeout: float, reload_note: str) -> None:
        self.parts: list[Part] = []
        self.ready_timeout = ready_timeout
        self.reload_note = reload_note
        self._stop_reason: str | None = None
        self._reloads = 0
        self._terminal = has_terminal()
        self._hangup_ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN

    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """Record SIGINT, SIGTERM and SIGHUP for the loops while the stack runs."""
        wanted = {signal.SIGINT: self._on_stop, signal.SIGTERM: self._on_stop, signal.SIGHUP: self._on_hangup}
        previous = {signum: signal.signal(signum, handler) for signum, handler in wanted.items()}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_reason = self._stop_reason or signal.Signals(signum).name

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        if not self._hangup_ignored and self._terminal and not has_terminal():
            self._stop_reason = self._stop_reason or "the terminal closed"
        else:
            self._reloads += 1

    def _tend(self) -> None:
        """Act on what the signals asked for: raise `Stopped`, or forward a reload."""
        if self._stop_reason is not None:
            raise Stopped(self._stop_reason)
        if self._reloads:
            self._reloads = 0
            say(self.reload_note)
            for part in self.parts:
                if part.reloads:
                    part.reload_waiting = True
        for part in self.parts:
            if part.reload_waiting and part.ready and part.process.poll() is None:
                part.reload_waiting = False
                part.process.send_signal(signal.SIGHUP)

    def start(self, name: str, args: Sequence[str], ready: Callable[[], bool], reloads: bool = False) -> None:
        """Start `toolsearch ARGS` as `name` and wait until `ready()`; raises `StartError`, `Stopped`."""
        # SIGHUP blocked across the spawn: the part inherits the mask, and unblocks it once it
        # ignores the signal; one sent to `up` meanwhile waits for its handler here
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "commands.cli", *args],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, SUPERVISOR_ENV: str(os.getpid())},
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        part = Part(name, process, reloads)
        self.parts.append(part)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            self._tend()
            if process.poll() is not None:
                raise StartError(
                    f"the {name} exited with {exit_status(process.returncode)} before it was ready"
                )
            if ready():
                break
            if time.monotonic() > deadline:
                raise StartError(f"the {name} was not ready within {self.ready_timeout:.0f}s")
            time.sleep(POLL)
        part.ready = True
        self._tend()

    def supervise(self) -> int:
        """Keep the parts running until a stop is asked for (`Stopped`) or one exits (returns 1)."""
        while True:
            self._tend()
            for part in self.parts:
                code = part.process.poll()
                if code is not None:
                    say(f"the {part.name} exited with {exit_status(code)}; stopping the rest")
                    return 1
            time.sleep(POLL)

    def stop(self) -> None:
        """SIGTERM to every part's process group, newest first; SIGKILL after `STOP_TIMEOUT`."""
        if self._stop_reason is not None:
            say(f"stopping ({self._stop_reason})")
        for part in reversed(self.parts):
            if part.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(part.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for part in reversed(self.parts):
            try:
                part.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"the {part.name} did not stop within {STOP_TIMEOUT:g}s: killed")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(part.process.pid, signal.SIGKILL)  # and whatever it started
            part.process.wait()
