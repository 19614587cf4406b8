"""How well a tool fits a need: the features the second stage reads of a pair, and the model that scores them.

The first stage asks how far a tool stands out from the rest of the catalog; a catalog that cannot
serve the request still has a best tool, and that tool still stands out. Whether it fits is a
question about the pair: four features of it (`pair_features`), none of which depends on how the
rest of the catalog ranks, so a fit means the same over 14 tools and over 2,000:

- the need's cosine with the tool's closest view (the first stage's `Hit.match` for that need);
- the whole query's best cosine with the tool (a task's need read in its context);
- the share of the need's words (`lexical_tokens`) the tool's text holds;
- the share of the need's words any tool of the catalog holds: a request for a care plan over a
  catalog where no tool says "care" or "plan" is not served by the closest tool, whatever it is.

`FitModel` scores them with a small network (one hidden layer) trained on the public training
corpus to tell a request's right tools from what the first stage offers beside them, without them
and over catalogs that cannot serve it (`toolsearch model train --stage second-stage`), and turns
the score into the chance the tool serves the need (Platt scaling on the corpus's check part). It
runs in numpy: microseconds for an answer's candidates. Richer features were measured and dropped:
the elementwise product of the two vectors (384 more) fitted the corpus better and carried worse
to the shipped sets' tune splits (docs/retrieval.md, "The second stage").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, SearchIndex
from indexer.retrieval.text import lexical_tokens

FloatArray = npt.NDArray[np.float32]
FEATURES = 4  # cosine, the whole query's cosine, the need's words the tool holds, and the catalog holds
WEIGHTS = ("hidden.weight", "hidden.bias", "out.weight", "out.bias")


def pair_features(index: SearchIndex, query: Query, hits: Sequence[Hit]) -> FloatArray:
    """One row of `FEATURES` per hit (the module's docstring), each read beside its need (`Hit.need`)."""
    out = np.zeros((len(hits), FEATURES), dtype=np.float32)
    whole = np.asarray(query.needs[0].vector, dtype=np.float32)
    words: dict[int, set[str]] = {}
    known: dict[int, float] = {}
    for row, hit in enumerate(hits):
        need = np.asarray(query.needs[hit.need].vector, dtype=np.float32)
        views = index.views(hit.position)
        cosines = views @ need
        if hit.need not in words:
            words[hit.need] = wanted = set(lexical_tokens([query.needs[hit.need].text]))
            known[hit.need] = index.known(wanted) / len(wanted) if wanted else 0.0
        wanted = words[hit.need]
        held = len(wanted.intersection(index.terms(hit.position))) / len(wanted) if wanted else 0.0
        out[row] = (float(cosines.max()), float((views @ whole).max()), held, known[hit.need])
    return out


@dataclass(frozen=True, slots=True)
class Calibration:
    """A score as the chance the tool serves the need: Platt scaling, `sigmoid(scale * score + shift)`."""

    scale: float
    shift: float

    def chance(self, scores: FloatArray) -> FloatArray:
        exponent = np.clip(-(self.scale * scores.astype(np.float64) + self.shift), -60.0, 60.0)
        chances: FloatArray = (1.0 / (1.0 + np.exp(exponent))).astype(np.float32)
        return chances


@dataclass(frozen=True, eq=False)
class FitModel:
    """The network over `pair_features`: features -> ReLU(hidden) -> one score; and its calibration."""

    hidden_weight: FloatArray  # (hidden, features)
    hidden_bias: FloatArray  # (hidden,)
    out_weight: FloatArray  # (hidden,)
    out_bias: float
    calibration: Calibration

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, npt.NDArray[np.floating]], calibration: Calibration
    ) -> FitModel:
        """From the four tensors a stage's weights file holds (`WEIGHTS`); raises ValueError if they do
        not fit together."""
        hidden_weight = np.asarray(tensors["hidden.weight"], dtype=np.float32)
        hidden_bias = np.asarray(tensors["hidden.bias"], dtype=np.float32).reshape(-1)
        out_weight = np.asarray(tensors["out.weight"], dtype=np.float32).reshape(-1)
        out_bias = np.asarray(tensors["out.bias"], dtype=np.float32).reshape(-1)
        size = hidden_weight.shape[0] if hidden_weight.ndim == 2 else -1
        if size < 1 or hidden_bias.shape != (size,) or out_weight.shape != (size,) or out_bias.shape != (1,):
            raise ValueError("the weights do not make a network of one hidden layer")
        return cls(hidden_weight, hidden_bias, out_weight, float(out_bias[0]), calibration)

    def tensors(self) -> dict[str, npt.NDArray[np.float32]]:
        return {
            "hidden.weight": self.hidden_weight,
            "hidden.bias": self.hidden_bias,
            "out.weight": self.out_weight.reshape(1, -1),
            "out.bias": np.asarray([self.out_bias], dtype=np.float32),
        }

    @property
    def features(self) -> int:
        return int(self.hidden_weight.shape[1])

    def scores(self, features: FloatArray) -> FloatArray:
        """The raw score of each row of `features`."""
        if features.shape[1] != self.features:
            raise ValueError(f"{features.shape[1]} features for a model of {self.features}")
        hidden = np.maximum(features @ self.hidden_weight.T + self.hidden_bias, 0.0)
        scores: FloatArray = (hidden @ self.out_weight + np.float32(self.out_bias)).astype(np.float32)
        return scores
