"""The packaged training corpus: each source keeps its licence and its provenance, every pair names
tools the corpus holds, none is an evaluation query, and the match bands are calibrated on its check
part exactly as documented. Embedding runs on the deterministic fake embedder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from commands.retrieval.corpus import (
    CorpusError,
    CorpusVectors,
    Pair,
    calibrate_bands,
    corpus_part,
    embed_corpus,
    read_corpus,
    sources,
)
from indexer.embedder import FakeEmbedder
from indexer.retrieval.bands import Bands
from indexer.retrieval.embeddings import Embeddings
from toolsearch.catalog import EVAL_DATA, TRAIN_DATA

PAIRS = [json.loads(line) for line in (TRAIN_DATA / "pairs.jsonl").read_text().splitlines() if line.strip()]
TOOLS = [json.loads(line) for line in (TRAIN_DATA / "tools.jsonl").read_text().splitlines() if line.strip()]
FAKE = FakeEmbedder(dimension=32)


def test_every_source_keeps_its_licence_and_where_it_came_from() -> None:
    named = {pair["source"] for pair in PAIRS} | {tool["id"].split("::", 1)[0] for tool in TOOLS}
    assert len(named) == 7
    sources_md = (TRAIN_DATA / "SOURCES.md").read_text()
    readme = (TRAIN_DATA / "README.md").read_text()
    assert "SOURCES.md" in readme and "licenses/" in readme
    for source in named:
        licence = (TRAIN_DATA / "licenses" / f"{source}.txt").read_text()
        assert re.search(r"Apache License|MIT License|Permission is hereby granted", licence), source
        section = sources_md.split(f"### {source}\n", 1)[1].split("\n### ", 1)[0]
        assert re.search(r"- repository: github\.com/\S+", section), source
        assert re.search(r"- commit: `[0-9a-f]{40}`", section), source
        assert re.search(r"- licence: (Apache-2\.0|MIT)", section), source
    # no licence of a source the corpus no longer holds
    assert {path.stem for path in (TRAIN_DATA / "licenses").iterdir()} == named


def test_every_pair_names_tools_of_its_own_source() -> None:
    ids = {tool["id"] for tool in TOOLS}
    assert len(ids) == len(TOOLS) == 7161 and len(PAIRS) == 6160
    assert len({pair["id"] for pair in PAIRS}) == len(PAIRS)
    for pair in PAIRS:
        assert pair["query"].strip() and pair["relevant"], pair["id"]
        assert set(pair["relevant"]) <= ids, pair["id"]
        assert {tool.split("::", 1)[0] for tool in pair["relevant"]} == {pair["source"]}, pair["id"]


def test_no_pair_is_an_evaluation_query() -> None:
    asked = {
        json.loads(line)["query"].strip().lower()
        for path in EVAL_DATA.glob("*/queries*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    }
    assert asked
    assert not [pair["id"] for pair in PAIRS if pair["query"].strip().lower() in asked]


def test_about_a_tenth_of_the_pairs_is_the_check_part_by_id_alone() -> None:
    parts = [corpus_part(pair["id"]) for pair in PAIRS]
    assert 0.08 < parts.count("check") / len(parts) < 0.12
    assert parts == [corpus_part(pair["id"]) for pair in reversed(PAIRS)][::-1]


def _small_corpus(folder: Path, source: str = "tooltalk") -> Path:
    folder.mkdir()
    tools = [tool for tool in TOOLS if tool["id"].startswith(f"{source}::")]
    other = [tool for tool in TOOLS if tool["id"].startswith("restbench::")][:30]
    pairs = [pair for pair in PAIRS if pair["source"] == source]
    (folder / "tools.jsonl").write_text("".join(json.dumps(tool) + "\n" for tool in tools + other))
    (folder / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return folder


def test_the_corpus_is_embedded_as_the_indexer_reads_tools_and_queries(tmp_path: Path) -> None:
    folder = _small_corpus(tmp_path / "corpus")
    corpus = embed_corpus(read_corpus(folder), Embeddings(FAKE, None), FAKE.count_tokens, FAKE.max_tokens)
    assert corpus.views.shape[:2] == corpus.view_mask.shape and corpus.views.shape[0] == 58
    assert corpus.view_mask[:, 0].all()  # every tool has at least one view
    assert not corpus.views[~corpus.view_mask].any()  # missing views are zero rows
    assert corpus.queries.shape == (78, 32) and sources(corpus.pairs) == ["tooltalk"]
    first = corpus.pairs[0]
    assert all(corpus.tool_sources[tool] == "tooltalk" for tool in first.relevant)
    assert len(corpus.digest) == 64
    bands = calibrate_bands(corpus)
    assert 0 < bands.possible <= bands.strong <= 1


def test_a_pair_naming_a_missing_tool_is_refused_with_its_line(tmp_path: Path) -> None:
    folder = _small_corpus(tmp_path / "corpus")
    with (folder / "pairs.jsonl").open("a") as out:
        out.write(json.dumps({"id": "x", "source": "tooltalk", "query": "q", "relevant": ["nope::t"]}) + "\n")
    with pytest.raises(
        CorpusError, match=r"pairs\.jsonl: pair x names tools the corpus lacks: \['nope::t'\]"
    ):
        read_corpus(folder)


def _check_ids(count: int) -> list[str]:
    """`count` pair ids that fall in the check part."""
    found = (f"p{n}" for n in range(100_000))
    return [pid for pid in found if corpus_part(pid) == "check"][:count]


def test_the_bands_are_the_documented_quantiles_of_the_check_part() -> None:
    # two sources of one tool each; every request is about source "a", in the check part
    ids = _check_ids(20)
    right = np.linspace(0.2, 0.9, 20, dtype=np.float32)  # each request's cosine with its own tool
    foreign = np.linspace(0.0, 0.6, 20, dtype=np.float32)  # and with the other source's tool
    views = np.zeros((2, 1, 2), dtype=np.float32)
    views[:, 0] = [[1.0, 0.0], [0.0, 1.0]]
    corpus = CorpusVectors(
        tool_ids=("a::t", "b::t"),
        tool_sources=("a", "b"),
        tool_names=("t", "t"),
        views=views,
        view_mask=np.ones((2, 1), dtype=bool),
        pairs=tuple(Pair(pid, "a", "q", (0,)) for pid in ids),
        queries=np.stack([right, foreign], axis=1),
        digest="",
    )
    bands = calibrate_bands(corpus)
    strong = round(float(np.quantile(foreign, 0.95)), 3)
    possible = round(float(np.quantile(right, 0.10)), 3)
    assert bands == Bands(strong=strong, possible=possible)
    # right tools that come closer than half the unrelated catalogs' best tools do (a model trained on
    # these requests' sources) do not raise `possible` past that half
    closer = np.stack([right + 0.3, foreign], axis=1)
    assert calibrate_bands(corpus, closer).possible == round(float(np.quantile(foreign, 0.5)), 3)
    # the same requests embedded otherwise bring their own bands; a wrong count is refused
    assert calibrate_bands(corpus, corpus.queries[:, ::-1].copy()).strong == round(
        float(np.quantile(right, 0.95)), 3
    )
    with pytest.raises(CorpusError, match="one per pair"):
        calibrate_bands(corpus, corpus.queries[:5])
