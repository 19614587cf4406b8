"""Cold embedding throughput, and an indexer start in this process on a filled cache.

The cold build is the indexer's own `build_version` over a catalog, with an empty embedding cache:
it times the model work apart from the rest (text views, token counts, BM25, FAISS). The in-process
start is the indexer's own start-up (`IndexerProcess.build` then `start`: discovery over MCP from the real
catalog server, then the warm-up build) on the cache dir a real indexer process filled; the
re-index part runs on it. The restart that must embed nothing is judged on the real process, by the
embedding counters of its Status answer (`catalogs.started`).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from commands.bench.common import CatalogFile
from indexer.api.process import IndexerProcess
from indexer.embedder import Embedder
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.index import Builder, IndexVersion, build_version
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.tools import advertise
from indexer.state.disk import DiskEmbeddings
from toolsearch.catalog import group_by_server, load_catalog
from toolsearch.config import Config, load_config


def catalog_tools(catalog: CatalogFile) -> dict[str, list[dict[str, Any]]]:
    """A catalog's tool definitions by backend id, as the indexer registers catalog servers."""
    return {
        slug[:64]: [tool.definition() for tool in tools]
        for slug, tools in group_by_server(load_catalog(catalog.path)).items()
    }


def cold_build(
    embedder: Embedder, catalog: CatalogFile, cache_dir: Path
) -> tuple[IndexVersion, dict[str, Any]]:
    """Build a catalog's index version with an empty cache; returns it and the throughput."""
    embeddings = Embeddings(embedder, DiskEmbeddings(cache_dir, embedder.identity, embedder.dimension))
    spent = [0.0]

    def timed(texts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return embeddings.embed_documents(texts)
        finally:
            spent[0] += time.perf_counter() - started

    builder = Builder(
        embed_documents=timed,
        count_tokens=embedder.count_tokens,
        max_tokens=embedder.max_tokens,
        settings=SearchSettings(),
    )
    tools = advertise(catalog_tools(catalog))
    started = time.perf_counter()
    version = build_version(tools, builder)
    total = time.perf_counter() - started
    embeddings.close()
    texts = embeddings.texts_embedded
    return version, {
        "tools": len(tools),
        "texts_embedded": texts,
        "model_calls": embeddings.model_calls,
        "build_seconds": round(total, 3),
        "embed_seconds": round(spent[0], 3),
        "tools_per_second": round(len(tools) / total, 2),
        "texts_per_second": round(texts / spent[0], 2) if spent[0] else 0.0,
    }


def without_health(config: Config) -> Config:
    """The same configuration with health probing off: the benchmark makes the health changes itself."""
    health = config.indexer.health.model_copy(update={"enabled": False})
    indexer = config.indexer.model_copy(update={"health": health})
    return config.model_copy(update={"indexer": indexer})


async def restart_in_process(config_path: Path, embedder: Embedder) -> tuple[IndexerProcess, dict[str, Any]]:
    """Start the indexer of a configuration in this process, on its cache dir; count what it embeds."""
    config = without_health(load_config(config_path, os.environ))
    indexer = IndexerProcess.build(config, embedder, os.environ)
    started = time.perf_counter()
    await indexer.start()
    seconds = time.perf_counter() - started
    gc.freeze()  # as `indexer.api.server.serve` does once started
    states = indexer.registry.states.values()
    public = [s for s in states if s.config.auth.type != "passthrough"]
    embeddings = indexer.embeddings
    return indexer, {
        "seconds_to_ready": round(seconds, 3),
        "backends_listed": sum(1 for s in public if s.advertised),
        "backends": len(public),
        "tools": sum(len(s.listing.tools) for s in public if s.listing is not None),
        "texts_embedded": embeddings.texts_embedded,
        "model_calls": embeddings.model_calls,
        "cache_hits": embeddings.cache_hits,
    }
