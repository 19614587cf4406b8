"""A tuning: what `toolsearch model train` learned over a base model, kept as low-rank changes.

Fine-tuning all-MiniLM-L6-v2 whole would change all 90 MB of its weights; the training learns a
low-rank change per linear layer instead (LoRA: W + up @ down, rank 16), 2.7 MB in all, which ships
in `tunings/<name>/`: `low_rank.safetensors` (each layer's `<weight>.up` and `<weight>.down`) and
`tuning.json` (the base folder's digest, the sha256 of both files this makes, the match bands
calibrated for the tuned vectors, how it was trained and what that bought on the corpus's check part).

`apply_tuning` makes the tuned model folder from the base one: the base's files, and weights with
each change added in, scaled by the tuning's `merge` share (weight-space ensembling: the served
weights lie that share of the way from the published model's to the fine-tuned ones, which keeps
more of what the published model knows of text nobody trained on; docs/retrieval.md). The sum is
taken in float64 one rank at a time with numpy's elementwise operations, each rounded as IEEE 754
says, then rounded once to float32: no BLAS kernel, whose summation order varies with the CPU,
decides a bit, so every machine makes the same bytes, and they are checked against the recorded
sha256. The folder also holds `tuning.json`, so it says what it is and which bands fit its vectors
(`read_tuning`); its ONNX export then comes from the shipped recipe for its digest
(`indexer.embedder.recipe`), without torch.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from indexer.embedder.files import (
    EXPORT_DIR,
    WEIGHTS,
    ExportError,
    file_sha256,
    folder_digest,
    swap_into_place,
)

TUNINGS = Path(__file__).with_name("tunings")
TUNING = "tuning.json"
LOW_RANK = "low_rank.safetensors"
TUNING_FORMAT = 1
# hidden folders a tuned folder is made in and its predecessor waits in, as `commands.retrieval.model`
# clears them
TEMP_PREFIX = ".tuned.tmp-"
OLD_PREFIX = ".tuned.old-"


class TuningError(ExportError):
    """Raised when a tuning cannot be read, does not fit its base, or does not make its recorded bytes."""


@dataclass(frozen=True)
class TrainSettings:
    """How the low-rank changes are trained; recorded in the tuning."""

    seed: int = 13
    steps: int = 150
    batch: int = 32
    learning_rate: float = 5e-4
    rank: int = 16
    max_tokens: int = 64  # the training window; the tuned model serves with the base's own
    scale: float = 20.0  # cosine times this is the logit
    threads: int = 2
    merge: float = 0.75  # the share of the learned change merged into the published weights

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Tuning:
    """A tuning as `tuning.json` records it."""

    name: str  # the tuned model folder's name
    base_name: str
    base_digest: str  # `folder_digest` of the base folder it was trained over
    low_rank_sha256: str
    weights_sha256: str  # of the tuned folder's model.safetensors
    bands: dict[str, float]  # "strong" and "possible": `indexer.retrieval.search.Bands`
    training: dict[str, Any] = field(default_factory=dict)
    merge: float = 1.0  # the share of the low-rank change added to the base weights
    folder: Path | None = None  # where it was read from; None for one being written

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TUNING_FORMAT,
            "name": self.name,
            "base_name": self.base_name,
            "base_digest": self.base_digest,
            "low_rank_sha256": self.low_rank_sha256,
            "weights_sha256": self.weights_sha256,
            "merge": self.merge,
            "bands": self.bands,
            "training": self.training,
        }


def read_tuning(folder: Path) -> Tuning | None:
    """The tuning in `folder` (a shipped one, or a tuned model folder); None when it holds none."""
    path = folder / TUNING
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw["format"] != TUNING_FORMAT:
            raise TuningError(f"{path} is in format {raw['format']!r}, this version reads {TUNING_FORMAT}")
        bands = {key: float(raw["bands"][key]) for key in ("strong", "possible")}
        return Tuning(
            name=str(raw["name"]),
            base_name=str(raw["base_name"]),
            base_digest=str(raw["base_digest"]),
            low_rank_sha256=str(raw["low_rank_sha256"]),
            weights_sha256=str(raw["weights_sha256"]),
            bands=bands,
            training=dict(raw.get("training", {})),
            merge=float(raw.get("merge", 1.0)),
            folder=folder,
        )
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TuningError(f"cannot read {path} ({exc}): reinstall toolsearch") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise TuningError(f"{path} is not a tuning ({type(exc).__name__}: {exc})") from None


def shipped_tunings(root: Path = TUNINGS) -> list[Tuning]:
    """Every tuning shipped with the package, by name."""
    found = (read_tuning(path.parent) for path in sorted(root.glob(f"*/{TUNING}")))
    return [tuning for tuning in found if tuning is not None]


def merged_weights(base: dict[str, Any], low_rank: dict[str, Any], merge: float = 1.0) -> dict[str, Any]:
    """`base`'s tensors with each low-rank change added in, `merge` times it, as float32, the same
    bits on every CPU."""
    import numpy as np

    merged = dict(base)
    for name in sorted({key.rsplit(".", 1)[0] for key in low_rank}):
        up, down = low_rank.get(f"{name}.up"), low_rank.get(f"{name}.down")
        weight = base.get(name)
        if up is None or down is None or weight is None:
            raise TuningError(f"the low-rank change {name!r} lacks its up or down half, or names no weight")
        if up.shape != (weight.shape[0], down.shape[0]) or down.shape[1] != weight.shape[1]:
            raise TuningError(f"the low-rank change {name!r} does not fit a weight of shape {weight.shape}")
        total = weight.astype(np.float64)
        up64, down64 = up.astype(np.float64) * merge, down.astype(np.float64)
        for rank in range(down.shape[0]):  # elementwise, rank by rank: no BLAS summation order
            total = total + np.multiply.outer(up64[:, rank], down64[rank])
        merged[name] = total.astype(np.float32)
    return merged


def write_tuned_files(base_dir: Path, low_rank_path: Path, folder: Path, merge: float = 1.0) -> str:
    """Write the base's files into `folder`, its weights with the changes in `low_rank_path` added in
    (`merge` times each).

    Returns the sha256 of the weights written. The caller checks both inputs.
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    for path in sorted(base_dir.iterdir()):
        if path.name == EXPORT_DIR or path.name.startswith(".") or path.name in (WEIGHTS, TUNING):
            continue
        copy = shutil.copytree if path.is_dir() else shutil.copy2
        copy(path, folder / path.name)
    with safe_open(str(base_dir / WEIGHTS), framework="numpy") as handle:
        metadata = handle.metadata()
    merged = merged_weights(load_file(str(base_dir / WEIGHTS)), load_file(str(low_rank_path)), merge)
    save_file(merged, str(folder / WEIGHTS), metadata=metadata)
    (folder / WEIGHTS).chmod(0o644)  # safetensors writes 0600, which would hide it from a service's user
    return file_sha256(folder / WEIGHTS)


def apply_tuning(base_dir: Path, tuning: Tuning, target: Path) -> Path:
    """Make the tuned folder `target` from `base_dir` (already verified) and `tuning`; returns it.

    Raises TuningError when the base is not the one the tuning was trained over, the low-rank file
    is not the recorded one, or the result's weights are not the recorded bytes; nothing is left in
    place then. The caller holds the models folder's lock.
    """
    if tuning.folder is None:
        raise TuningError(f"the tuning {tuning.name} was not read from a folder")
    if (digest := folder_digest(base_dir)) != tuning.base_digest:
        raise TuningError(
            f"{base_dir} (digest {digest[:12]}) is not the model {tuning.name} was trained over "
            f"({tuning.base_digest[:12]}): run `toolsearch model prepare` to restore it"
        )
    low_rank_path = tuning.folder / LOW_RANK
    if not low_rank_path.is_file() or file_sha256(low_rank_path) != tuning.low_rank_sha256:
        raise TuningError(
            f"{low_rank_path} is missing or not the file its tuning records: reinstall toolsearch"
        )
    staging = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=target.parent))
    try:
        staging.chmod(0o755)
        made = write_tuned_files(base_dir, low_rank_path, staging, tuning.merge)
        if made != tuning.weights_sha256:
            raise TuningError(
                f"the tuning {tuning.name} made weights of sha256 {made}, not the recorded "
                f"{tuning.weights_sha256}: refusing them"
            )
        shutil.copy2(tuning.folder / TUNING, staging / TUNING)
        swap_into_place(staging, target, OLD_PREFIX)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise TuningError(f"cannot make {target}: {exc}") from exc
        raise
    return target
