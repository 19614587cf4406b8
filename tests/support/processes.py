"""Real processes for tests: a free port, a process started and waited for, and a clean stop.

    port = free_port()  # commands/ports.py
    proc = start_process([sys.executable, "-m", "commands.cli", ...], f"http://127.0.0.1:{port}/healthz")
    try:
        ...
    finally:
        output = proc.stop()

`start_process` returns once `ready_url` answers 2xx or 3xx, and fails with the process's output
when it exits first or the timeout passes. Output (stdout and stderr together) goes to a temporary
file rather than a pipe, so a chatty process never blocks on a full pipe.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

POLL_INTERVAL = 0.05  # seconds between readiness probes; the wait doubles as an exit check
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a proxy must not answer for us


class Proc:
    """A started process, its captured output, and a stop that always ends it."""

    def __init__(self, args: Sequence[str], popen: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.args = list(args)
        self.popen = popen
        self._log = log
        self._final_output: str | None = None  # set by stop(), which deletes the log file

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended, else None."""
        return self.popen.poll()

    def output(self) -> str:
        """Everything the process has written so far (stdout and stderr, interleaved)."""
        if self._final_output is not None:
            return self._final_output
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")

    def wait_exit(self, timeout: float) -> str:
        """Wait up to `timeout` seconds for the process to end by itself, then `stop` it.

        Returns the captured output; a process still running at the deadline fails the test
        with what it wrote so far.
        """
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.args} still runs after {timeout} s:\n{self.stop()}") from None
        return self.stop()

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the process (not its children), if it still runs."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def stop(self, timeout: float = 10.0) -> str:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns the captured output.

        The process gets the SIGTERM alone, so it can shut down its own children; whatever is
        left of its process group afterwards is killed, so no test leaks processes. Calling it
        again returns the same output.
        """
        if self._final_output is not None:
            return self._final_output
        self.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._final_output = output = self.output()
        self._log.close()
        os.unlink(self._log.name)
        return output

    def __enter__(self) -> Proc:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def port_accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port` now."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def url_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a GET of `url` answers 2xx or 3xx now."""
    try:
        with _DIRECT.open(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 400
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return False  # nothing answers yet, or not HTTP/1.1 (a port another part holds)


def start_process(
    args: Sequence[str],
    ready_url: str | None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Proc:
    """Start `args` and wait until `ready_url` answers (no wait when it is None).

    `env` adds to (or overrides) the current environment. Raises RuntimeError with the process's
    output when it exits before it is ready or `timeout` seconds pass.
    """
    # the Proc owns the file from here on: stop() closes and deletes it
    log = tempfile.NamedTemporaryFile(prefix="proc-", suffix=".log", delete=False)  # noqa: SIM115
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    popen = subprocess.Popen(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        cwd=cwd,
        start_new_session=True,  # its own process group, so stop() can reap its children
    )
    proc = Proc(args, popen, log)
    if ready_url is None:
        return proc
    deadline = time.monotonic() + timeout
    while not url_answers(ready_url):
        try:
            code = popen.wait(timeout=POLL_INTERVAL)
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline:
                continue
            output = proc.stop()
            raise RuntimeError(f"{ready_url} did not answer within {timeout:g}s; output:\n{output}") from None
        output = proc.stop()
        raise RuntimeError(f"the process exited with {code} before {ready_url} answered; output:\n{output}")
    return proc
