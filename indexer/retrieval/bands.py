"""How strong a match is: the bands a tool's similarity to the request falls in, per model.

A hit's `match` is its best cosine with the request (`indexer.retrieval.search.Hit`). Where it
turns from weak to possible and from possible to strong depends on the model that made the vectors,
so each model brings its bands: a tuned model folder records them in its `tuning.json`
(`indexer.embedder.tuning`, calibrated by `toolsearch model train`); all-MiniLM-L6-v2 as published
has `UNTRAINED_BANDS`, measured the same way. docs/retrieval.md, "How strong a match is".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from indexer.embedder.tuning import read_tuning, shipped_tunings
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME


@dataclass(frozen=True, slots=True)
class Bands:
    """Where `Hit.match` turns from weak to possible and from possible to strong.

    Calibrated per model on the training corpus's check part (`commands.retrieval.corpus.calibrate_bands`):
    `strong` is the similarity the best tool of a catalog that cannot serve the request (another
    source's tools) reaches for one request in twenty; `possible` the one a tenth of the right tools
    fall under.
    """

    strong: float
    possible: float


# all-MiniLM-L6-v2's own vectors, calibrated as a tuning's are; also what a model without bands gets
UNTRAINED_BANDS = Bands(strong=0.496, possible=0.237)


def model_bands(model_dir: Path) -> Bands:
    """The bands of the model in `model_dir`: its tuning's, or `UNTRAINED_BANDS` when it has none.

    Raises `indexer.embedder.tuning.TuningError` when the folder's tuning.json cannot be read.
    """
    tuning = read_tuning(model_dir)
    if tuning is None:
        return UNTRAINED_BANDS
    return Bands(strong=tuning.bands["strong"], possible=tuning.bands["possible"])


def named_model_bands(name: str) -> Bands | None:
    """The bands of a model known by its name (a server's name for what it serves, or a folder's):
    a tuning shipped with the project, or all-MiniLM-L6-v2 as published; None for any other."""
    base = name.rstrip("/").rpartition("/")[2]
    for tuning in shipped_tunings():
        if base == tuning.name:
            return Bands(strong=tuning.bands["strong"], possible=tuning.bands["possible"])
    return UNTRAINED_BANDS if base == BASE_MODEL_NAME else None


def match_band(match: float, bands: Bands = UNTRAINED_BANDS) -> str:
    """A `Hit.match` as a word a model can act on: strong, possible or weak."""
    if match >= bands.strong:
        return "strong"
    return "possible" if match >= bands.possible else "weak"
