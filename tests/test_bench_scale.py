"""``mia bench scale``: the size steps and growth exponents by hand, and one small real run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evals.bench_scale import growth_exponent, prefix_ends
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
