"""The model's ONNX export served by ONNX Runtime on CPU, with the folder's own tokenizer; no torch.

The transformer runs in ONNX Runtime; everything around it is read from the sentence-transformers
folder (`indexer.embedder.pipeline`): the fast tokenizer's `tokenizer.json` (the `tokenizers`
library), truncation at `max_seq_length`, the pooling modes, then L2 normalisation. The fp32 export
gives sentence-transformers' vectors to within 1e-5 (`toolsearch model prepare` checks that before it
installs an export), so it shares the torch embedder's identity, and with it every cached vector.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from indexer.embedder.base import EmbedderError, Vectors, normalise
from indexer.embedder.batching import default_threads, padding_batches
from indexer.embedder.files import ExportError, Variant, folder_digest, verify_export
from indexer.embedder.pipeline import Pipeline, pool, read_pipeline

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

# the tokenizer's output feeding each graph input the export may have
_FEEDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


def identity_of(model_dir: Path, variant: Variant, digest: str, export_sha256: str) -> str:
    """The identity an ONNX embedder of `model_dir` has.

    fp32: the torch embedder's, `sentence-transformers:<folder name>:<first 16 hex of the folder
    digest>`, because its vectors are the same to within 1e-5. int8: its own,
    `onnx-int8:<folder name>:<16 hex over the folder digest and the int8 file's sha256>`.
    """
    name = model_dir.resolve().name
    if variant == "fp32":
        return f"sentence-transformers:{name}:{digest[:16]}"
    combined = hashlib.sha256(f"{digest}\0{export_sha256}".encode()).hexdigest()
    return f"onnx-int8:{name}:{combined[:16]}"


class OnnxEmbedder:
    """Embeds with a model folder's ONNX export (`toolsearch model prepare` makes it) on CPU.

    Loading checks the export against its manifest (size, sha256, the folder digest it was made
    from) and hashes the folder, about half a second for a 90 MB model. Model calls are serialised,
    as two concurrent calls would only compete for the same cores. `threads` is ONNX Runtime's
    intra-op thread count (default `default_threads()`) for every call, a lone query included:
    unlike torch's, a second thread pays for itself there (a one-line request, 1.7 texts: 8.1 ms
    p50 on two threads, 12.2 on one, for 19.9 and 17.9 ms of CPU), so one session serves every
    batch size. Its threads never spin: waiting, they sleep, so a core another process needs is not
    held. Every call runs without a memory arena: an arena keeps the peak of the largest batch for
    good (1.3 GB after 64 texts of 256 tokens) for 3 to 6% faster document chunks. `batch_size` is
    texts per forward pass.
    """

    kind = "onnx"  # what the status says embeds

    def __init__(
        self,
        model_dir: Path,
        variant: Variant = "fp32",
        batch_size: int = 64,
        threads: int | None = None,
        export: Path | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not model_dir.is_dir():
            raise EmbedderError(f"model directory {model_dir} not found: run `toolsearch model prepare`")
        self._pipeline = read_pipeline(model_dir)
        digest = folder_digest(model_dir)
        path, manifest = verify_export(model_dir, variant, digest, folder=export)
        if unknown := [name for name in manifest.inputs if name not in _FEEDS]:
            raise ExportError(f"{path} takes input {unknown[0]!r}, which no tokenizer output feeds")
        self._inputs = manifest.inputs
        self._batch_size = batch_size
        self._threads = max(1, threads if threads is not None else default_threads())
        self._tokenizer, self._counter, self._pad = _tokenizers(self._pipeline)
        self._session = _session(path, self._threads)
        self._lock = threading.Lock()
        self._dimension = self._pipeline.dimension
        self._identity = identity_of(model_dir, variant, digest, manifest.files[variant].sha256)
        self.variant = variant
        self.export = path
        probe = self.embed(["a"])  # a wrong graph fails here, at load, not on the first query
        if probe.shape != (1, self._dimension):
            raise ExportError(
                f"{path} gives vectors of shape {probe.shape[1:]}, the folder says {self._dimension}"
            )

    @property
    def identity(self) -> str:
        """See `identity_of`: shared with the torch embedder for fp32, its own for int8."""
        return self._identity

    @property
    def dimension(self) -> int:
        """The sentence vector's length (384 for all-MiniLM-L6-v2)."""
        return self._dimension

    @property
    def max_tokens(self) -> int:
        """The folder's max_seq_length, special tokens included (256 for all-MiniLM-L6-v2)."""
        return self._pipeline.max_seq_length

    @property
    def threads(self) -> int:
        """ONNX Runtime's intra-op thread count."""
        return self._threads

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed `texts`: (n, dimension) float32, L2-normalised.

        Texts are tokenized (and cut at max_seq_length) first, then go to the model in batches of
        like token count (`padding_batches`), at most `batch_size` each, padded to their longest.
        """
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        array = np.empty((len(texts), self._dimension), dtype=np.float32)
        prepared = [text.lower() for text in texts] if self._pipeline.lower_case else list(texts)
        try:
            with self._lock:
                encodings = self._tokenizer.encode_batch(prepared)
                lengths = [len(encoding.ids) for encoding in encodings]
                for rows in padding_batches(lengths, self._batch_size):
                    feeds, mask = self._feeds([encodings[row] for row in rows])
                    (tokens,) = self._session.run(None, feeds)
                    pooled = pool(np.asarray(tokens, dtype=np.float32), mask, self._pipeline.pooling)
                    array[rows] = normalise(pooled)
        except EmbedderError:
            raise
        except Exception as exc:
            raise EmbedderError(f"embedding {len(texts)} texts failed: {exc}") from exc
        return array

    def _feeds(self, encodings: Sequence[Encoding]) -> tuple[dict[str, Any], npt.NDArray[np.int64]]:
        """The graph's inputs for one batch, right-padded to its longest text, and its attention mask."""
        width = max(len(encoding.ids) for encoding in encodings)
        arrays = {
            "ids": np.full((len(encodings), width), self._pad, dtype=np.int64),
            "attention_mask": np.zeros((len(encodings), width), dtype=np.int64),
            "type_ids": np.zeros((len(encodings), width), dtype=np.int64),
        }
        for row, encoding in enumerate(encodings):
            count = len(encoding.ids)
            arrays["ids"][row, :count] = encoding.ids
            arrays["attention_mask"][row, :count] = encoding.attention_mask
            arrays["type_ids"][row, :count] = encoding.type_ids
        return {name: arrays[_FEEDS[name]] for name in self._inputs}, arrays["attention_mask"]

    def count_tokens(self, text: str) -> int:
        """Word pieces of `text` including the special tokens the model adds, untruncated."""
        prepared = text.lower() if self._pipeline.lower_case else text
        return len(self._counter.encode(prepared).ids)


def folder_token_counter(model_dir: Path) -> tuple[Callable[[str], int], int]:
    """A model folder's own count of a text's word pieces (special tokens included, untruncated), and
    how many its model reads: for an embedder that runs the model elsewhere (an inference server)."""
    pipeline = read_pipeline(model_dir)
    _, counter, _ = _tokenizers(pipeline)
    lower = pipeline.lower_case

    def count(text: str) -> int:
        return len(counter.encode(text.lower() if lower else text).ids)

    return count, pipeline.max_seq_length


def _tokenizers(pipeline: Pipeline) -> tuple[Tokenizer, Tokenizer, int]:
    """The folder's tokenizer twice (one cutting at max_seq_length, one counting), and the padding id.

    Both are configured once, here: changing a tokenizer's settings while another thread encodes
    with it fails, so neither is touched again. Padding is done per batch by the embedder.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise EmbedderError(
            f"the tokenizers library is not installed ({exc}): pip install 'toolsearch[indexer]'"
        ) from exc
    path = pipeline.transformer_dir / "tokenizer.json"
    if not path.is_file():
        raise EmbedderError(
            f"{path} not found: the onnx embedder needs the fast tokenizer's tokenizer.json; "
            "set indexer.embedder: torch for this model"
        )
    try:
        cutting = Tokenizer.from_file(str(path))
        counting = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise EmbedderError(f"cannot load {path}: {exc}") from exc
    for tokenizer in (cutting, counting):
        tokenizer.no_padding()  # tokenizer.json may fix a padded width of its own
        tokenizer.no_truncation()
    cutting.enable_truncation(max_length=pipeline.max_seq_length, strategy="longest_first")
    return cutting, counting, _pad_id(path, cutting)


def _pad_id(path: Path, tokenizer: Tokenizer) -> int:
    """The padding token's id: tokenizer.json's own padding setting, else its [PAD] or <pad> token."""
    try:
        padding = json.loads(path.read_text(encoding="utf-8")).get("padding") or {}
    except (OSError, ValueError):
        padding = {}
    if isinstance(padding.get("pad_id"), int):
        return int(padding["pad_id"])
    for token in ("[PAD]", "<pad>"):
        if (found := tokenizer.token_to_id(token)) is not None:
            return int(found)
    return 0  # masked out either way: the id only has to exist


def _session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session of `path` with `threads` intra-op threads that never spin."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise EmbedderError(
            f"onnxruntime is not installed ({exc}): pip install 'toolsearch[indexer]'"
        ) from exc
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 3  # errors only: its warnings are about graph rewrites, not ours
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ExportError(f"ONNX Runtime cannot load {path}: {exc}") from exc
