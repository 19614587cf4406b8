"""The suite's two tiers, a folder each, and the guard that keeps the in-process tier honest.

A test's tier is the folder right under `tests/` that holds it. The in-process tier (`IN_PROCESS`)
runs toolsearch's parts in the test's own process and starts no process at all: while one of its
tests runs (its fixtures' setup and teardown included), starting a process is refused. Every way
Python has to start one goes through a function patched here (`subprocess` and asyncio's
subprocesses through `fork_exec` or `os.posix_spawn`, multiprocessing through those or `os.fork`,
`os.system`, the `exec` family), so the start fails where it was asked for, and the test fails with
what it tried to start and from where, even when the code under test swallowed the error. A test
whose subject is a process belongs in the system tier (`SYSTEM`), which may start any.

    pytest --tier in-process      # the in-process tier alone (`make test-fast`)
    pytest --tier system          # the system tier alone
    pytest                        # both

The root conftest loads this plugin; a file in a folder of neither tier fails the collection, so
that no test is left out of `make test`.
"""

from __future__ import annotations

import _posixsubprocess
import os
import shlex
import subprocess
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

IN_PROCESS = ("search", "gateway", "indexer", "operations")
SYSTEM = ("system",)
TIERS = {"in-process": IN_PROCESS, "system": SYSTEM}
SUPPORT = ("support", "servers")  # what tests use, holding no tests
ROOT = Path(__file__).resolve().parents[2]
WHERE_FRAMES = 4  # of the project's own, shown for each start refused


def tier_folder(path: Path) -> str | None:
    """The folder right under a `tests` folder that holds `path`, if any."""
    for parent in path.parents:
        if parent.parent.name == "tests":
            return parent.name
    return None


class ProcessRefused(RuntimeError):
    """What a test of the in-process tier meets when it starts a process."""


def _command(args: Sequence[Any]) -> str:
    """A start's arguments as a shell line, bytes or not."""
    return shlex.join(os.fsdecode(arg) if isinstance(arg, bytes | os.PathLike) else str(arg) for arg in args)


def _where() -> str:
    """The project's frames that led to the start, innermost last (the libraries' and ours left out)."""
    own = [
        frame
        for frame in traceback.extract_stack()
        if Path(frame.filename).is_relative_to(ROOT)
        and not Path(frame.filename).is_relative_to(ROOT / ".venv")
        and frame.filename != __file__
    ]
    return "".join(traceback.format_list(own[-WHERE_FRAMES:]))


class NoProcesses:
    """While entered, every way to start a process raises `ProcessRefused` and is recorded in `starts`.

    Entered once per phase of a test; nested guards (a test that runs pytest in process) each keep
    their own record and restore what they found.
    """

    def __init__(self) -> None:
        self.starts: list[str] = []
        self._saved: list[tuple[object, str, Callable[..., Any]]] = []

    def _refuse(self, what: str) -> ProcessRefused:
        self.starts.append(f"{what}\n{_where()}")
        return ProcessRefused(f"the in-process tier starts no process: refused {what}")

    def _patch(self, owner: object, name: str, describe: Callable[..., str]) -> None:
        original = getattr(owner, name, None)
        if original is None:  # not on this platform
            return

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise self._refuse(describe(*args, **kwargs))

        self._saved.append((owner, name, original))
        setattr(owner, name, refused)

    def __enter__(self) -> NoProcesses:
        # subprocess.Popen (asyncio's subprocesses too), which holds its own name for fork_exec, and
        # multiprocessing's spawn, which calls it on its module: with the argv
        self._patch(subprocess, "_fork_exec", lambda args, *_, **__: _command(args))
        self._patch(_posixsubprocess, "fork_exec", lambda args, *_, **__: _command(args))
        # subprocess.Popen where it prefers posix_spawn, with the argv
        self._patch(os, "posix_spawn", lambda path, argv, *_, **__: _command(argv))
        self._patch(os, "posix_spawnp", lambda path, argv, *_, **__: _command(argv))
        # multiprocessing's fork, pty.fork, os.spawn*: no argv to show
        self._patch(os, "fork", lambda: "os.fork()")
        self._patch(os, "forkpty", lambda: "os.forkpty()")
        self._patch(os, "system", lambda command: command)
        # the exec family (execl, execlp, execvp, ... end in these two): this process replaced
        self._patch(os, "execv", lambda path, argv: _command(argv))
        self._patch(os, "execve", lambda path, argv, env: _command(argv))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=sorted(TIERS),
        default=None,
        help="run one tier of the suite: in-process (no process started) or system (default: both)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `--tier`, the other tier's folders are not even imported."""
    tier = config.getoption("tier")
    folder = tier_folder(collection_path)
    if tier is None or folder is None or folder in SUPPORT:
        return None
    return True if folder not in TIERS[tier] else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test in no tier's folder would run in neither `make test` run: say where it must go."""
    tiered = (*IN_PROCESS, *SYSTEM)
    strays = sorted({str(item.path) for item in items if tier_folder(item.path) not in tiered})
    if strays:
        raise pytest.UsageError(
            "test files outside the tiers' folders (tests/support/tiers.py): "
            + ", ".join(strays)
            + f"; put each in an in-process folder ({', '.join(IN_PROCESS)}) or in tests/system"
        )


def _guarded(item: pytest.Item) -> Iterator[None]:
    """One phase of a test; for the in-process tier, refusing every process start in it."""
    if tier_folder(item.path) not in IN_PROCESS:
        return (yield)
    with NoProcesses() as guard:
        try:
            return (yield)
        finally:
            if guard.starts:
                folder = tier_folder(item.path)
                raise pytest.fail.Exception(
                    f"{item.nodeid} started a process, which no test of the in-process tier (tests/{folder}) "
                    "does: serve the part from the test's process (tests/support/in_process.py), or, when "
                    "the process is what the test is about, move the file to tests/system.\n"
                    + "\n".join(f"started: {start}" for start in guard.starts),
                    pytrace=False,
                ) from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))
