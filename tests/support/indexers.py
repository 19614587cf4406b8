"""An indexer's parts in the test's own event loop, with the fake embedder: inspectable directly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from indexer.api.process import IndexerProcess
from indexer.embedder import FakeEmbedder
from toolsearch.config import Config


@asynccontextmanager
async def running_indexer(config: Config, secrets: Mapping[str, str]) -> AsyncIterator[IndexerProcess]:
    """Build and start the indexer of `config` (discovery, warm-up, probes); close it afterwards."""
    indexer = IndexerProcess.build(config, FakeEmbedder(), secrets)
    await indexer.start()
    try:
        yield indexer
    finally:
        await indexer.close()
