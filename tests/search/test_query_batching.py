"""Concurrent queries batched into shared model calls give the answers each would get alone.

On the real model in process (ONNX Runtime; on a real embedding server, Infinity, in
tests/system/test_embedding_server.py): the same queries, sent together, once with batching across
queries (the default) and once one query a call, get the same vectors within float32 rounding, the
same tools in the same order, and the batched run makes fewer model calls. The bounds: a batch
never exceeds its texts, and a query's texts stay in one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from indexer.embedder import FakeEmbedder, Vectors, load_embedder
from indexer.retrieval.embeddings import Embeddings, QueryPath
from tests.support.query_batching import TUNED, batched_against_one_at_a_time


async def test_batched_queries_get_the_answers_one_at_a_time_gets_on_the_model_in_process() -> None:
    await batched_against_one_at_a_time(load_embedder("onnx", TUNED))


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
