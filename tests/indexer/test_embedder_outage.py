"""While the embedder is away: no call is tried, builds make lexical versions, and one check brings
the dense arm back, the versions built meanwhile rebuilt with their vectors.

On a fake that can be away (the `Embedder` protocol's fast stand-in); the real server's outages are
in tests/system/test_embedding_server.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from indexer.embedder import FakeEmbedder, Vectors
from indexer.embedder.base import EmbedderUnavailable
from indexer.retrieval.embeddings import Embeddings, QueryPath
from indexer.retrieval.index import Builder, VersionPool
from indexer.retrieval.outage import Outage
from indexer.retrieval.query import Need, Query
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.tools import advertise
from tests.support.waits import wait_for

TOOLS = {
    "mail": [
        {"name": "send_email", "description": "Send an email message to a recipient", "inputSchema": {}},
        {"name": "list_inbox", "description": "List the messages in the inbox", "inputSchema": {}},
    ],
    "weather": [{"name": "forecast", "description": "The weather forecast for a city", "inputSchema": {}}],
}


class Away(FakeEmbedder):
    """The fake, answering only while `here`; counts the calls it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.here = True
        self.asked = 0

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.asked += 1
        if not self.here:
            raise EmbedderUnavailable("the embedding server is unreachable: ConnectError")
        return super().embed(texts)


def parts(away: Away) -> tuple[Embeddings, Outage, VersionPool]:
    def check() -> None:
        away.embed(["probe"])

    outage = Outage(check, retry_interval=0.05)
    embeddings = Embeddings(away, queries=QueryPath(outage=outage))
    builder = Builder(embeddings.embed_documents, away.count_tokens, away.max_tokens, SearchSettings())
    return embeddings, outage, VersionPool(builder)


async def test_the_first_failure_opens_the_outage_and_no_call_is_tried_until_a_check_passes() -> None:
    away = Away()
    embeddings, outage, _ = parts(away)
    away.here = False
    with pytest.raises(EmbedderUnavailable, match="unreachable"):
        await embeddings.embed_query("send an email")
    assert outage.down and "unreachable" in outage.reason and outage.since is not None
    asked = away.asked
    with pytest.raises(EmbedderUnavailable, match="unreachable"):
        await embeddings.embed_query("another query")
    with pytest.raises(EmbedderUnavailable):
        embeddings.embed_documents(["a tool text"])
    assert away.asked == asked  # refused at once, without asking the embedder
    back: list[bool] = []

    async def note_back() -> None:
        back.append(True)

    outage.on_back(note_back)
    outage.start()
    try:
        await asyncio.sleep(0.2)
        assert outage.down and not back  # the checks go on failing while it is away
        away.here = True
        await wait_for(lambda: bool(back), within=10)
        assert not outage.down and outage.reason == "" and outage.outages == 1
        vector = await embeddings.embed_query("another query")
        np.testing.assert_array_equal(vector, FakeEmbedder().embed(["another query"])[0])
    finally:
        await outage.close()
        embeddings.close()


async def test_a_version_built_while_the_embedder_is_away_answers_lexically_then_gets_its_vectors() -> None:
    away = Away()
    embeddings, outage, pool = parts(away)
    tools = advertise(TOOLS)
    away.here = False
    lexical = await pool.get(tools)
    assert not lexical.dense and outage.down
    zero = Need("send an email", np.zeros(lexical.dimension, dtype=np.float32))
    found = lexical.find_hits(Query("send an email", (), (zero,)), 2, "lexical")
    assert found[0][0].name == "send_email"
    assert await pool.get(tools) is lexical  # the pool hands it out while the embedder is away
    assert await pool.complete() == []  # nothing to rebuild with yet

    away.here = True
    assert await outage.check_now()
    (pair,) = await pool.complete()
    assert pair[0] is lexical
    dense = pair[1]
    assert dense.dense and dense.fingerprint == lexical.fingerprint
    assert await pool.get(tools) is dense
    vector = await embeddings.embed_query("send an email")
    hits = dense.find_hits(Query("send an email", (), (Need("send an email", vector),)), 2)
    assert hits[0][0].name == "send_email" and hits[0][1].match > 0
    embeddings.close()
