"""The suite's two tiers (tests/support/tiers.py): a test of the in-process tier that starts a process
fails, saying what it started and where, by whichever of Python's ways it started it, even when the
code under test swallowed the refusal; the system tier starts what it likes; `--tier` runs one tier;
a test file in neither tier's folder stops the run.

Each test runs pytest in this process (pytester) on test files written for it. It sits in the system
tier because one of its checks starts a process, as the system tier may.
"""

from __future__ import annotations

import pytest

from tests.support.tiers import IN_PROCESS

pytest_plugins = ("pytester",)
PLUGINS = ("-p", "tests.support.tiers", *("-p", "no:randomly", "-p", "no:xdist", "-p", "no:asyncio"))
STARTS = """
import asyncio, multiprocessing, os, subprocess, sys

def test_subprocess_run():
    subprocess.run(["true"], check=False)

def test_popen_by_posix_spawn():
    subprocess.Popen(["/bin/true"], close_fds=False).wait()

def test_asyncio_subprocess():
    async def run():
        await (await asyncio.create_subprocess_exec("true")).wait()
    asyncio.run(run())

def test_os_system():
    os.system("true")

def test_multiprocessing_spawn():
    process = multiprocessing.get_context("spawn").Process(target=print)
    process.start()
    process.join()

def test_multiprocessing_fork():
    process = multiprocessing.get_context("fork").Process(target=print)
    process.start()
    process.join()

def test_swallowed():
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    except Exception:
        pass

def test_none():
    assert os.getpid() > 0
"""


def tiers(pytester: pytest.Pytester, **files: str) -> None:
    """Test files under pytester's tests/, by folder: `gateway="..."` is tests/gateway/test_it.py."""
    for folder, source in files.items():
        (pytester.path / "tests" / folder).mkdir(parents=True)
        (pytester.path / "tests" / folder / "test_it.py").write_text(source)


def test_a_test_of_the_in_process_tier_fails_for_each_way_it_starts_a_process(
    pytester: pytest.Pytester,
) -> None:
    tiers(pytester, gateway=STARTS)
    result = pytester.runpytest_inprocess(*PLUGINS)
    result.assert_outcomes(passed=1, failed=7)
    output = result.stdout.str()
    # one failure's message each, counted where it opens (with its test's id): the short summary
    # repeats it, cut to the terminal's width or whole (as under CI), so it is not counted
    refused = [
        line
        for line in result.outlines
        if line.startswith("tests/gateway/test_it.py::")
        and "which no test of the in-process tier (tests/gateway) does" in line
    ]
    assert len(refused) == 7, output
    for started in ("started: true", "started: /bin/true", "started: os.fork()", "-c pass"):
        assert started in output, output
    assert "move the file to tests/system" in output


def test_a_test_of_the_system_tier_starts_processes(pytester: pytest.Pytester) -> None:
    tiers(pytester, system="import subprocess\n\ndef test_it():\n    subprocess.run(['true'], check=True)\n")
    pytester.runpytest_inprocess(*PLUGINS).assert_outcomes(passed=1)


@pytest.mark.parametrize(("tier", "folder"), [("in-process", "gateway"), ("system", "system")])
def test_a_tier_alone_collects_its_own_folders_only(
    pytester: pytest.Pytester, tier: str, folder: str
) -> None:
    tiers(pytester, gateway="def test_it():\n    pass\n", system="def test_it():\n    pass\n")
    result = pytester.runpytest_inprocess(*PLUGINS, "--tier", tier, "--collect-only", "-q")
    assert [line for line in result.outlines if "::" in line] == [f"tests/{folder}/test_it.py::test_it"]


def test_a_test_file_outside_the_tiers_stops_the_run_naming_it(pytester: pytest.Pytester) -> None:
    tiers(pytester, gateway="def test_it():\n    pass\n", elsewhere="def test_it():\n    pass\n")
    result = pytester.runpytest_inprocess(*PLUGINS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "tests/elsewhere/test_it.py" in result.stderr.str()
    assert all(folder in result.stderr.str() for folder in IN_PROCESS)
