"""The suite's CPU report (tests/support/cpu_time.py): files dearest first, their processes counted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import ROOT

BUSY = """
import subprocess, sys

BURN = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"

def test_a_child_process_burns_cpu():
    subprocess.run([sys.executable, "-c", BURN], check=True)
"""
IDLE = """
import time

def test_waiting_costs_no_cpu():
    time.sleep(0.3)
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["alone", "two-workers"])
def test_the_report_lists_each_file_by_its_cpu_counting_the_processes_it_ran(
    tmp_path: Path, workers: list[str]
) -> None:
    (tmp_path / "test_busy.py").write_text(BUSY)
    (tmp_path / "test_idle.py").write_text(IDLE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.cpu_time", "-p", "no:cacheprovider", *workers],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "CPU by test file" in done.stdout, done.stdout
    rows = re.findall(r"^\s*([0-9.]+) s CPU\s+[0-9.]+%\s+([0-9.]+) s wall\s+(\S+)$", done.stdout, re.M)
    assert [path for _, _, path in rows] == ["test_busy.py", "test_idle.py"], done.stdout
    (busy_cpu, _, _), (idle_cpu, idle_wall, _) = rows
    assert float(busy_cpu) >= 0.5  # the child's CPU, which it spent before the test reaped it
    assert float(idle_cpu) < float(idle_wall)  # the sleep is wall time, not CPU
