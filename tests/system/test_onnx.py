"""The ONNX Runtime embedder on the real model: torch's vectors, a refused tampered export, no torch.

The model folder is the repository's `models/all-MiniLM-L6-v2` with its export (`toolsearch model
prepare`, which `make test` runs first). Tests that change an export work on a copy whose other
files are hard links to it, so nothing of the shared folder is ever written.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import httpx2
import numpy as np
import pytest
import yaml

from commands.cli import main
from commands.retrieval.model import BASE_MODEL_NAME, ModelError, ensure_export, prepare_default_model
from indexer.embedder import EMBEDDER_KINDS, EmbedderError, load_embedder
from indexer.embedder.files import (
    MANIFEST,
    VARIANT_FILES,
    ExportError,
    StaleExportError,
    export_dir,
    file_sha256,
    verify_export,
)
from indexer.embedder.onnx import OnnxEmbedder, identity_of
from indexer.embedder.pipeline import read_pipeline
from indexer.embedder.sentence import SentenceTransformerEmbedder
from tests.support.stack import HEADERS, open_session, running_stack
from toolsearch.catalog import load_catalog
from toolsearch.config import ConfigError, load_config
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME, Indexer

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5

# a fixed set: everyday requests, task instructions, tool texts of the demo catalog, and edge cases
EDGE_CASES = [
    "",
    "x",
    "   padded with whitespace\t\n",
    "Ünïcödé café, naïve résumé; Москва, 東京, 🙂",
    "create_issue(owner: str, repo: str, title: str, body: str | None = None) -> Issue",
    " ".join(f"word{number}" for number in range(600)),  # far past max_seq_length: truncation
]
QUERIES = [
    "what's the weather in Lisbon tomorrow",
    "Book a table for four at an Italian restaurant near the office on Friday evening. "
    "Then send the confirmation to my team and add it to the shared calendar.",
    "convert 250 US dollars to euros",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return prepare_default_model(ROOT / "models")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    tools = load_catalog(ROOT / "examples" / "catalog.jsonl")[:24]
    return [*EDGE_CASES, *QUERIES, *(f"{tool.name}: {tool.description}" for tool in tools)]


@pytest.fixture(scope="module")
def onnx(model_dir: Path) -> OnnxEmbedder:
    """The fp32 embedder, loaded with any network connection made to fail loudly."""

    def refuse(self: socket.socket, address: object) -> None:
        raise AssertionError(f"the ONNX embedder tried to reach {address}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        return OnnxEmbedder(model_dir)


def _linked_copy(model: Path, destination: Path, real: tuple[str, ...] = ()) -> Path:
    """A copy of a model folder whose files are hard links, except `real` (relative paths): copies."""
    shutil.copytree(model, destination, copy_function=os.link)
    for name in real:
        path = destination / name
        path.unlink()
        shutil.copyfile(model / name, path)
    return destination


def _flip_a_byte(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_onnx_gives_torchs_vectors_within_1e5(model_dir: Path, texts: list[str], onnx: OnnxEmbedder) -> None:
    torch = SentenceTransformerEmbedder(model_dir)
    wanted = torch.embed(texts)
    batched = onnx.embed(texts)
    one_by_one = np.vstack([onnx.embed([text]) for text in texts])
    assert batched.shape == wanted.shape == (len(texts), 384) and batched.dtype == np.float32
    assert float(np.abs(batched - wanted).max()) <= TOLERANCE
    assert float(np.abs(one_by_one - wanted).max()) <= TOLERANCE
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    # the same vectors under the same identity: both share the embedding cache
    assert onnx.identity == torch.identity
    assert (onnx.dimension, onnx.max_tokens) == (torch.dimension, torch.max_tokens) == (384, 256)
    assert [onnx.count_tokens(t) for t in texts] == [torch.count_tokens(t) for t in texts]
    assert onnx.count_tokens(EDGE_CASES[-1]) > onnx.max_tokens  # counted untruncated


def test_int8_is_measured_not_served(model_dir: Path, tmp_path: Path) -> None:
    # it lost more than half a point on a shipped set, so indexer.embedder does not offer it
    path = tmp_path / "toolsearch.yaml"
    path.write_text(yaml.safe_dump({"indexer": {"embedder": "onnx-int8"}}))
    with pytest.raises(ConfigError, match=r"indexer\.embedder"):
        load_config(path, {})
    # `toolsearch eval --embedder onnx-int8` still measures it, under an identity of its own
    digest = "ab" * 32
    assert identity_of(model_dir, "fp32", digest, "f" * 64).startswith("sentence-transformers:")
    assert identity_of(model_dir, "int8", digest, "f" * 64).startswith(f"onnx-int8:{BASE_MODEL_NAME}:")
    manifest = f"onnx/{MANIFEST}"
    copy = _linked_copy(model_dir, tmp_path / BASE_MODEL_NAME, real=(manifest,))
    raw = json.loads((copy / manifest).read_text())
    raw["files"].pop("int8", None)
    (copy / manifest).write_text(json.dumps(raw))
    with pytest.raises(StaleExportError, match=r"no int8 model: run `toolsearch model prepare --int8`"):
        load_embedder("onnx-int8", copy)


def test_the_factory_knows_what_the_configuration_allows(model_dir: Path, onnx: OnnxEmbedder) -> None:
    names = next(arg for arg in get_args(Indexer.model_fields["embedder"].annotation) if get_args(arg))
    assert set(EMBEDDER_KINDS) == set(get_args(names))  # the names; a mapping names a server
    assert Indexer().embedder == "onnx"
    assert onnx.threads == len(os.sched_getaffinity(0))
    assert load_embedder("onnx", model_dir, threads=1).threads == 1  # type: ignore[attr-defined]
    with pytest.raises(EmbedderError, match="unknown embedder 'cuda': one of onnx, torch, onnx-int8"):
        load_embedder("cuda", model_dir)


def test_the_embedder_key_is_checked_and_overridable(tmp_path: Path) -> None:
    path = tmp_path / "toolsearch.yaml"
    path.write_text(yaml.safe_dump({"indexer": {"embedder": "cuda"}}))
    with pytest.raises(ConfigError, match=r"indexer\.embedder") as caught:
        load_config(path, {})
    assert str(path) in str(caught.value)
    assert load_config(path, {"TOOLSEARCH_INDEXER_EMBEDDER": "torch"}).indexer.embedder == "torch"


def test_a_tampered_export_is_refused_by_prepare_verify_and_the_embedder(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fp32 = f"onnx/{VARIANT_FILES['fp32']}"
    copy = _linked_copy(model_dir, tmp_path / "models" / BASE_MODEL_NAME, real=(fp32,))
    _flip_a_byte(copy / fp32)
    tampered = file_sha256(copy / fp32)
    recorded = json.loads((copy / "onnx" / MANIFEST).read_text())["files"]["fp32"]["sha256"]
    with pytest.raises(ModelError, match="changed after it was made") as caught:
        prepare_default_model(tmp_path / "models")
    assert tampered in str(caught.value) and recorded in str(caught.value)
    assert file_sha256(copy / fp32) == tampered  # refused, not quietly exported over
    assert main(["model", "verify", str(copy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("toolsearch model verify: ") and "refusing it" in err and "Traceback" not in err
    with pytest.raises(ExportError, match="changed after it was made"):
        load_embedder("onnx", copy)


def test_an_export_of_other_files_is_made_again(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = f"onnx/{MANIFEST}"
    copy = _linked_copy(model_dir, tmp_path / BASE_MODEL_NAME, real=(manifest,))
    raw = json.loads((copy / manifest).read_text())
    raw["source_digest"] = "0" * 64
    (copy / manifest).write_text(json.dumps(raw))
    with pytest.raises(StaleExportError, match="made from other files"):
        verify_export(copy)
    with pytest.raises(StaleExportError, match="run `toolsearch model prepare`"):
        OnnxEmbedder(copy)

    exported: list[Path] = []

    def export_onnx(folder: Path, int8: bool = False) -> None:
        exported.append(folder)
        raise ExportError("stopped here")

    monkeypatch.setattr("indexer.embedder.export.export_onnx", export_onnx)
    with pytest.raises(ModelError, match="stopped here"):
        ensure_export(copy, with_torch=True)
    assert exported == [copy]
    # without torch asked for, the default model's export is made again from its shipped recipe
    remade = ensure_export(copy)
    assert exported == [copy] and verify_export(copy)[1] == remade


def test_a_missing_or_foreign_export_says_what_to_do(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare, copy_function=os.link, ignore=shutil.ignore_patterns("onnx"))
    with pytest.raises(ExportError, match=r"no ONNX export .* run `toolsearch model prepare`"):
        load_embedder("onnx", bare)
    assert main(["model", "verify", str(bare)]) == 0
    assert "no ONNX export" in capsys.readouterr().out
    (bare / "onnx").mkdir()
    os.link(model_dir / "onnx" / VARIANT_FILES["fp32"], bare / "onnx" / VARIANT_FILES["fp32"])
    with pytest.raises(ExportError, match="not made by `toolsearch model prepare`"):
        load_embedder("onnx", bare)
    with pytest.raises(EmbedderError, match="not found: run `toolsearch model prepare`"):
        load_embedder("onnx", tmp_path / "absent")


def test_a_pipeline_the_embedder_cannot_reproduce_is_refused(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dense"
    shutil.copytree(model_dir, folder, copy_function=os.link, ignore=shutil.ignore_patterns("onnx"))
    modules = json.loads((model_dir / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (folder / "modules.json").unlink()
    (folder / "modules.json").write_text(json.dumps([*modules, dense]))
    with pytest.raises(
        EmbedderError,
        match=r"Dense, which only sentence-transformers itself runs: set indexer\.embedder: torch",
    ):
        read_pipeline(folder)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").unlink()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"embedding_dimension": 384, "pooling_mode": "lasttoken"})
    )
    with pytest.raises(EmbedderError, match="pooling mode 'lasttoken'"):
        read_pipeline(folder)


def test_the_prepare_command_names_the_export(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "prepare", "--models-dir", str(model_dir.parent)]) == 0
    base_line, tuned_line = capsys.readouterr().out.splitlines()
    for line, folder in ((base_line, model_dir), (tuned_line, model_dir.parent / TUNED_MODEL_NAME)):
        sha = json.loads((export_dir(folder) / MANIFEST).read_text())["files"]["fp32"]["sha256"]
        assert line.startswith(f"{folder}: ready") and line.endswith(f", onnx/model.onnx sha256 {sha}")


# modules that must never load in a process that serves with ONNX (or routes)
MODEL_RUNTIMES = ("torch", "transformers", "sentence_transformers")
HEAVY = (*MODEL_RUNTIMES, "onnxruntime", "faiss", "tokenizers", "numpy")


def _fresh(code: str) -> dict[str, Any]:
    """Run `code` in a fresh interpreter at the repository's root; it prints a JSON answer last."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_no_router_module_imports_a_model_runtime_or_faiss() -> None:
    answer = _fresh(
        "import json, pkgutil, importlib, sys, router, router.frontdoor.app\n"
        "names = [m.name for m in pkgutil.walk_packages(router.__path__, 'router.')]\n"
        "for name in names: importlib.import_module(name)\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps({'modules': len(names), 'heavy': heavy}))\n"
    )
    assert answer["modules"] >= 5
    assert answer["heavy"] == []


def test_the_indexer_serving_with_onnx_imports_no_torch(model_dir: Path) -> None:
    answer = _fresh(
        "import json, pkgutil, importlib, sys\n"
        "from pathlib import Path\n"
        "import indexer, indexer.api.server\n"
        "from indexer.embedder import load_embedder\n"
        "skip = ('indexer.embedder.sentence', 'indexer.embedder.export')\n"
        "names = [m.name for m in pkgutil.walk_packages(indexer.__path__, 'indexer.')]\n"
        "names = [name for name in names if name not in skip]\n"
        "for name in names: importlib.import_module(name)\n"
        f"embedder = load_embedder('onnx', Path({str(model_dir)!r}), 1)\n"
        "embedder.embed(['find the weather tomorrow'])\n"
        f"runtimes = sorted(m for m in sys.modules if m.split('.')[0] in {MODEL_RUNTIMES!r})\n"
        "print(json.dumps({'runtimes': runtimes, 'onnxruntime': 'onnxruntime' in sys.modules}))\n"
    )
    assert answer == {"runtimes": [], "onnxruntime": True}


def _mapped(pid: int) -> str:
    """The shared libraries a running process has mapped."""
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_the_running_stack_maps_no_torch(tmp_path: Path) -> None:
    lines = (ROOT / "examples" / "catalog.jsonl").read_text().splitlines()[:40]
    catalog = tmp_path / "catalog.jsonl"
    catalog.write_text("".join(f"{line}\n" for line in lines))
    with running_stack(tmp_path, catalog=catalog) as stack:
        session = open_session(stack.mcp_url)
        find = {"name": "find_tool", "arguments": {"tool_description": "what is the weather", "limit": 3}}
        reply = httpx2.post(
            stack.mcp_url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": find},
            headers={**HEADERS, "MCP-Protocol-Version": "2025-11-25", "Mcp-Session-Id": session},
            timeout=30,
        )
        assert reply.status_code == 200 and reply.json()["result"]["isError"] is False, reply.text
        indexer, router = _mapped(stack.procs["indexer"].pid), _mapped(stack.procs["router0"].pid)
    assert "onnxruntime" in indexer and "libtorch" not in indexer
    for library in ("libtorch", "onnxruntime", "faiss"):
        assert library not in router, library


def test_config_file_default_is_onnx_for_the_demo() -> None:
    assert load_config(ROOT / "examples" / "demo.yaml", {}).indexer.embedder == "onnx"
