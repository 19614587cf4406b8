"""Training the second stage: the fit model (`indexer.retrieval.fit`) from mined corpus pairs.

Rows are the pairs `commands.retrieval.stage_mining` mines from the corpus's train part: each
request's relevant tools (label 1), and the first stage's other candidates over its own catalog, over
its catalog without its servers, and over another source's catalog (label 0). Each row weighs one
over the square root of its source's size, spread over the request's rows of its label, so the two
sources that hold four fifths of the pairs do not decide alone, and a request counts as much for its
positives as for its negatives. The network (one hidden layer, ReLU) is trained with binary
cross-entropy and Adam in full batches, seeded and with torch's deterministic algorithms; the
features are standardised while training and the standardisation folded into the first layer, so
the model served reads raw features. Then the corpus's check part (never trained on) fits the
calibration (Platt scaling) and the bands, and gives the figures a retrain is compared by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from commands.retrieval.stage_mining import Mined
from indexer.retrieval.bands import Bands
from indexer.retrieval.fit import Calibration, FitModel

FloatArray = npt.NDArray[np.float32]
ANSWER = 8  # candidates of an answer, as find_tool's default limit


@dataclass(frozen=True)
class StageSettings:
    """How the second stage is trained and read; recorded with it."""

    seed: int = 13
    hidden: int = 8
    epochs: int = 300
    learning_rate: float = 3e-3
    weight_decay: float = 1e-3
    threads: int = 2
    train_per_source: int = 150  # requests of each source's train part mined
    check_per_source: int = 100  # and of its check part
    # the chance from which a tool is `possible`, not weak: chosen on the shipped sets' tune splits, the
    # most abstention with every split's false abstention under 10% (docs/retrieval.md, "The second stage")
    possible: float = 0.021
    depth: int = 10  # first-stage candidates read for an answer of up to 10 tools
    weight: float = 0.0  # of the fit score beside the fused one in the answer's order (chosen: none)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def training_rows(mined: Sequence[Mined]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Features, labels and weights of the train part's rows (this module's docstring)."""
    train = [m for m in mined if m.part == "train" and len(m.positives)]
    sizes: dict[str, int] = {}
    for request in train:
        sizes[request.source] = sizes.get(request.source, 0) + 1
    rows, labels, weights = [], [], []
    for request in train:
        share = sizes[request.source] ** -0.5
        negatives = [block for block in (request.negatives, request.absent, request.foreign) if len(block)]
        count = sum(len(block) for block in negatives)
        for block, label, total in (
            (request.positives, 1.0, len(request.positives)),
            *((b, 0.0, count) for b in negatives),
        ):
            rows.append(block)
            labels.append(np.full(len(block), label, dtype=np.float32))
            weights.append(np.full(len(block), share / total, dtype=np.float32))
    weight = np.concatenate(weights)
    return np.concatenate(rows), np.concatenate(labels), weight / weight.mean()


def fit_model(
    features: FloatArray,
    labels: FloatArray,
    weights: FloatArray,
    settings: StageSettings,
    progress: Callable[[int, float], None] | None = None,
) -> FitModel:
    """Train the network on the rows; its calibration is the identity until `fit_calibration`."""
    import torch

    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(settings.seed)
    mean = features.mean(axis=0)
    std = features.std(axis=0) + 1e-6
    x = torch.from_numpy((features - mean) / std)
    y = torch.from_numpy(labels)
    w = torch.from_numpy(weights)
    hidden = torch.nn.Linear(features.shape[1], settings.hidden)
    out = torch.nn.Linear(settings.hidden, 1)
    parameters = [*hidden.parameters(), *out.parameters()]
    optimiser = torch.optim.AdamW(parameters, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    for epoch in range(settings.epochs):
        logits = out(torch.relu(hidden(x))).squeeze(-1)
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none") * w).mean()
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
        if progress is not None and epoch % 25 == 0:
            progress(epoch, float(loss.item()))
    # the standardisation folded into the first layer: (x - mean) / std @ W.T + b
    weight = hidden.weight.detach().numpy().astype(np.float64) / std.astype(np.float64)
    bias = hidden.bias.detach().numpy().astype(np.float64) - weight @ mean.astype(np.float64)
    return FitModel(
        hidden_weight=weight.astype(np.float32),
        hidden_bias=bias.astype(np.float32),
        out_weight=out.weight.detach().numpy().reshape(-1).astype(np.float32),
        out_bias=float(out.bias.detach().numpy().reshape(-1)[0]),
        calibration=Calibration(1.0, 0.0),
    )


def fit_calibration(scores: FloatArray, labels: npt.NDArray[np.bool_]) -> Calibration:
    """Platt scaling: the `scale` and `shift` whose sigmoid best predicts `labels`.

    Newton's method on the log-loss over standardised scores, each step halved until the loss falls,
    so scores far apart (a confident network) converge as well as close ones.
    """
    raw = scores.astype(np.float64)
    mean, spread = float(raw.mean()), float(raw.std()) or 1.0
    x = (raw - mean) / spread
    y = labels.astype(np.float64)

    def loss(a: float, b: float) -> float:
        z = a * x + b
        return float(np.mean(np.logaddexp(0.0, z) - y * z))

    a, b = 1.0, 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(a * x + b, -60, 60)))
        curvature = p * (1 - p) + 1e-9
        gradient = np.array([np.mean((p - y) * x), np.mean(p - y)])
        hessian = np.array(
            [
                [np.mean(curvature * x * x), np.mean(curvature * x)],
                [np.mean(curvature * x), np.mean(curvature)],
            ]
        )
        step = np.linalg.solve(hessian + 1e-9 * np.eye(2), gradient)
        size, before = 1.0, loss(a, b)
        while size > 1e-6 and loss(a - size * step[0], b - size * step[1]) > before:
            size /= 2
        a, b = a - size * step[0], b - size * step[1]
        if np.abs(size * step).max() < 1e-10:
            break
    return Calibration(scale=round(a / spread, 6), shift=round(b - a * mean / spread, 6))


def calibrated(model: FitModel, check: Sequence[Mined]) -> FitModel:
    """`model` with the calibration its scores of the check part's rows fit."""
    rows = [m.positives for m in check] + [m.negatives for m in check] + [m.absent for m in check]
    rows += [m.foreign for m in check]
    labels = [np.ones(len(m.positives), bool) for m in check]
    labels += [np.zeros(len(block), bool) for block in rows[len(check) :]]
    features = np.concatenate([block for block in rows if len(block)])
    truth = np.concatenate([label for label, block in zip(labels, rows, strict=True) if len(block)])
    return FitModel(
        model.hidden_weight,
        model.hidden_bias,
        model.out_weight,
        model.out_bias,
        fit_calibration(model.scores(features), truth),
    )


def best_chance(model: FitModel, block: FloatArray) -> float:
    """The best chance among an answer's candidates (0 for none)."""
    return float(model.calibration.chance(model.scores(block)).max()) if len(block) else 0.0


def calibrate_bands(model: FitModel, check: Sequence[Mined], possible: float) -> Bands:
    """The bands on the chance: `possible` as chosen; `strong` where the best candidate of another
    source's catalog (8 of them) reaches it for one request in twenty of the check part, never below
    `possible`."""
    foreign = [best_chance(model, m.foreign[:ANSWER]) for m in check]
    strong = max(float(np.quantile(foreign, 0.95)), possible)
    return Bands(strong=round(strong, 3), possible=possible)


def check_figures(model: FitModel, bands: Bands, check: Sequence[Mined], weight: float) -> dict[str, float]:
    """The check part's figures, in percent: R@5 of the first stage's order and of the order the
    second stage gives its `PRESENT` candidates; abstention over each request's catalog, over it
    without the request's servers, and over another source's catalog."""
    first, second = [], []
    for m in check:
        order = np.lexsort(
            (np.arange(len(m.present_scores)), -(m.present_scores + weight * model.scores(m.present)))
        )
        first.append(m.present_labels[:5].sum() / m.wanted)
        second.append(m.present_labels[order[:5]].sum() / m.wanted)

    def abstains(blocks: Sequence[FloatArray]) -> float:
        return 100 * float(np.mean([best_chance(model, b[:ANSWER]) < bands.possible for b in blocks]))

    figures = {
        "r_at_5_first_stage": 100 * float(np.mean(first)),
        "r_at_5_second_stage": 100 * float(np.mean(second)),
        "false_abstention": abstains([m.present for m in check]),
        "abstention_without_servers": abstains([m.absent for m in check if len(m.absent)]),
        "abstention_foreign": abstains([m.foreign for m in check]),
    }
    return {key: round(value, 2) for key, value in figures.items()}
