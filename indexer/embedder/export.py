"""Exporting a sentence-transformers folder's transformer to ONNX, checked against torch before use.

`export_onnx` runs from `toolsearch model prepare` where no shipped recipe (`indexer.embedder.recipe`)
fits the folder, or when asked to; it needs torch, sentence-transformers, onnx and onnxscript (the
`model` extra), which the serving path never imports. It exports the
transformer (token vectors out; pooling stays with the embedder, as the folder configures it) with
PyTorch's own exporter, `torch.onnx.export(dynamo=True)`, into a hidden folder beside the weights,
embeds `PROBE_TEXTS` with both the export and sentence-transformers, and refuses the export unless
every vector agrees to within `TOLERANCE`. Only then are the manifest written and the folder renamed
to `onnx/`, so a killed or failed export never leaves a half-made one in place. The exporter's stack
traces are taken out of the graph: with them gone, one folder and one set of versions make the same
file on every machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import shutil
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embedder.files import (
    EXPORT_OLD_PREFIX,
    VARIANT_FILES,
    ExportError,
    ExportFile,
    Manifest,
    Variant,
    export_dir,
    export_staging,
    file_sha256,
    folder_digest,
    swap_into_place,
    sync_folder,
    write_manifest,
)
from indexer.embedder.pipeline import read_pipeline

TOLERANCE = 1e-5  # the largest difference of any vector component to sentence-transformers' own
# Texts the export is checked on: empty and one-character texts, everyday requests, a tool
# description, punctuation, accents and scripts other than Latin, stray whitespace, and a text far
# past max_seq_length (so truncation is checked too). Embedded as one batch, so padding is exercised.
PROBE_TEXTS = (
    "",
    "a",
    "weather forecast for tomorrow",
    "Find me a tool that books flights from Paris to Tokyo next Tuesday. I need the cheapest fare.",
    "get_forecast: Get the weather forecast for a city. Parameters: city (string), days (integer, 1-14)",
    "github_create_issue(owner, repo, title, body?) -> {number, url}",
    "Ünïcödé café, naïve résumé; Москва, 東京, 🙂",
    "   leading and trailing whitespace\t\n",
    "Which tools can translate a PDF document into German and keep its layout?",
    " ".join(f"token{number}" for number in range(400)),
)
_STACK_TRACE = "pkg.torch.onnx.stack_trace"

_log = logging.getLogger(__name__)


def export_onnx(model_dir: Path, int8: bool = False) -> Manifest:
    """Export `model_dir`'s transformer into `model_dir/onnx/` (fp32, int8 when asked); returns the manifest.

    Raises ExportError when the tools are missing, the folder's pipeline cannot be reproduced, or the
    export's vectors differ from sentence-transformers' by more than TOLERANCE.
    """
    pipeline = read_pipeline(model_dir)  # refuses what the onnx embedder could not reproduce, first
    digest = folder_digest(model_dir)
    torch, model, versions = _load_tools(model_dir)
    staging = export_staging(model_dir)
    try:
        inputs = _export(torch, model, staging / VARIANT_FILES["fp32"])
        files: dict[Variant, ExportFile] = {"fp32": _describe(staging, VARIANT_FILES["fp32"])}
        if int8:
            _quantize(staging / VARIANT_FILES["fp32"], staging / VARIANT_FILES["int8"])
            files["int8"] = _describe(staging, VARIANT_FILES["int8"])
        manifest = Manifest(
            source_digest=digest,
            inputs=inputs,
            output="last_hidden_state",
            files=files,
            checks={},
            made_with=versions,
        )
        write_manifest(staging, manifest)
        checks = _check(model_dir, staging, model, sorted(files), pipeline.max_seq_length)
        manifest = dataclasses.replace(manifest, checks=checks)
        write_manifest(staging, manifest)
        sync_folder(staging)
        swap_into_place(staging, export_dir(model_dir), EXPORT_OLD_PREFIX)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _load_tools(model_dir: Path) -> tuple[Any, Any, dict[str, str]]:
    """torch and the folder's SentenceTransformer (offline, CPU), and the versions to record."""
    try:
        import onnx
        import onnxruntime
        import onnxscript
        import sentence_transformers
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ExportError(
            f"exporting the model to ONNX needs torch, sentence-transformers, onnx and onnxscript ({exc}): "
            "pip install 'toolsearch[model]'"
        ) from exc
    import transformers.utils.logging

    progress: Any = transformers.utils.logging  # untyped
    bars = progress.is_progress_bar_enabled()
    progress.disable_progress_bar()  # a progress bar of loading the weights, on stderr
    try:
        with _quiet():
            model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    except Exception as exc:
        raise ExportError(f"cannot load the model in {model_dir}: {exc}") from exc
    finally:
        if bars:
            progress.enable_progress_bar()
    model.eval()
    versions = {
        "torch": str(torch.__version__),
        "sentence-transformers": str(sentence_transformers.__version__),
        "onnx": str(onnx.__version__),
        "onnxscript": str(onnxscript.__version__),
        "onnxruntime": str(onnxruntime.__version__),
    }
    return torch, model, versions


def _export(torch: Any, model: Any, path: Path) -> tuple[str, ...]:
    """Export the transformer module of `model` to `path`; returns the graph's input names."""
    transformer = model[0].auto_model
    accepted = set(inspect.signature(transformer.forward).parameters)
    names = tuple(name for name in ("input_ids", "attention_mask", "token_type_ids") if name in accepted)
    if names[:2] != ("input_ids", "attention_mask"):
        raise ExportError(f"the transformer takes {sorted(accepted)}, not input_ids and attention_mask")

    class Pair(torch.nn.Module):  # type: ignore[misc]
        """The transformer with its inputs by name and the last hidden state out, as the exporter wants."""

        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Triple(Pair):
        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:  # type: ignore[override]
            return self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    # two texts, the second padded: the traced graph must honour the attention mask
    ids = torch.full((2, 16), 1000, dtype=torch.long)
    mask = torch.ones((2, 16), dtype=torch.long)
    mask[1, 9:] = 0
    sample = (ids, mask, torch.zeros((2, 16), dtype=torch.long))[: len(names)]
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens", max=4096)
    try:
        with _quiet(), torch.no_grad():
            torch.onnx.export(
                (Triple() if len(names) == 3 else Pair()).eval(),
                sample,
                str(path),
                input_names=list(names),
                output_names=["last_hidden_state"],
                dynamic_shapes={name: {0: batch, 1: tokens} for name in names},
                dynamo=True,
                external_data=False,
                optimize=True,
            )
    except Exception as exc:
        summary = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {summary}") from exc
    _drop_stack_traces(path)
    return names


def _drop_stack_traces(path: Path) -> None:
    """Remove the exporter's stack traces from the graph's nodes.

    They name the files of the machine that made the export (its source and virtualenv paths), so two
    exports of one folder with one set of versions would differ by machine; without them they are
    identical, byte for byte, which is what lets a recipe (`indexer.embedder.recipe`) stand for one.
    """
    import onnx

    model = onnx.load(str(path))
    graphs = [model.graph]
    nodes = [*(node for function in model.functions for node in function.node)]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            nodes.append(node)
            for attribute in node.attribute:
                graphs.extend([attribute.g] if attribute.HasField("g") else [])
                graphs.extend(attribute.graphs)
    for node in nodes:
        kept = [prop for prop in node.metadata_props if prop.key != _STACK_TRACE]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(model, str(path))


def _quantize(source: Path, target: Path) -> None:
    """int8 weights per output channel, activations quantised on the fly (ONNX Runtime's dynamic mode)."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.preprocess import quant_pre_process
    except ImportError as exc:
        raise ExportError(f"int8 quantization needs onnxruntime and onnx ({exc})") from exc
    prepared = target.with_suffix(".pre.onnx")
    try:
        with _quiet():
            # the optimised graph quantizes as ONNX Runtime recommends; symbolic shapes do not resolve here
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            quantize_dynamic(str(prepared), str(target), weight_type=QuantType.QInt8, per_channel=True)
    except Exception as exc:
        raise ExportError(f"int8 quantization failed: {exc}") from exc
    finally:
        prepared.unlink(missing_ok=True)


def _describe(folder: Path, name: str) -> ExportFile:
    path = folder / name
    return ExportFile(name=name, sha256=file_sha256(path), size=path.stat().st_size)


def _check(
    model_dir: Path, staging: Path, model: Any, variants: Sequence[Variant], max_tokens: int
) -> dict[str, Any]:
    """Embed PROBE_TEXTS with the export and sentence-transformers; refuse a difference over TOLERANCE."""
    from indexer.embedder.onnx import OnnxEmbedder

    with _quiet():
        wanted = np.asarray(
            model.encode(list(PROBE_TEXTS), normalize_embeddings=True, convert_to_numpy=True),
            dtype=np.float32,
        )
    if int(model.max_seq_length) != max_tokens:
        raise ExportError(
            f"sentence-transformers reads {model.max_seq_length} tokens of a text, the folder's files say "
            f"{max_tokens}: refusing an export that would cut texts elsewhere"
        )
    checks: dict[str, Any] = {"texts": len(PROBE_TEXTS), "tolerance": TOLERANCE}
    for variant in variants:
        embedder = OnnxEmbedder(model_dir, variant=variant, threads=1, export=staging)
        got = embedder.embed(PROBE_TEXTS)
        if variant == "fp32":
            difference = float(np.abs(got - wanted).max())
            checks["fp32_max_difference"] = difference
            if not difference <= TOLERANCE:
                raise ExportError(
                    f"the ONNX export's vectors differ from sentence-transformers' by {difference:.2e} "
                    f"(more than {TOLERANCE:.0e}): not installing it"
                )
        else:
            cosines = (got * wanted).sum(axis=1)
            checks["int8_mean_cosine"] = round(float(cosines.mean()), 5)
            checks["int8_min_cosine"] = round(float(cosines.min()), 5)
    return checks


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the exporter's progress lines and warnings off stdout, which a command prints its result to."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()) as captured:
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        except BaseException:
            if text := captured.getvalue().strip():
                _log.debug("exporter output: %s", text[-2000:])
            raise
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
