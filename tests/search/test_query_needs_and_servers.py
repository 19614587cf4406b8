"""A multi-step task read need by need, and servers read as units, on the deterministic fake embedder."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from indexer.embedder import FakeEmbedder
from indexer.retrieval.documents import server_documents
from indexer.retrieval.query import Query
from indexer.retrieval.search import SearchSettings, build_tool_index
from indexer.retrieval.text import MAX_QUERY_PARTS, query_needs, query_texts, server_text

EMBEDDER = FakeEmbedder(dimension=64)


def tool(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": {"type": "object"}}


def test_a_task_is_cut_into_its_needs() -> None:
    task = (
        "Plan my trip:\n"
        "1. find flights from Paris to Rome\n"
        "2) book a hotel near the station\n"
        "- check the weather forecast; also convert euros to dollars. "
        "Search the reviews and then email the summary to Ann. Thanks!"
    )
    assert query_needs(task) == [
        "Plan my trip:",
        "find flights from Paris to Rome",
        "book a hotel near the station",
        "check the weather forecast",
        "also convert euros to dollars.",  # a step word after ";" stays: measured so
        "Search the reviews",
        "email the summary to Ann.",
    ]
    whole, *needs = query_texts(task)
    assert whole.startswith("Plan my trip: 1. find flights") and needs == query_needs(task)
    assert query_texts("weather in Paris") == ["weather in Paris"]  # one need: the whole query alone
    many = ". ".join(f"step {n} fetch item{n}" for n in range(40))
    assert len(query_texts(many)) == 1 + MAX_QUERY_PARTS


def test_a_server_reads_as_its_name_what_it_says_and_a_line_per_tool() -> None:
    head, text = server_text(
        "weather_data",
        [tool("get_forecast", "Forecast for a city. Uses the national service."), tool("alerts", "")],
        about="Weather Data: forecasts and alerts",
    )
    assert head == "weather data Weather Data: forecasts and alerts"
    assert text == f"{head}: get forecast (Forecast for a city.); alerts"


CATALOG = [
    ("weather", tool("get_forecast", "Forecast for a city")),
    ("weather", tool("get_alerts", "Severe weather alerts for a region")),
    ("mail", tool("send_email", "Send an email message")),
    ("mail", tool("list_inbox", "List the messages of the inbox")),
    ("billing", tool("refund_payment", "Give money back for a charge")),
]


def build(settings: SearchSettings) -> Any:
    return build_tool_index(
        [d for _, d in CATALOG],
        [b for b, _ in CATALOG],
        [d["name"] for _, d in CATALOG],
        [[] for _ in CATALOG],
        EMBEDDER.embed,
        settings,
        about={"mail": "Mail: read and send email"},
    )


def test_each_need_reaches_its_tool_through_both_arms() -> None:
    index = build(SearchSettings())
    query = "Get the forecast for Paris. Then send an email to Bob about it."
    hits = index.search(Query.embedded(query, EMBEDDER.embed(query_texts(query))), 2)
    assert {hit.position for hit in hits} == {0, 2}
    # a caller that embedded the whole query alone still gets an answer, from the whole query
    assert len(index.search(Query.embedded(query, EMBEDDER.embed(query_texts(query)[:1])), 3)) == 3


def test_the_server_arm_lifts_a_servers_tools_and_turns_off_with_its_weight() -> None:
    query = "read and send email"
    embedded = Query.embedded(query, EMBEDDER.embed(query_texts(query)))
    with_servers = build(SearchSettings()).scores(embedded, "hybrid")
    without = build(replace(SearchSettings(), server_weight=0.0)).scores(embedded, "hybrid")
    assert not np.allclose(with_servers, without)
    lift = with_servers - without
    assert lift[2] == pytest.approx(lift[3], abs=1e-5) and lift[2] > lift[0]  # both mail tools, more
    documents = server_documents([d for _, d in CATALOG], [b for b, _ in CATALOG], EMBEDDER.embed)
    assert [d.backend for d in documents] == ["billing", "mail", "weather"]
    assert all(d.vectors.shape[0] >= 1 and not d.vectors.flags.writeable for d in documents)
