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

from commands.retrieval.destination import (
    TOLERANCE,
    Destination,
    compare_with_shipped,
    destination,
    environment,
)
from indexer.embedder.tuning import LOW_RANK, TUNING, TUNINGS, TrainSettings, Tuning, read_tuning
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
    where: Destination,
    keep_changes: bool = False,
) -> Tuning:
    """Train (or, with `keep_changes`, take the shipped tuning's changes at `settings.merge`), then
    write the tuning, the tuned model folder and its export's recipe where `where` says; returns the
    tuning."""
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
    out = where.tunings / TUNED_MODEL_NAME
    if keep_changes:
        settings = kept_settings(TUNINGS / TUNED_MODEL_NAME, settings.merge)
        if out != TUNINGS / TUNED_MODEL_NAME:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TUNINGS / TUNED_MODEL_NAME / LOW_RANK, out / LOW_RANK)
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
            "environment": environment(settings.threads),
            # the corpus's own check part (never trained on), R@5 against each pair's source
            "check_recall_at_5": {"base": before, "tuned": after},
        },
    )
    (out / TUNING).write_text(json.dumps(tuning.to_json(), indent=2) + "\n", encoding="utf-8")
    shipped = read_tuning(out)
    assert shipped is not None  # written a line above
    tuned_dir = apply_tuning(base_dir, shipped, where.models / TUNED_MODEL_NAME)
    shutil.rmtree(tuned_dir / "onnx", ignore_errors=True)
    export_onnx(tuned_dir)
    write_recipe(tuned_dir, where.recipes / TUNED_MODEL_NAME)
    return shipped


def add_train_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch model train` under `toolsearch model`."""
    defaults = TrainSettings()
    train = actions.add_parser(
        "train",
        help=f"train {TUNED_MODEL_NAME}, or find_tool's second stage, on the public training corpus again "
        "(CPU; needs the model extra)",
        description="Fine-tune the default model on the training corpus (low-rank changes), or train the "
        "second stage (a fit model over the first stage's candidates), and write what ships into a new "
        "folder (--out), or over the shipped files (--replace); then compare what it measures on the "
        "corpus's check part with the shipped one's figures. Deterministic for a given seed, corpus, "
        "thread count, CPU and torch build.",
    )
    train.add_argument(
        "--stage",
        choices=["embedder", "second-stage"],
        default="embedder",
        help=f"what to train: the embedding model {TUNED_MODEL_NAME} (default), or the second stage for "
        "the vectors of --model",
    )
    train.add_argument(
        "--model",
        type=Path,
        help=f"the second stage's model: whose vectors it reads (default: <models-dir>/{TUNED_MODEL_NAME})",
    )
    train.add_argument("--models-dir", type=Path, default=Path("models"), help="default: models/")
    train.add_argument(
        "--corpus",
        type=Path,
        default=TRAIN_DATA,
        help="tools.jsonl and pairs.jsonl (default: the packaged corpus)",
    )
    where = train.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        help="the folder to write tunings/, recipes/ and models/ (the embedder) or stages/ (the second "
        "stage) into (default: a new <models-dir>/trained-<UTC time>/)",
    )
    where.add_argument(
        "--replace",
        action="store_true",
        help="write over the shipped files (and the tuned model folder in --models-dir)",
    )
    train.add_argument("--seed", type=int, default=defaults.seed, help=f"default {defaults.seed}")
    train.add_argument("--steps", type=int, help="the embedder's training steps (default 150)")
    train.add_argument("--rank", type=int, default=defaults.rank, help=f"default {defaults.rank}")
    train.add_argument(
        "--merge",
        type=float,
        default=defaults.merge,
        help=f"the share of the learned change merged into the published weights (default {defaults.merge}; "
        "the embedder only)",
    )
    train.add_argument(
        "--keep-changes",
        action="store_true",
        help="train nothing: merge the shipped tuning's changes again at --merge (its other settings kept)",
    )
    train.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help=f"default {defaults.threads}; the same count gives the same bytes",
    )
    train.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".toolsearch") / "cache",
        help="embedding cache for the corpus's texts (the second stage's mining; default: .toolsearch/cache)",
    )
    train.add_argument("--log", type=Path, help="a file to append the second stage's progress to")


def run_train(args: argparse.Namespace) -> int:
    """Run `toolsearch model train`; returns the exit code (3: trained, but off the shipped figures)."""
    steps = args.steps if args.steps is not None else 1
    if min(steps, args.threads, args.rank) < 1:
        print("toolsearch model train: --steps, --rank and --threads must be at least 1", file=sys.stderr)
        return 2
    if not 0 < args.merge <= 1:
        print("toolsearch model train: --merge is a share of the change: above 0, at most 1", file=sys.stderr)
        return 2
    if args.stage == "second-stage" and args.keep_changes:
        print("toolsearch model train: --keep-changes is for the embedder's merge share", file=sys.stderr)
        return 2
    from commands.retrieval.corpus import CorpusError
    from commands.retrieval.model import ModelError
    from indexer.embedder import EmbedderError

    where = destination(args.models_dir, args.out, args.replace)
    shipped = read_tuning(TUNINGS / TUNED_MODEL_NAME)  # before a replacing run writes over it
    started = time.perf_counter()
    try:
        if args.stage == "second-stage":
            return _run_stage(args, where, started)
        settings = replace(
            TrainSettings(),
            seed=args.seed,
            steps=args.steps or TrainSettings().steps,
            rank=args.rank,
            threads=args.threads,
            merge=args.merge,
        )
        tuning = train_tuning(args.models_dir, args.corpus, settings, where, args.keep_changes)
    except (ModelError, EmbedderError, CorpusError, OSError) as exc:
        print(f"toolsearch model train: {exc}", file=sys.stderr)
        return 1
    check = tuning.training["check_recall_at_5"]
    print(
        f"{tuning.name}: {'merged' if args.keep_changes else 'trained'} in "
        f"{time.perf_counter() - started:.0f} s into {where.tunings.parent}; corpus check part R@5 "
        f"{check['base']} -> {check['tuned']}; bands {tuning.bands}; "
        f"{LOW_RANK} sha256 {tuning.low_rank_sha256}"
    )
    recorded = shipped.training.get("check_recall_at_5", {}) if shipped is not None else {}
    return _compared({"check R@5": check["tuned"]}, {"check R@5": recorded.get("tuned", check["tuned"])})


def _run_stage(args: argparse.Namespace, where: Destination, started: float) -> int:
    from commands.retrieval.model import prepare_default_model, prepare_tuned_models
    from commands.retrieval.stage_training import StageSettings
    from commands.retrieval.stage_tuning import shipped_figures, train_stage
    from indexer.retrieval.second_stage import STAGES

    model = args.model
    if model is None:
        prepare_default_model(args.models_dir)
        prepare_tuned_models(args.models_dir)
        model = args.models_dir / TUNED_MODEL_NAME
    settings = StageSettings(seed=args.seed, threads=args.threads)
    stages = STAGES if where.replaces_shipped else where.tunings.parent / "stages"
    shipped = shipped_figures(model.resolve().name)  # before a replacing run writes over them

    def say(line: str) -> None:
        if args.log is not None:
            with args.log.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    stage = train_stage(model, args.corpus, settings, stages, args.cache_dir, say)
    check = stage.record["training"]["check"]
    print(
        f"second stage for {stage.identity}: trained in {time.perf_counter() - started:.0f} s into "
        f"{stages}; corpus check part {check}; bands {stage.bands}"
    )
    return _compared(check, shipped)


def _compared(made: dict[str, float], shipped: dict[str, float]) -> int:
    """Print how a retrain's check-part figures stand against the shipped tuning's; 3 when off."""
    if not shipped:
        print("nothing ships to compare it with")
        return 0
    off = compare_with_shipped(made, shipped)
    if off:
        print(f"differs from the shipped tuning by more than {TOLERANCE} points: {'; '.join(off)}")
        return 3
    print(f"within {TOLERANCE} points of the shipped tuning's check-part figures")
    return 0
