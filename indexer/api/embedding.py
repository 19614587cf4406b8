"""The embedder `indexer.embedder` names, ready to serve: a model in process, or an inference server.

A model in process (`onnx`, `torch`) is loaded from `indexer.model`. A server (a mapping with its
`url` and `model`) is asked once before the indexer serves: `connect_server` waits for it, saying
why every `retry_interval`, since until it answers nobody knows which model it serves, and so under
which name its vectors are cached. Its token counts come from the model folder's own tokenizer when
`indexer.model` holds one (the project's model served there too), else from an estimate, and its
match bands are the served model's (`served_bands`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from indexer.embedder import Embedder, EmbedderError, Vectors, load_embedder
from indexer.embedder.server import PROBE_TEXT, ServerEmbedder, ServerSettings, ServerUnavailable
from indexer.retrieval.bands import UNTRAINED_BANDS, Bands, model_bands, named_model_bands
from indexer.retrieval.embeddings import Embeddings, QueryPath
from indexer.retrieval.outage import Outage
from indexer.retrieval.text import estimate_word_pieces
from indexer.state.base import EmbeddingStore
from toolsearch.sections.indexer_settings import EmbeddingServer, Indexer

logger = logging.getLogger(__name__)

DEFAULT_SERVER_MAX_TOKENS = 256  # what a server's model is taken to read without a folder saying more


def server_embedder(settings: EmbeddingServer, model_dir: Path, secrets: Mapping[str, str]) -> ServerEmbedder:
    """The server's client (not asked yet); raises EmbedderError for an unset API key variable."""
    api_key = None
    if settings.api_key_env is not None:
        api_key = secrets.get(settings.api_key_env)
        if not api_key:
            raise EmbedderError(
                f"indexer.embedder.api_key_env names {settings.api_key_env}, which is not set: "
                "set it to the embedding server's API key, or remove the key"
            )
    count: Callable[[str], int] = estimate_word_pieces
    max_tokens = DEFAULT_SERVER_MAX_TOKENS
    if (model_dir / "modules.json").is_file():
        from indexer.embedder.onnx import folder_token_counter

        count, max_tokens = folder_token_counter(model_dir)
    server = ServerSettings(
        url=settings.url,
        model=settings.model,
        api_key=api_key,
        batch_size=settings.batch_size,
        timeout=settings.timeout,
        max_tokens=settings.max_tokens or max_tokens,
    )
    return ServerEmbedder(server, count)


async def connect_server(embedder: ServerEmbedder, retry_interval: float) -> None:
    """Ask the server until it answers, saying why not every `retry_interval` seconds."""
    while True:
        try:
            await asyncio.to_thread(embedder.connect)
        except ServerUnavailable as exc:
            logger.warning(
                "waiting for the embedding server at %s: %s (asking again in %gs)",
                embedder.settings.endpoint,
                exc,
                retry_interval,
            )
            await asyncio.sleep(retry_interval)
            continue
        logger.info(
            "embedding server at %s serves %s (%d dimensions)",
            embedder.settings.endpoint,
            embedder.served_model,
            embedder.dimension,
        )
        return


async def configured_embedder(section: Indexer, secrets: Mapping[str, str]) -> Embedder:
    """The embedder of the indexer section, loaded (a model) or answering (a server)."""
    choice = section.embedder
    if isinstance(choice, EmbeddingServer):
        embedder = server_embedder(choice, section.model, secrets)
        await connect_server(embedder, choice.retry_interval)
        return embedder
    return await asyncio.to_thread(load_embedder, choice, section.model, section.model_threads)


def served_bands(section: Indexer, embedder: Embedder) -> Bands:
    """The match bands of the model that embeds: its own, as calibrated for it.

    A model in process: its folder's (`model_bands`). A server: the configured `bands`, else those
    of the model it names when the project knows it (a shipped tuning, all-MiniLM-L6-v2, or the
    model folder's own tuning under the same name), else all-MiniLM-L6-v2's, with a warning that
    says how to calibrate them (`toolsearch bands --calibrate`).
    """
    choice = section.embedder
    if not isinstance(choice, EmbeddingServer) or not isinstance(embedder, ServerEmbedder):
        return model_bands(section.model)
    if choice.bands is not None:
        return Bands(strong=choice.bands.strong, possible=choice.bands.possible)
    served = embedder.served_model
    known = named_model_bands(served)
    if known is not None:
        return known
    same_name = served.rstrip("/").rpartition("/")[2] == section.model.name
    if same_name and (section.model / "tuning.json").is_file():
        return model_bands(section.model)
    fallback = UNTRAINED_BANDS
    logger.warning(
        "no match bands known for %s, the model the embedding server serves: using all-MiniLM-L6-v2's "
        "(strong %.3f, possible %.3f). Calibrate its own with `toolsearch bands --calibrate --config "
        "FILE` and set indexer.embedder.bands",
        served,
        fallback.strong,
        fallback.possible,
    )
    return fallback


def embeddings_for(section: Indexer, embedder: Embedder, store: EmbeddingStore | None = None) -> Embeddings:
    """The cache and the query batching in front of `embedder`; a server, which can be away, also gets
    an `Outage`, and a deadline (`query_timeout`) on the calls for queries."""
    batching = section.query_batching
    choice = section.embedder
    if not isinstance(embedder, ServerEmbedder) or not isinstance(choice, EmbeddingServer):
        return Embeddings(
            embedder, store, queries=QueryPath(batch=batching.max_texts, coalesce=batching.enabled)
        )
    server, deadline = embedder, choice.query_timeout

    def within_deadline(texts: Sequence[str]) -> Vectors:
        return server.embed_within(texts, deadline)

    def check() -> None:
        within_deadline([PROBE_TEXT])

    path = QueryPath(
        batch=batching.max_texts,
        chars=batching.max_chars,
        coalesce=batching.enabled,
        embed=within_deadline,
        outage=Outage(check, choice.retry_interval),
    )
    return Embeddings(embedder, store, queries=path)
