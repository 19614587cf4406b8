"""The second stage: the first stage's best candidates read again, each beside the need it serves,
then ordered and judged.

The first stage (`indexer.retrieval.search`) ranks every tool of a version by how far it stands out
from the rest; this one reads only its best few, each pair of need and tool on its own
(`indexer.retrieval.fit`), and gives each the chance that the tool serves the need. That chance
decides the tool's band (strong, possible or weak), hence whether an answer says nothing fits, and
moves the candidate by `weight` against the others. The two stages stay apart: whatever decides
which tools a search may return (a session's catalog, a caller's allowed set) acts in the first, and
the second reads what the first returned. Without a second stage an answer is banded by the first
stage's cosine (`first_stage`), as before.

A second stage is trained for the vectors of one model, so each ships beside the package for the
model it reads (`stages/<model folder>/`: `second_stage.json`, and `second_stage.safetensors`, its
weights), recording that model's embedder identity; `shipped_stage` finds the one for the served
model. docs/retrieval.md, "The second stage", has how it was trained and chosen.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.embedder.base import EmbedderError
from indexer.retrieval.bands import Bands, match_band
from indexer.retrieval.fit import Calibration, FitModel, pair_features
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, SearchIndex

STAGES = Path(__file__).with_name("stages")
STAGE = "second_stage.json"
STAGE_WEIGHTS = "second_stage.safetensors"
STAGE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Judged:
    """One tool of an answer: its first-stage hit, how well it fits, and that as a band."""

    hit: Hit
    fit: float  # what the band was cut from: the second stage's chance, or the first stage's cosine
    band: str  # strong, possible or weak


def first_stage(hits: Sequence[Hit], bands: Bands) -> list[Judged]:
    """The hits as the first stage ordered them, each banded by its cosine (`Hit.match`)."""
    return [Judged(hit, hit.match, match_band(hit.match, bands)) for hit in hits]


@dataclass(frozen=True, eq=False)
class SecondStage:
    """A trained fit model over the first stage's best `depth` candidates (or `limit`, if more)."""

    model: FitModel
    bands: Bands  # on the chance, not on a cosine
    depth: int
    weight: float  # of the fit score, beside the fused one, in the answer's order
    identity: str  # the embedder identity whose vectors it was trained on
    record: dict[str, Any]  # what second_stage.json says: its training, its figures

    def candidates(self, limit: int) -> int:
        """How many of the first stage's hits `judge` reads for an answer of `limit` tools."""
        return max(limit, self.depth)

    def judge(self, index: SearchIndex, query: Query, hits: Sequence[Hit], limit: int) -> list[Judged]:
        """The best `limit` of `hits` (the first stage's over `index`, best first), reordered and banded.

        Exact names stay first and strong: the caller named the tool. Every other hit read is scored
        beside its need, ordered by its fused score plus `weight` times its fit score (ties keep the
        first stage's order), and banded by the calibrated chance.
        """
        read = list(hits[: self.candidates(limit)])
        ranked: list[tuple[float, int, Judged]] = [
            (float("inf"), i, Judged(hit, 1.0, "strong")) for i, hit in enumerate(read) if hit.exact
        ]
        positions = [i for i, hit in enumerate(read) if not hit.exact]
        if positions:
            scores = self.model.scores(pair_features(index, query, [read[i] for i in positions]))
            chances = self.model.calibration.chance(scores)
            for i, score, chance in zip(positions, scores.tolist(), chances.tolist(), strict=True):
                judged = Judged(read[i], round(chance, 3), match_band(chance, self.bands))
                ranked.append((read[i].score + self.weight * score, i, judged))
        ranked.sort(key=lambda item: (-item[0], item[1]))
        return [item[2] for item in ranked[:limit]]


def read_stage(folder: Path) -> SecondStage:
    """The second stage in `folder`; raises EmbedderError naming what is missing or wrong."""
    from safetensors.numpy import load_file

    from indexer.embedder.files import file_sha256

    path = folder / STAGE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw["format"] != STAGE_FORMAT:
            raise ValueError(f"format {raw['format']!r}, this version reads {STAGE_FORMAT}")
        weights = folder / STAGE_WEIGHTS
        if file_sha256(weights) != raw["weights_sha256"]:
            raise ValueError(f"{weights} is not the file it records: reinstall toolsearch")
        calibration = Calibration(float(raw["calibration"]["scale"]), float(raw["calibration"]["shift"]))
        model = FitModel.from_tensors(load_file(str(weights)), calibration)
        bands = Bands(strong=float(raw["bands"]["strong"]), possible=float(raw["bands"]["possible"]))
        depth = int(raw["depth"])
        if depth < 1:
            raise ValueError("depth must be at least 1")
        return SecondStage(model, bands, depth, float(raw["weight"]), str(raw["embedder_identity"]), raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmbedderError(
            f"cannot read the second stage in {folder} ({exc}): reinstall toolsearch"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise EmbedderError(f"{path} is not a second stage ({type(exc).__name__}: {exc})") from None


def shipped_stage(identity: str, root: Path = STAGES) -> SecondStage | None:
    """The shipped second stage trained on the vectors of the embedder `identity`; None when none is."""
    for path in sorted(root.glob(f"*/{STAGE}")):
        stage = read_stage(path.parent)
        if stage.identity == identity:
            return stage
    return None
