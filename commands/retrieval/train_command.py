"""`toolsearch model train`: the shipped tuning, made again from the corpus (docs/retrieval.md).

Trains the low-rank changes (`commands.retrieval.training`) over the prepared default model, then writes what
ships: the tuning (`indexer/embedder/tunings/<name>/`: the changes, and `tuning.json` with the match
bands calibrated for the tuned vectors on the corpus's check part and the check part's R@5 before
and after), the tuned model folder (`models/<name>/`, made from the tuning as `toolsearch model
prepare` makes it) and the recipe of its ONNX export (`indexer/embedder/recipes/<name>/`), so a
fresh machine prepares it without torch. Nothing of the run's duration goes into a file: the same
corpus, base, settings, thread count and torch build make the same bytes.

`--keep-changes` trains nothing: it merges the tuning's own changes again at `--merge` (its training
settings otherwise kept) and writes the rest as a training would, in minutes instead of a quarter
of an hour, so a merge share can be tried without the training's machine and torch build.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.embedder.recipe import RECIPES
from indexer.embedder.tuning import LOW_RANK, TUNING, TUNINGS, TrainSettings, Tuning
from toolsearch.catalog import TRAIN_DATA
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME, TUNED_MODEL_NAME

if TYPE_CHECKING:
    from commands.retrieval.corpus import Corpus


def _measured(model_dir: Path, corpus: Corpus, threads: int) -> tuple[dict[str, float], float]:
    """The bands calibrated for `model_dir`'s vectors on the corpus, and its check part's R@5."""
    from commands.retrieval.corpus import calibrate_bands, embed_corpus
    from commands.retrieval.training import check_recall
    from indexer.embedder import load_embedder
    from indexer.retrieval.embeddings import Embeddings

    embedder = load_embedder("torch", model_dir, threads=threads)
    vectors = embed_corpus(corpus, Embeddings(embedder, None), embedder.count_tokens, embedder.max_tokens)
    bands = calibrate_bands(vectors)
    return {"strong": bands.strong, "possible": bands.possible}, check_recall(vectors)


def kept_settings(out: Path, merge: float) -> TrainSettings:
    """The settings the tuning in `out` was trained with, merged at `merge`; its changes verified."""
    from indexer.embedder.files import file_sha256
    from indexer.embedder.tuning import TuningError, read_tuning

    tuning = read_tuning(out)
    if tuning is None or not (out / LOW_RANK).is_file():
        raise TuningError(f"{out} holds no tuning whose changes could be kept: train one first")
    if file_sha256(out / LOW_RANK) != tuning.low_rank_sha256:
        raise TuningError(f"{out / LOW_RANK} is not the file its tuning records: reinstall toolsearch")
    recorded = dict(tuning.training.get("settings", {}))
    try:
        return replace(TrainSettings(**recorded), merge=merge)
    except TypeError as exc:
        raise TuningError(
            f"{out / TUNING} records training settings this version cannot read: {exc}"
        ) from None


def train_tuning(
    models_dir: Path,
    corpus_dir: Path,
    settings: TrainSettings,
    tunings: Path = TUNINGS,
    recipes: Path = RECIPES,
    keep_changes: bool = False,
) -> Tuning:
    """Train (or, with `keep_changes`, take the tuning's own changes at `settings.merge`), then write
    the tuning, the tuned model folder and its export's recipe; returns the tuning."""
    from safetensors.numpy import save_file

    from commands.retrieval.corpus import read_corpus
    from commands.retrieval.model import prepare_default_model
    from commands.retrieval.training import fit_low_rank
    from indexer.embedder import load_embedder
    from indexer.embedder.export import export_onnx
    from indexer.embedder.files import file_sha256, folder_digest
    from indexer.embedder.recipe import write_recipe
    from indexer.embedder.tuning import apply_tuning, read_tuning, write_tuned_files

    base_dir = prepare_default_model(models_dir)
    corpus = read_corpus(corpus_dir)
    out = tunings / TUNED_MODEL_NAME
    if keep_changes:
        settings = kept_settings(out, settings.merge)
    else:
        base = load_embedder("onnx", base_dir, threads=settings.threads)
        changes = fit_low_rank(base_dir, corpus, settings, base.count_tokens, base.max_tokens)
        out.mkdir(parents=True, exist_ok=True)
        save_file(changes, str(out / LOW_RANK))
        (out / LOW_RANK).chmod(0o644)
    with tempfile.TemporaryDirectory(prefix=".train-", dir=models_dir) as scratch:
        weights_sha256 = write_tuned_files(base_dir, out / LOW_RANK, Path(scratch), settings.merge)
        bands, after = _measured(Path(scratch), corpus, settings.threads)
    _, before = _measured(base_dir, corpus, settings.threads)
    tuning = Tuning(
        name=TUNED_MODEL_NAME,
        base_name=BASE_MODEL_NAME,
        base_digest=folder_digest(base_dir),
        low_rank_sha256=file_sha256(out / LOW_RANK),
        weights_sha256=weights_sha256,
        bands=bands,
        merge=settings.merge,
        training={
            "corpus_sha256": corpus.digest,
            "settings": settings.to_json(),
            # the corpus's own check part (never trained on), R@5 against each pair's source
            "check_recall_at_5": {"base": before, "tuned": after},
        },
    )
    (out / TUNING).write_text(json.dumps(tuning.to_json(), indent=2) + "\n", encoding="utf-8")
    shipped = read_tuning(out)
    assert shipped is not None  # written a line above
    tuned_dir = apply_tuning(base_dir, shipped, models_dir / TUNED_MODEL_NAME)
    shutil.rmtree(tuned_dir / "onnx", ignore_errors=True)
    export_onnx(tuned_dir)
    write_recipe(tuned_dir, recipes / TUNED_MODEL_NAME)
    return shipped


def add_train_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch model train` under `toolsearch model`."""
    defaults = TrainSettings()
    train = actions.add_parser(
        "train",
        help=f"train {TUNED_MODEL_NAME} on the public training corpus again (CPU, about 25 minutes; "
        "needs the model extra)",
        description="Fine-tune the default model on the training corpus (low-rank changes) and write the "
        "tuning, the tuned model folder and its export's recipe: deterministic for a given seed, corpus, "
        "thread count and torch build.",
    )
    train.add_argument("--models-dir", type=Path, default=Path("models"), help="default: models/")
    train.add_argument(
        "--corpus",
        type=Path,
        default=TRAIN_DATA,
        help="tools.jsonl and pairs.jsonl (default: the packaged corpus)",
    )
    train.add_argument(
        "--tunings", type=Path, default=TUNINGS, help="where the tuning goes (default: the shipped one)"
    )
    train.add_argument(
        "--recipes", type=Path, default=RECIPES, help="where the recipe goes (default: the shipped one)"
    )
    train.add_argument("--seed", type=int, default=defaults.seed, help=f"default {defaults.seed}")
    train.add_argument("--steps", type=int, default=defaults.steps, help=f"default {defaults.steps}")
    train.add_argument("--rank", type=int, default=defaults.rank, help=f"default {defaults.rank}")
    train.add_argument(
        "--merge",
        type=float,
        default=defaults.merge,
        help=f"the share of the learned change merged into the published weights (default {defaults.merge})",
    )
    train.add_argument(
        "--keep-changes",
        action="store_true",
        help="train nothing: merge the tuning's own changes again at --merge (its settings otherwise kept)",
    )
    train.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help=f"default {defaults.threads}; the same count gives the same bytes",
    )


def run_train(args: argparse.Namespace) -> int:
    """Run `toolsearch model train`; returns the exit code."""
    if min(args.steps, args.threads, args.rank) < 1:
        print("toolsearch model train: --steps, --rank and --threads must be at least 1", file=sys.stderr)
        return 2
    if not 0 < args.merge <= 1:
        print("toolsearch model train: --merge is a share of the change: above 0, at most 1", file=sys.stderr)
        return 2
    settings = replace(
        TrainSettings(),
        seed=args.seed,
        steps=args.steps,
        rank=args.rank,
        threads=args.threads,
        merge=args.merge,
    )
    from commands.retrieval.corpus import CorpusError
    from commands.retrieval.model import ModelError
    from indexer.embedder import EmbedderError

    started = time.perf_counter()
    try:
        tuning = train_tuning(
            args.models_dir, args.corpus, settings, args.tunings, args.recipes, args.keep_changes
        )
    except (ModelError, EmbedderError, CorpusError, OSError) as exc:
        print(f"toolsearch model train: {exc}", file=sys.stderr)
        return 1
    check = tuning.training["check_recall_at_5"]
    print(
        f"{tuning.name}: {'merged' if args.keep_changes else 'trained'} in "
        f"{time.perf_counter() - started:.0f} s; corpus check part R@5 "
        f"{check['base']} -> {check['tuned']}; bands {tuning.bands}; "
        f"{LOW_RANK} sha256 {tuning.low_rank_sha256}"
    )
    return 0
