"""Concurrent queries, batched and one at a time, on any embedder: the same vectors within float32
rounding, the same tools in the same order, and fewer model calls batched (tests/search/
test_query_batching.py on the model in process, tests/system/test_embedding_server.py on a server).
"""

from __future__ import annotations

import asyncio

import numpy as np

from indexer.embedder import Embedder, Vectors
from indexer.retrieval.embeddings import Embeddings, QueryPath
from indexer.retrieval.index import Builder, IndexVersion, build_version
from indexer.retrieval.query import Need, Query
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.text import query_texts
from indexer.retrieval.tools import advertise
from tests.support.embedding_server import MODELS
from toolsearch.catalog import EVAL_DATA, group_by_server, load_catalog
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME

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
