"""Hybrid search and tool text, on the deterministic fake embedder: fusion, names, keywords, edges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from indexer.embedder import FakeEmbedder
from indexer.retrieval import text as text_module
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, SearchIndex, SearchSettings, build_tool_index
from indexer.retrieval.text import (
    document_chunks,
    document_views,
    estimate_word_pieces,
    fits_window,
    lexical_text,
    lexical_tokens,
    name_key,
    query_texts,
    split_identifier,
    tool_text,
)

EMBEDDER = FakeEmbedder(dimension=64)


def tool(name: str, description: str, **parameters: str) -> dict[str, Any]:
    properties = {key: {"type": "string", "description": about} for key, about in parameters.items()}
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
    }


CATALOG: list[tuple[str, dict[str, Any]]] = [
    ("weather", tool("get_forecast", "Weather forecast for a city for the next days", city="City name")),
    ("weather", tool("get_alerts", "Severe weather alerts issued for a region", region="Region code")),
    ("github", tool("create_issue", "Open a new issue in a repository", title="Issue title")),
    ("github", tool("list_pull_requests", "List the open pull requests of a repository")),
    ("mail", tool("send_email", "Send an email message to a recipient", to="Recipient address")),
    ("billing", tool("createInvoice", "Bill a customer for an order", amount="Amount due")),
    ("billing", tool("refund_payment", "Give money back for a charge")),
    ("maps", tool("get_forecast", "Traffic forecast along a driving route", route="Route id")),
]


def build(
    catalog: Sequence[tuple[str, Mapping[str, Any]]] = CATALOG, settings: SearchSettings | None = None
) -> tuple[SearchIndex, list[str]]:
    """An index named like the indexer does: names shared by two backends get the backend prefix."""
    counts: dict[str, int] = {}
    for _, definition in catalog:
        counts[definition["name"]] = counts.get(definition["name"], 0) + 1
    names = [d["name"] if counts[d["name"]] == 1 else f"{b}_{d['name']}" for b, d in catalog]
    aliases = [
        sorted({d["name"], f"{b}_{d['name']}"} - {n}) for (b, d), n in zip(catalog, names, strict=True)
    ]
    index = build_tool_index(
        [d for _, d in catalog],
        [b for b, _ in catalog],
        names,
        aliases,
        EMBEDDER.embed,
        settings or SearchSettings(),
    )
    return index, names


def search(
    index: SearchIndex, query: str, limit: int = 5, keywords: Sequence[str] = (), **kw: Any
) -> list[Hit]:
    return index.search(
        Query.embedded(query, EMBEDDER.embed(query_texts(query, keywords)), keywords), limit, **kw
    )


def named(names: Sequence[str], hits: Sequence[Hit]) -> list[str]:
    return [names[hit.position] for hit in hits]


def test_identifiers_split_into_words() -> None:
    assert split_identifier("get_forecast") == "get forecast"
    assert split_identifier("getForecast") == "get Forecast"
    assert split_identifier("HTTPServer-v2.list") == "HTTP Server v2 list"
    assert name_key("weather.getForecast") == name_key("weather_get_forecast") == "weather_get_forecast"


def test_tool_text_has_backend_name_words_description_and_parameters() -> None:
    text = tool_text(tool("getForecast", "Weather **forecast**", city_name="The city"), "weather-api")
    assert text == "weather api get Forecast: Weather forecast Parameters: city name (The city)"
    titled = {"name": "songs_v2", "title": "Top songs chart", "description": "Charts"}
    assert "Top songs chart" in tool_text(titled, "")


def test_long_text_is_chunked_not_cut() -> None:
    words = [f"word{i}" for i in range(600)]
    definition = tool("long_tool", " ".join(words), tail_parameter="the last thing said")
    views = document_views(definition, "backend", count_tokens=EMBEDDER.count_tokens, max_tokens=128)
    assert all(EMBEDDER.count_tokens(view) <= 128 for view in views)
    assert len(views) > 4
    assert "tail parameter" in views[-1]  # the end of the text is embedded too
    assert all(view.startswith("backend long tool") for view in views)
    covered = {w for view in views for w in view.split()}
    assert set(words) <= covered
    assert document_chunks("short text", "head") == ["short text"]


def test_dense_text_is_cut_until_every_piece_fits() -> None:
    def count(text: str) -> int:  # a tokenizer that reads symbols as one piece each
        return (
            2
            + sum(1 if ch.isalpha() else 0 for ch in text.replace(" ", "")) // 4
            + sum(1 for ch in text if not ch.isalnum() and ch != " ")
        )

    text = "plain words here " * 40 + "{" + '"k":[1,2,3],' * 300 + "} " + "x" * 5000 + " the end"
    chunks = document_chunks(text, "tool head", count, 64)
    assert all(count(chunk) <= 64 for chunk in chunks)
    assert chunks[-1].endswith("the end") and all(c.startswith("tool head: ") for c in chunks[1:])


def test_a_short_ascii_text_fits_the_window_without_a_count() -> None:
    def refuse(text: str) -> int:
        raise AssertionError(f"counted {text!r}")

    assert fits_window("x" * 61, refuse, 64)  # 61 characters and the special tokens: at most 64 pieces
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return len(text) + 2

    assert fits_window("x" * 62, count, 64) and not fits_window("x" * 63, count, 64)
    assert not fits_window("한" * 30, lambda text: 3 * len(text) + 2, 64)  # jamo: counted, not assumed
    assert counted == ["x" * 62, "x" * 63]


@pytest.mark.parametrize("count_tokens", [estimate_word_pieces, EMBEDDER.count_tokens])
def test_skipping_the_count_of_short_texts_cuts_the_same_views(
    count_tokens: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_tool = tool("long_tool", " ".join(f"word{i}" for i in range(300)), tail="the last thing said")
    catalog = [*CATALOG, ("backend", long_tool)]
    sizes = (16, 24, 64, 128)
    skipped = [document_views(d, b, count_tokens, size) for b, d in catalog for size in sizes]
    monkeypatch.setattr(text_module, "_UNCOUNTED_ROOM", 10**9)  # every text counted, as before
    assert skipped == [document_views(d, b, count_tokens, size) for b, d in catalog for size in sizes]


def test_an_index_from_tool_documents_equals_one_from_texts_and_views() -> None:
    index, names = build()
    views = [document_views(d, b, estimate_word_pieces, 256) for b, d in CATALOG]
    owners = np.repeat(np.arange(len(views)), [len(v) for v in views])
    direct = SearchIndex.build(
        [lexical_text(d, b) for b, d in CATALOG],
        names,
        [[] for _ in names],
        EMBEDDER.embed([view for tool_views in views for view in tool_views]),
        SearchSettings(),
        owners=owners,
        backends=[b for b, _ in CATALOG],
    )
    for query in ("weather forecast for a city", "refund a charge. then email the customer"):
        embedded = Query.embedded(query, EMBEDDER.embed(query_texts(query)))
        for method in ("dense", "lexical"):
            assert np.array_equal(index.scores(embedded, method), direct.scores(embedded, method))


def test_query_texts_add_sentences_of_a_long_query() -> None:
    assert query_texts("  find the weather  ") == ["find the weather"]
    assert query_texts(" ", ["invoice", " ", "refund"]) == ["invoice refund"]
    whole, *parts = query_texts("Get the weather in Paris. Then email it to Bob! ok")
    assert whole.startswith("Get the weather") and parts == [
        "Get the weather in Paris.",
        "Then email it to Bob!",
    ]


def test_lexical_tokens_are_stemmed_without_stop_words() -> None:
    assert lexical_tokens(["The forecasts of getForecast"]) == ["forecast", "get", "forecast"]


def test_results_are_filled_to_the_limit() -> None:
    index, _ = build()
    for method in ("hybrid", "dense", "lexical"):
        hits = search(index, "zzz qqq nothing matches this", limit=6, method=method)
        assert len(hits) == 6 and len({h.position for h in hits}) == 6
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(search(index, "weather", limit=50)) == len(CATALOG)


def test_a_strong_hit_of_either_arm_is_kept() -> None:
    index, names = build()
    # lexical only: "refund" is in one tool's name, and the fake's vectors know nothing of meaning
    assert named(names, search(index, "refund", limit=2))[0] == "refund_payment"
    assert "send_email" in named(names, search(index, "email message recipient", limit=3))


def test_keywords_feed_the_lexical_arm() -> None:
    index, names = build()
    query = "take care of this for me"
    before = named(names, search(index, query, limit=3, method="lexical"))
    after = named(names, search(index, query, limit=3, keywords=["invoice"], method="lexical"))
    assert after[0] == "createInvoice" and before != after
    # keywords alone are a query
    assert named(names, search(index, "", limit=1, keywords=["invoice"]))[0] == "createInvoice"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("send_email", "send_email"),
        ("mail_send_email", "send_email"),
        ("sendEmail", "send_email"),
        ("weather_get_forecast", "weather_get_forecast"),
        ("maps_get_forecast", "maps_get_forecast"),
        ("refund_payment", "refund_payment"),
        ("billing_createInvoice", "createInvoice"),
    ],
)
def test_an_exact_name_comes_first(query: str, expected: str) -> None:
    index, names = build()
    hits = search(index, query, limit=3)
    assert names[hits[0].position] == expected
    assert hits[0].score > hits[1].score


def test_a_name_shared_by_backends_brings_every_owner_first() -> None:
    index, names = build()
    assert set(named(names, search(index, "get_forecast", limit=4))[:2]) == {
        "weather_get_forecast",
        "maps_get_forecast",
    }
    assert len(search(index, "get_forecast", limit=1)) == 1


def test_min_score_drops_weak_hits_but_keeps_the_best() -> None:
    index, names = build(settings=SearchSettings(min_score=1e6))
    hits = search(index, "refund", limit=5)
    assert named(names, hits) == ["refund_payment"]
    loose, _ = build(settings=SearchSettings(min_score=-1e6))
    assert len(search(loose, "refund", limit=5)) == 5
    middle, _ = build(settings=SearchSettings(min_score=0.5))
    assert all(h.score >= 0.5 for h in search(middle, "weather forecast city", limit=8))


def test_nothing_only_for_an_empty_catalog_or_query() -> None:
    index, _ = build()
    assert search(index, "   ") == []
    assert search(index, "", keywords=["  "]) == []
    assert search(index, "weather", limit=0) == []
    empty = SearchIndex.build([], [], [], np.zeros((0, 64), dtype=np.float32), SearchSettings())
    assert empty.search(Query.embedded("weather", EMBEDDER.embed(["weather"])[0]), 5) == []
    single, _ = build(CATALOG[:1])
    assert len(search(single, "anything at all")) == 1
    wordless, names = build([("", {"name": "a", "description": "the"}), ("", {"name": "of"})])
    assert len(search(wordless, "the weather", keywords=["of"])) == 2  # no term to index: dense only
    assert named(names, search(wordless, "of"))[0] == "of"


def test_a_tool_scores_as_its_best_view() -> None:
    texts = ["alpha", "beta"]
    vectors = EMBEDDER.embed(["unrelated words", "alpha", "kiwi banana mango", "beta"])
    owners = np.array([0, 1, 1, 0])  # tool 1 owns the fruit view
    index = SearchIndex.build(texts, ["a", "b"], [[], []], vectors, SearchSettings(), owners=owners)
    hit = index.search(Query.embedded("kiwi banana mango", EMBEDDER.embed(["kiwi banana mango"])), 1, "dense")
    assert hit[0].position == 1
    with pytest.raises(ValueError, match="at least one vector"):
        SearchIndex.build(texts, ["a", "b"], [[], []], vectors[:2], SearchSettings(), owners=np.array([0, 0]))
    with pytest.raises(ValueError, match="one row per view"):
        SearchIndex.build(texts, ["a", "b"], [[], []], vectors, SearchSettings())
    with pytest.raises(ValueError, match="dimension"):
        index.search(Query.embedded("x", np.zeros(3, dtype=np.float32)), 1)


def test_weights_choose_between_the_arms() -> None:
    index, names = build(settings=replace(SearchSettings(), dense_weight=0.0, backend_weight=0.0))
    lexical = build(settings=SearchSettings())[0]
    query = "forecast for a driving route"
    only_lexical = named(names, search(index, query, limit=len(CATALOG), method="hybrid"))
    assert only_lexical == named(names, search(lexical, query, limit=len(CATALOG), method="lexical"))


def test_concurrent_searches_agree() -> None:
    index, _ = build()
    queries = ["weather alerts", "open an issue", "email", "refund a charge", "invoice a customer"] * 20
    expected = [search(index, q) for q in queries]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda q: search(index, q), queries)) == expected
