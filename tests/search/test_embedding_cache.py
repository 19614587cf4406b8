"""The embedding cache and query micro-batching, on the fake embedder; one check on the real model."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from commands.retrieval.model import prepare_default_model
from indexer.embedder import Embedder, EmbedderError, FakeEmbedder, Vectors
from indexer.embedder.sentence import padding_batches
from indexer.retrieval.embeddings import Embeddings, QueryPath
from indexer.retrieval.model_gate import padded_chunks
from indexer.state.disk import DiskEmbeddings

ROOT = Path(__file__).resolve().parents[2]
TOOL_TEXTS = [
    "create_issue: Open a new issue in a GitHub repository with a title and body",
    "list_issues: List the open issues of a repository, filtered by label",
    "send_email: Send an email message to a recipient with a subject",
    "get_weather: Current weather and forecast for a city",
    "query_database: Run a read-only SQL query against the analytics database",
]


class HeldEmbedder(FakeEmbedder):
    """A fake whose calls wait for `release`, so a test can hold a model call in flight."""

    def __init__(self, fail_first: bool = False) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self._fail_first = fail_first

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.batches.append(list(texts))
        self.entered.set()
        if not self.release.wait(10):
            raise TimeoutError("the test never released the model call")
        if self._fail_first:
            self._fail_first = False
            raise EmbedderError("the model failed")
        return super().embed(texts)


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Yield to the loop until `condition` holds; fail after `limit` seconds."""
    async with asyncio.timeout(limit):
        # polled: what the condition reads may change in another thread, which has no event to set
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder()


def on_disk(embedder: Embedder, folder: Path) -> Embeddings:
    """An embedding cache whose second tier is the SQLite store in `folder`, as the memory state's."""
    return Embeddings(embedder, DiskEmbeddings(folder, embedder.identity, embedder.dimension))


def test_documents_are_embedded_once_then_answered_from_memory(fake: FakeEmbedder) -> None:
    embeddings = Embeddings(fake)
    first = embeddings.embed_documents(TOOL_TEXTS)
    again = embeddings.embed_documents(list(reversed(TOOL_TEXTS)))
    assert fake.calls == 1 and embeddings.model_calls == 1
    assert embeddings.texts_embedded == len(TOOL_TEXTS)
    assert embeddings.cache_misses == len(TOOL_TEXTS) and embeddings.cache_hits == len(TOOL_TEXTS)
    np.testing.assert_array_equal(again, first[::-1])
    np.testing.assert_array_equal(first, FakeEmbedder().embed(TOOL_TEXTS))
    assert first.dtype == np.float32 and first.shape == (len(TOOL_TEXTS), fake.dimension)


def test_only_new_texts_reach_the_model_in_one_batched_call(fake: FakeEmbedder) -> None:
    embeddings = Embeddings(fake)
    embeddings.embed_documents(TOOL_TEXTS[:2])
    embeddings.embed_documents([*TOOL_TEXTS, TOOL_TEXTS[3]])
    assert fake.calls == 2
    assert fake.texts_embedded == len(TOOL_TEXTS)


def test_a_restart_on_the_same_cache_dir_embeds_nothing_again(tmp_path: Path) -> None:
    before = on_disk(FakeEmbedder(), tmp_path)
    vectors = before.embed_documents(TOOL_TEXTS)
    before.close()
    fresh_model = FakeEmbedder()
    after = on_disk(fresh_model, tmp_path)
    np.testing.assert_array_equal(after.embed_documents(TOOL_TEXTS), vectors)
    assert fresh_model.calls == 0 and after.model_calls == 0
    assert after.cache_hits == len(TOOL_TEXTS)
    after.close()


def test_caches_of_different_models_never_answer_for_each_other(tmp_path: Path) -> None:
    small = on_disk(FakeEmbedder(dimension=32), tmp_path)
    small.embed_documents(TOOL_TEXTS)
    small.close()
    other_model = FakeEmbedder(dimension=48)
    other = on_disk(other_model, tmp_path)
    assert other.embed_documents(TOOL_TEXTS).shape == (len(TOOL_TEXTS), 48)
    assert other_model.calls == 1
    other.close()


def _cache_file(folder: Path) -> Path:
    (found,) = folder.glob("*.sqlite3")
    return found


def _truncate(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def _scribble(raw: bytes) -> bytes:
    middle = len(raw) // 2
    return raw[:middle] + os.urandom(8192) + raw[middle + 8192 :]


def _overwrite_header(raw: bytes) -> bytes:
    return os.urandom(100) + raw[100:]


@pytest.mark.parametrize("damage", [_truncate, _scribble, _overwrite_header], ids=lambda f: f.__name__[1:])
def test_a_damaged_cache_file_is_detected_discarded_and_rebuilt(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    texts = [f"tool {i}: does task {i} with options {' '.join(map(str, range(i % 40)))}" for i in range(2000)]
    writer = on_disk(FakeEmbedder(dimension=384), tmp_path)
    expected = writer.embed_documents(texts)
    writer.close()
    path = _cache_file(tmp_path)
    path.write_bytes(damage(path.read_bytes()))

    model = FakeEmbedder(dimension=384)
    reader = on_disk(model, tmp_path)
    np.testing.assert_array_equal(reader.embed_documents(texts), expected)
    assert model.texts_embedded == len(texts)  # nothing trusted from the damaged file
    reader.close()
    assert path.with_suffix(".corrupt").exists()

    rebuilt_model = FakeEmbedder(dimension=384)
    rebuilt = on_disk(rebuilt_model, tmp_path)
    np.testing.assert_array_equal(rebuilt.embed_documents(texts), expected)
    assert rebuilt_model.calls == 0
    rebuilt.close()


def test_a_malformed_stored_vector_is_embedded_again_and_replaced(tmp_path: Path) -> None:
    writer = on_disk(FakeEmbedder(), tmp_path)
    expected = writer.embed_documents(TOOL_TEXTS)
    writer.close()
    with sqlite3.connect(_cache_file(tmp_path)) as connection:
        connection.execute(
            "UPDATE vectors SET vector = ? WHERE key = ?", (b"\0" * 12, writer.key(TOOL_TEXTS[0]))
        )
        connection.execute(
            "UPDATE vectors SET vector = ? WHERE key = ?",
            (np.full(64, 3.0, np.float32).tobytes(), writer.key(TOOL_TEXTS[1])),
        )
    connection.close()
    model = FakeEmbedder()
    reader = on_disk(model, tmp_path)
    np.testing.assert_array_equal(reader.embed_documents(TOOL_TEXTS), expected)
    assert model.texts_embedded == 2
    reader.close()
    again = FakeEmbedder()
    on_disk(again, tmp_path).embed_documents(TOOL_TEXTS)
    assert again.calls == 0


def test_document_builds_from_several_threads_get_consistent_vectors(fake: FakeEmbedder) -> None:
    embeddings = Embeddings(fake, document_batch=7)
    texts = [f"tool {i} for task {i % 13}" for i in range(300)]
    results: list[Vectors] = []

    def build() -> None:
        results.append(embeddings.embed_documents(texts))

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    expected = FakeEmbedder().embed(texts)
    assert len(results) == 4
    for result in results:
        np.testing.assert_array_equal(result, expected)


async def test_a_lone_query_starts_its_model_call_at_once() -> None:
    held = HeldEmbedder()
    embeddings = Embeddings(held)
    task = asyncio.create_task(embeddings.embed_query("send an email"))
    assert await asyncio.to_thread(held.entered.wait, 10)
    held.release.set()
    vector = await asyncio.wait_for(task, 10)
    np.testing.assert_array_equal(vector, FakeEmbedder().embed(["send an email"])[0])
    embeddings.close()


async def test_queries_arriving_during_a_model_call_share_the_next_one() -> None:
    held = HeldEmbedder()
    embeddings = Embeddings(held)
    first = asyncio.create_task(embeddings.embed_query("query 0"))
    assert await asyncio.to_thread(held.entered.wait, 10)
    queries = [f"query {i}" for i in range(1, 21)]
    others = [asyncio.create_task(embeddings.embed_query(text)) for text in [*queries, "query 5"]]
    await until(lambda: embeddings.cache_misses + embeddings.cache_hits == 22)
    held.release.set()
    results = await asyncio.wait_for(asyncio.gather(first, *others), 10)
    assert embeddings.model_calls == 2
    assert held.batches == [["query 0"], queries]
    expected = FakeEmbedder().embed(["query 0", *queries, "query 5"])
    np.testing.assert_array_equal(np.stack(results), expected)
    embeddings.close()


async def test_a_repeated_query_is_answered_from_the_lru_without_the_model(fake: FakeEmbedder) -> None:
    embeddings = Embeddings(fake)
    first = await embeddings.embed_query("weather in Paris")
    second = await embeddings.embed_query("weather in Paris")
    assert fake.calls == 1 and embeddings.model_calls == 1
    assert embeddings.cache_hits == 1
    np.testing.assert_array_equal(first, second)
    assert first.shape == (fake.dimension,) and not first.flags.writeable
    embeddings.close()


async def test_the_query_lru_forgets_the_least_recently_used(fake: FakeEmbedder) -> None:
    embeddings = Embeddings(fake, queries=QueryPath(items=2))
    for text in ("a", "b", "a", "c"):
        await embeddings.embed_query(text)
    calls = fake.calls
    await embeddings.embed_query("a")
    assert fake.calls == calls
    await embeddings.embed_query("b")
    assert fake.calls == calls + 1
    embeddings.close()


async def test_a_failed_model_call_fails_its_queries_and_the_next_one_succeeds() -> None:
    held = HeldEmbedder(fail_first=True)
    held.release.set()
    embeddings = Embeddings(held)
    with pytest.raises(EmbedderError, match="the model failed"):
        await embeddings.embed_query("first")
    vector = await embeddings.embed_query("first")
    assert vector.shape == (held.dimension,)
    embeddings.close()


async def test_a_cancelled_waiter_does_not_cancel_others_waiting_for_the_same_query() -> None:
    held = HeldEmbedder()
    embeddings = Embeddings(held)
    leaving = asyncio.create_task(embeddings.embed_query("shared"))
    staying = asyncio.create_task(embeddings.embed_query("shared"))
    assert await asyncio.to_thread(held.entered.wait, 10)
    leaving.cancel()
    held.release.set()
    vector = await asyncio.wait_for(staying, 10)
    assert vector.shape == (held.dimension,)
    assert held.batches == [["shared"]]
    embeddings.close()


async def query_during_build(embeddings: Embeddings, held: HeldEmbedder, texts: list[str]) -> Vectors:
    """Embed `texts` as a build whose first model call is held until the query "find the weather" is
    queued at the model gate (an internal detail these tests are about); returns the build's vectors."""
    build = asyncio.create_task(asyncio.to_thread(embeddings.embed_documents, texts))
    assert await asyncio.to_thread(held.entered.wait, 10)
    query = asyncio.create_task(embeddings.embed_query("find the weather"))
    await until(lambda: embeddings._gate.queries_waiting == 1)
    held.release.set()
    vectors, _ = await asyncio.wait_for(asyncio.gather(build, query), 10)
    return vectors


async def test_a_query_goes_before_the_next_chunk_of_a_document_build() -> None:
    held = HeldEmbedder()
    embeddings = Embeddings(held, document_batch=2)
    await query_during_build(embeddings, held, TOOL_TEXTS)
    longest_first = sorted(TOOL_TEXTS, key=len, reverse=True)
    assert held.batches == [longest_first[:2], ["find the weather"], longest_first[2:4], longest_first[4:]]
    embeddings.close()


async def test_a_waiting_query_runs_before_the_rest_of_a_large_document_build() -> None:
    held = HeldEmbedder()
    embeddings = Embeddings(held)  # the default chunking
    texts = [f"tool {i}: " + "does one thing with its options " * (1 + i % 12) for i in range(400)]
    vectors = await query_during_build(embeddings, held, texts)
    first, second, *rest = held.batches
    assert second == ["find the weather"]
    # the query waited for one small chunk, not for hundreds of texts of the build
    assert len(first) * max(map(len, first)) <= 2048 and len(first) < 10
    assert sorted(text for batch in [first, *rest] for text in batch) == sorted(texts)
    np.testing.assert_array_equal(vectors, FakeEmbedder().embed(texts))
    embeddings.close()


async def test_document_chunks_shrink_while_queries_come_and_stay_large_when_none_do() -> None:
    texts = [f"tool {i}: " + "does one thing with its options " * 4 for i in range(40)]  # 140 chars
    quiet = HeldEmbedder()
    quiet.release.set()
    Embeddings(quiet, document_chars=2048, busy_document_chars=512).embed_documents(texts)
    assert max(map(len, quiet.batches)) == 2048 // max(map(len, texts))  # nobody searched: large chunks

    held = HeldEmbedder()
    # a long window: "a query used the model lately" must not depend on how fast this machine is
    embeddings = Embeddings(held, document_chars=2048, busy_document_chars=512, queries_recent=3600.0)
    await query_during_build(embeddings, held, texts)
    first, second, *rest = held.batches
    assert len(first) * max(map(len, first)) > 512  # sized before any query came
    assert second == ["find the weather"]
    assert rest and all(len(chunk) * max(map(len, chunk)) <= 512 for chunk in rest)
    assert sorted(text for batch in [first, *rest] for text in batch) == sorted(texts)
    embeddings.close()


def test_document_chunks_go_longest_first_and_stay_within_their_padded_size() -> None:
    lengths = [10, 300, 40, 1200, 290, 35, 5, 310, 45]
    chunks = list(padded_chunks(lengths, max_items=3, max_padded=1000))
    assert sorted(row for chunk in chunks for row in chunk) == list(range(len(lengths)))
    flat = [lengths[row] for chunk in chunks for row in chunk]
    assert flat == sorted(lengths, reverse=True)
    assert chunks[0] == [3]  # longer than the budget: alone
    for chunk in chunks[1:]:
        assert len(chunk) <= 3 and len(chunk) * lengths[chunk[0]] <= 1000
    assert list(padded_chunks([], 3, 1000)) == []


async def test_an_embedder_returning_the_wrong_shape_is_reported() -> None:
    class Broken(FakeEmbedder):
        def embed(self, texts: Sequence[str]) -> Vectors:
            return super().embed([*texts, "extra"])

    embeddings = Embeddings(Broken())
    with pytest.raises(EmbedderError, match="shape"):
        embeddings.embed_documents(["one"])
    with pytest.raises(EmbedderError, match="shape"):
        await embeddings.embed_query("one")
    embeddings.close()


@pytest.fixture(scope="session")
def minilm() -> Embedder:
    """The real default model, loaded once, with any network connection made to fail loudly."""
    from indexer.embedder import SentenceTransformerEmbedder

    model_dir = prepare_default_model(ROOT / "models")

    def refuse(self: socket.socket, address: object) -> None:
        raise AssertionError(f"the model loader tried to reach {address}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        embedder = SentenceTransformerEmbedder(model_dir)
    return embedder


async def test_the_real_model_puts_related_tool_texts_closer_than_unrelated_ones(minilm: Embedder) -> None:
    embeddings = Embeddings(minilm)
    vectors = embeddings.embed_documents(TOOL_TEXTS)
    assert vectors.shape == (len(TOOL_TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ vectors.T
    create_issue, list_issues, send_email, weather, _ = range(len(TOOL_TEXTS))
    assert similarity[create_issue, list_issues] > similarity[create_issue, send_email]
    assert similarity[create_issue, list_issues] > similarity[create_issue, weather]
    query = await embeddings.embed_query("what is the temperature in Berlin tomorrow")
    assert int(np.argmax(vectors @ query)) == weather
    embeddings.close()


def test_the_real_model_names_its_weights_and_counts_word_pieces(minilm: Embedder) -> None:
    assert minilm.identity.startswith("sentence-transformers:all-MiniLM-L6-v2:")
    assert minilm.dimension == 384 and minilm.max_tokens == 256
    assert minilm.count_tokens("hello world") == 4  # [CLS] hello world [SEP]
    assert minilm.count_tokens("word " * 1000) == 1002  # counted untruncated


def test_a_lone_short_query_runs_on_one_thread_and_a_large_batch_on_all_of_them() -> None:
    import torch

    from indexer.embedder import SentenceTransformerEmbedder
    from indexer.embedder.sentence import PARALLEL_CHARS

    before = torch.get_num_threads()
    try:
        embedder = SentenceTransformerEmbedder(prepare_default_model(ROOT / "models"), threads=3)
        embedder.embed(["weather in Berlin"])
        assert torch.get_num_threads() == 1
        embedder.embed(["a tool that files an issue in a tracker"] * (PARALLEL_CHARS // 20))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_loading_a_missing_model_folder_says_how_to_prepare_it(tmp_path: Path) -> None:
    from indexer.embedder import SentenceTransformerEmbedder

    with pytest.raises(EmbedderError, match="toolsearch model prepare"):
        SentenceTransformerEmbedder(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmbedderError, match="not a sentence-transformers model"):
        SentenceTransformerEmbedder(tmp_path / "empty")


def test_a_long_query_and_its_short_sentences_go_to_the_model_in_separate_batches() -> None:
    # the whole query, then its three sentences: one batch would be mostly padding
    assert padding_batches([240, 80, 75, 70], max_size=64) == [[0], [1, 2, 3]]


def test_texts_of_like_length_share_a_batch_up_to_the_batch_size() -> None:
    assert padding_batches([50, 48, 52, 49, 51], max_size=64) == [[2, 4, 0, 3, 1]]
    assert padding_batches([50] * 5, max_size=2) == [[0, 1], [2, 3], [4]]
    assert padding_batches([], max_size=8) == []


def test_the_real_model_gives_each_text_the_same_vector_whichever_batch_it_lands_in(
    minilm: Embedder,
) -> None:
    texts = [
        "Get the weather forecast for Paris tomorrow, then email it to Bob and book a table for two.",
        "Get the weather forecast for Paris tomorrow.",
        "Then email it to Bob.",
        "Book a table.",
        *TOOL_TEXTS,
    ]
    together = minilm.embed(texts)
    alone = np.vstack([minilm.embed([text]) for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
