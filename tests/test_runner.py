"""The evaluation runner: resumes without rerunning finished questions, and its recall figures are
the ones a hand check of the retrieved chunks gives (real MiniLM, real Chroma, real stories)."""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mia.evals import report, runner
from mia.evals.cli import register
from mia.evals.metrics import answer_in_passages
from mia.evals.datasets import DATA_ENV, Dataset, build_custom, default_data_root
from mia.graph import registry
from mia.stores.ingest import book_id
from mia.stores.mindscape import Mindscape
from tests.conftest import requires_data

DATA = default_data_root()
STORIES = ("self-did-it", "hat-of-huldres", "old-hop-giant")
SECTIONS = DATA / "fairytaleqa" / "data-by-train-split" / "section-stories" / "test"
QUESTIONS = DATA / "fairytaleqa" / "data-by-train-split" / "questions" / "test"
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"shared data not found at {DATA}; set ${DATA_ENV}")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _write_custom(folder: Path) -> tuple[Path, Path]:
    """Three short test-split stories as books, two questions each with their cor_section spans,
    plus one question that quotes its gold section verbatim (query-only R@1 must find it)."""
    texts = folder / "texts"
    texts.mkdir(parents=True)
    records: list[dict[str, Any]] = []
    for story in STORIES:
        parts, spans, offset = [], {}, 0
        for section in _rows(SECTIONS / f"{story}-story.csv"):
            if parts:
                parts.append("\n\n")
                offset += 2
            spans[section["section"].strip()] = (offset, offset + len(section["text"]))
            parts.append(section["text"])
            offset += len(section["text"])
        text = "".join(parts)
        (texts / f"{story}.txt").write_text(text, encoding="utf-8", newline="")
        for q in _rows(QUESTIONS / f"{story}-questions.csv")[:2]:
            gold = [{"book": story, "start": spans[s.strip()][0], "end": spans[s.strip()][1]} for s in q["cor_section"].split(",")]
            records.append({"id": f"{story}-{q['question_id']}", "question": q["question"], "answers": [q["answer1"]], "gold": gold})
    start, end = spans["2"]
    quote = " ".join(text[start:end].split()[:25])
    records.append({"id": "verbatim", "question": quote, "answers": ["x"], "gold": [{"book": STORIES[-1], "start": start, "end": end}]})
    questions = folder / "questions.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return texts, questions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    """A built custom data set, with caches and Chroma isolated under the test's own folder."""
    root = tmp_path_factory.mktemp("runner")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MIA_HOME", str(root / "home"))
        patch.setenv("MIA_CHROMA_PATH", str(root / "chroma"))
        texts, questions = _write_custom(root)
        yield build_custom(root / "dataset", texts, questions)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mia")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def retrieval_run(tiny: Dataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One real retrieval-only run through the CLI with --json (stdout captured by hand: capsys
    is function-scoped)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("retrieval") / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = _cli(["eval", "--dataset", str(tiny.dir), "--systems", "rag,mia_rag", "--retrieval-only",
                     "--set", "window=2", "--out", str(out), "--json", "--seed", "3"])
    assert code == 0
    return out, json.loads(stdout.getvalue())


@needs_data
@pytest.mark.slow
def test_json_output_shape(retrieval_run: tuple[Path, dict[str, Any]], tiny: Dataset) -> None:
    _, summary = retrieval_run
    assert set(summary) == {"dataset", "split", "questions", "systems"}
    assert (summary["dataset"], summary["split"], summary["questions"]) == ("custom", "test", len(tiny.questions))
    assert list(summary["systems"]) == ["rag", "mia_rag"]
    for row in summary["systems"].values():
        # retrieval only: answer metrics do not apply and are omitted, but whether the references' words
        # were retrieved is scored; costs are zero, not missing
        assert set(row) == {"recall@1", "recall@5", "recall@10", "recall@20", "strict_recall@1", "strict_recall@5",
                            "strict_recall@10", "strict_recall@20", "answer_in@5", "answer_in@10", "answer_in@20",
                            *report.TOKEN_METRICS, "llm_calls", "prompt_tokens", "generated_tokens", "seconds"}
        assert all(row[f"strict_recall@{k}"] <= row[f"recall@{k}"] for k in (1, 5, 10, 20))
        assert row["llm_calls"] == row["prompt_tokens"] == row["generated_tokens"] == 0


@needs_data
@pytest.mark.slow
def test_recall_matches_hand_check(retrieval_run: tuple[Path, dict[str, Any]], tiny: Dataset) -> None:
    out, summary = retrieval_run
    records = [json.loads(line) for line in (out / runner.RESULTS_FILE).read_text().splitlines()]
    assert len(records) == 2 * len(tiny.questions)
    gold_of = {q["id"]: q["gold"] for q in tiny.questions}
    answers_of = {q["id"]: q["answers"] for q in tiny.questions}
    to_book = {book_id(p): b for p, b in zip(tiny.sources, tiny.books)}
    for record in records:
        # retrieval-only rankings are kept RANKING_DEPTH deep, or whole when the collection is smaller
        assert len(record["retrieved"]) == min(runner.RANKING_DEPTH, Mindscape(record["collection"]).chunks.count())
        chunks = Mindscape(record["collection"]).chunk_records(record["retrieved"], documents=False)
        assert record["tokens"] == [c["tokens"] for c in chunks]  # each chunk's tokens, as ingestion counted them
        for k in (1, 5, 10, 20):  # recall@20 is defined with fewer chunks when all of them came back
            hit = [
                g for g in gold_of[record["id"]]
                if any(to_book[c["book"]] == g["book"] and c["start"] < g["end"] and g["start"] < c["end"] for c in chunks[:k])
            ]
            assert record["scores"][f"recall@{k}"] == pytest.approx(100 * len(hit) / len(gold_of[record["id"]]))
        texts = [c["text"] for c in Mindscape(record["collection"]).chunk_records(record["retrieved"])]
        for k in (5, 10, 20):
            assert record["scores"][f"answer_in@{k}"] == 100 * answer_in_passages(texts[:k], answers_of[record["id"]])
    verbatim = next(r for r in records if r["system"] == "rag" and r["id"] == "verbatim")
    assert verbatim["scores"]["recall@1"] == 100.0
    for system, row in summary["systems"].items():
        mine = [r for r in records if r["system"] == system]
        for metric, value in row.items():
            if metric.startswith("recall@"):
                assert value == pytest.approx(sum(r["scores"][metric] for r in mine) / len(mine), abs=1e-3)


@needs_data
@pytest.mark.slow
def test_report_files(retrieval_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = retrieval_run
    for name in ("report.md", "recall_at_k.png", "cost_vs_length.png", "run.json", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    text = (out / "report.md").read_text()
    assert "custom · test split · retrieval only" in text
    assert "all-MiniLM-L6-v2" in text and "Seed: 3" in text
    assert "--retrieval-only --seed 3 --set window=2 --concurrency 1 --out" in text  # the exact command
    assert "Paired difference against `rag`" in text and "| mia_rag |" in text


class CountingGraph:
    """Stands in for a question graph: answers every question with its first gold answer."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def invoke(self, payload: dict[str, Any], context: Any) -> dict[str, Any]:
        self.calls.append(payload["question"])
        return {"answer": self.answers[payload["question"]], "retrieved": [],
                "usage": {"llm_calls": 1, "input_tokens": 100, "output_tokens": 7}}


@needs_data
@pytest.mark.slow
def test_resume_skips_finished_questions(tiny: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = CountingGraph({q["question"]: q["answers"][0] for q in tiny.questions})
    monkeypatch.setattr(registry, "load_graph", lambda name: fake)
    out = tmp_path / "out"

    def run(limit: int, **settings: str) -> runner.EvalResults:
        return runner.run_eval(str(tiny.dir), None, ["rag"], limit=limit, out=out, settings=settings,
                               progress=False, concurrency=2)

    run(3)
    assert len(fake.calls) == 3
    run(3)
    assert len(fake.calls) == 3  # everything cached: no invocation at all
    with (out / runner.RESULTS_FILE).open("a") as handle:
        handle.write('{"system": "rag", "conf')  # a run killed mid-write leaves a torn line
    results = run(5)
    assert len(fake.calls) == 5  # only the two new questions ran
    run(5)
    assert len(fake.calls) == 5  # and their results, written after the torn line, are read back
    assert [r["id"] for r in results.records] == [q["id"] for q in tiny.questions[:5]]
    row = results.summary["systems"]["rag"]
    assert row["f1"] == row["em"] == 100.0 and row["llm_calls"] == 1 and row["prompt_tokens"] == 100
    run(5, top_k="7")
    assert len(fake.calls) == 10  # a changed setting is another configuration: all five rerun


@needs_data
@pytest.mark.slow
def test_reuse_adopts_identical_jobs_from_another_run(tiny: Dataset, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake = CountingGraph({q["question"]: q["answers"][0] for q in tiny.questions})
    monkeypatch.setattr(registry, "load_graph", lambda name: fake)

    def run(out: str, limit: int, reuse: list[Path], **settings: str) -> runner.EvalResults:
        return runner.run_eval(str(tiny.dir), None, ["rag"], limit=limit, out=tmp_path / out, settings=settings,
                               progress=False, reuse=reuse)

    run("first", 3, [])
    assert len(fake.calls) == 3
    results = run("second", 5, [tmp_path / "first"])
    assert len(fake.calls) == 5  # three adopted, two run
    assert results.run["reused"] == {str(tmp_path / "first"): 3}
    assert "3 results taken from" in (tmp_path / "second" / "report.md").read_text()
    again = run("second", 5, [])
    assert len(fake.calls) == 5  # adopted results were copied: the folder stands alone
    assert again.run["reused"] == {str(tmp_path / "first"): 3}  # and the report still says where from
    run("third", 2, [tmp_path / "first"], top_k="7")
    assert len(fake.calls) == 7  # other settings: nothing to adopt
    with pytest.raises(ValueError, match="no results.jsonl there"):
        run("fourth", 1, [tmp_path / "missing"])
    assert not (tmp_path / "fourth").exists()


def test_variants_and_sweeps() -> None:
    variants = runner.expand_variants(
        ["rag", "mia_rag"], {"k0": "40", "mia_rag:k_sum": "3"},
        {"mia_rag:k0": ["30", "60"], "mia_rag:window": ["5", "20"]},
        retrieval_only=True, summarizer="extractive",
    )
    names = [v.name for v in variants]
    assert names == ["rag", "mia_rag[k0=30,window=5]", "mia_rag[k0=30,window=20]",
                     "mia_rag[k0=60,window=5]", "mia_rag[k0=60,window=20]"]
    assert variants[0].context.top_k == runner.RANKING_DEPTH and variants[0].retrieval_only
    assert not hasattr(variants[0].context, "k0")  # a global setting goes to the graphs that read it
    assert variants[1].context.k0 == 30 and variants[1].context.k_sum == 3 and variants[1].ingest.window == 5
    assert variants[0].ingest.window == 20  # window is an ingestion option: it never reaches the settings
    assert len({v.fingerprint for v in variants}) == 5
    rag, explicit = runner.expand_variants(["rag", "mia_rag"], {"mia_rag:k0": "050"}, {},
                                               retrieval_only=False, summarizer="extractive")
    plain = runner.expand_variants(["mia_rag"], {}, {}, retrieval_only=False, summarizer="extractive")[0]
    assert explicit.fingerprint == plain.fingerprint != rag.fingerprint  # k0 50 is the default


def test_linked_sweeps_move_settings_together() -> None:
    sweeps = runner.parse_assignments(["passage_order&top_k=score&5,document&12", "mia_rag:k0=30,60"], multi=True)
    assert sweeps == {"passage_order&top_k": [("score", "5"), ("document", "12")], "mia_rag:k0": ["30", "60"]}
    variants = runner.expand_variants(["rag", "mia_rag"], {}, sweeps, retrieval_only=False, summarizer="extractive")
    assert [v.name for v in variants] == [
        "rag[passage_order=score,top_k=5]", "rag[passage_order=document,top_k=12]",
        "mia_rag[passage_order=score,top_k=5,k0=30]", "mia_rag[passage_order=score,top_k=5,k0=60]",
        "mia_rag[passage_order=document,top_k=12,k0=30]", "mia_rag[passage_order=document,top_k=12,k0=60]"]
    assert (variants[1].context.passage_order, variants[1].context.top_k) == ("document", 12)
    scoped = runner.parse_assignments(["rag:passage_order&top_k=score&5,document&12", "mia_rag:top_k=3"], multi=True)
    assert [v.name for v in runner.expand_variants(["rag", "mia_rag"], {}, scoped, retrieval_only=False,
                                                   summarizer="extractive")] == [
        "rag[passage_order=score,top_k=5]", "rag[passage_order=document,top_k=12]", "mia_rag[top_k=3]"]
    with pytest.raises(ValueError, match="needs 2 parts"):
        runner.parse_assignments(["passage_order&top_k=score,document&12"], multi=True)
    with pytest.raises(ValueError, match="reads only some of these settings"):
        runner.expand_variants(["rag", "mia_rag"], {}, runner.parse_assignments(["top_k&k0=5&30"], multi=True),
                               retrieval_only=False, summarizer="extractive")
    with pytest.raises(ValueError, match="unknown setting.*colour"):
        runner.expand_variants(["rag"], {}, runner.parse_assignments(["top_k&colour=5&red"], multi=True),
                               retrieval_only=False, summarizer="extractive")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"systems": ["nope"]}, "unknown system"),
        ({"systems": ["mia_rag"], "settings": {"delta": "2"}}, "delta must be in"),
        ({"systems": ["rag"], "settings": {"colour": "red"}}, "unknown setting"),
        ({"systems": ["rag", "infmem"], "sweeps": {"k0": ["30", "60"]}}, "no graph of rag, infmem reads them"),
        ({"systems": ["rag", "mia_rag"], "settings": {"rag:k0": "30"}}, "unknown setting.*for graph rag"),
        ({"systems": ["rag"], "settings": {"agent:k0": "30"}}, "not among the systems"),
        ({"systems": ["rag"], "dataset": "nope"}, "unknown dataset"),
        ({"systems": ["rag"], "dataset": "fairytale-series", "length": 16000}, "--length applies to multihop-synth only"),
        ({"systems": ["rag"], "dataset": "custom"}, "needs --texts"),
        ({"systems": ["rag", "mia_rag"], "baselines": ["agent"]}, r"--baseline agent: not a variant of this run; pick one of rag, mia_rag"),
        ({"systems": ["rag"], "dataset": "multihop-synth", "origins": ["scottish-fairybook"]}, "--origins applies to fairytale-series"),
        ({"systems": ["rag"], "origins": ["atlantis-fairybook"]}, "unknown FairytaleQA origins"),
        ({"systems": ["rag"], "dataset": "multihop-synth", "interference": [1000]}, "--interference applies to fairytale-series"),
        ({"systems": ["rag"], "origins": ["lilac-fairybook"], "interference": [1000]}, "does not combine with --origins"),
    ],
)
def test_user_errors(kwargs: dict[str, Any], message: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = {"dataset": "fairytale-series", "split": None, "out": out, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        runner.run_eval(**args)
    assert not out.exists(), "a refused run must not leave an output folder behind"


@requires_data
def test_origins_make_a_smaller_series_of_their_own(tmp_path: Path) -> None:
    (part,) = runner.prepare_parts("fairytale-series", "val", [], 0, tmp_path, origins=["swedish-fairybook"])
    assert part.dataset.books == ["swedish-fairybook"] and part.tag == "fairytale-series-val-swedish-fairybook"
    assert {q["meta"]["origin"] for q in part.dataset.questions} == {"swedish-fairybook"}
    (full,) = runner.prepare_parts("fairytale-series", "val", [], 0, tmp_path)
    assert len(full.dataset.books) == 4 and full.dataset.dir != part.dataset.dir


@requires_data
def test_interference_makes_one_part_per_size_named_by_its_tokens(tmp_path: Path) -> None:
    small, grown = runner.prepare_parts("fairytale-series", "val", [], 0, tmp_path, interference=[0, 1])
    assert small.tag == "fairytale-series-val" and grown.tag == "fairytale-series-val-library1"
    assert len(grown.dataset.books) == len(small.dataset.books) + 1
    assert grown.length == grown.dataset.manifest["tokens"] > small.length == small.dataset.manifest["tokens"]


def test_agents_refused_in_retrieval_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "QUESTION_GRAPHS", ("rag", "mia_rag", "mia_agent"))
    with pytest.raises(ValueError, match="mia_agent cannot run retrieval-only"):
        runner.expand_variants(["rag", "mia_agent"], {}, {}, retrieval_only=True, summarizer="extractive")


def test_paired_table_uses_a_swept_rag_as_baseline() -> None:
    """With ``--sweep retriever=dense,hybrid`` no variant is called plain ``rag``: the first rag[...] is the baseline."""

    def rec(system: str, qid: str, recall: float) -> dict[str, Any]:
        return {"system": system, "part": "p", "id": qid, "scores": {"recall@10": recall},
                **{m: 0.0 for m in report.COST_METRICS}}

    systems = ["rag[retriever=dense]", "rag[retriever=hybrid]"]
    records = [rec(systems[0], q, 0.0) for q in "abcd"] + [rec(systems[1], q, 1.0) for q in "abcd"]
    lines = report._tables({"parts": [{}]}, report._by_system(records), systems, seed=0)
    text = "\n".join(lines)
    assert "Paired difference against `rag[retriever=dense]`" in text
    paired = lines[next(i for i, line in enumerate(lines) if line.startswith("## Paired")):]
    row = next(line for line in paired if line.startswith("| rag[retriever=hybrid] |"))
    assert row.split("|")[2].strip() == "1.0 [1.0, 1.0]"  # hybrid − dense recall@10, the same on every question


def test_named_baselines_replace_rag_with_one_paired_table_each() -> None:
    """``--baseline agent --baseline infmem``: a table against each, none against ``rag``."""

    def rec(system: str, qid: str, f1: float) -> dict[str, Any]:
        return {"system": system, "part": "p", "id": qid, "scores": {"f1": f1}, **{m: 0.0 for m in report.COST_METRICS}}

    systems = ["rag", "agent", "infmem"]
    scores = {"rag": 10.0, "agent": 30.0, "infmem": 20.0}
    records = [rec(name, q, scores[name]) for name in systems for q in "abc"]
    lines = report._tables({"parts": [{}]}, report._by_system(records), systems, seed=0, baselines=["agent", "infmem"])
    headings = [line for line in lines if line.startswith("## Paired")]
    assert [h.split("`")[1] for h in headings] == ["agent", "infmem"]
    tables = "\n".join(lines).split("## Paired")[1:]
    against_agent = [row.split("|")[1:3] for row in tables[0].splitlines() if row.startswith("| ") and "system" not in row]
    assert [(name.strip(), cell.strip()) for name, cell in against_agent] == [("rag", "-20.0 [-20.0, -20.0]"),
                                                                               ("infmem", "-10.0 [-10.0, -10.0]")]
    assert "| agent | 10.0 [10.0, 10.0]" in tables[1]


def test_fingerprint_holds_every_resolved_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting changed by the environment, like a default that changes, is another configuration:
    a cached result never stands for a setting it was not made under."""
    def rag(settings: dict[str, str]) -> str:
        return runner.expand_variants(["rag"], settings, {}, retrieval_only=False, summarizer="extractive")[0].fingerprint

    default = rag({})
    assert rag({"top_k": "10"}) == default  # the default typed out is the same configuration
    monkeypatch.setenv("MIA_TOP_K", "7")  # as a changed default would
    assert rag({}) == rag({"top_k": "7"}) != default


def test_a_global_setting_changes_only_the_graphs_that_read_it() -> None:
    """A streaming agent's result stands for every retriever and k0; a change it reads makes a new one."""
    def prints(settings: dict[str, str]) -> dict[str, str]:
        variants = runner.expand_variants(["rag", "mia_rag", "infmem"], settings, {}, retrieval_only=False,
                                          summarizer="extractive")
        return {v.name: v.fingerprint for v in variants}

    base = prints({})
    retrieval = prints({"retriever": "dense", "top_k": "5", "k0": "40"})
    assert retrieval["infmem"] == base["infmem"]
    assert retrieval["rag"] != base["rag"] and retrieval["mia_rag"] != base["mia_rag"]
    streaming = prints({"memory_tokens": "512"})
    assert streaming["infmem"] != base["infmem"]
    assert streaming["rag"] == base["rag"] and streaming["mia_rag"] == base["mia_rag"]
    # The fusion's settings matter to hybrid retrieval only.
    assert prints({"rrf_k": "30"})["rag"] != base["rag"]
    with pytest.raises(ValueError, match="rrf_k is read only by retriever=hybrid"):
        prints({"retriever": "dense", "rrf_k": "30"})
    assert prints({"bm25_stemming": "false"})["rag"] != base["rag"]


def test_cost_growth_compares_the_same_questions() -> None:
    """Ratios to the shortest length use only questions finished at both lengths (hand-computed)."""

    def rec(part: str, qid: str, source: int, calls: int, prompt: int) -> dict[str, Any]:
        return {"system": "memagent", "part": part, "id": qid, "scores": {}, "source_tokens": source,
                "llm_calls": calls, "prompt_tokens": prompt, "generated_tokens": 10, "seconds": 1.0}

    run = {"parts": [{"tag": "a", "length": 16000}, {"tag": "b", "length": 32000}]}
    records = [rec("a", "q1", 16000, 4, 1000), rec("a", "q2", 16000, 4, 3000),
               rec("b", "q1", 32000, 7, 2500), rec("b", "q3", 32000, 99, 99999)]  # q3 has no 16k row
    lines = report._growth(run, report._by_system(records), ["memagent"])
    assert lines[-1] == "| memagent | 32000 | 1 | ×2.00 | ×1.75 | ×2.50 | ×1.00 |"


def test_report_names_each_variants_summarizer_when_a_sweep_changes_it() -> None:
    def run(*kinds: str) -> dict[str, Any]:
        return {"summarizer": "extractive", "variants": [{"ingest": {"summarizer": kind}} for kind in kinds]}

    assert report._summarizers_text(run("extractive", "extractive")) == "extractive"
    assert report._summarizers_text(run("llm", "extractive")) == "per variant (extractive, llm)"


def test_token_table_reads_strict_first_and_leaves_a_budget_some_ranking_did_not_fill() -> None:
    """Recall at equal tokens gets a table of its own and a paired one against rag; a budget that one
    question's ranking did not fill (no score in its record) is "–" for that system, not a mean over fewer questions."""

    def rec(system: str, qid: str, value: float, budgets: tuple[int, ...]) -> dict[str, Any]:
        scores = {f"{kind}@{n}tok": value for n in budgets for kind in ("strict_recall", "recall")}
        return {"system": system, "part": "p", "id": qid, "scores": scores, **{m: 0.0 for m in report.COST_METRICS}}

    records = [rec("rag", q, 50.0, (500, 1000)) for q in "ab"] + [rec("bm25", "a", 75.0, (500, 1000)), rec("bm25", "b", 75.0, (500,))]
    lines = report._tables({"parts": [{}]}, report._by_system(records), ["rag", "bm25"], seed=0)
    table = lines[lines.index(next(line for line in lines if line.startswith("## Recall at equal retrieved tokens"))):]
    assert table[2] == "| system | strict_recall@500tok | recall@500tok | strict_recall@1000tok | recall@1000tok |"
    assert table[5] == "| bm25 | 75.0 [75.0, 75.0] | 75.0 [75.0, 75.0] | – | – |"
    paired = "\n".join(table)
    assert "## Paired difference in recall at equal retrieved tokens against `rag`" in paired
    assert "| bm25 | 25.0 [25.0, 25.0] | 25.0 [25.0, 25.0] | – | – |" in paired


def test_misses_are_split_into_reading_and_retrieval_and_answers_sit_beside_references() -> None:
    def rec(system: str, qid: str, f1: float, seen: float, answer: str, holds: float = 100.0) -> dict[str, Any]:
        return {"system": system, "part": "p", "id": qid, "question": f"Who is {qid}?", "answer": answer,
                "references": [f"ref {qid}", "other | ref"],
                "scores": {"f1": f1, "answer_in_passages": seen, "first_citation_holds": holds},
                **{m: 0.0 for m in report.COST_METRICS}}

    records = [rec("rag", "a", 100.0, 100.0, "ref a"), rec("rag", "b", 0.0, 100.0, "wrong"),
               rec("rag", "c", 40.0, 0.0, "half"), rec("rag", "d", 0.0, 0.0, "x" * 300),
               rec("mia_rag", "a", 50.0, 0.0, "ref", holds=0.0), rec("mia_rag", "b", 0.0, 0.0, "no")]
    grouped = report._by_system(records)
    lines = report._tables({"parts": [{}]}, grouped, ["rag", "mia_rag"], seed=0)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines
            if line.startswith("| ") and line.count("|") == 8}
    # questions, answered (F1 >= 50), of them first citation holds, missed, reading misses, retrieval misses
    assert rows["rag"] == ["4", "1", "1 of 1", "3", "1", "2"] and rows["mia_rag"] == ["2", "1", "0 of 1", "1", "0", "1"]
    answers = report.answers_section(grouped, ["rag", "mia_rag"])
    assert answers[3] == "| question | references | `rag` | `mia_rag` |"
    by_question = {line.split(" | ")[0]: line for line in answers[5:]}
    assert by_question["| Who is a?"] == "| Who is a? | ref a / other \\| ref | ref a (100 ·) | ref (50) |"
    assert by_question["| Who is c?"].endswith("| half (40) | – |")  # mia_rag did not answer c
    assert "x" * (report.ANSWER_CELL_CHARS - 1) + "…" in by_question["| Who is d?"]
    assert report.answers_section(report._by_system([{**r, "scores": {}} for r in records]), ["rag"]) == []


@needs_data
@pytest.mark.slow
def test_a_folder_of_question_files_runs_as_one_set_each_question_over_its_own_book(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The literaryqa layout: one JSONL file per book, each question naming its book in meta.book,
    is one data set, and each question is asked over a collection of its own book alone."""
    monkeypatch.setenv("MIA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "chroma"))
    texts, questions = _write_custom(tmp_path)
    folder = tmp_path / "questions"
    folder.mkdir()
    for story in STORIES[:2]:
        own = [json.loads(line) for line in questions.read_text().splitlines() if json.loads(line)["id"].startswith(story)]
        (folder / f"{story}.jsonl").write_text("".join(json.dumps({**r, "meta": {"book": story}}) + "\n" for r in own))
    built = build_custom(tmp_path / "dataset", texts, folder)
    first, second = sorted(STORIES[:2])  # the files in name order
    assert [q["meta"]["book"] for q in built.questions] == [first] * 2 + [second] * 2
    results = runner.run_eval(str(built.dir), None, ["rag"], retrieval_only=True, out=tmp_path / "out", progress=False)
    assert len(results.records) == 4
    collections = {r["id"].rsplit("-", 1)[0]: r["collection"] for r in results.records}
    assert len(set(collections.values())) == 2
    for record in results.records:
        store = Mindscape(record["collection"])
        assert len(store.commits.records()) == 1  # its own book alone
        assert record["scores"]["recall@20"] == 100.0  # the whole (short) story came back


def test_a_limit_takes_questions_in_turn_from_each_source_or_book() -> None:
    def q(qid: str, **meta: str) -> dict[str, Any]:
        return {"id": qid, "meta": meta}

    books = [q("a0", book="a"), q("a1", book="a"), q("a2", book="a"), q("b0", book="b"), q("c0", book="c"), q("c1", book="c")]
    assert [x["id"] for x in runner.select_questions(books, 4)] == ["a0", "b0", "c0", "a1"]
    sources = [q("h0", source="hotpot", book="h0"), q("h1", source="hotpot", book="h1"), q("m0", source="musique", book="m0")]
    assert [x["id"] for x in runner.select_questions(sources, 2)] == ["h0", "m0"]  # the source groups, not the books
    assert runner.select_questions(books, None) == books


def test_answer_in_at_tokens_reads_whole_passages_then_the_crossing_one_cut_in_proportion() -> None:
    question = {"answers": ["green door"]}
    passages = ["aaaa bbbb", "the green", "door here", "never read"]
    tokens = [4, 4, 4, 4]
    spans = [("book", 10 * i, 10 * i + 9) for i in range(4)]
    scores = runner.score_question(question, "", spans, tokens, 4, retrieval_only=True, passages=passages)
    # 1,000 tokens and more hold all four passages; "door" is in the third
    assert scores["answer_in@1000tok"] == 100.0 and scores["answer_in@5"] == 100.0
    assert runner._first_tokens(passages, spans, tokens, 8) == ["aaaa bbbb", "the green"]
    # 2 of its 4 tokens: 4.5 of its 9 characters, rounded up; 1 of 4: 2.25, rounded up
    assert runner._first_tokens(passages, spans, tokens, 10) == ["aaaa bbbb", "the green", "door "]
    assert runner._first_tokens(passages, spans, tokens, 9) == ["aaaa bbbb", "the green", "doo"]
