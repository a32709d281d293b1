"""Data set builders: gold spans must point at exactly the evidence, or every Recall@k is wrong."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from mia.evals import datasets as datasets
from mia.evals.datasets import (
    BUILDERS,
    DATA_ENV,
    Dataset,
    DatasetError,
    build_custom,
    build_fairytale_series,
    build_multihop_synth,
    default_data_root,
    load_dataset,
    read_source,
)
from mia.stores.tokens import count_tokens

DATA = default_data_root()
pytestmark = pytest.mark.skipif(
    not DATA.exists(), reason=f"shared data not found at {DATA}; set ${DATA_ENV}"
)
SECTIONS = DATA / "fairytaleqa" / "data-by-train-split" / "section-stories"
TARGET = 3000
# A document stops when the next paragraph would pass the target, so it falls short by less than one
# paragraph; the largest in the multi-hop pool is 1,553 tokens (median 89).
PARAGRAPH_TOLERANCE = 1600


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _span_text(dataset: Dataset, span: dict[str, Any]) -> str:
    return read_source(dataset.sources[dataset.books.index(span["book"])])[span["start"] : span["end"]]


# --------------------------------------------------------------------------- fairytale series


@pytest.fixture(scope="module")
def fairy(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return build_fairytale_series(tmp_path_factory.mktemp("fairy") / "fts")


def test_fairytale_layout(fairy: Dataset) -> None:
    assert fairy.name == "fairytale-series" and fairy.split == "test"
    assert fairy.books == list(datasets.DEFAULT_ORIGINS)
    assert [p.name for p in fairy.sources] == [f"{i:02d}_{b}.txt" for i, b in enumerate(fairy.books, 1)]
    manifest = fairy.manifest
    assert manifest["questions"] == len(fairy.questions) > 0
    assert manifest["tokens"] == sum(s["tokens"] for s in manifest["sources"])
    for source, path in zip(manifest["sources"], fairy.sources, strict=True):
        assert source["chars"] == len(read_source(path))
    # Norwegian comes first, its first story in story_meta order, titled from its file name.
    assert read_source(fairy.sources[0]).startswith("Anent Giant Who Did Not Have His Heart About Him\n\n")
    assert load_dataset(fairy.dir) == fairy


def test_fairytale_questions_come_from_the_split(fairy: Dataset) -> None:
    with (DATA / "fairytaleqa" / "story_meta.csv").open(newline="", encoding="utf-8") as handle:
        split_of = {row["filename"]: row["split"] for row in csv.DictReader(handle)}
    assert {split_of[q["meta"]["story"]] for q in fairy.questions} == {"test"}
    assert len({q["id"] for q in fairy.questions}) == len(fairy.questions)
    for q in fairy.questions:
        assert q["answers"] and all(a.strip() for a in q["answers"])
        assert q["meta"]["origin"] in fairy.books


def test_fairytale_gold_is_the_cor_sections(fairy: Dataset) -> None:
    sections: dict[str, dict[str, str]] = {}
    for q in fairy.questions:
        story = q["meta"]["story"]
        if story not in sections:
            with (SECTIONS / "test" / f"{story}-story.csv").open(newline="", encoding="utf-8") as handle:
                sections[story] = {row["section"]: row["text"] for row in csv.DictReader(handle)}
        expected = [sections[story][sid.strip()] for sid in q["meta"]["cor_section"].split(",")]
        assert [_span_text(fairy, g) for g in q["gold"]] == expected
        assert {g["book"] for g in q["gold"]} == {q["meta"]["origin"]}


def test_fairytale_reuses_a_complete_build(fairy: Dataset) -> None:
    stamp = (fairy.dir / "manifest.json").stat().st_mtime_ns
    again = build_fairytale_series(fairy.dir)
    assert again == fairy
    assert (fairy.dir / "manifest.json").stat().st_mtime_ns == stamp
    with pytest.raises(DatasetError, match="different arguments"):
        build_fairytale_series(fairy.dir, split="val")


def test_fairytale_interference_adds_library_books_and_keeps_gold_exact(fairy: Dataset, tmp_path: Path) -> None:
    library = sorted((DATA / "books").rglob("*.txt"))
    first_two = count_tokens(read_source(library[0])) + 1  # just past the first book: two are needed
    grown = build_fairytale_series(tmp_path / "grown", interference_tokens=first_two)
    assert grown.books[:4] == fairy.books
    assert grown.books[4:] == [f"library-{p.parent.name}-{p.stem}" for p in library[:2]]
    for path, book in zip(library[:2], grown.books[4:]):
        assert read_source(grown.sources[grown.books.index(book)]) == read_source(path)
    assert grown.questions == fairy.questions  # same questions, same gold spans into the same fairy books
    for q in grown.questions[:50]:
        assert [_span_text(grown, g) for g in q["gold"]] == [_span_text(fairy, g) for g in q["gold"]]
    assert grown.manifest["params"]["interference_tokens"] == first_two
    assert "interference_tokens" not in fairy.manifest["params"]  # earlier builds keep their names
    everything = build_fairytale_series(tmp_path / "all", interference_tokens=10**9)
    assert len(everything.books) == 4 + len(library)
    with pytest.raises(DatasetError, match="0 or more tokens"):
        build_fairytale_series(tmp_path / "bad", interference_tokens=-1)


def test_fairytale_titled(tmp_path: Path) -> None:
    titled = BUILDERS["fairytale-series-titled"](tmp_path / "t", split="val", origins=("lilac-fairybook",))
    assert titled.name == "fairytale-series-titled" and titled.books == ["lilac-fairybook"]
    for q in titled.questions:
        assert q["question"].startswith(f"In {q['meta']['title']}: ")


def test_fairytale_rejects_unknown_origin(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown FairytaleQA origins"):
        build_fairytale_series(tmp_path / "x", origins=("lilac",))
    assert not (tmp_path / "x").exists()


def test_missing_data_root_names_path_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=DATA_ENV) as error:
        build_fairytale_series(tmp_path / "x", data_root=missing)
    assert str(missing) in str(error.value)
    monkeypatch.setenv(DATA_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_multihop_synth(tmp_path / "y")


# --------------------------------------------------------------------------- synthetic multi-hop


def _expected_gold(source: str, source_id: str) -> list[str]:
    """Gold paragraphs straight from the raw files, formatted as the documents format them."""
    path = DATA / "multihop" / datasets.MULTIHOP_FILES[source]
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    clean = lambda s: " ".join(s.split())  # noqa: E731
    if source == "musique":
        record = next(r for r in records if r["id"] == source_id)
        supporting = [p for p in record["paragraphs"] if p["is_supporting"]]
        return [f"{clean(p['title'])}\n{clean(p['paragraph_text'])}" for p in supporting]
    record = next(r for r in records if r["_id"] == source_id)
    gold = {title for title, _ in record["supporting_facts"]}
    return [f"{clean(t)}\n{clean(' '.join(s))}" for t, s in record["context"] if t in gold]


@pytest.fixture(scope="module")
def multihop(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return build_multihop_synth(tmp_path_factory.mktemp("mh") / "a", target_tokens=TARGET, n_questions=2, seed=0)


def test_multihop_gold_is_the_supporting_paragraphs(multihop: Dataset) -> None:
    assert len(multihop.questions) == 6  # 2 per source
    assert [q["meta"]["source"] for q in multihop.questions] == ["hotpot"] * 2 + ["musique"] * 2 + ["wikihop"] * 2
    assert multihop.books == [q["meta"]["book"] for q in multihop.questions]
    for q in multihop.questions:
        assert {g["book"] for g in q["gold"]} == {q["meta"]["book"]}
        spans = sorted(_span_text(multihop, g) for g in q["gold"])
        assert spans == sorted(_expected_gold(q["meta"]["source"], q["meta"]["source_id"]))
        assert q["answers"] and q["answers"][0]


def test_multihop_distractors_never_share_a_gold_title(multihop: Dataset) -> None:
    for q, path in zip(multihop.questions, multihop.sources, strict=True):
        text = read_source(path)
        gold_starts = {g["start"] for g in q["gold"]}
        gold_titles = {t.casefold() for t in q["meta"]["gold_titles"]}
        offset, titles = 0, []
        for paragraph in text.split("\n\n"):
            title = paragraph.split("\n", 1)[0]
            titles.append(title)
            if offset not in gold_starts:
                assert title.casefold() not in gold_titles
            offset += len(paragraph) + 2
        assert len(titles) == q["meta"]["paragraphs"]
        assert len(set(titles)) == len(titles) or q["meta"]["source"] == "musique"


def test_multihop_target_length(multihop: Dataset) -> None:
    for source in multihop.manifest["sources"]:
        assert source["tokens"] <= TARGET
        assert source["tokens"] >= TARGET - PARAGRAPH_TOLERANCE
        assert source["tokens"] == count_tokens(read_source(multihop.dir / source["file"]))


def test_multihop_is_deterministic_per_seed(multihop: Dataset, tmp_path: Path) -> None:
    again = build_multihop_synth(tmp_path / "b", target_tokens=TARGET, n_questions=2, seed=0)
    assert _files(again.dir) == _files(multihop.dir)
    other = build_multihop_synth(tmp_path / "c", target_tokens=TARGET, n_questions=2, seed=1)
    assert _files(other.dir)["questions.jsonl"] != _files(multihop.dir)["questions.jsonl"]
    assert [q["id"] for q in other.questions] == [q["id"] for q in multihop.questions]


def test_multihop_question_documents_do_not_depend_on_n(multihop: Dataset, tmp_path: Path) -> None:
    one = build_multihop_synth(tmp_path / "one", target_tokens=TARGET, n_questions=1)
    for i, question in enumerate(one.questions):
        assert question == multihop.questions[2 * i]
        assert read_source(one.sources[i]) == read_source(multihop.sources[2 * i])


def test_multihop_train_split_is_2wiki_train(tmp_path: Path) -> None:
    """The tuning split: 2Wiki train questions, none of them a dev question, gold spans exact."""
    train = build_multihop_synth(tmp_path / "train", target_tokens=TARGET, n_questions=3, split="train")
    assert train.split == "train" and len(train.questions) == 3
    dev_ids = {json.loads(line)["_id"] for line in (DATA / "multihop" / "wikihop.json").read_text().splitlines() if line.strip()}
    raw = json.loads((DATA / "multihop" / datasets.MULTIHOP_TRAIN_FILES["wikihop"]).read_text())
    by_id = {r["_id"]: r for r in raw}
    for q in train.questions:
        assert q["meta"]["source"] == "wikihop" and q["meta"]["source_id"] not in dev_ids
        record = by_id[q["meta"]["source_id"]]
        gold = {t for t, _ in record["supporting_facts"]}
        expected = sorted(f"{' '.join(t.split())}\n{' '.join(' '.join(s).split())}" for t, s in record["context"] if t in gold)
        assert sorted(_span_text(train, g) for g in q["gold"]) == expected
    with pytest.raises(DatasetError, match="splits 'dev' and 'train'"):
        build_multihop_synth(tmp_path / "x", split="test")
    with pytest.raises(DatasetError, match="'train' split"):
        build_multihop_synth(tmp_path / "y", split="train", sources=("hotpot",))


def test_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = iter(range(2))

    def flaky(text: str) -> int:
        if next(calls, None) is None:
            raise KeyboardInterrupt
        return len(text)

    monkeypatch.setattr(datasets, "count_tokens", flaky)
    with pytest.raises(KeyboardInterrupt):
        build_multihop_synth(tmp_path / "out", target_tokens=500, n_questions=1)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- custom


def _custom_inputs(tmp_path: Path, lines: list[str]) -> tuple[Path, Path]:
    texts = tmp_path / "texts"
    texts.mkdir(exist_ok=True)
    (texts / "b_second.md").write_text("# Two\nThe key is under the mat.\n", encoding="utf-8")
    (texts / "a_first.txt").write_text("Once upon a time.\r\nThe end.\n", encoding="utf-8", newline="")
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return texts, questions


def test_custom_builds_and_round_trips(tmp_path: Path) -> None:
    lines = [
        json.dumps({"question": "Where is the key?", "answers": ["under the mat"],
                    "gold": [{"book": "b_second", "start": 6, "end": 31}]}),
        json.dumps({"id": "mc", "question": "How does it end?", "options": ["badly", "The end."], "label": "b"}),
    ]
    texts, questions = _custom_inputs(tmp_path, lines)
    built = build_custom(tmp_path / "out", texts, questions)
    assert built.books == ["a_first", "b_second"]
    assert [p.name for p in built.sources] == ["01_a_first.txt", "02_b_second.txt"]
    assert read_source(built.sources[0]) == "Once upon a time.\r\nThe end.\n"  # offsets keep \r\n
    assert _span_text(built, built.questions[0]["gold"][0]) == "The key is under the mat."
    assert built.questions[0]["id"] == "q1"
    assert built.questions[1]["label"] == "B" and built.questions[1]["answers"] == []
    assert load_dataset(built.dir) == built == build_custom(tmp_path / "out", texts, questions)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ("{not json", "invalid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"question": "q", "answer": ["x"]}', "unknown keys \\['answer'\\]"),
        ('{"question": " ", "answers": ["x"]}', "'question' must be a non-empty string"),
        ('{"question": "q"}', "give 'answers'"),
        ('{"question": "q", "answers": "x"}', "'answers' must be a list"),
        ('{"question": "q", "options": ["x", "y"], "label": "C"}', "'label' must be one of \\['A', 'B'\\]"),
        ('{"question": "q", "answers": ["x"], "label": "A"}', "'label' given without 'options'"),
        ('{"question": "q", "answers": ["x"], "gold": [{"book": "c", "start": 0, "end": 1}]}', "names book 'c'"),
        ('{"question": "q", "answers": ["x"], "gold": [{"book": "a_first", "start": 5, "end": 999}]}', "not inside"),
        ('{"question": "q", "answers": ["x"], "gold": [{"book": "a_first", "start": 0}]}', "exactly 'book'"),
        ('{"id": "q1", "question": "q", "answers": ["x"]}', "duplicate id 'q1'"),
    ],
)
def test_custom_validation_names_file_and_line(tmp_path: Path, record: str, message: str) -> None:
    texts, questions = _custom_inputs(tmp_path, [json.dumps({"question": "ok?", "answers": ["yes"]}), record])
    with pytest.raises(DatasetError, match=message) as error:
        build_custom(tmp_path / "out", texts, questions)
    assert f"{questions}:2:" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_custom_rejects_bad_folders(tmp_path: Path) -> None:
    texts, questions = _custom_inputs(tmp_path, [json.dumps({"question": "ok?", "answers": ["yes"]})])
    (texts / "a_first.md").write_text("clash", encoding="utf-8")
    with pytest.raises(DatasetError, match="'a_first' is used by another file"):
        build_custom(tmp_path / "out", texts, questions)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no .txt or .md files"):
        build_custom(tmp_path / "out", empty, questions)


def test_custom_takes_one_book_file(tmp_path: Path) -> None:
    texts, questions = _custom_inputs(tmp_path, [json.dumps(
        {"question": "Where is the key?", "answers": ["under the mat"], "gold": [{"book": "b_second", "start": 6, "end": 31}]})])
    built = build_custom(tmp_path / "out", texts / "b_second.md", questions)
    assert built.books == ["b_second"]
    assert _span_text(built, built.questions[0]["gold"][0]) == "The key is under the mat."
    (tmp_path / "notes.pdf").write_bytes(b"%PDF")
    with pytest.raises(DatasetError, match="not a .txt/.md file or a folder"):
        build_custom(tmp_path / "other", tmp_path / "notes.pdf", questions)


def test_registry() -> None:
    assert set(BUILDERS) == {"fairytale-series", "fairytale-series-titled", "fairytale-train", "multihop-synth", "custom"}


def test_custom_reads_a_folder_of_question_files_as_one_set(tmp_path: Path) -> None:
    texts, _ = _custom_inputs(tmp_path, [])
    folder = tmp_path / "questions"
    folder.mkdir()
    (folder / "b_second.jsonl").write_text(json.dumps({"question": "Where is the key?", "answers": ["under the mat"],
                                                       "meta": {"book": "b_second"}}) + "\n", encoding="utf-8")
    (folder / "a_first.jsonl").write_text(json.dumps({"question": "How does it start?", "answers": ["once"],
                                                      "meta": {"book": "a_first"}}) + "\n", encoding="utf-8")
    (folder / "notes.txt").write_text("not questions", encoding="utf-8")
    built = build_custom(tmp_path / "out", texts, folder)
    assert [(q["id"], q["meta"]["book"]) for q in built.questions] == [("a_first-q1", "a_first"), ("b_second-q1", "b_second")]
    (folder / "c.jsonl").write_text(json.dumps({"id": "a_first-q1", "question": "q", "answers": ["x"]}) + "\n")
    with pytest.raises(DatasetError, match=r"c.jsonl:1: duplicate id 'a_first-q1'"):  # ids are unique across the files
        build_custom(tmp_path / "out2", texts, folder)
    (folder / "c.jsonl").write_text(json.dumps({"question": "q", "answers": ["x"], "meta": {"book": "c"}}) + "\n")
    with pytest.raises(DatasetError, match=r"c.jsonl:1: meta.book 'c' is not one of the files \['a_first', 'b_second'\]"):
        build_custom(tmp_path / "out2", texts, folder)
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no .jsonl files in this folder"):
        build_custom(tmp_path / "out2", texts, empty)
    with pytest.raises(DatasetError, match="questions file or folder not found"):
        build_custom(tmp_path / "out2", texts, tmp_path / "missing.jsonl")
    assert not (tmp_path / "out2").exists()
