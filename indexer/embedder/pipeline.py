"""What a sentence-transformers folder says happens between tokens and a sentence vector.

`read_pipeline` reads `modules.json`, the Pooling module's `config.json` and
`sentence_bert_config.json`, the files sentence-transformers builds its model from, so that an
embedder running the transformer elsewhere (ONNX Runtime) truncates, pools and normalises exactly as
sentence-transformers would. Only what can be reproduced exactly is accepted: a Transformer, one
Pooling and an optional Normalize; any other module (Dense, LayerNorm, ...) is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from indexer.embedder.base import EmbedderError

# the pooling modes reproduced here, in sentence-transformers' names
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
# sentence-transformers' older boolean keys, in the order it concatenates their modes
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class Pipeline:
    """Where the transformer's files are, how far it reads, and how its token vectors are pooled."""

    transformer_dir: Path  # the folder holding config.json and tokenizer.json
    max_seq_length: int  # tokens read of one text, special tokens included; the rest is cut
    pooling: tuple[str, ...]  # modes, concatenated in this order
    token_dimension: int  # the transformer's hidden size
    lower_case: bool  # sentence_bert_config's do_lower_case: texts are lower-cased first

    @property
    def dimension(self) -> int:
        """The sentence vector's length: one token dimension per pooling mode."""
        return self.token_dimension * len(self.pooling)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EmbedderError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmbedderError(f"cannot read {path}: {exc}") from None


def read_pipeline(model_dir: Path) -> Pipeline:
    """The pipeline of a sentence-transformers folder; raises EmbedderError naming the file and problem."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        raise EmbedderError(
            f"model directory {model_dir} is not a sentence-transformers model (no modules.json): "
            "run `toolsearch model prepare`, or configure another folder"
        )
    modules = _json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise EmbedderError(f"{modules_file} is not a list of modules")
    kinds = [str(m.get("type", "")) for m in modules]
    known = (_TRANSFORMER, _POOLING, _NORMALIZE)
    if other := [kind for kind in kinds if kind not in known]:
        raise EmbedderError(
            f"{modules_file} has module {other[0]}, which only sentence-transformers itself runs: "
            "set indexer.embedder: torch for this model"
        )
    if kinds[:2] != [_TRANSFORMER, _POOLING] or kinds[2:] not in ([], [_NORMALIZE]):
        raise EmbedderError(
            f"{modules_file} lists {kinds}; the onnx embedder runs a Transformer, a Pooling and an "
            "optional Normalize, in that order: set indexer.embedder: torch for this model"
        )
    transformer_dir = model_dir / str(modules[0].get("path", ""))
    pooling_file = model_dir / str(modules[1].get("path", "")) / "config.json"
    pooling_config = _json(pooling_file)
    modes = _pooling_modes(pooling_config, pooling_file)
    token_dimension = pooling_config.get(
        "embedding_dimension", pooling_config.get("word_embedding_dimension")
    )
    if not isinstance(token_dimension, int) or token_dimension < 1:
        raise EmbedderError(f"{pooling_file} does not say the embedding dimension")
    settings_file = transformer_dir / "sentence_bert_config.json"
    settings = _json(settings_file) if settings_file.is_file() else {}
    max_seq_length = settings.get("max_seq_length")
    if max_seq_length is None:
        max_seq_length = _default_max_length(transformer_dir)
    if not isinstance(max_seq_length, int) or max_seq_length < 2:
        raise EmbedderError(f"{settings_file}: max_seq_length must be a whole number of tokens, at least 2")
    return Pipeline(
        transformer_dir=transformer_dir,
        max_seq_length=max_seq_length,
        pooling=modes,
        token_dimension=token_dimension,
        lower_case=bool(settings.get("do_lower_case", False)),
    )


def _pooling_modes(config: dict[str, Any], path: Path) -> tuple[str, ...]:
    raw = config.get("pooling_mode")
    if raw is None:
        modes = tuple(mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key)) or ("mean",)
    else:
        modes = (raw,) if isinstance(raw, str) else tuple(str(m) for m in raw)
    if unknown := [mode for mode in modes if mode not in POOLING_MODES]:
        raise EmbedderError(
            f"{path}: pooling mode {unknown[0]!r} is not one the onnx embedder reproduces "
            f"({', '.join(POOLING_MODES)}): set indexer.embedder: torch for this model"
        )
    if config.get("include_prompt", True) is False:
        raise EmbedderError(f"{path}: include_prompt false needs prompts, which only the torch embedder runs")
    return modes


def _default_max_length(transformer_dir: Path) -> int:
    """sentence-transformers' fallback without max_seq_length: the tokenizer's and the model's limit."""
    limits = []
    tokenizer_config = transformer_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        value = _json(tokenizer_config).get("model_max_length")
        if isinstance(value, int) and value > 0:
            limits.append(value)
    model_config = transformer_dir / "config.json"
    if model_config.is_file():
        value = _json(model_config).get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            limits.append(value)
    if not limits:
        raise EmbedderError(
            f"{transformer_dir} says neither max_seq_length (sentence_bert_config.json) nor a tokenizer "
            "or model limit"
        )
    return min(limits)


def pool(
    tokens: npt.NDArray[np.float32], mask: npt.NDArray[np.int64], modes: tuple[str, ...]
) -> npt.NDArray[np.float32]:
    """Sentence vectors from token vectors (batch, tokens, dimension), as sentence-transformers pools them.

    Padding (mask 0) never counts: the mean divides by the real token count (at least 1e-9), the
    maximum skips padded positions, and cls takes the first real token.
    """
    weights = mask[..., None].astype(np.float32)
    parts: list[npt.NDArray[np.float32]] = []
    for mode in modes:
        if mode == "cls":
            first = mask.argmax(axis=1)
            parts.append(tokens[np.arange(tokens.shape[0]), first])
        elif mode == "max":
            parts.append(np.where(weights > 0, tokens, -np.inf).max(axis=1).astype(np.float32))
        else:
            total = (tokens * weights).sum(axis=1)
            count = np.maximum(weights.sum(axis=1), 1e-9)
            parts.append(
                (total / (np.sqrt(count) if mode == "mean_sqrt_len_tokens" else count)).astype(np.float32)
            )
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
