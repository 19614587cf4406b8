"""Where `toolsearch model train` writes, what it records of the machine, and how a retrain is checked.

A training writes into a new folder (`<models>/trained-<UTC time>/`, or `--out`): the tuning under
`tunings/<name>/`, its export's recipe under `recipes/<name>/` and the model folder it makes under
`models/<name>/`, so that the shipped tuning and the model find_tool serves stay as they are until
someone chooses to replace them (`--replace` writes into the shipped folders and `<models>/`).
Each tuning records the environment it was trained in (package versions, CPU, threads): torch sums
floats in an order of its own on each CPU, so a retrain elsewhere makes other bytes, and is checked
against the shipped tuning by what it measures on the corpus's check part, within a tolerance
(`compare_with_shipped`), not by its bytes.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from indexer.embedder.recipe import RECIPES
from indexer.embedder.tuning import TUNINGS

PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "tokenizers",
    "numpy",
    "safetensors",
    "onnx",
    "onnxscript",
    "onnxruntime",
)
# how far a retrain's check-part figures (percentage points) may lie from the shipped tuning's
TOLERANCE = 2.0


@dataclass(frozen=True)
class Destination:
    """Where a training's tuning, recipe and model folder go."""

    tunings: Path
    recipes: Path
    models: Path
    replaces_shipped: bool


def destination(models_dir: Path, out: Path | None, replace: bool) -> Destination:
    """The shipped folders with `replace`; else `out`, or a new `trained-<UTC time>` in `models_dir`."""
    if replace:
        return Destination(TUNINGS, RECIPES, models_dir, True)
    root = out if out is not None else models_dir / time.strftime("trained-%Y%m%d-%H%M%S", time.gmtime())
    return Destination(root / "tunings", root / "recipes", root / "models", False)


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it, else what Python knows of the machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(threads: int) -> dict[str, Any]:
    """What a training ran on: Python, the packages that shape its numbers, the CPU, the threads."""
    versions: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "python": platform.python_version(),
        "packages": versions,
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "threads": threads,
    }


def compare_with_shipped(
    made: Mapping[str, float], shipped: Mapping[str, float], tolerance: float = TOLERANCE
) -> list[str]:
    """Figures of a retrain more than `tolerance` points from the shipped tuning's, as sentences; []
    when every figure both record is within it."""
    out = []
    for key in sorted(set(made) & set(shipped)):
        if abs(made[key] - shipped[key]) > tolerance:
            out.append(f"{key} {made[key]:.2f} against the shipped {shipped[key]:.2f}")
    return out
