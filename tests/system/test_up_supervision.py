"""`toolsearch up` supervises its parts: reload on SIGHUP, stop with its terminal, no part left behind.

`up` runs as a user runs it: on a terminal of its own (a pseudo-terminal here, whose closing is the
terminal closing), with the real indexer, router and catalog server. A port in use is found before
anything starts. Each part sets its own signals as it starts (SIGHUP ignored, SIGTERM when its
supervisor dies), since `up` runs nothing between fork and exec, and a fork in a process of the
command that runs gRPC's core leaves the core's threads alone.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from commands.ports import free_port
from commands.supervisor import Supervisor
from tests.support.catalogs import small_catalog
from tests.support.processes import start_process, url_answers
from tests.support.stack import CLI, MODEL, ROOT, START_TIMEOUT

WAIT = 30.0


def write_config(folder: Path) -> tuple[Path, dict[str, Any]]:
    small_catalog(folder / "catalog.jsonl")
    indexer = f"127.0.0.1:{free_port()}"
    config: dict[str, Any] = {
        "router": {"listen": f"127.0.0.1:{free_port()}", "indexer": [indexer]},
        "indexer": {
            "listen": indexer,
            "model": str(MODEL),
            "cache_dir": str(folder / "cache"),
            "health": {"enabled": False},
        },
        "catalog_servers": [{"catalog": str(folder / "catalog.jsonl"), "listen": f"127.0.0.1:{free_port()}"}],
    }
    path = folder / "toolsearch.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


class Terminal:
    """`toolsearch up` on a pseudo-terminal: what it printed, and the terminal's closing."""

    def __init__(self, config: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: `up` as the terminal's session leader
            # as on a user's terminal, whatever ran the tests: a runner started under nohup, or in
            # the background of a shell, hands its children SIGHUP or SIGINT ignored (and `up`
            # rightly takes a SIGHUP it started with ignored for a reload, never for a hangup)
            for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP, signal.SIGINT, signal.SIGTERM})
            os.execv(sys.executable, [sys.executable, *CLI[1:], "up", "--config", str(config)])
        self.output = b""

    def read_until(self, text: str, within: float) -> None:
        deadline = time.monotonic() + within
        while text.encode() not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not printed within {within}s:\n{self.output.decode(errors='replace')}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:  # the terminal side is gone: `up` exited
                    assert text.encode() in self.output, self.output.decode(errors="replace")

    def close(self) -> None:
        os.close(self.fd)

    def wait(self, within: float) -> int:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        signals = signal_state(self.pid)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"toolsearch up did not exit within {within}s; its signals then: {signals}")


def signal_state(pid: int) -> str:
    """What the kernel says of a process's signals and where it waits: why it may not have acted."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        waiting = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"unknown ({exc})"
    wanted = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    lines = [line for line in status.splitlines() if line.split(":")[0] in wanted]
    return "; ".join([*lines, f"wchan: {waiting}"])


HANGUP = 1 << (signal.SIGHUP - 1)  # SIGHUP's bit in /proc/PID/status's signal masks


def hangup_handling(pid: int) -> dict[str, bool]:
    """Whether the process blocks, ignores and catches SIGHUP, from its /proc/PID/status."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: bool(int(fields[name], 16) & HANGUP) for name in ("SigBlk", "SigIgn", "SigCgt")}


def gone(processes: list[psutil.Process]) -> bool:
    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in processes)


def wait_gone(processes: list[psutil.Process], within: float = WAIT) -> None:
    deadline = time.monotonic() + within
    while not gone(processes):
        assert time.monotonic() < deadline, [p.pid for p in processes if p.is_running()]
        time.sleep(0.05)


@pytest.fixture
def leftovers() -> Iterator[list[psutil.Process]]:
    """The parts a test saw; killed after it, should it fail before they stopped."""
    parts: list[psutil.Process] = []
    yield parts
    for part in parts:
        if part.is_running():
            part.kill()


def test_sighup_reloads_the_indexer_and_the_terminal_closing_stops_everything(
    tmp_path: Path, leftovers: list[psutil.Process]
) -> None:
    path, config = write_config(tmp_path)
    terminal = Terminal(path)
    terminal.read_until("toolsearch is up", START_TIMEOUT)
    parts = psutil.Process(terminal.pid).children()
    leftovers.extend(parts)
    assert len(parts) == 3  # catalog server, indexer, router: each in a session of its own
    assert all(os.getsid(part.pid) == part.pid for part in parts)
    # a stray SIGHUP kills none: the indexer reloads on it, the others ignore it; none holds it blocked
    handling = {part.pid: hangup_handling(part.pid) for part in parts}
    assert all(h["SigIgn"] or h["SigCgt"] for h in handling.values()), handling
    assert not any(h["SigBlk"] for h in handling.values()), handling

    # kill -HUP: the documented reload. The indexer rereads the file; nothing is orphaned.
    server = config["catalog_servers"][0]["listen"]
    config["backends"] = [{"id": "cocktails_again", "url": f"http://{server}/servers/Cocktails/mcp"}]
    path.write_text(yaml.safe_dump(config))
    os.kill(terminal.pid, signal.SIGHUP)
    terminal.read_until("the router and the catalog servers have no reload", WAIT)
    terminal.read_until("config reload: added cocktails_again", WAIT)
    assert all(part.is_running() for part in parts)
    assert {p.pid for p in psutil.Process(terminal.pid).children()} == {p.pid for p in parts}

    # the terminal closes: `up` stops every part and exits
    terminal.close()
    assert terminal.wait(WAIT) == 0
    wait_gone(parts)


def test_a_part_that_dies_is_reported_and_the_rest_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two light parts under the supervisor `up` uses; the first is killed while both run
    small_catalog(tmp_path / "catalog.jsonl")
    supervisor = Supervisor(ready_timeout=WAIT, reload_note="")
    with supervisor.signals():
        try:
            for name in ("first", "second"):
                port = free_port()
                args = ["catalog-server", "--catalog", str(tmp_path / "catalog.jsonl"), "--port", str(port)]
                supervisor.start(
                    f"catalog server {name}",
                    args,
                    partial(url_answers, f"http://127.0.0.1:{port}/healthz"),
                )
            parts = [psutil.Process(part.process.pid) for part in supervisor.parts]
            parts[0].kill()
            assert supervisor.supervise() == 1
        finally:
            supervisor.stop()
    wait_gone(parts)
    assert (
        "toolsearch up: the catalog server first exited with signal SIGKILL; stopping the rest"
        in capsys.readouterr().err
    )


def test_a_part_that_cannot_start_is_reported_and_up_is_never_printed(tmp_path: Path) -> None:
    path, config = write_config(tmp_path)
    config["indexer"]["model"] = str(tmp_path / "no-model-here")
    path.write_text(yaml.safe_dump(config))
    up = start_process([*CLI, "up", "--config", str(path)], None)
    output = up.wait_exit(WAIT)
    assert up.returncode == 1
    assert "toolsearch up: the indexer exited with code 2 before it was ready" in output
    assert "toolsearch is up" not in output
    catalog = config["catalog_servers"][0]["listen"]
    assert not url_answers(f"http://{catalog}/healthz")  # the catalog server was stopped with it


def test_a_port_in_use_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    path, config = write_config(tmp_path)
    host, _, port = config["indexer"]["listen"].rpartition(":")
    with socket.create_server((host, int(port))):  # an earlier run's indexer, still listening
        up = start_process([*CLI, "up", "--config", str(path)], None)
        output = up.wait_exit(WAIT)
    assert up.returncode == 1
    assert output.strip() == (
        f"toolsearch up: port {port} is in use: the indexer cannot listen on {host}:{port}; stop what "
        "listens there (an earlier toolsearch up?) or change indexer.listen"
    )


# A supervisor that starts one catalog server, says its pid, and waits to be killed.
SUPERVISING = """
import sys, time
from functools import partial
from commands.supervisor import Supervisor
from tests.support.processes import url_answers
catalog, port = sys.argv[1:]
ready = partial(url_answers, f"http://127.0.0.1:{port}/healthz")
supervisor = Supervisor(ready_timeout=60, reload_note="")
supervisor.start("catalog server", ["catalog-server", "--catalog", catalog, "--port", port], ready)
print("part", supervisor.parts[0].process.pid, flush=True)
time.sleep(600)
"""


def test_a_part_stops_when_its_supervisor_is_killed(tmp_path: Path, leftovers: list[psutil.Process]) -> None:
    small_catalog(tmp_path / "catalog.jsonl")
    args = [sys.executable, "-c", SUPERVISING, str(tmp_path / "catalog.jsonl"), str(free_port())]
    supervising = start_process(args, None, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while "part " not in supervising.output():
            assert supervising.returncode is None and time.monotonic() < deadline, supervising.output()
            time.sleep(0.05)
        part = psutil.Process(int(supervising.output().split("part ", 1)[1].split()[0]))
        leftovers.append(part)
        assert os.getsid(part.pid) == part.pid  # a session of its own: killing the group spares it
        os.kill(supervising.pid, signal.SIGKILL)
        wait_gone([part])  # its parent-death signal, SIGTERM, stopped it
    finally:
        supervising.stop()


# In a process as the `toolsearch` command sets it up, gRPC's core runs its threads, then it forks.
FORKING = """
import os
from commands.cli import prepare_process
prepare_process(os.environ)
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel("127.0.0.1:1") as channel:  # nobody answers there: the core's threads start
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.3)
    except grpc.RpcError:
        pass
    threads = sorted(os.listdir("/proc/self/task"))
    child = os.fork()
    if child == 0:
        os._exit(len(os.listdir("/proc/self/task")))
    _, status = os.waitpid(child, 0)
    print(len(threads), os.waitstatus_to_exitcode(status), threads == sorted(os.listdir("/proc/self/task")))
"""


def test_a_fork_in_a_toolsearch_process_running_grpc_restarts_none_of_its_threads() -> None:
    """gRPC's fork handlers are off in every process of the command: with them on, a fork stops and
    restarts the core's threads in the parent and starts them again in the copy, where a part `up`
    started could abort before it ran (docs/reliability.md, "Starts that abort")."""
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    args = [sys.executable, "-c", FORKING]
    done = subprocess.run(
        args, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    threads, in_the_copy, unchanged = done.stdout.split()[-3:]
    assert int(threads) > 1  # the core's threads ran
    assert (in_the_copy, unchanged) == ("1", "True"), done.stdout + done.stderr
