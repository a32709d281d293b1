"""``mia bench scale`` and ``mia bench retrieval``: the size steps, growth exponents and per-node times
by hand, and small real runs."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from mia.evals.bench import MEMOISED, measure_retrieval, print_retrieval, timed_run
from mia.evals.bench_scale import growth_exponent, prefix_ends
from tests.conftest import requires_data, write_stories


def test_prefix_ends_pick_the_closest_book_boundary() -> None:
    tokens = [100, 100, 300, 500]  # running totals 100, 200, 500, 1000
    assert prefix_ends(tokens, [0.1, 0.3, 1.0]) == [1, 2, 4]  # 100 → 100, 300 → 200 (nearer than 500), 1000
    assert prefix_ends(tokens, [0.5, 0.45, 1.0]) == [3, 4]  # 450 and 500 both → 3 books: one step
    assert prefix_ends(tokens, [0.01]) == [1]  # at least one book
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        prefix_ends(tokens, [1.5])


def test_growth_exponent_is_the_log_log_slope() -> None:
    assert growth_exponent((1e5, 10.0), (1e6, 100.0)) == pytest.approx(1.0)  # linear
    assert growth_exponent((1e5, 10.0), (1e6, 10.0)) == pytest.approx(0.0)  # flat
    assert growth_exponent((1e5, 10.0), (1e6, 20.0)) == pytest.approx(math.log10(2))


@requires_data
def test_a_small_library_run_reports_every_figure(tmp_path: Path, cli) -> None:
    books = tmp_path / "books"
    write_stories(books / "a", ("golden-goose", "fox-and-wolf"))
    write_stories(books / "b", ("how-molo-stole-the-lovely-rose-red",))
    out = tmp_path / "out"
    result = cli("bench", "scale", "--books", str(books), "--held-out", "fox-and-wolf", "--fractions", "0.5,1",
                 "--questions", "2", "--no-server", "--out", str(out))
    assert result.code == 0, result.err
    report = json.loads((out / "results.json").read_text())
    steps = report["steps"]
    assert [s["books"] for s in steps] == [1, 2] and steps[0]["tokens"] < steps[1]["tokens"]
    for step in steps:
        assert step["ingest_ratio"] > 0 and step["disk_bytes"] > 0 and step["peak_rss_bytes"] > 0
        assert 0 < step["latency"]["rag"]["p50"] <= step["latency"]["rag"]["p95"]
    assert report["add_one_book"]["book"] == "fox-and-wolf" and len(report["add_one_book"]["alone_seconds"]) == 2
    assert len(report["growth"]) == 1 and report["server"] is None
    assert (out / "scale.png").stat().st_size > 0 and "| books | tokens |" in (out / "table.md").read_text()
    assert "goal ≤ 1.3" in result.out
    missing = cli("bench", "scale", "--books", str(books), "--held-out", "no-such-book", "--no-server")
    assert missing.code != 0 and "no-such-book" in missing.err


class SleepingGraph:
    """Streams one update per node after sleeping that node's time, as a compiled graph streams them."""

    def __init__(self, nodes: dict[str, float]) -> None:
        self.nodes = nodes

    def stream(self, payload: dict[str, Any], context: Any, stream_mode: str) -> Iterator[dict[str, Any]]:
        assert stream_mode == "updates" and payload == {"question": "q"}
        for node, seconds in self.nodes.items():
            time.sleep(seconds)
            yield {node: {}}


def test_each_node_is_timed_from_the_update_before_it() -> None:
    stages = timed_run(SleepingGraph({"prepare": 0.0, "init_signature": 0.05, "retrieve": 0.02}), "q", None)
    assert list(stages) == ["prepare", "init_signature", "retrieve", "total"]
    assert stages["init_signature"] == pytest.approx(0.05, abs=0.03) and stages["retrieve"] == pytest.approx(0.02, abs=0.03)
    assert stages["total"] >= sum(stages[n] for n in ("prepare", "init_signature", "retrieve"))


@pytest.mark.slow
def test_retrieval_bench_times_both_graphs_per_node(tiny_collection, capsys: pytest.CaptureFixture[str]) -> None:
    result = measure_retrieval(tiny_collection.name, n_questions=2)
    nodes = {"rag": ["prepare", "hypothesize", "retrieve", "total"],
             "mia_rag": ["prepare", "hypothesize", "init_signature", "retrieve", "total"]}
    assert {system: list(stages) for system, stages in result["stages"].items()} == {
        **nodes, **{f"{name}, {MEMOISED}": stages for name, stages in nodes.items()}}
    assert all(stage["mean"] > 0 for stages in result["stages"].values() for stage in stages.values())
    assert set(result["ratios"]) == {"graphs", "retrieval_nodes", "graphs_without_query_embedding"}
    print_retrieval(result)
    assert "ratio mia_rag / rag" in capsys.readouterr().out
