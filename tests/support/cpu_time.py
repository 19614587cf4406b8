"""Which test files the suite's CPU goes to: `make test PYTEST_ARGS="-p tests.support.cpu_time"`.

On a small machine the suite is bound by CPU, not by waiting: its wall time is about its CPU time
over the cores. So what to make cheaper is read from CPU, not from pytest's `--durations`, which
counts a file that waits on a process as dear as one that keeps both cores busy. Each test's CPU is
its worker's own and that of the processes the worker reaped meanwhile (`RUSAGE_CHILDREN`: every
process a test starts and stops, with the processes those started), from the start of its setup to
the end of its teardown, so a module's stack counts for the file that started it. The workers attach
each test's figure to its teardown report, and the run ends with the files, dearest first.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

SHOWN = 25  # files listed, dearest first
_STARTED = pytest.StashKey[tuple[float, float]]()


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has reaped, user and system."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@dataclass
class Spent:
    cpu: float = 0.0
    wall: float = 0.0


_spent: dict[str, Spent] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = (cpu_seconds(), time.monotonic())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    started = item.stash.get(_STARTED, None)
    if call.when == "teardown" and started is not None:
        report: pytest.TestReport = outcome.get_result()
        report.user_properties.append(("cpu_seconds", cpu_seconds() - started[0]))
        report.user_properties.append(("wall_seconds", time.monotonic() - started[1]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller (and in a run without workers): each teardown's figures, by file."""
    figures = dict(report.user_properties)
    if report.when == "teardown" and "cpu_seconds" in figures:
        spent = _spent.setdefault(report.nodeid.split("::")[0], Spent())
        spent.cpu += float(figures["cpu_seconds"])
        spent.wall += float(figures["wall_seconds"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _spent:
        return
    total = sum(s.cpu for s in _spent.values())
    terminalreporter.section(f"CPU by test file: {total:.0f} s in all")
    for path, spent in sorted(_spent.items(), key=lambda kv: -kv[1].cpu)[:SHOWN]:
        share = 100 * spent.cpu / total if total else 0.0
        terminalreporter.write_line(f"{spent.cpu:7.1f} s CPU {share:5.1f}% {spent.wall:7.1f} s wall  {path}")
