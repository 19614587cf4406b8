"""`toolsearch model train`: fine-tune the default model on the training corpus, as low-rank changes.

Each training pair of the corpus (`commands.retrieval.corpus`; its check part is never trained on) gives one
example per relevant tool: the request as the indexer embeds a whole query, against one of the
tool's views as the indexer embeds them (`indexer.retrieval.text.document_views`, chosen at random
per example), so what is learned is learned over the texts find_tool compares. The loss is the
cross-entropy of each request against every tool of its batch (in-batch negatives, scaled cosine);
a tool of the batch that is the request's own, or shares its name (BFCL defines `multiply` six
times), is no negative and is left out. Examples are drawn in proportion to one over the square
root of their source's size, so the two sources that hold four fifths of the pairs do not decide
alone what is learned.

Only low-rank changes to the encoder's linear layers are trained (`indexer.embedder.tuning`): the
rest of the model stays as it is, and what ships is 2.7 MB. Deterministic: seeded, torch's
deterministic algorithms, a fixed thread count; one machine and torch build make the same bytes.
Needs torch and sentence-transformers (the `model` extra).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from commands.retrieval.corpus import Corpus, CorpusVectors, corpus_part, similarities
from indexer.embedder.tuning import TrainSettings
from indexer.retrieval.text import document_views, query_text


@dataclass(frozen=True)
class Example:
    """One request against one of its relevant tools."""

    query: str
    tool: int  # position in the corpus's tools
    source: str


def training_examples(corpus: Corpus) -> list[Example]:
    """Every (request, relevant tool) of the corpus's train part, in corpus order."""
    return [
        Example(query_text(pair.query), tool, pair.source)
        for pair in corpus.pairs
        if corpus_part(pair.id) == "train"
        for tool in pair.relevant
    ]


def sampling_odds(examples: Sequence[Example]) -> npt.NDArray[np.float64]:
    """Each example's chance to be drawn: one over the square root of its source's size, normalised."""
    sizes: dict[str, int] = {}
    for example in examples:
        sizes[example.source] = sizes.get(example.source, 0) + 1
    odds = np.array([sizes[example.source] ** -0.5 for example in examples], dtype=np.float64)
    total: npt.NDArray[np.float64] = odds / odds.sum()
    return total


class _LowRank:
    """Wraps a torch Linear so its output gains (x @ down.T) @ up.T; up starts at zero."""

    @staticmethod
    def wrap(torch: Any, linear: Any, rank: int, generator: Any) -> Any:
        class LowRankLinear(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.base = linear
                scale = linear.in_features**-0.5
                self.down = torch.nn.Parameter(
                    torch.randn(rank, linear.in_features, generator=generator) * scale
                )
                self.up = torch.nn.Parameter(torch.zeros(linear.out_features, rank))

            def forward(self, x: Any) -> Any:
                return self.base(x) + (x @ self.down.T) @ self.up.T

        return LowRankLinear()


def fit_low_rank(
    base_dir: Path, corpus: Corpus, settings: TrainSettings, count_tokens: Any, max_view_tokens: int
) -> dict[str, npt.NDArray[np.float32]]:
    """Train the low-rank changes over `base_dir`; returns them by `<weight name>.up|.down`."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    chooser = random.Random(settings.seed)

    model = SentenceTransformer(str(base_dir), device="cpu")
    model.max_seq_length = settings.max_tokens
    encoder: Any = model[0].auto_model
    for parameter in model.parameters():
        parameter.requires_grad = False
    wrapped: dict[str, Any] = {}
    for name, module in list(encoder.named_modules()):
        if name.startswith("encoder.") and isinstance(module, torch.nn.Linear):
            parent_name, _, child = name.rpartition(".")
            layer = _LowRank.wrap(torch, module, settings.rank, generator)
            setattr(encoder.get_submodule(parent_name), child, layer)
            wrapped[f"{name}.weight"] = layer
    trained = [p for layer in wrapped.values() for p in (layer.down, layer.up)]
    optimiser = torch.optim.AdamW(trained, lr=settings.learning_rate, weight_decay=0.01)
    warmup = max(1, settings.steps // 10)

    def rate(step: int) -> float:  # linear warm-up, then linear decay to zero
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (settings.steps - step) / max(1, settings.steps - warmup))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, rate)
    examples = training_examples(corpus)
    odds = sampling_odds(examples)
    views = [
        document_views(tool.definition(), corpus.backend(i), count_tokens, max_view_tokens)
        for i, tool in enumerate(corpus.tools)
    ]
    names = [tool.name.lower() for tool in corpus.tools]
    model.train()
    for _ in range(settings.steps):
        batch = [examples[i] for i in rng.choice(len(examples), size=settings.batch, replace=False, p=odds)]
        documents = [chooser.choice(views[example.tool]) for example in batch]
        same = torch.tensor(
            [
                [i != j and names[a.tool] == names[b.tool] for j, b in enumerate(batch)]
                for i, a in enumerate(batch)
            ]
        )
        queries = model(model.tokenize([example.query for example in batch]))["sentence_embedding"]
        tools = model(model.tokenize(documents))["sentence_embedding"]
        logits = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(tools, dim=1).T
        logits = (logits * settings.scale).masked_fill(same, -1e4)
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(batch)))
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
        schedule.step()
    changes: dict[str, npt.NDArray[np.float32]] = {}
    for weight, layer in wrapped.items():
        changes[f"{weight}.up"] = layer.up.detach().numpy().astype(np.float32)
        changes[f"{weight}.down"] = layer.down.detach().numpy().astype(np.float32)
    return changes


def check_recall(vectors: CorpusVectors, k: int = 5) -> float:
    """Mean R@k of the corpus's check pairs, each against its own source's tools, in percent."""
    rows = [i for i, pair in enumerate(vectors.pairs) if corpus_part(pair.id) == "check"]
    similarity = similarities(vectors, rows, vectors.queries)
    owner = np.array(vectors.tool_sources)
    totals = []
    for line, row in enumerate(rows):
        pair = vectors.pairs[row]
        scores = np.where(owner == pair.source, similarity[line], -np.inf)
        best = set(np.argsort(-scores, kind="stable")[:k].tolist())
        totals.append(len(best & set(pair.relevant)) / len(pair.relevant))
    return round(100 * float(np.mean(totals)), 2) if totals else 0.0
