"""Part 9 (full runs only): the first run of a new user, `make run` from a clean clone.

The project is cloned from the checkout the benchmark runs in (its committed tree, as a user's
clone would be) into the run's folder, and `make run` is timed until it prints `toolsearch is up`:
the virtualenv made and filled with what the demo serves with (pip takes what it holds in its cache
and downloads the rest), the model prepared, the demo's catalog embedded and served. The demo's
configuration is copied with free ports, so nothing already listening on the machine is in the way.
Then the stack is stopped and the virtualenv's size taken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from commands.bench.stack import Proc
from commands.ports import free_port

UP = "toolsearch is up"
TIMEOUT = 1800.0  # seconds a first run may take at most, downloads included


def _demo_config(clone: Path) -> Path:
    """The demo's configuration beside it in the clone, on free loopback ports."""
    config = yaml.safe_load((clone / "examples" / "demo.yaml").read_text())
    indexer = f"127.0.0.1:{free_port()}"
    config["router"]["listen"] = f"127.0.0.1:{free_port()}"
    config["router"]["indexer"] = [indexer]
    config["indexer"]["listen"] = indexer
    for server in config.get("catalog_servers", []):
        server["listen"] = f"127.0.0.1:{free_port()}"
    path = clone / "examples" / "bench-first-run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _size_mb(folder: Path) -> float:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return round(total / 2**20, 1)


def make_run_from_clone(root: Path, work: Path) -> dict[str, Any]:
    """`make run` from a clean clone of `root`, timed to `toolsearch is up`; the virtualenv's size."""
    clone = work / "first-run"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True, timeout=300)
    config = _demo_config(clone)
    started = time.perf_counter()
    make = Proc("make run", ["make", "-C", str(clone), "run", f"CONFIG={config}"], work / "first-run.log")
    try:
        while UP not in make.log.read_text(errors="replace"):
            if make.popen.poll() is not None:
                raise RuntimeError(f"make run exited with {make.popen.returncode}:\n{make.tail()}")
            if time.perf_counter() - started > TIMEOUT:
                raise RuntimeError(f"make run not up within {TIMEOUT:g}s:\n{make.tail()}")
            time.sleep(0.2)
        seconds = time.perf_counter() - started
    finally:
        make.stop()
    return {"seconds_to_up": round(seconds, 1), "venv_mb": _size_mb(clone / ".venv")}
