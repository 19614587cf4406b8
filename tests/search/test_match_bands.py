"""Match bands that mean the same at any catalog size: a hit's match is its best cosine with the
query, never a score relative to the rest of the catalog; the right tool is strong over 14 tools and
over 83, and a request no tool serves is weak over both.

The real-model cases use the real model and real tools (MCP-Bench's servers); their embeddings come
from the shared cache. The others run on the deterministic fake embedder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from commands.cli import main
from commands.retrieval.bands import bands_table, measure_bands
from commands.retrieval.evaluation import SHIPPED_SETS, build_index
from commands.retrieval.model import prepare_default_model, prepare_tuned_models
from indexer.embedder import FakeEmbedder, load_embedder
from indexer.embedder.base import Embedder
from indexer.retrieval.bands import UNTRAINED_BANDS, Bands, match_band, model_bands
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.query import Query
from indexer.retrieval.search import SearchSettings
from indexer.retrieval.text import document_texts, query_texts
from indexer.state.disk import DiskEmbeddings
from tests.support.stack import EMBEDDING_CACHE
from toolsearch.catalog import EVAL_DATA, CatalogTool, load_catalog
from toolsearch.sections.indexer_settings import BASE_MODEL_NAME, TUNED_MODEL_NAME

ROOT = Path(__file__).resolve().parents[2]
# the served model and the published one, each under its own bands
MODELS = [ROOT / "models" / TUNED_MODEL_NAME, ROOT / "models" / BASE_MODEL_NAME]
TOOLS = load_catalog(EVAL_DATA / "mcpbench" / "tools.jsonl")
SMALL = TOOLS[6:20]  # the unit converter's tools and Wikipedia's: 14
LARGE = TOOLS[:83]
FAKE = FakeEmbedder(dimension=64)


@pytest.fixture(scope="module", params=MODELS, ids=lambda path: path.name)
def model(request: pytest.FixtureRequest) -> tuple[Embedder, Bands]:
    prepare_default_model(ROOT / "models")
    prepare_tuned_models(ROOT / "models")
    return load_embedder("onnx", request.param), model_bands(request.param)


def _best(model: tuple[Embedder, Bands], tools: Sequence[CatalogTool], query: str) -> tuple[str, str]:
    """The best tool's name and band for `query` over `tools`."""
    embedder, bands = model
    store = DiskEmbeddings(EMBEDDING_CACHE, embedder.identity, embedder.dimension)
    index, ids = build_index(tools, Embeddings(embedder, store), SearchSettings())
    hit = index.search(Query.embedded(query, embedder.embed(query_texts(query))), 5)[0]
    return ids[hit.position].split("::")[-1], match_band(hit.match, bands)


def test_the_right_tool_is_strong_over_14_tools_and_over_83(model: tuple[Embedder, Bands]) -> None:
    query = "convert force from newtons to pound-force"
    assert _best(model, SMALL, query) == ("convert_force", "strong")
    assert _best(model, LARGE, query) == ("convert_force", "strong")


def test_a_request_no_tool_serves_is_weak_at_both_sizes(model: tuple[Embedder, Bands]) -> None:
    query = "knead the sourdough and bake it until the crust is dark and crisp"
    assert _best(model, SMALL, query)[1] == "weak"
    assert _best(model, LARGE, query)[1] == "weak"


def test_a_match_is_the_best_cosine_of_the_tools_views_with_any_need() -> None:
    index, ids = build_index(SMALL, Embeddings(FAKE, None), SearchSettings())
    text = "Convert a temperature. Then look up the article about Kelvin."
    query = Query.embedded(text, FAKE.embed(query_texts(text)))
    by_id = {tool.id: tool for tool in SMALL}
    for hit in index.search(query, 5):
        tool = by_id[ids[hit.position]]
        views = FAKE.embed(document_texts(tool.definition(), tool.server_slug[:64])[0])
        assert hit.match == round(float((query.matrix() @ views.T).max()), 3)


def test_a_match_does_not_depend_on_the_rest_of_the_catalog() -> None:
    text = "convert force from newtons to pound-force"
    query = Query.embedded(text, FAKE.embed(query_texts(text)))
    matches = []
    for tools in (SMALL, LARGE):
        index, ids = build_index(tools, Embeddings(FAKE, None), SearchSettings())
        matches.append(dict(zip(ids, index.similarities(query).tolist(), strict=True)))
    assert matches[0] == {tool: matches[1][tool] for tool in matches[0]}


def test_an_exact_name_is_a_strong_match_of_one() -> None:
    index, ids = build_index(SMALL, Embeddings(FAKE, None), SearchSettings())
    hit = index.search(Query.embedded("convert_force", FAKE.embed(["convert_force"])), 3)[0]
    assert ids[hit.position].endswith("::convert_force")
    assert hit.match == 1.0 and match_band(hit.match) == "strong"


def test_a_model_brings_its_own_bands() -> None:
    assert [match_band(m) for m in (0.6, 0.3, 0.1)] == ["strong", "possible", "weak"]
    own = Bands(strong=0.8, possible=0.5)
    assert [match_band(m, own) for m in (0.6, 0.3, 0.9)] == ["possible", "weak", "strong"]
    assert UNTRAINED_BANDS.possible < UNTRAINED_BANDS.strong


def test_the_bands_command_refuses_a_count_of_no_queries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bands", "--limit-queries", "0"]) == 2
    assert "--limit-queries must be at least 1" in capsys.readouterr().err


def test_the_bands_command_measures_every_shipped_set_in_percent() -> None:
    # the fake embedder: what is counted, not how well; bands under every cosine call all strong
    rates = measure_bands(FAKE, None, limit=3, bands=Bands(strong=-1.0, possible=-1.0))
    assert [r.name for r in rates] == list(SHIPPED_SETS)
    for r in rates:
        assert set(r.right_weak) <= {"tune", "held-apart"} and set(r.right_weak.values()) == {0.0}
        assert (r.foreign_strong, r.foreign_weak) == (100.0, 0.0)
    assert len(bands_table(rates).splitlines()) == 1 + len(SHIPPED_SETS)
