"""A caller's allowed set applied inside the search over the catalog's shared index."""

from __future__ import annotations

import numpy as np
import pytest

from indexer.retrieval.search import SearchSettings
from tests.search.test_hybrid_search import CATALOG, build, named, search

WITHOUT_LIFTS = SearchSettings(backend_weight=0.0, server_weight=0.0)


def mask(names: list[str], allowed: set[str]) -> np.ndarray:
    return np.array([name in allowed for name in names])


@pytest.mark.parametrize("method", ["hybrid", "dense", "lexical"])
def test_a_search_over_an_allowed_set_returns_only_allowed_tools_and_still_fills_the_limit(
    method: str,
) -> None:
    index, names = build()
    allowed = {"send_email", "refund_payment", "createInvoice", "maps_get_forecast"}
    hits = search(
        index, "weather forecast for tomorrow", limit=3, method=method, allowed=mask(names, allowed)
    )
    assert len(hits) == 3
    assert set(named(names, hits)) <= allowed


def test_the_dense_ranking_over_an_allowed_set_is_the_ranking_of_an_index_of_those_tools_alone() -> None:
    index, names = build(settings=WITHOUT_LIFTS)
    kept = [entry for entry, name in zip(CATALOG, names, strict=True) if name != "weather_get_forecast"]
    alone, alone_names = build(kept, WITHOUT_LIFTS)
    allowed = mask(names, set(names) - {"weather_get_forecast"})
    query = "forecast of the weather in a city"
    shared = search(index, query, limit=7, method="dense", allowed=allowed)
    own = search(alone, query, limit=7, method="dense")
    # the one forecast left is named without its prefix in a catalog of its own: compare by position
    assert [names[h.position].removeprefix("maps_") for h in shared] == [alone_names[h.position] for h in own]
    assert [h.score for h in shared] == pytest.approx([h.score for h in own], abs=1e-5)


def test_an_exact_name_the_caller_may_not_use_is_not_answered() -> None:
    index, names = build()
    denied = search(index, "send_email", limit=2, allowed=mask(names, set(names) - {"send_email"}))
    assert "send_email" not in named(names, denied)
    assert not any(hit.exact for hit in denied)
    allowed = search(index, "send_email", limit=2, allowed=mask(names, {"send_email", "get_alerts"}))
    assert named(names, allowed)[0] == "send_email" and allowed[0].exact


def test_an_empty_allowed_set_finds_nothing() -> None:
    index, names = build()
    assert search(index, "weather", allowed=mask(names, set())) == []


def test_a_backend_is_lifted_by_its_best_allowed_tool_not_by_a_denied_one() -> None:
    """The backend lift over an allowed set is the lift of an index of the allowed tools alone."""
    lifted = SearchSettings(lexical_weight=0.0, dense_weight=1.0, backend_weight=0.5, server_weight=0.0)
    index, names = build(settings=lifted)
    denied = {"weather_get_forecast", "get_alerts"}
    kept = [entry for entry, name in zip(CATALOG, names, strict=True) if name not in denied]
    alone, alone_names = build(kept, lifted)
    query = "severe weather alerts and the forecast for my region"
    shared = search(index, query, limit=6, allowed=mask(names, set(names) - denied))
    own = search(alone, query, limit=6)
    assert [names[h.position].removeprefix("maps_") for h in shared] == [alone_names[h.position] for h in own]
