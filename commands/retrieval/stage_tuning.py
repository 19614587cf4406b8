"""`toolsearch model train --stage second-stage`: the second stage mined, trained, calibrated and written.

The steps: embed the chosen corpus requests and every corpus tool with the model the stage will read
(the served one by default), mine the first stage's candidates (`commands.retrieval.stage_mining`),
train the fit model on the train part (`commands.retrieval.stage_training`), calibrate it and cut
its bands on the check part, and write `second_stage.safetensors` and `second_stage.json` (the model's
embedder identity, the weights' sha256, calibration, bands, settings, environment and the check
part's figures) into `stages/<model folder>/` of the destination: the shipped folder with
`--replace`, a new one otherwise.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commands.retrieval.destination import environment
from indexer.retrieval.second_stage import STAGE, STAGE_FORMAT, STAGE_WEIGHTS, STAGES, SecondStage, read_stage

_log = logging.getLogger(__name__)


def train_stage(
    model_dir: Path,
    corpus_dir: Path,
    settings: Any,
    stages: Path,
    cache_dir: Path | None,
    say: Callable[[str], None] | None = None,
) -> SecondStage:
    """Train the second stage for `model_dir`'s vectors and write it under `stages`; returns it, read back."""
    from commands.retrieval.corpus import read_corpus
    from commands.retrieval.stage_mining import chosen_pairs, mine
    from commands.retrieval.stage_training import (
        calibrate_bands,
        calibrated,
        check_figures,
        fit_model,
        training_rows,
    )
    from indexer.embedder import load_embedder
    from indexer.retrieval.embeddings import Embeddings
    from indexer.state.disk import disk_embeddings

    tell = say or (lambda line: _log.info("%s", line))
    corpus = read_corpus(corpus_dir)
    embedder = load_embedder("onnx", model_dir, threads=settings.threads)
    store = disk_embeddings(cache_dir, embedder.identity, embedder.dimension)
    chosen = chosen_pairs(corpus, settings.train_per_source, settings.check_per_source)
    tell(f"mining the first stage's candidates of {len(chosen)} requests with {embedder.identity}")
    mined = mine(corpus, Embeddings(embedder, store), settings.seed, chosen)
    features, labels, weights = training_rows(mined)
    tell(f"training on {len(labels)} pairs ({int(labels.sum())} right)")
    model = fit_model(
        features, labels, weights, settings, lambda e, loss: tell(f"epoch {e}: loss {loss:.4f}")
    )
    check = [m for m in mined if m.part == "check" and len(m.positives)]
    model = calibrated(model, check)
    bands = calibrate_bands(model, check, settings.possible)
    record = {
        "format": STAGE_FORMAT,
        "model": model_dir.resolve().name,
        "embedder_identity": embedder.identity,
        "weights_sha256": "",
        "calibration": {"scale": model.calibration.scale, "shift": model.calibration.shift},
        "bands": {"strong": bands.strong, "possible": bands.possible},
        "depth": settings.depth,
        "weight": settings.weight,
        "training": {
            "corpus_sha256": corpus.digest,
            "requests": {"train": sum(m.part == "train" for m in mined), "check": len(check)},
            "settings": settings.to_json(),
            "environment": environment(settings.threads),
            "check": check_figures(model, bands, check, settings.weight),
        },
    }
    folder = stages / model_dir.resolve().name
    write_stage(folder, model.tensors(), record)
    return read_stage(folder)


def write_stage(folder: Path, tensors: dict[str, Any], record: dict[str, Any]) -> None:
    """Write a stage's weights and its record (with the weights' sha256) into `folder`."""
    from safetensors.numpy import save_file

    from indexer.embedder.files import file_sha256

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / STAGE_WEIGHTS))
    (folder / STAGE_WEIGHTS).chmod(0o644)
    record = record | {"weights_sha256": file_sha256(folder / STAGE_WEIGHTS)}
    (folder / STAGE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def shipped_figures(model_name: str) -> dict[str, float]:
    """The check-part figures the shipped second stage of `model_name` records ({} when none ships)."""
    if not (STAGES / model_name / STAGE).is_file():
        return {}
    return dict(read_stage(STAGES / model_name).record["training"]["check"])
