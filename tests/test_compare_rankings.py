"""evals.compare_rankings: how two runs' rankings differ, counted by hand on tiny files."""

from __future__ import annotations

import json
from pathlib import Path

from evals.compare_rankings import compare, main, rankings


def _write(path: Path, rows: list[tuple[str, int | None, str, list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"system": s, "length": n, "id": i, "retrieved": r}) + "\n" for s, n, i, r in rows))
    return path


def test_counts_differences_anywhere_and_at_rank_one(tmp_path: Path, capsys) -> None:
    a = _write(tmp_path / "a.jsonl", [("rag", 10, "q1", ["x", "y"]), ("rag", 10, "q2", ["x", "y"]),
                                      ("rag", 10, "q3", ["x"]), ("mia_rag", 10, "q1", ["x", "y"]), ("rag", 10, "only-a", [])])
    b = _write(tmp_path / "b.jsonl", [("rag", 10, "q1", ["x", "y"]), ("rag", 10, "q2", ["x", "z"]),
                                      ("rag", 10, "q3", ["y"]), ("mia_rag", 10, "q1", ["x", "y"])])
    assert compare(rankings(a), rankings(b)) == {
        ("mia_rag", 10): {"questions": 1, "differ": 0, "differ_at_1": 0},
        ("rag", 10): {"questions": 3, "differ": 2, "differ_at_1": 1},
    }
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| rag | 10 | 3 | 2 (66.7%) | 1 (33.3%) |" in out
    assert "2 of 4 rankings differ (50.0%); 1 (system, length, question) keys are in one run only" in out


def test_a_missing_file_is_named(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "none.jsonl"), str(tmp_path / "none.jsonl")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_runs_without_a_source_length(tmp_path: Path, capsys) -> None:
    """The fairy-tale series has no --length: its records carry length null."""
    a = _write(tmp_path / "a.jsonl", [("rag", None, "q1", ["x"]), ("mia_rag", None, "q1", ["x"])])
    b = _write(tmp_path / "b.jsonl", [("rag", None, "q1", ["y"]), ("mia_rag", None, "q1", ["x"])])
    assert main([str(a), str(b)]) == 0
    assert "| rag | - | 1 | 1 (100.0%) | 1 (100.0%) |" in capsys.readouterr().out
