"""What the indexer makes of an OpenAI-compatible inference server's answers and settings, without
one: a server that never answers costs its timeout, an answer that is not the vectors asked for is
refused saying what is wrong, and the settings are checked naming the key.

The real server (Infinity) is the system tier's: tests/system/test_embedding_server.py.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from indexer.api.embedding import server_embedder
from indexer.embedder import EmbedderError
from indexer.embedder.server import ServerEmbedder, ServerSettings, ServerUnavailable, read_answer
from tests.support.embedding_server import MODELS
from toolsearch.config import ConfigError, load_config
from toolsearch.sections.indexer_settings import TUNED_MODEL_NAME
from toolsearch.sections.indexer_settings import EmbeddingServer as Settings


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


TUNED = MODELS / TUNED_MODEL_NAME
KEY_ENV = "TEST_EMBEDDING_KEY"


def settings(url: str) -> Settings:
    return Settings(url=url, model=TUNED_MODEL_NAME, api_key_env=KEY_ENV)


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
