"""A model folder's files: its digest, and the ONNX export kept beside the weights with its manifest.

The export lives in `<model folder>/onnx/` (where sentence-transformers keeps its own ONNX files):
`model.onnx` (fp32), optionally `model_qint8.onnx` (int8), and `manifest.json`, which records each
file's sha256 and size and the digest of the folder the export was made from. Loading checks both,
so an export that was edited, truncated or made from other weights is refused rather than served.
Nothing here imports torch or onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from indexer.embedder.base import EmbedderError

WEIGHTS = "model.safetensors"  # a model folder's weights
EXPORT_DIR = "onnx"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
Variant = Literal["fp32", "int8"]
VARIANT_FILES: dict[Variant, str] = {"fp32": "model.onnx", "int8": "model_qint8.onnx"}
# where an export is made before one rename puts it in place, and where the one it replaces waits
# to be removed: hidden, so neither counts in the folder's digest
EXPORT_STAGING_PREFIX = f".{EXPORT_DIR}.tmp-"
EXPORT_OLD_PREFIX = f".{EXPORT_DIR}.old-"


class ExportError(EmbedderError):
    """Raised when a model folder's ONNX export is missing, changed, stale or cannot be read."""


class StaleExportError(ExportError):
    """Raised when an intact export no longer fits its folder: other weights, or an older format.

    Unlike a changed file, this is what exporting again fixes, so `toolsearch model prepare` does.
    """


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's contents, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def folder_digest(folder: Path) -> str:
    """A sha256 over every file of a model folder (weights, tokenizer, configuration).

    Each file contributes its relative path, size and contents, so renaming, swapping or editing any
    file that shapes the vectors changes the digest. Hidden entries and the ONNX export are left
    out: the export is derived from the rest, and adding it must not change what the rest is.
    """
    digest = hashlib.sha256()
    files = sorted(
        path for path in folder.rglob("*") if path.is_file() and _counted(path.relative_to(folder).parts)
    )
    for path in files:
        relative = path.relative_to(folder).as_posix().encode()
        digest.update(len(relative).to_bytes(8, "little") + relative)
        digest.update(path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def _counted(parts: tuple[str, ...]) -> bool:
    return parts[0] != EXPORT_DIR and not any(part.startswith(".") for part in parts)


@dataclass(frozen=True)
class ExportFile:
    """One file of the export as the manifest records it."""

    name: str  # relative to the export folder
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """What `onnx/manifest.json` says about an export."""

    source_digest: str  # folder_digest of the model folder the export was made from
    inputs: tuple[str, ...]  # the graph's inputs, in the tokenizer's names
    output: str  # the token embeddings: (batch, tokens, dimension)
    files: dict[Variant, ExportFile]
    checks: dict[str, Any]  # what the export was checked against when it was made
    made_with: dict[str, str]  # library versions, for the record

    def to_json(self) -> dict[str, Any]:
        """The manifest as written to disk."""
        return {
            "format": MANIFEST_FORMAT,
            "source_digest": self.source_digest,
            "inputs": list(self.inputs),
            "output": self.output,
            "files": {
                variant: {"name": f.name, "sha256": f.sha256, "size": f.size}
                for variant, f in self.files.items()
            },
            "checks": self.checks,
            "made_with": self.made_with,
        }


def export_dir(model_dir: Path) -> Path:
    """Where a model folder's ONNX export lives."""
    return model_dir / EXPORT_DIR


def read_manifest(folder: Path, shown_as: str | None = None) -> Manifest:
    """Read an export folder's manifest; raises ExportError naming what is missing or malformed."""
    path = folder / MANIFEST
    where = shown_as or str(folder)
    if not folder.is_dir():
        raise ExportError(
            f"no ONNX export in {where} (no {EXPORT_DIR}/ folder): run `toolsearch model prepare` "
            "to make one, or set indexer.embedder: torch"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(
            f"{folder} has no {MANIFEST}, so it was not made by `toolsearch model prepare` and cannot be "
            f"checked: remove {folder} and run `toolsearch model prepare`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(
            f"cannot read {path} ({exc}): remove {folder} and run `toolsearch model prepare`"
        ) from None
    return parse_manifest(raw, path)


def parse_manifest(raw: Any, path: Path) -> Manifest:
    """A manifest from its JSON form, read from `path`; raises ExportError naming what is malformed."""
    try:
        if raw["format"] != MANIFEST_FORMAT:
            raise StaleExportError(
                f"{path} is in format {raw['format']!r}, this version reads {MANIFEST_FORMAT}: "
                "run `toolsearch model prepare` to export again"
            )
        files: dict[Variant, ExportFile] = {}
        for variant, entry in raw["files"].items():
            if variant not in VARIANT_FILES:
                raise ExportError(f"{path} names an unknown variant {variant!r}")
            files[variant] = ExportFile(str(entry["name"]), str(entry["sha256"]), int(entry["size"]))
        return Manifest(
            source_digest=str(raw["source_digest"]),
            inputs=tuple(str(name) for name in raw["inputs"]),
            output=str(raw["output"]),
            files=files,
            checks=dict(raw.get("checks", {})),
            made_with={str(k): str(v) for k, v in raw.get("made_with", {}).items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExportError(f"{path} is not an export manifest ({type(exc).__name__}: {exc})") from None


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write `manifest.json` into an export folder and flush it to disk."""
    path = folder / MANIFEST
    with path.open("w", encoding="utf-8") as handle:
        json.dump(manifest.to_json(), handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def verify_export(
    model_dir: Path,
    variant: Variant = "fp32",
    source_digest: str | None = None,
    folder: Path | None = None,
) -> tuple[Path, Manifest]:
    """Check the export of `variant` in `model_dir`; returns its file and the manifest.

    The file must have the size and sha256 its manifest records, and the manifest's source digest must
    be the folder's (`source_digest`, computed when not given). `folder` is the export's folder when
    it is not yet in place (default `export_dir(model_dir)`). Raises ExportError naming the file, what
    was found and what to do.
    """
    folder = folder if folder is not None else export_dir(model_dir)
    manifest = read_manifest(folder, str(model_dir))
    entry = manifest.files.get(variant)
    if entry is None:
        flag = " --int8" if variant == "int8" else ""
        raise StaleExportError(
            f"the ONNX export in {model_dir} has no {variant} model: run `toolsearch model prepare{flag}` "
            "to export again"
        )
    path = folder / entry.name
    if Path(entry.name).name != entry.name or not path.is_file():
        raise ExportError(f"{folder / entry.name} is missing: run `toolsearch model prepare` to export again")
    actual = file_sha256(path)
    if path.stat().st_size != entry.size or actual != entry.sha256:
        raise ExportError(
            f"{path} has sha256 {actual}, its manifest records {entry.sha256}: the export was "
            f"changed after it was made; refusing it (remove {folder} and run "
            "`toolsearch model prepare` to export again)"
        )
    current = source_digest if source_digest is not None else folder_digest(model_dir)
    if manifest.source_digest != current:
        raise StaleExportError(
            f"the ONNX export in {model_dir} was made from other files than the folder holds now "
            f"(digest {manifest.source_digest[:16]}, the folder's {current[:16]}): run "
            "`toolsearch model prepare` to export again"
        )
    return path, manifest


def export_staging(model_dir: Path) -> Path:
    """A new hidden folder in `model_dir` to make an export in, after removing what a killed run left.

    The caller holds the folder's lock (`toolsearch model prepare` takes it), so no other run is
    making one there.
    """
    for leftover in [*model_dir.glob(f"{EXPORT_STAGING_PREFIX}*"), *model_dir.glob(f"{EXPORT_OLD_PREFIX}*")]:
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=EXPORT_STAGING_PREFIX, dir=model_dir))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the export from a service's own user
    return staging


def sync_folder(folder: Path) -> None:
    """Every file of `folder` on disk before a rename publishes it."""
    for path in folder.iterdir():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())


def swap_into_place(staging: Path, target: Path, old_prefix: str) -> None:
    """Put the folder `staging` where `target` is, in one rename, and make the rename durable.

    A rename cannot replace a folder that is not empty, so an old `target` is first moved aside into
    a temporary folder named with `old_prefix` beside it (a stray file or link there is removed);
    a crash between the two renames leaves that folder, which the caller's clean-up recognises.
    """
    if target.exists() or target.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=old_prefix, dir=target.parent))
        if target.is_dir() and not target.is_symlink():
            os.replace(target, old / target.name)
        else:
            target.unlink()
        os.rename(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, target)
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
