"""What an answer says of itself, and how the second stage judges the first stage's candidates.

The second stage here is a network built by hand over the fake embedder's vectors: the plumbing
(features, order, bands, exact names, the needs met) is what is tested, not how well it fits. The
trained one is measured on the real model in tests/search/test_abstention_floors.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from commands.retrieval.abstention import removed_for
from commands.retrieval.eval_catalog import EvalCatalog
from commands.retrieval.scoring import EvalQuery
from commands.retrieval.stage_training import fit_calibration
from commands.retrieval.stage_tuning import write_stage
from indexer.embedder import FakeEmbedder
from indexer.embedder.base import EmbedderError
from indexer.retrieval.bands import Bands
from indexer.retrieval.embeddings import Embeddings
from indexer.retrieval.fit import FEATURES, Calibration, FitModel, pair_features
from indexer.retrieval.query import Query
from indexer.retrieval.search import Hit, SearchSettings
from indexer.retrieval.second_stage import STAGE, Judged, SecondStage, first_stage, read_stage, shipped_stage
from indexer.retrieval.text import query_texts
from indexer.retrieval.verdict import partial_note, verdict
from toolsearch.catalog import EVAL_DATA, load_catalog

FAKE = FakeEmbedder(dimension=64)
TOOLS = load_catalog(EVAL_DATA / "mcpbench" / "tools.jsonl")[:83]  # several servers
BANDS = Bands(strong=0.8, possible=0.5)


def _catalog() -> EvalCatalog:
    return EvalCatalog(TOOLS, Embeddings(FAKE, None), SearchSettings())


def _query(text: str) -> Query:
    return Query.embedded(text, FAKE.embed(query_texts(text)))


def _cosine_model() -> FitModel:
    """A network whose score is the pair's cosine (through one ReLU unit) times 10, less 5."""
    hidden = np.zeros((1, FEATURES), dtype=np.float32)
    hidden[0, 0] = 1.0  # the cosine feature
    return FitModel(
        hidden, np.zeros(1, np.float32), np.full(1, 10.0, np.float32), -5.0, Calibration(1.0, 0.0)
    )


def _stage(weight: float = 0.0) -> SecondStage:
    return SecondStage(_cosine_model(), BANDS, depth=10, weight=weight, identity=FAKE.identity, record={})


def test_the_features_of_a_pair_are_its_cosines_and_the_words_the_tool_and_the_catalog_hold() -> None:
    catalog = _catalog()
    query = _query("convert force from newtons to pound-force")
    hits = catalog.full.search(query, 3)
    rows = pair_features(catalog.full, query, hits)
    assert rows.shape == (3, FEATURES)
    for row, hit in zip(rows, hits, strict=True):
        views = catalog.full.views(hit.position)
        assert row[0] == pytest.approx(float((views @ query.needs[hit.need].vector).max()), abs=1e-6)
        assert row[1] == pytest.approx(float((views @ query.needs[0].vector).max()), abs=1e-6)
        assert 0.0 <= row[2] <= row[3] <= 1.0  # a tool holds no word the catalog lacks
    assert rows[0, 2] > 0  # the best tool holds some of the request's words
    unknown = _query("knead zzqx sourdough")
    (row,) = pair_features(catalog.full, unknown, catalog.full.search(unknown, 1))
    assert row[3] < 1.0  # words no tool of the catalog holds


def test_the_second_stage_bands_by_its_chance_and_keeps_the_first_stages_order_at_weight_zero() -> None:
    catalog = _catalog()
    query = _query("convert force from newtons to pound-force")
    hits = catalog.full.search(query, 10)
    judged = _stage().judge(catalog.full, query, hits, 8)
    assert [j.hit.position for j in judged] == [h.position for h in hits[:8]]
    chances = _cosine_model().calibration.chance(
        _cosine_model().scores(pair_features(catalog.full, query, hits[:8]))
    )
    assert [j.fit for j in judged] == [round(float(c), 3) for c in chances]
    assert [j.band for j in judged] == [
        "strong" if c >= BANDS.strong else "possible" if c >= BANDS.possible else "weak" for c in chances
    ]


def test_a_weighted_second_stage_moves_its_best_fit_first_and_an_exact_name_stays_first() -> None:
    catalog = _catalog()
    query = _query("convert force from newtons to pound-force")
    hits = catalog.full.search(query, 10)
    judged = _stage(weight=100.0).judge(catalog.full, query, hits, 5)
    assert judged[0].fit == max(j.fit for j in judged)
    named = _query("convert_force")
    exact = catalog.full.search(named, 10)
    assert exact[0].exact
    first = _stage(weight=100.0).judge(catalog.full, named, exact, 5)[0]
    assert first.hit.position == exact[0].position and first.band == "strong" and first.fit == 1.0


def test_an_answer_whose_every_tool_is_weak_says_nothing_fits() -> None:
    query = _query("knead the sourdough")
    weak = [Judged(Hit(p, 1.0, 0.1), 0.1, "weak") for p in range(3)]
    assert verdict(query, weak).nothing_fits
    assert not verdict(query, [*weak, Judged(Hit(9, 0.5, 0.6), 0.6, "possible")]).nothing_fits
    assert not verdict(query, []).nothing_fits  # an empty answer says why it is empty instead


def test_a_task_whose_needs_fit_in_part_names_the_needs_without_a_tool() -> None:
    query = _query("Convert the force to pound-force. Then knead the sourdough and bake the loaf.")
    assert len(query.needs) == 3
    judged = [
        Judged(Hit(1, 3.0, 0.7, need=1), 0.9, "strong"),
        Judged(Hit(2, 2.0, 0.3, need=2), 0.1, "weak"),
    ]
    found = verdict(query, judged)
    assert not found.nothing_fits and found.met == (1,) and found.unmet == (2,)
    note = partial_note(query, found)
    assert '"Then knead the sourdough and bake the loaf."' in note and "No tool below serves" in note
    assert note.index("knead") < note.index("Convert")  # the needs without a tool come first
    # every need met, or a tool named outright: nothing to add
    assert (
        partial_note(query, verdict(query, [*judged, Judged(Hit(3, 1.0, 0.6, need=2), 0.7, "possible")]))
        == ""
    )
    named = [Judged(Hit(4, 9.0, 1.0, exact=True), 1.0, "strong"), judged[1]]
    assert verdict(query, named).unmet == ()


def test_without_a_second_stage_the_first_stage_bands_by_cosine() -> None:
    hits = [Hit(0, 3.0, 0.9), Hit(1, 2.0, 0.6), Hit(2, 1.0, 0.2)]
    assert [j.band for j in first_stage(hits, BANDS)] == ["strong", "possible", "weak"]
    assert [j.fit for j in first_stage(hits, BANDS)] == [0.9, 0.6, 0.2]


def test_abstention_takes_out_a_querys_servers_or_in_a_one_server_catalog_its_tools() -> None:
    catalog = _catalog()
    tool = TOOLS[7]
    removed = removed_for(catalog, EvalQuery("q", "x", (tool.id,)))
    assert {catalog.backends[p] for p in removed} == {tool.server_slug[:64]}
    assert len(removed) == sum(t.server == tool.server for t in TOOLS)
    single = EvalCatalog(
        load_catalog(EVAL_DATA / "metatool" / "tools.jsonl")[:30], Embeddings(FAKE, None), SearchSettings()
    )
    one = single.ids[4]
    assert removed_for(single, EvalQuery("q", "x", (one,))) == frozenset({single.position[one]})
    index, kept = single.without(frozenset({4}))
    assert index.size == 29 and 4 not in kept


def test_platt_scaling_recovers_a_known_calibration() -> None:
    rng = np.random.default_rng(1)
    scores = rng.normal(size=20_000).astype(np.float32)
    truth = rng.random(20_000) < 1 / (1 + np.exp(-(2.0 * scores - 1.0)))
    fitted = fit_calibration(scores, truth)
    assert fitted.scale == pytest.approx(2.0, abs=0.1) and fitted.shift == pytest.approx(-1.0, abs=0.1)


def test_a_stage_is_read_back_as_written_and_a_changed_weights_file_is_refused(tmp_path: Path) -> None:
    model = _cosine_model()
    record = {
        "format": 1,
        "model": "fake",
        "embedder_identity": FAKE.identity,
        "calibration": {"scale": 1.0, "shift": 0.0},
        "bands": {"strong": BANDS.strong, "possible": BANDS.possible},
        "depth": 10,
        "weight": 0.0,
        "training": {},
    }
    write_stage(tmp_path / "fake", model.tensors(), record)
    stage = read_stage(tmp_path / "fake")
    assert stage.identity == FAKE.identity and stage.bands == BANDS and stage.depth == 10
    assert np.array_equal(stage.model.hidden_weight, model.hidden_weight)
    found = shipped_stage(FAKE.identity, tmp_path)
    assert found is not None and found.identity == stage.identity and found.record == stage.record
    assert shipped_stage("another model", tmp_path) is None
    raw = json.loads((tmp_path / "fake" / STAGE).read_text())
    (tmp_path / "fake" / STAGE).write_text(json.dumps(raw | {"weights_sha256": "0" * 64}))
    with pytest.raises(EmbedderError, match="is not the file it records"):
        read_stage(tmp_path / "fake")
