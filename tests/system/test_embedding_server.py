"""Embeddings from an OpenAI-compatible inference server: a real one (Infinity on CPU, serving the
project's model folder), down, slow, swapped for another model and answering garbage.

find_tool goes on answering from the lexical arm while the server cannot embed, says so in its note,
and the status says why; nothing waits longer than the query deadline; the dense arm comes back when
the server does. The vectors are keyed by the model the server names, checked on every answer.
What is checked without a server is tests/indexer/test_embedding_server_answers.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.status import fetch
from indexer.api.embedding import served_bands, server_embedder
from indexer.embedder import load_embedder
from indexer.embedder.server import ServerEmbedder, ServerUnavailable
from indexer.retrieval.bands import UNTRAINED_BANDS, model_bands
from tests.support.catalogs import small_catalog
from tests.support.embedding_server import MODELS, EmbeddingServer
from tests.support.in_process import in_process_stack
from tests.support.query_batching import batched_against_one_at_a_time
from tests.support.stack import Stack, structured
from tests.support.waits import wait_for
from toolsearch.sections.indexer_settings import (
    BASE_MODEL_NAME,
    TUNED_MODEL_NAME,
    Indexer,
)
from toolsearch.sections.indexer_settings import (
    EmbeddingServer as Settings,
)

TUNED = MODELS / TUNED_MODEL_NAME


KEY_ENV = "TEST_EMBEDDING_KEY"


KEY = "a-key-the-server-requires"


QUERY_TIMEOUT = 30.0


LEXICAL = "Matched by words alone"


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddingServer]:
    running = EmbeddingServer(TUNED, TUNED_MODEL_NAME, api_key=KEY)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def settings(url: str, **more: Any) -> Settings:
    return Settings(url=url, model=TUNED_MODEL_NAME, api_key_env=KEY_ENV, **more)


def connected(url: str, **more: Any) -> ServerEmbedder:
    embedder = server_embedder(settings(url, **more), TUNED, {KEY_ENV: KEY})
    embedder.connect()
    return embedder


def test_the_server_serves_the_project_model_with_the_vectors_it_gives_in_process(
    server: EmbeddingServer,
) -> None:
    embedder = connected(server.url)
    texts = ["get the weather forecast for Paris", "send an email to the team", "x" * 3000]
    local = load_embedder("onnx", TUNED)
    try:
        vectors = embedder.embed(texts)
        assert embedder.identity == f"openai-server:{TUNED_MODEL_NAME}:384"
        assert embedder.max_tokens == local.max_tokens  # read from the model folder, as its tokenizer
        assert embedder.count_tokens(texts[0]) == local.count_tokens(texts[0])
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert np.all(np.einsum("ij,ij->i", vectors, local.embed(texts)) > 0.9999)
    finally:
        embedder.close()


def test_the_served_model_brings_its_own_bands(server: EmbeddingServer) -> None:
    embedder = connected(server.url)
    try:
        section = Indexer(embedder=settings(server.url), model=Path("nowhere"))
        assert served_bands(section, embedder) == model_bands(TUNED) != UNTRAINED_BANDS
        chosen = Indexer(embedder=settings(server.url, bands={"strong": 0.6, "possible": 0.3}))
        assert (served_bands(chosen, embedder).strong, served_bands(chosen, embedder).possible) == (0.6, 0.3)
    finally:
        embedder.close()


def test_a_wrong_api_key_is_refused_with_the_key_to_check(server: EmbeddingServer) -> None:
    embedder = server_embedder(settings(server.url), TUNED, {KEY_ENV: "not-the-key"})
    with pytest.raises(ServerUnavailable, match=r"HTTP 401.*api_key_env"):
        embedder.connect()
    embedder.close()


def test_a_url_that_is_not_the_api_says_which_setting_to_check(server: EmbeddingServer) -> None:
    embedder = server_embedder(settings(server.url.removesuffix("/v1")), TUNED, {KEY_ENV: KEY})
    with pytest.raises(ServerUnavailable, match=r"HTTP 404.*indexer\.embedder\.url"):
        embedder.connect()
    embedder.close()


@asynccontextmanager
async def client(url: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as c,
    ):
        yield c


async def find(c: Client, query: str) -> dict[str, Any]:
    result = await c.call_tool("find_tool", {"tool_description": query})
    assert not result.is_error, result
    return structured(result)


def embedding_status(stack: Stack) -> Any:
    return fetch(stack.indexer_address, 10.0).embedding


@pytest.fixture
def stack(tmp_path: Path, server: EmbeddingServer) -> Iterator[Stack]:
    catalog = tmp_path / "catalog.jsonl"
    small_catalog(catalog)
    embedder = {
        "url": server.url,
        "model": TUNED_MODEL_NAME,
        "api_key_env": KEY_ENV,
        "query_timeout": QUERY_TIMEOUT,
        "retry_interval": 0.5,
    }
    extra = {
        "indexer": {"embedder": embedder, "cache_dir": str(tmp_path / "cache")},
        "router": {"indexer_timeout": 2 * QUERY_TIMEOUT},  # the router waits for the query deadline
    }
    with in_process_stack(tmp_path, catalog=catalog, extra=extra, env={KEY_ENV: KEY}) as running:
        yield running


async def test_find_tool_answers_lexically_while_the_server_is_away_and_densely_once_it_is_back(
    stack: Stack, server: EmbeddingServer
) -> None:
    async with client(stack.mcp_url) as c:
        answer = await find(c, "cocktails made with lime and rum")
        assert LEXICAL not in answer.get("message", "")
        assert embedding_status(stack).embedder == "server" and not embedding_status(stack).unavailable

        server.stop()
        try:
            answer = await find(c, "which cocktails can I make with gin")
            assert LEXICAL in answer["message"] and "unreachable" in answer["message"], answer
            assert answer["tools"], "the lexical arm still finds the tools that share the words"
            status = embedding_status(stack)
            assert status.unavailable and "unreachable" in status.unavailable_reason
            assert status.unavailable_since_unix > 0
            # and the status page says why, for people and as JSON
            async with httpx2.AsyncClient(timeout=60) as http:
                page = (await http.get(f"{stack.router_urls[0]}/status")).text
                view = (await http.get(f"{stack.router_urls[0]}/status.json")).json()
            assert "id=embedding-unavailable" in page and "unreachable" in page
            said = view["indexer"]["embedding"]
            assert said["unavailable"] and "unreachable" in said["unavailable_reason"], said
            # while it is away no call is tried: the next answer waits for no server
            answer = await find(c, "nba team standings this season")
            assert LEXICAL in answer["message"], answer
            after = embedding_status(stack)
            assert after.model_calls == status.model_calls and after.lexical_answers >= 2
        finally:
            await asyncio.to_thread(server.start)

        await wait_for(lambda: not embedding_status(stack).unavailable, within=60, poll=0.3)
        answer = await find(c, "what is the weather going to be tomorrow")
        assert LEXICAL not in answer.get("message", ""), answer
        assert embedding_status(stack).outages == 1


async def test_a_model_swapped_behind_the_same_url_is_refused_never_mixed(
    stack: Stack, server: EmbeddingServer
) -> None:
    async with client(stack.mcp_url) as c:
        await find(c, "cocktails made with lime and rum")
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start, MODELS / BASE_MODEL_NAME, BASE_MODEL_NAME)
        try:
            answer = await find(c, "which cocktails can I make with gin")
            assert LEXICAL in answer["message"], answer
            await wait_for(
                lambda: BASE_MODEL_NAME in embedding_status(stack).unavailable_reason, within=60, poll=0.3
            )
            reason = embedding_status(stack).unavailable_reason
            assert f"now serves model {BASE_MODEL_NAME!r}, not {TUNED_MODEL_NAME!r}" in reason
            assert "restart the indexer" in reason
        finally:
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start, TUNED, TUNED_MODEL_NAME)
        await wait_for(lambda: not embedding_status(stack).unavailable, within=60, poll=0.3)
        answer = await find(c, "nba team standings this season")
        assert LEXICAL not in answer.get("message", ""), answer


async def test_batched_queries_get_the_answers_one_at_a_time_gets_on_the_server(
    server: EmbeddingServer,
) -> None:
    embedder = await asyncio.to_thread(connected, server.url)
    try:
        await batched_against_one_at_a_time(embedder)
    finally:
        embedder.close()
