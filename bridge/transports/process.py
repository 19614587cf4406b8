"""One stdio MCP server as a child process: how it is started, and its pipes as message streams.

`launch_of` makes a backend's `Launch`: its `env` is merged over the few variables MCP clients
pass on to the servers they start (`mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS`: HOME, PATH, ...),
so a server behaves as it does under Claude Desktop or the SDK's own client. `${NAME}` in an env
value is the variable NAME of the bridge's environment, substituted there, at start: a missing one
is a `LaunchError` naming the backend, the key and the variable. The values may be secrets: nothing
here logs them, and `Launch.describe` shows the command line alone.

`ServerProcess.run` starts the program in a process group of its own, with stdin, stdout and stderr
as pipes, and yields the pair of streams a `ClientSession` runs on. Each stdout line is one JSON-RPC
message; a line that is not one is logged (within a budget: `LogBudget`) and dropped, because many
servers print a banner there. A line over `max_line_bytes` ends the streams: reading on could mean
holding any amount. stderr goes to `StderrLog`.

Leaving the context stops the process, shielded and bounded: stdin is closed (the MCP way to ask a
stdio server to exit), then after `EXIT_GRACE` the whole process group gets SIGTERM and, after
`KILL_GRACE`, SIGKILL, so nothing the server started outlives it. A bridge killed outright cannot do
that; its servers then see their stdin close.
"""

from __future__ import annotations

import logging
import shlex
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bridge.transports.links import Link, Reads, StartFailed, Writes
from bridge.transports.stderr import LogBudget, StderrLog
from toolsearch.sections.backend_settings import ENV_REFERENCE, Backend

logger = logging.getLogger(__name__)

EXIT_GRACE = 2.0  # seconds a server gets to exit once its stdin is closed
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL to its process group
EXIT_POLL = 0.05  # seconds between looks at whether the process has exited

Incoming = MemoryObjectSendStream[SessionMessage | Exception]
Outgoing = MemoryObjectReceiveStream[SessionMessage]


class LaunchError(ValueError):
    """A stdio backend that cannot be started as configured (a variable its env names is unset)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one stdio server; `env` is its whole environment."""

    backend_id: str
    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path | None

    what: ClassVar[str] = "stdio server"
    many: ClassVar[str] = "stdio server processes"

    def describe(self) -> str:
        """The command line as configured, for messages (never the environment)."""
        return shlex.join([self.command, *self.args])

    def open(
        self, max_message_bytes: int, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[tuple[Link, Reads, Writes]]:
        """Start the process (`headers` are an HTTP server's business: a pipe has none)."""
        return ServerProcess.run(self, max_message_bytes)


def launch_of(backend: Backend, environ: Mapping[str, str]) -> Launch:
    """The launch of a stdio backend, its env references substituted from `environ`."""
    if backend.command is None:
        raise LaunchError(f"backend {backend.id} has no command: it is not a stdio server")
    env = {name: environ[name] for name in DEFAULT_INHERITED_ENV_VARS if name in environ}
    for name, value in backend.env.items():
        missing = [m.group(1) for m in ENV_REFERENCE.finditer(value) if m.group(1) not in environ]
        if missing:
            raise LaunchError(
                f"backend {backend.id}: env.{name} names ${{{missing[0]}}}, which is not set in the "
                "environment of the bridge"
            )
        env[name] = ENV_REFERENCE.sub(lambda m: environ[m.group(1)], value)
    return Launch(backend.id, backend.command, tuple(backend.args), env, backend.cwd)


class ServerProcess:
    """A running stdio server: its pid, how it ended, and what it wrote that was not a message."""

    def __init__(self, launch: Launch, process: Process, max_line_bytes: int) -> None:
        self.launch = launch
        self.pid = process.pid
        self.stderr = StderrLog(launch.backend_id)
        self.exited = anyio.Event()  # the process exited
        self.ended = anyio.Event()  # it exited, or its messages can no longer be read
        self.problem = ""  # why the messages ended while the process ran on
        self.noise = 0  # stdout lines that were not JSON-RPC messages
        self.first_noise = ""
        self._process = process
        self._max_line_bytes = max_line_bytes
        self._noise_budget = LogBudget(burst=5, per_second=0.2)

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def exit_reason(self) -> str:
        """How it ended, in words, with its last stderr line; empty while it runs."""
        code = self.returncode
        if self.problem:
            reason = self.problem
        elif code is None:
            return ""
        elif code < 0:
            reason = f"was killed by {signal.Signals(-code).name}"
        else:
            reason = f"exited with code {code}"
        last = self.stderr.last_line()
        return f"{reason} (its last stderr line: {last[:300]})" if last else reason

    def noise_note(self) -> str:
        """A note on the stdout lines that were not messages, for a start failure; empty if none."""
        if not self.noise:
            return ""
        return (
            f"; it wrote {self.noise} line(s) to stdout that are not JSON-RPC messages, the first: "
            f"{self.first_noise[:200]!r} (stdout carries MCP messages only: log to stderr)"
        )

    async def settle(self, timeout: float) -> None:
        """Wait up to `timeout` for an ending process's exit status, so that `exit_reason` can name it."""
        if not self.problem:
            with anyio.move_on_after(timeout):
                await self.exited.wait()

    @classmethod
    @asynccontextmanager
    async def run(cls, launch: Launch, max_line_bytes: int) -> AsyncIterator[tuple[Link, Reads, Writes]]:
        try:
            process = await anyio.open_process(
                [launch.command, *launch.args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=launch.cwd,
                env=dict(launch.env),
                start_new_session=True,  # its own process group: stopping it reaches its children
            )
        except OSError as exc:
            raise StartFailed(f"cannot run {launch.command!r}: {exc.strerror or exc}") from None
        server = cls(launch, process, max_line_bytes)
        incoming, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, outgoing = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server._read_stdout, incoming)
            tasks.start_soon(server._write_stdin, outgoing)
            if process.stderr is not None:
                tasks.start_soon(server.stderr.drain, process.stderr)
                tasks.start_soon(server.stderr.report_held_back)
            tasks.start_soon(server._watch_exit)
            try:
                yield server, read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await server._stop()
                    for stream in (read_stream, write_stream):
                        await stream.aclose()
                tasks.cancel_scope.cancel()

    async def _read_stdout(self, incoming: Incoming) -> None:
        assert self._process.stdout is not None
        pending = bytearray()
        async with incoming:
            try:
                async for chunk in self._process.stdout:
                    scanned = len(pending)  # a long line is scanned once, not once per chunk
                    pending += chunk
                    while (end := pending.find(b"\n", scanned)) >= 0:
                        line = bytes(pending[:end])
                        del pending[: end + 1]
                        scanned = 0
                        message = self._parse(line)
                        if message is not None:
                            await incoming.send(message)
                    if len(pending) > self._max_line_bytes:
                        self.problem = (
                            f"wrote a message of more than {self._max_line_bytes} bytes to stdout "
                            "(raise backends[].max_response_bytes if its answers are that large)"
                        )
                        logger.warning(
                            "backend %s: the stdio server %s", self.launch.backend_id, self.problem
                        )
                        break
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                pass  # the process is gone, or we stopped it
        self.ended.set()

    def _parse(self, line: bytes) -> SessionMessage | None:
        if not line.strip():
            return None
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except (ValidationError, ValueError):
            self.noise += 1
            text = line.decode("utf-8", "replace").strip()
            self.first_noise = self.first_noise or text
            if self._noise_budget.allow():
                logger.warning(
                    "backend %s: the stdio server wrote a line to stdout that is not a JSON-RPC message "
                    "(stdout carries MCP messages only: log to stderr): %.200r",
                    self.launch.backend_id,
                    text,
                )
            return None

    async def _write_stdin(self, outgoing: Outgoing) -> None:
        assert self._process.stdin is not None
        async with outgoing:
            try:
                async for message in outgoing:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await self._process.stdin.send(data.encode())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass  # the process is gone: its stdout's end tells the session

    async def _watch_exit(self) -> None:
        # returncode, polled, not wait(): wait() also waits for the pipes, which a grandchild may hold
        while True:
            if self._process.returncode is not None:
                break
            await anyio.sleep(EXIT_POLL)
        self.exited.set()
        self.ended.set()

    async def _wait_exit(self, timeout: float) -> None:
        # polled here, not through `exited`: on a cancelled exit its watcher is cancelled too
        with anyio.move_on_after(timeout):
            while True:
                if self._process.returncode is not None:
                    return
                await anyio.sleep(EXIT_POLL)

    async def _stop(self) -> None:
        if self._process.stdin is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._process.stdin.aclose()
        await self._wait_exit(EXIT_GRACE)
        # the group, even when the server itself has exited: what it started must not outlive it
        await terminate_posix_process_tree(self._process, KILL_GRACE)
        await self._wait_exit(KILL_GRACE)
        with anyio.move_on_after(KILL_GRACE), suppress(OSError, anyio.BrokenResourceError):
            await self._process.aclose()
