"""The tuned model: trained the same way twice, made on any machine from what ships, refused when changed.

`toolsearch model train` learns low-rank changes over all-MiniLM-L6-v2 (`commands.retrieval.training`); what
ships is the changes and their record (`indexer.embedder.tuning`), from which `toolsearch model
prepare` makes the tuned folder and its ONNX export without torch. The real base model is used;
training runs a few steps over a small slice of the corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from commands.cli import main
from commands.retrieval.corpus import Corpus, read_corpus
from commands.retrieval.model import prepare_default_model, prepare_tuned_models
from commands.retrieval.train_command import kept_settings
from commands.retrieval.training import fit_low_rank
from indexer.embedder import load_embedder
from indexer.embedder.files import file_sha256, read_manifest
from indexer.embedder.recipe import find_recipe
from indexer.embedder.tuning import (
    LOW_RANK,
    TUNING,
    TrainSettings,
    TuningError,
    apply_tuning,
    merged_weights,
    read_tuning,
    shipped_tunings,
)
from indexer.retrieval.bands import UNTRAINED_BANDS, Bands, model_bands
from toolsearch.catalog import TRAIN_DATA
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME, TUNED_MODEL_NAME

ROOT = Path(__file__).resolve().parents[2]
SMALL = TrainSettings(steps=2, batch=8, rank=2)


@pytest.fixture(scope="module")
def base() -> Path:
    return prepare_default_model(ROOT / "models")


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """Two sources' tools and twenty of each one's requests."""
    folder = tmp_path_factory.mktemp("corpus")
    sources = ("tooltalk", "restbench")
    tools = [line for line in (TRAIN_DATA / "tools.jsonl").read_text().splitlines() if line]
    pairs = [json.loads(line) for line in (TRAIN_DATA / "pairs.jsonl").read_text().splitlines() if line]
    kept = [p for source in sources for p in [p for p in pairs if p["source"] == source][:20]]
    (folder / "tools.jsonl").write_text(
        "".join(line + "\n" for line in tools if json.loads(line)["id"].split("::")[0] in sources)
    )
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in kept))
    return read_corpus(folder)


def _fingerprint(changes: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(changes):
        digest.update(name.encode() + changes[name].tobytes())
    return digest.hexdigest()


def _models(base: Path, folder: Path) -> Path:
    """A models folder holding a hard-linked copy of the base model and nothing else."""
    folder.mkdir()
    shutil.copytree(base, folder / BASE_MODEL_NAME, copy_function=os.link)
    return folder


def _tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.unlink()  # a hard link: the shared file stays as it was
    path.write_bytes(bytes(data))


def test_training_twice_with_one_seed_learns_the_same_changes(base: Path, small_corpus: Corpus) -> None:
    embedder = load_embedder("onnx", base)
    runs = [
        fit_low_rank(base, small_corpus, settings, embedder.count_tokens, embedder.max_tokens)
        for settings in (SMALL, SMALL, replace(SMALL, seed=SMALL.seed + 1))
    ]
    assert _fingerprint(runs[0]) == _fingerprint(runs[1])
    assert _fingerprint(runs[0]) != _fingerprint(runs[2])
    # every linear layer of the encoder gets a change of the rank asked for
    assert len(runs[0]) == 2 * 6 * 6
    up = runs[0]["encoder.layer.0.attention.self.query.weight.up"]
    assert up.shape == (384, SMALL.rank) and np.abs(up).max() > 0


def test_the_shipped_tuning_makes_its_recorded_weights_and_export_without_torch(
    base: Path, tmp_path: Path
) -> None:
    models = _models(base, tmp_path / "models")
    # a Python that cannot import torch: what a fresh `make run` has
    script = (
        "import sys; sys.modules['torch'] = None; from pathlib import Path; "
        "from commands.retrieval.model import prepare_tuned_models; "
        f"print(prepare_tuned_models(Path({str(models)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tuned = models / TUNED_MODEL_NAME
    (tuning,) = shipped_tunings()
    assert file_sha256(tuned / "model.safetensors") == tuning.weights_sha256
    assert read_tuning(tuned) == replace(tuning, folder=tuned)
    recipe = find_recipe(read_manifest(tuned / "onnx").source_digest)
    assert recipe is not None and recipe.folder.name == TUNED_MODEL_NAME
    assert read_manifest(tuned / "onnx").files["fp32"].sha256 == recipe.manifest.files["fp32"].sha256
    assert sorted(p.name for p in models.iterdir()) == [BASE_MODEL_NAME, TUNED_MODEL_NAME]
    # verify checks a tuned folder against the sha256 its own tuning records
    assert main(["model", "verify", str(tuned)]) == 0


def test_a_changed_low_rank_file_is_refused(base: Path, tmp_path: Path) -> None:
    (tuning,) = shipped_tunings()
    assert tuning.folder is not None
    copy = shutil.copytree(tuning.folder, tmp_path / "tuning")
    _tamper(copy / LOW_RANK)
    changed = read_tuning(copy)
    assert changed is not None
    with pytest.raises(TuningError, match="not the file its tuning records"):
        apply_tuning(base, changed, tmp_path / "tuned")
    assert not (tmp_path / "tuned").exists()


def test_a_tuning_over_another_base_is_refused(base: Path, tmp_path: Path) -> None:
    (tuning,) = shipped_tunings()
    other = replace(tuning, base_digest="0" * 64)
    with pytest.raises(TuningError, match="is not the model all-MiniLM-L6-v2-tools was trained over"):
        apply_tuning(base, other, tmp_path / "tuned")


def test_a_tuned_folder_whose_weights_changed_is_made_again(
    base: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = _models(base, tmp_path / "models")
    (tuned,) = prepare_tuned_models(models, export=False)
    (tuning,) = shipped_tunings()
    _tamper(tuned / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="commands.retrieval.model"):
        assert prepare_tuned_models(models, export=False) == [tuned]
    assert file_sha256(tuned / "model.safetensors") == tuning.weights_sha256
    assert "making" in caplog.text and "again" in caplog.text
    assert [p.name for p in models.iterdir() if p.name.startswith(".")] == []


def test_changes_are_added_in_exactly_and_a_change_that_does_not_fit_is_refused() -> None:
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((5, 4)).astype(np.float32)
    up, down = rng.standard_normal((5, 2)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    merged = merged_weights({"w": weight, "b": weight[0]}, {"w.up": up, "w.down": down})
    # in float64, rank by rank, rounded once: the order every machine takes
    total = weight.astype(np.float64)
    for rank in range(2):
        total = total + np.outer(up[:, rank].astype(np.float64), down[rank].astype(np.float64))
    assert np.array_equal(merged["w"], total.astype(np.float32))
    assert np.array_equal(merged["b"], weight[0])  # a tensor without a change stays as it is
    with pytest.raises(TuningError, match="does not fit a weight of shape"):
        merged_weights({"w": weight}, {"w.up": up.T.copy(), "w.down": down})
    with pytest.raises(TuningError, match="lacks its up or down half"):
        merged_weights({"w": weight}, {"w.up": up})


def test_a_merge_share_adds_that_share_of_each_change_and_none_leaves_the_weights_as_they_were() -> None:
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((6, 3)).astype(np.float32)
    up, down = rng.standard_normal((6, 2)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    changes = {"w.up": up, "w.down": down}
    share = merged_weights({"w": weight}, changes, merge=0.75)["w"]
    total = weight.astype(np.float64)
    for rank in range(2):  # the share taken of each up half, then added rank by rank, as every CPU does
        total = total + np.outer(up[:, rank].astype(np.float64) * 0.75, down[rank].astype(np.float64))
    assert np.array_equal(share, total.astype(np.float32))
    whole = merged_weights({"w": weight}, changes)["w"]
    assert not np.array_equal(share, whole)
    assert np.allclose(share - weight, 0.75 * (whole - weight), atol=1e-5)
    assert np.array_equal(merged_weights({"w": weight}, changes, merge=0.0)["w"], weight)


def test_each_model_brings_its_own_bands(base: Path, tmp_path: Path) -> None:
    (tuning,) = shipped_tunings()
    assert model_bands(base) == UNTRAINED_BANDS
    assert tuning.folder is not None
    assert model_bands(tuning.folder) == Bands(**tuning.bands)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / TUNING).write_text('{"format": 1, "name": "x"}')
    with pytest.raises(TuningError, match="is not a tuning"):
        model_bands(broken)


def test_train_refuses_settings_that_train_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "train", "--steps", "0"]) == 2
    assert "--steps, --rank and --threads must be at least 1" in capsys.readouterr().err
    for share in ("0", "1.5"):
        assert main(["model", "train", "--merge", share]) == 2
        assert "--merge is a share of the change: above 0, at most 1" in capsys.readouterr().err


def test_keeping_the_changes_keeps_their_training_settings_and_refuses_changes_not_recorded(
    tmp_path: Path,
) -> None:
    (tuning,) = shipped_tunings()
    assert tuning.folder is not None
    kept = kept_settings(tuning.folder, 0.5)
    recorded = tuning.training["settings"]
    assert (kept.seed, kept.steps, kept.rank, kept.learning_rate) == (
        recorded["seed"],
        recorded["steps"],
        recorded["rank"],
        recorded["learning_rate"],
    )
    assert kept.merge == 0.5
    copy = tmp_path / TUNED_MODEL_NAME
    shutil.copytree(tuning.folder, copy)
    _tamper(copy / "low_rank.safetensors")
    with pytest.raises(TuningError, match="is not the file its tuning records"):
        kept_settings(copy, 0.5)
    with pytest.raises(TuningError, match="holds no tuning whose changes could be kept"):
        kept_settings(tmp_path / "nothing", 0.5)
