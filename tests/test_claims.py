"""Claims judged as NoCha judges them: the custom data set's claims, claim and pair accuracy, end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mia.evals import report, runner
from mia.evals.datasets import DatasetError, build_custom
from tests.conftest import requires_data, story_text

STORY = "self-did-it"
CLAIMS = [
    {"id": "name-true", "question": "The woman told the girl from underground that her name was Self.", "label": "TRUE",
     "meta": {"pair": "p1"}},
    {"id": "name-false", "question": "The woman told the girl from underground that her name was Anna.", "label": "FALSE",
     "meta": {"pair": "p1"}},
]


def _inputs(tmp_path: Path, records: list[dict[str, Any]]) -> tuple[Path, Path]:
    texts = tmp_path / "texts"
    texts.mkdir(exist_ok=True)
    (texts / "book.txt").write_text("A boy met a fox. The fox ran away.\n", encoding="utf-8")
    questions = tmp_path / "claims.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return texts, questions


def test_claims_and_their_pairs_are_read_and_checked(tmp_path: Path) -> None:
    records = [{"id": "a", "question": "A boy met a fox.", "label": "true", "meta": {"pair": "p"}},
               {"id": "b", "question": "A boy met a wolf.", "label": "FALSE", "meta": {"pair": "p"}},
               {"id": "c", "question": "The fox ran away.", "label": "TRUE"}]
    built = build_custom(tmp_path / "out", *_inputs(tmp_path, records))
    assert [(q["id"], q["label"], q.get("claim")) for q in built.questions] == [("a", "TRUE", True), ("b", "FALSE", True), ("c", "TRUE", True)]
    assert built.questions[0]["answers"] == [] and built.questions[0]["meta"] == {"pair": "p"}


@pytest.mark.parametrize(("records", "message"), [
    ([{"question": "x", "label": "TRUE", "meta": {"pair": "p"}}, {"question": "y", "label": "TRUE", "meta": {"pair": "p"}}],
     "pair 'p' must hold one TRUE and one FALSE claim"),
    ([{"question": "x", "label": "TRUE", "meta": {"pair": "p"}}], "pair 'p' must hold one TRUE and one FALSE"),
    ([{"question": "x", "answers": ["y"], "meta": {"pair": "p"}}], "meta.pair must be a non-empty string, on a claim"),
    ([{"question": "x", "label": "MAYBE"}], "or a claim's 'label' \\(TRUE or FALSE\\)"),
])
def test_bad_claims_are_refused_with_the_reason(tmp_path: Path, records: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        build_custom(tmp_path / "out", *_inputs(tmp_path, records))
    assert not (tmp_path / "out").exists()


def _record(system: str, qid: str, pair: str, label: str, answer: str) -> dict[str, Any]:
    right = 100.0 * (answer == label)
    return {"system": system, "part": "p", "id": qid, "pair": pair, "label": label, "answer": answer,
            "scores": {"claim_accuracy": right}, "llm_calls": 1, "prompt_tokens": 100, "generated_tokens": 1, "seconds": 1.0}


def test_pair_accuracy_from_a_results_file_matches_a_hand_count(tmp_path: Path) -> None:
    # rag: pair 1 both right, pair 2 one wrong, pair 3 both right -> 2/3; always-TRUE: no pair right.
    answers = {"rag": ["TRUE", "FALSE", "TRUE", "TRUE", "TRUE", "FALSE"], "always": ["TRUE"] * 6}
    labels = ["TRUE", "FALSE"] * 3
    records = [_record(system, f"q{i}", f"p{i // 2 + 1}", labels[i], said[i]) for system, said in answers.items() for i in range(6)]
    path = tmp_path / runner.RESULTS_FILE
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    loaded = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    grouped = {s: [r for r in loaded if r["system"] == s] for s in answers}
    assert report.pair_values(grouped["rag"]) == {"p1": 100.0, "p2": 0.0, "p3": 100.0}
    assert report.pair_values(grouped["always"]) == {"p1": 0.0, "p2": 0.0, "p3": 0.0}
    run = {"dataset": "custom", "split": "test", "questions": 6, "parts": [{"tag": "p", "length": None}]}
    summary = report.summarise(run, loaded, ["rag", "always"])
    assert summary["systems"]["rag"]["pair_accuracy"] == pytest.approx(200 / 3, abs=1e-3)
    assert summary["systems"]["rag"]["claim_accuracy"] == pytest.approx(500 / 6, abs=1e-3)
    assert summary["systems"]["always"]["pair_accuracy"] == 0.0 and summary["systems"]["always"]["claim_accuracy"] == 50.0
    # A retrieval-only run judged no claim: its records count towards no pair.
    assert report.pair_values([{**r, "answer": "", "scores": {}} for r in grouped["rag"]]) == {}
    table = "\n".join(report._pair_table(grouped, ["rag", "always"], ["rag"], seed=0))
    assert "| rag | 3 | 66.7 [" in table and "| always | 3 | 0.0 [0.0, 0.0] | -66.7 [" in table


@requires_data
@pytest.mark.slow
def test_verify_end_to_end_with_the_embedded_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedded_model_file: Path) -> None:
    """A tiny claim pair through the real graph and model: TRUE/FALSE answers, claim and pair accuracy, grounded sources."""
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "chroma"))
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / f"{STORY}.txt").write_text(story_text(STORY), encoding="utf-8")
    claims = tmp_path / "claims.jsonl"
    claims.write_text("".join(json.dumps(c) + "\n" for c in CLAIMS), encoding="utf-8")
    results = runner.run_eval("custom", None, ["rag"], texts=texts, questions_file=claims, out=tmp_path / "out",
                              settings={"top_k": "3", "window": "4"}, progress=False)
    records = [json.loads(line) for line in (tmp_path / "out" / runner.RESULTS_FILE).read_text().splitlines()]
    assert sorted(r["answer"] for r in records) in (["FALSE", "FALSE"], ["FALSE", "TRUE"], ["TRUE", "TRUE"])
    assert all(r["pair"] == "p1" and r["scores"]["claim_accuracy"] in (0.0, 100.0) for r in records)
    assert results.summary["systems"]["rag"]["pairs"] == 1
    assert results.summary["systems"]["rag"]["pair_accuracy"] in (0.0, 100.0)
    assert "NoCha pair accuracy" in (tmp_path / "out" / "report.md").read_text()
