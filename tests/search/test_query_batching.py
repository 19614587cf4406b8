"""Concurrent queries batched into shared model calls give the answers each would get alone.

On the real model in process (ONNX Runtime) and on a real embedding server (Infinity): the same
queries, sent together, once with batching across queries (the default) and once one query a call,
get the same vectors within float32 rounding, the same tools in the same order, and the batched run
makes fewer model calls. The bounds: a batch never exceeds its texts, and a query's texts stay in
one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from indexer.api.embedding import server_embedder
from indexer.embedder import Embedder, FakeEmbedder, Vectors, load_embedder
from indexer.retrieval.embeddings import Embeddings, QueryPath
from indexer.retrieval.index import Builder, IndexVersion, build_version
from indexer.retrieval.query import Need, Query
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.text import query_texts
from indexer.retrieval.tools import advertise
from tests.support.embedding_server import MODELS, EmbeddingServer
from toolsearch.catalog import EVAL_DATA, group_by_server, load_catalog
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME
from toolsearch.sections.indexer_settings import EmbeddingServer as ServerSection

TUNED = MODELS / TUNED_MODEL_NAME
QUERIES = [
    "What is the weather forecast for Lisbon this weekend?",
    "I need a cocktail recipe with gin. It should be easy to make. Give me the ingredients.",
    "nba scores",
    "Find a hotel near the airport for two nights and book it. Then send me the confirmation.",
    "convert 100 dollars to euros",
    "Look up the lyrics of a song, then translate them to French.",
    "current price of bitcoin",
    "Plan a road trip from Berlin to Prague: the route, the fuel cost, and places to stop.",
]


def catalog_version(embedder: Embedder) -> IndexVersion:
    """An index over the first 60 StableToolBench tools, built by the indexer's own builder."""
    tools = load_catalog(EVAL_DATA / "stabletoolbench" / "tools.jsonl")[:60]
    grouped = {
        slug: [tool.definition() for tool in members] for slug, members in group_by_server(tools).items()
    }
    builder = Builder(
        embed_documents=Embeddings(embedder).embed_documents,
        count_tokens=embedder.count_tokens,
        max_tokens=embedder.max_tokens,
        settings=SearchSettings(),
    )
    return build_version(advertise(grouped), builder)


async def answers(embeddings: Embeddings, version: IndexVersion) -> tuple[list[Vectors], list[list[str]]]:
    """Every query sent at once, as concurrent find_tool calls send them: vectors and tool names."""
    texts = [query_texts(query) for query in QUERIES]
    rows = await asyncio.gather(*(embeddings.embed_query_texts(group) for group in texts))
    names = []
    for query, group, vectors in zip(QUERIES, texts, rows, strict=True):
        needs = tuple(Need(text, vector) for text, vector in zip(group, vectors, strict=True))
        names.append([tool.name for tool, _ in version.find_hits(Query(query, (), needs), 8)])
    return [np.stack(vectors) for vectors in rows], names


async def batched_against_one_at_a_time(embedder: Embedder) -> None:
    version = catalog_version(embedder)
    batched = Embeddings(embedder)
    alone = Embeddings(embedder, queries=QueryPath(coalesce=False))
    try:
        together_vectors, together_names = await answers(batched, version)
        alone_vectors, alone_names = await answers(alone, version)
    finally:
        batched.close()
        alone.close()
    for mine, theirs in zip(together_vectors, alone_vectors, strict=True):
        np.testing.assert_allclose(mine, theirs, atol=2e-6)
    assert together_names == alone_names
    assert alone.model_calls == len(QUERIES)
    assert batched.model_calls < alone.model_calls  # the first query alone, the others together


async def test_batched_queries_get_the_answers_one_at_a_time_gets_on_the_model_in_process() -> None:
    await batched_against_one_at_a_time(load_embedder("onnx", TUNED))


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddingServer]:
    running = EmbeddingServer(TUNED, TUNED_MODEL_NAME)
    running.start()
    try:
        yield running
    finally:
        running.stop()


async def test_batched_queries_get_the_answers_one_at_a_time_gets_on_an_embedding_server(
    server: EmbeddingServer,
) -> None:
    embedder = server_embedder(ServerSection(url=server.url, model=TUNED_MODEL_NAME), TUNED, {})
    await asyncio.to_thread(embedder.connect)
    try:
        await batched_against_one_at_a_time(embedder)
    finally:
        embedder.close()


class Recording(FakeEmbedder):
    """The fake, noting each call's texts."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.batches.append(list(texts))
        return super().embed(texts)


async def test_a_batch_holds_whole_queries_up_to_its_texts() -> None:
    recording = Recording()
    embeddings = Embeddings(recording, queries=QueryPath(batch=5))
    groups = [[f"q{i} whole", f"q{i} first need", f"q{i} second need"] for i in range(4)]
    await asyncio.gather(*(embeddings.embed_query_texts(group) for group in groups))
    embeddings.close()
    # the first query starts alone; then no call holds more than 5 texts, nor part of a query
    assert recording.batches[0] == groups[0]
    for batch in recording.batches:
        assert len(batch) <= 5 or batch in groups
        assert len(batch) % 3 == 0
    assert sorted(text for batch in recording.batches for text in batch) == sorted(
        text for group in groups for text in group
    )


def test_a_query_batch_of_no_texts_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        QueryPath(batch=0)


async def test_a_batch_of_long_texts_stops_at_its_padded_size_and_a_long_query_still_goes_whole() -> None:
    recording = Recording()
    embeddings = Embeddings(recording, queries=QueryPath(chars=600))
    short = [[f"short request {i}"] for i in range(6)]
    long = [[f"a long task {i} " + "word " * 100, f"its first need {i}"] for i in range(3)]
    await asyncio.gather(*(embeddings.embed_query_texts(group) for group in [*short, *long]))
    embeddings.close()
    for batch in recording.batches[1:]:  # the first call starts alone, before any other arrives
        padded = len(batch) * max(map(len, batch))
        assert padded <= 600 or batch in long, batch  # a query over the budget still goes, alone
    assert [group for group in long if group in recording.batches] == long
