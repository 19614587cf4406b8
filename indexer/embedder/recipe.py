"""A recipe for a model folder's ONNX export: the export's bytes less the weights the folder holds.

A torch export of a sentence-transformers folder is one protobuf file whose weights, copied from
`model.safetensors` as they are or transposed, make up all but about 0.5% of its bytes. A recipe
keeps the rest: `graph.bin.gz`, the export's bytes between its weights (449 KB for all-MiniLM-L6-v2,
23 KB compressed),
and `recipe.json`, which says in what order the graph's pieces and the folder's tensors follow each
other, and holds the export's own manifest (its sha256, the digest of the folder it was made from,
how it was checked against sentence-transformers). `install_export` writes the export from a folder
whose digest is the recorded one, with neither torch nor an exporter, and refuses the result unless
its sha256 is the recorded one too: what it installs is, byte for byte, the file `export_onnx` made
and checked. `write_recipe` makes a recipe from such an export; those shipped with the package live
in `recipes/<model name>/`. Nothing here imports torch or onnxruntime.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.embedder.files import (
    EXPORT_OLD_PREFIX,
    WEIGHTS,
    ExportError,
    Manifest,
    export_dir,
    export_staging,
    file_sha256,
    parse_manifest,
    swap_into_place,
    sync_folder,
    verify_export,
    write_manifest,
)

RECIPES = Path(__file__).with_name("recipes")
RECIPE = "recipe.json"
GRAPH = "graph.bin.gz"  # gzip: the graph's bytes shrink twentyfold
RECIPE_FORMAT = 1
# a tensor shorter than this stays in graph.bin: too short to be told apart from the graph's own bytes
_SMALLEST = 1024


@dataclass(frozen=True)
class Piece:
    """The next bytes of the export: `size` bytes of graph.bin, or one tensor of the weights."""

    size: int = 0
    tensor: str = ""
    transposed: bool = False


@dataclass(frozen=True)
class Recipe:
    """A recipe as read from its folder."""

    folder: Path
    manifest: Manifest  # the export's, as `export_onnx` wrote it: its fp32 file only
    graph_sha256: str
    pieces: tuple[Piece, ...]


def find_recipe(source_digest: str, root: Path = RECIPES) -> Recipe | None:
    """The recipe under `root` for a folder of digest `source_digest`; None when none is for it."""
    for path in sorted(root.glob(f"*/{RECIPE}")):
        recipe = read_recipe(path.parent)
        if recipe.manifest.source_digest == source_digest:
            return recipe
    return None


def read_recipe(folder: Path) -> Recipe:
    """Read the recipe in `folder`; raises ExportError naming what is missing or malformed."""
    path = folder / RECIPE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw["format"] != RECIPE_FORMAT:
            raise ExportError(f"{path} is in format {raw['format']!r}, this version reads {RECIPE_FORMAT}")
        pieces = tuple(
            Piece(size=int(piece["graph"]))
            if "graph" in piece
            else Piece(tensor=str(piece["tensor"]), transposed=bool(piece.get("transposed", False)))
            for piece in raw["pieces"]
        )
        return Recipe(folder, parse_manifest(raw["manifest"], path), str(raw["graph_sha256"]), pieces)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"cannot read the recipe {path} ({exc}): reinstall toolsearch") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExportError(f"{path} is not a recipe ({type(exc).__name__}: {exc})") from None


def install_export(model_dir: Path, recipe: Recipe) -> Manifest:
    """Write `model_dir`'s ONNX export from `recipe` into `model_dir/onnx/`; returns its manifest.

    The caller has checked that the folder's digest is the recipe's and holds the folder's lock.
    Raises ExportError when the weights lack a tensor the recipe names or the result's sha256 is not
    the recorded one; nothing is left in place then.
    """
    staging = export_staging(model_dir)
    try:
        expected = recipe.manifest.files["fp32"]
        target = staging / expected.name
        with target.open("wb") as sink:
            for block in _blocks(model_dir, recipe):
                sink.write(block)
        write_manifest(staging, recipe.manifest)
        verify_export(model_dir, "fp32", recipe.manifest.source_digest, folder=staging)
        sync_folder(staging)
        swap_into_place(staging, export_dir(model_dir), EXPORT_OLD_PREFIX)
    except ExportError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExportError(f"the recipe {recipe.folder.name} made no verified export: {exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return recipe.manifest


def _blocks(model_dir: Path, recipe: Recipe) -> Iterator[bytes]:
    """The export's bytes, piece by piece: the graph's from graph.bin, the weights' from the folder."""
    try:
        graph = gzip.decompress((recipe.folder / GRAPH).read_bytes())
    except (OSError, EOFError) as exc:
        raise ExportError(f"cannot read {recipe.folder / GRAPH} ({exc}): reinstall toolsearch") from None
    if hashlib.sha256(graph).hexdigest() != recipe.graph_sha256:
        raise ExportError(f"{recipe.folder / GRAPH} is not the file its recipe records: reinstall toolsearch")
    with _weights(model_dir) as weights:
        names, offset = set(weights.keys()), 0
        for piece in recipe.pieces:
            if not piece.tensor:
                yield graph[offset : offset + piece.size]
                offset += piece.size
                continue
            if piece.tensor not in names:
                raise ExportError(f"{model_dir / WEIGHTS} has no tensor {piece.tensor!r}")
            tensor = weights.get_tensor(piece.tensor)
            yield (tensor.T if piece.transposed else tensor).tobytes()


@contextlib.contextmanager
def _weights(model_dir: Path) -> Iterator[Any]:
    """The folder's weights, read tensor by tensor: safetensors maps the file rather than loading it."""
    path = model_dir / WEIGHTS
    try:
        from safetensors import safe_open
    except ImportError as exc:
        raise ExportError(
            f"installing the ONNX export from its recipe needs safetensors ({exc}): "
            "pip install 'toolsearch[indexer]'"
        ) from exc
    try:
        handle = safe_open(str(path), framework="numpy")
    except Exception as exc:  # safetensors' own error type is not importable by name
        raise ExportError(f"cannot read {path}: {exc}") from exc
    with handle as weights:
        yield weights


def write_recipe(model_dir: Path, out: Path) -> Recipe:
    """Make the recipe of `model_dir`'s verified fp32 export in the folder `out`; returns it.

    Raises ExportError when the export does not verify or the recipe would not make it again.
    """
    import numpy as np
    from safetensors.numpy import load_file

    path, manifest = verify_export(model_dir, "fp32")
    data = path.read_bytes()
    spans: dict[int, Piece] = {}
    for name, tensor in load_file(str(model_dir / WEIGHTS)).items():
        forms = [(False, tensor)] + ([(True, np.ascontiguousarray(tensor.T))] if tensor.ndim == 2 else [])
        for transposed, form in forms:
            needle = form.tobytes()
            start = data.find(needle) if len(needle) >= _SMALLEST else -1
            while start >= 0:
                spans.setdefault(start, Piece(size=len(needle), tensor=name, transposed=transposed))
                start = data.find(needle, start + len(needle))
    graph, pieces, offset = bytearray(), [], 0
    for start in sorted(spans):
        if start < offset:
            raise ExportError(f"two tensors of {model_dir / WEIGHTS} overlap in {path}: no recipe for it")
        graph += data[offset:start]
        pieces += [Piece(size=start - offset)] if start > offset else []
        pieces.append(Piece(tensor=spans[start].tensor, transposed=spans[start].transposed))
        offset = start + spans[start].size
    graph += data[offset:]
    pieces += [Piece(size=len(data) - offset)] if len(data) > offset else []
    recipe_manifest = Manifest(
        manifest.source_digest,
        manifest.inputs,
        manifest.output,
        {"fp32": manifest.files["fp32"]},
        manifest.checks,
        manifest.made_with,
    )
    out.mkdir(parents=True, exist_ok=True)
    # no name nor time in the gzip header, so one export always makes the same file
    (out / GRAPH).write_bytes(gzip.compress(bytes(graph), compresslevel=9, mtime=0))
    recipe = Recipe(out, recipe_manifest, hashlib.sha256(graph).hexdigest(), tuple(pieces))
    made = hashlib.sha256()
    for block in _blocks(model_dir, recipe):
        made.update(block)
    if made.hexdigest() != file_sha256(path):
        raise ExportError(f"the recipe made from {path} does not make it again: no recipe for it")
    head = {"format": RECIPE_FORMAT, "graph_sha256": recipe.graph_sha256}
    head["manifest"] = recipe_manifest.to_json()
    lines = [
        json.dumps(
            {"graph": piece.size}
            if not piece.tensor
            else {"tensor": piece.tensor, **({"transposed": True} if piece.transposed else {})}
        )
        for piece in pieces
    ]
    # one piece a line, so a diff of two recipes reads as the pieces that changed
    text = json.dumps(head, indent=2)[:-2] + ',\n  "pieces": [\n    ' + ",\n    ".join(lines) + "\n  ]\n}\n"
    (out / RECIPE).write_text(text, encoding="utf-8")
    return recipe
