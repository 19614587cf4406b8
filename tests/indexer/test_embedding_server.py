"""Embeddings from an OpenAI-compatible inference server: a real one (Infinity on CPU, serving the
project's model folder), down, slow, swapped for another model and answering garbage.

find_tool goes on answering from the lexical arm while the server cannot embed, says so in its note,
and the status says why; nothing waits longer than the query deadline; the dense arm comes back when
the server does. The vectors are keyed by the model the server names, checked on every answer.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.status import fetch
from indexer.api.embedding import served_bands, server_embedder
from indexer.embedder import EmbedderError, load_embedder
from indexer.embedder.server import ServerEmbedder, ServerSettings, ServerUnavailable, read_answer
from indexer.retrieval.bands import UNTRAINED_BANDS, model_bands
from tests.support.catalogs import small_catalog
from tests.support.embedding_server import MODELS, EmbeddingServer
from tests.support.in_process import in_process_stack
from tests.support.stack import Stack, structured
from tests.support.waits import wait_for
from toolsearch.config import ConfigError, load_config
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
# seconds a find_tool waits for the server before it answers from the lexical arm: far above what a
# query takes on a busy machine, so that only the outages made here ever open one (a stopped
# server refuses at once)
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


def test_a_server_that_never_answers_costs_at_most_its_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        embedder = ServerEmbedder(
            ServerSettings(url=f"http://127.0.0.1:{silent.getsockname()[1]}/v1", model="m", timeout=0.5), len
        )
        with pytest.raises(ServerUnavailable, match=r"did not answer within 0\.5s"):
            embedder.connect()  # bounded by its timeout: were it not, the test would hang here
        embedder.close()


def test_a_url_that_is_not_the_api_says_which_setting_to_check(server: EmbeddingServer) -> None:
    embedder = server_embedder(settings(server.url.removesuffix("/v1")), TUNED, {KEY_ENV: KEY})
    with pytest.raises(ServerUnavailable, match=r"HTTP 404.*indexer\.embedder\.url"):
        embedder.connect()
    embedder.close()


GARBAGE = [
    ([], "without a list of embeddings"),
    ({"data": "vectors"}, "without a list of embeddings"),
    ({"data": [{"index": 0, "embedding": [0.1, 0.2]}]}, "1 embeddings for 2 texts"),
    ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 0, "embedding": [0.1, 0.2]}]}, "repeated"),
    ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 7, "embedding": [0.1, 0.2]}]}, "wrong index"),
    ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 1, "embedding": [0.1]}]}, "dimension"),
    ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 1, "embedding": "AAAA"}]}, "not a list"),
    ({"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 1, "embedding": [0, 0]}]}, "all zero"),
    ({"data": [{"index": 0, "embedding": [0.1, "x"]}, {"index": 1, "embedding": [0.1, 0.2]}]}, "numbers"),
    ({"data": [{"index": 0, "embedding": [1e39, 1.0]}, {"index": 1, "embedding": [0.1, 0.2]}]}, "finite"),
]


@pytest.mark.parametrize(("answer", "said"), GARBAGE)
def test_an_answer_that_is_not_the_vectors_asked_for_is_refused_saying_what_is_wrong(
    answer: Any, said: str
) -> None:
    with pytest.raises(ServerUnavailable, match=said):
        read_answer(answer, 2, None, "the embedding server")


def test_vectors_of_another_dimension_than_at_connection_are_refused() -> None:
    answer = {"data": [{"index": 0, "embedding": [0.1, 0.2, 0.3]}], "model": "m"}
    with pytest.raises(ServerUnavailable, match=r"dimension \[3\], not 384"):
        read_answer(answer, 1, 384, "the embedding server")
    model, vectors = read_answer(answer, 1, 3, "the embedding server")
    assert model == "m" and vectors.shape == (1, 3)


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


@pytest.mark.parametrize(
    ("embedder", "said"),
    [
        ("cuda", "must be onnx or torch, or a mapping naming an inference server"),
        ({"url": "ftp://embeddings/v1", "model": "m"}, "url: must be an http:// or https:// URL"),
        ({"url": "http://embeddings/v1"}, "model: Field required"),
        ({"url": "http://embeddings/v1", "model": "m", "timout": 3}, "timout: unknown key"),
        ({"url": "http://e/v1", "model": "m", "bands": {"strong": 0.2, "possible": 0.5}}, "must not exceed"),
    ],
)
def test_an_inference_servers_settings_are_checked_naming_the_key(
    tmp_path: Path, embedder: Any, said: str
) -> None:
    path = tmp_path / "toolsearch.yaml"
    path.write_text(yaml.safe_dump({"indexer": {"embedder": embedder}}))
    with pytest.raises(ConfigError, match=r"indexer\.embedder") as caught:
        load_config(path, {})
    assert said in str(caught.value) and str(path) in str(caught.value)


def test_an_api_key_variable_that_is_not_set_is_named() -> None:
    with pytest.raises(EmbedderError, match=f"{KEY_ENV}, which is not set"):
        server_embedder(settings("http://127.0.0.1:1/v1"), TUNED, {})
