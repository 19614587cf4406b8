"""The peer's row in `toolsearch eval`: FastMCP's BM25 search transform over the same catalog, in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands.cli import main
from commands.retrieval.fastmcp_peer import PeerSearch, evaluate_peer, peer_names, searched_names, version
from commands.retrieval.fastmcp_peer import main as serve
from commands.retrieval.scoring import PEER, EvalQuery
from toolsearch.catalog import CatalogTool

WEATHER = CatalogTool(
    "weather::forecast",
    "Weather",
    "forecast",
    "Get the weather forecast for a city",
    {"type": "object", "properties": {"city": {"type": "string", "description": "the city's name"}}},
)
MAIL = CatalogTool(
    "mail::send",
    "Mail",
    "send",
    "Send an email message to a recipient",
    {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}},
)
STOCKS = CatalogTool("stocks::quote", "Stocks", "quote", "Look up the latest price of a stock ticker", {})
CATALOG = [WEATHER, MAIL, STOCKS]


def test_tools_are_named_as_the_proxy_names_a_configurations_servers() -> None:
    assert peer_names(CATALOG) == ["Weather_forecast", "Mail_send", "Stocks_quote"]
    assert peer_names([WEATHER]) == ["forecast"]  # one server: FastMCP's proxy connects to it directly


async def test_the_search_ranks_by_the_words_a_query_shares_with_a_tool() -> None:
    async with PeerSearch.over(CATALOG, depth=10) as search:
        assert (await search.rank("what is the weather forecast in Paris"))[0] == "Weather_forecast"
        assert (await search.rank("email my landlord"))[0] == "Mail_send"
        assert await search.rank("zzzz qqqq") == []  # no shared word: the transform answers nothing


def test_an_answer_without_a_list_of_tools_is_an_error_that_says_so() -> None:
    assert searched_names({"result": [{"name": "a"}, {"name": "b"}]}) == ["a", "b"]
    with pytest.raises(RuntimeError, match="without a list of tools"):
        searched_names({"result": "No tools matched"})


def test_the_proxy_refuses_a_catalog_it_cannot_read_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.jsonl"
    with pytest.raises(SystemExit) as exited:
        serve(["--catalog", str(missing), "--catalog-url", "http://127.0.0.1:9", "--port", "9"])
    assert exited.value.code == 2 and str(missing) in capsys.readouterr().err


def test_the_peer_is_scored_with_the_same_metrics_and_splits() -> None:
    queries = [
        EvalQuery("q1", "weather forecast for Lyon", ("weather::forecast",)),
        EvalQuery("q2", "send an email", ("mail::send",)),
        EvalQuery("q3", "price of a stock and the weather", ("stocks::quote", "weather::forecast")),
    ]
    report = evaluate_peer(CATALOG, queries, name="tiny", progress=False)
    assert (report.method, report.model, report.tools, report.queries) == (PEER, f"fastmcp {version()}", 3, 3)
    assert report.rankings["q1"][0] == "weather::forecast"
    assert report.metrics["R@1"] == pytest.approx(100 * (1 + 1 + 0.5) / 3, abs=0.01)
    assert report.metrics["completeness@5"] == 100.0
    assert sum(report.split_queries.values()) == 3


def test_eval_prints_the_peer_row_without_loading_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog, queries = tmp_path / "tools.jsonl", tmp_path / "queries.jsonl"
    rows = [
        {"id": t.id, "server": t.server, "name": t.name, "description": t.description, "inputSchema": {}}
        for t in CATALOG
    ]
    catalog.write_text("".join(json.dumps(row) + "\n" for row in rows))
    queries.write_text(json.dumps({"id": "q1", "query": "send an email", "relevant": ["mail::send"]}) + "\n")
    args = ["eval", "--catalog", str(catalog), "--queries", str(queries), "--method", PEER]
    assert main([*args, "--model", str(tmp_path / "no-model-here")]) == 0
    table = capsys.readouterr().out
    assert "embedder" not in table  # no model was loaded
    assert PEER in table and f"fastmcp {version()}" in table
