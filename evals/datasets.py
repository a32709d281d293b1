"""Evaluation data sets built from the shared data, all in one on-disk format.

Every builder writes the same layout, so retrieval and answering code never needs to know which
benchmark it runs on::

    OUT/manifest.json          name, split, seed, params, sources (book, file, tokens, chars), totals
    OUT/sources/NN_<book>.txt  one file per book, in collection order
    OUT/questions.jsonl        id, question, answers, [options, label], gold spans, meta

Gold evidence is a list of ``{"book", "start", "end"}`` character spans (Python ``str`` indices into
the book's text, end exclusive), so Recall@k is defined at any chunk size: a chunk is a hit when it
overlaps a gold span. Source files are read and written with ``newline=""`` so those offsets survive
the round trip byte for byte.

A build goes to a temporary sibling folder that is renamed into place only when complete, so an
interrupted build never leaves a half-written data set; asking again for a folder that already holds
a complete build with the same arguments reuses it.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.stores.tokens import count_tokens

DATA_ENV = "MIA_DATA"
SPLITS = ("train", "val", "test")
DEFAULT_ORIGINS = ("norwegian-fairybook", "scottish-fairybook", "swedish-fairybook", "lilac-fairybook")
TRAIN_ORIGINS = (
    "andersen-fairybook", "beatrix-potter-fairybook", "blue-fairybook", "chinese-fairybook", "first-round",
    "green-fairybook", "grimm-fairybook", "irish-fairybook", "japanese-fairybook", "lilac-fairybook",
    "native-american-fairybook", "norwegian-fairybook", "scottish-fairybook", "swedish-fairybook",
    "wonderclock-fairybook",
)
"""Every FairytaleQA origin with train stories: ``fairytale-train`` merges each one's into a book."""
MULTIHOP_FILES = {"hotpot": "hotpot.json", "musique": "musique.json", "wikihop": "wikihop.json"}
MULTIHOP_TRAIN_FILES = {"wikihop": "wikihop_train_preprocess.json"}
"""The train split: 2Wiki train questions, for tuning what the dev questions then measure."""
DISTRACTOR_CORPUS = "2wikimultihopqa_corpus.json"
PARAGRAPH_SEP = "\n\n"
_MINOR_WORDS = frozenset({"a", "an", "and", "as", "at", "by", "for", "in", "of", "on", "or", "the", "to"})


class DatasetError(ValueError):
    """Bad builder input or a folder that cannot be reused; the message says where and why."""


@dataclass(frozen=True)
class Dataset:
    """A built data set: enough to index its sources and score answers on its questions."""

    name: str
    split: str
    dir: Path
    sources: list[Path]
    books: list[str]
    questions: list[dict[str, Any]]

    @property
    def manifest(self) -> dict[str, Any]:
        """Read on demand: token counts and params matter to reports, not to every consumer."""
        return json.loads((self.dir / "manifest.json").read_text(encoding="utf-8"))

    @property
    def book_names(self) -> dict[str, str]:
        """Each book's name in the data set by the id ingestion gives it (after its file): gold
        spans name books as the data set does, retrieved chunks as ingestion does."""
        from mia.stores.ingest import book_id  # ingestion's import cost only where a collection is read

        return {book_id(path): book for path, book in zip(self.sources, self.books)}


def default_data_root() -> Path:
    """``$MIA_DATA`` or ``../shared/data`` from the working directory (the project's convention)."""
    return Path(os.environ.get(DATA_ENV) or Path.cwd() / ".." / "shared" / "data")


def _require(path: Path, data_root: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"shared data not found: {path} is missing (data root {data_root}; "
            f"set ${DATA_ENV} to the folder holding fairytaleqa/ and multihop/)"
        )
    return path


def _resolve_root(data_root: Path | None) -> Path:
    root = Path(data_root) if data_root is not None else default_data_root()
    return _require(root, root)


def load_dataset(directory: Path) -> Dataset:
    """Read a built data set back; a folder without a manifest is not a complete build."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise DatasetError(f"{directory} is not a built data set: {manifest_path} is missing")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    with (directory / "questions.jsonl").open(encoding="utf-8") as handle:
        questions = [json.loads(line) for line in handle if line.strip()]
    return Dataset(
        name=manifest["name"],
        split=manifest["split"],
        dir=directory,
        sources=[directory / source["file"] for source in manifest["sources"]],
        books=[source["book"] for source in manifest["sources"]],
        questions=questions,
    )


def read_source(path: Path) -> str:
    """A source's text exactly as written, so gold offsets index it correctly."""
    with Path(path).open(encoding="utf-8", newline="") as handle:
        return handle.read()


# --------------------------------------------------------------------------- writing


def _jsonable(value: Any) -> Any:
    """Tuples become lists, as they will after a JSON round trip, so params compare equal."""
    return json.loads(json.dumps(value))


def _safe_name(name: str) -> str:
    """Question ids become book and file names, so keep them to characters every filesystem takes."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "book"


def _reuse(out_dir: Path, name: str, split: str, seed: int | None, params: dict[str, Any]) -> Dataset | None:
    """The existing build when it matches the request; refuse to touch one that does not."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return None
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file():
        raise DatasetError(f"{out_dir} exists but holds no manifest.json; remove it or choose another folder")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    wanted = {"name": name, "split": split, "seed": seed, "params": _jsonable(params)}
    found = {key: manifest.get(key) for key in wanted}
    if found != wanted:
        raise DatasetError(
            f"{out_dir} holds a build with different arguments ({found}, asked for {wanted}); "
            "remove it or choose another folder"
        )
    return load_dataset(out_dir)


class _Writer:
    """Streams books into a temporary folder and renames it into place only when complete.

    Books are written as they are made, so a large synthetic collection never sits in memory.
    """

    def __init__(
        self, out_dir: Path, name: str, split: str, seed: int | None, params: dict[str, Any], n_books: int
    ) -> None:
        self.out_dir = Path(out_dir)
        self.header = {"name": name, "split": split, "seed": seed, "params": _jsonable(params)}
        self.width = max(2, len(str(n_books)))
        self.sources: list[dict[str, Any]] = []
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", suffix=".tmp", dir=self.out_dir.parent))
        (self.tmp / "sources").mkdir()

    def add_book(self, book: str, text: str) -> None:
        file = f"sources/{len(self.sources) + 1:0{self.width}d}_{book}.txt"
        with (self.tmp / file).open("w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        self.sources.append({"book": book, "file": file, "tokens": count_tokens(text), "chars": len(text)})

    def finish(self, questions: list[dict[str, Any]]) -> Dataset:
        with (self.tmp / "questions.jsonl").open("w", encoding="utf-8") as handle:
            for question in questions:
                handle.write(json.dumps(question, ensure_ascii=False) + "\n")
        manifest = {
            **self.header,
            "sources": self.sources,
            "questions": len(questions),
            "tokens": sum(source["tokens"] for source in self.sources),
        }
        manifest_text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
        (self.tmp / "manifest.json").write_text(manifest_text, encoding="utf-8")
        try:
            os.rename(self.tmp, self.out_dir)
        except OSError:
            # Another process finished the same folder first: keep theirs if it is the same build.
            shutil.rmtree(self.tmp, ignore_errors=True)
            reused = _reuse(self.out_dir, **self.header)
            if reused is None:
                raise
            return reused
        return load_dataset(self.out_dir)

    def abort(self) -> None:
        """Drop the partial build, so only complete data sets ever exist under their own name."""
        shutil.rmtree(self.tmp, ignore_errors=True)


def _build(
    out_dir: Path,
    name: str,
    split: str,
    seed: int | None,
    params: dict[str, Any],
    n_books: int,
    fill: Callable[[_Writer], list[dict[str, Any]]],
) -> Dataset:
    """Reuse a matching build, or run ``fill`` (which adds books, returns questions) atomically."""
    existing = _reuse(out_dir, name, split, seed, params)
    if existing is not None:
        return existing
    writer = _Writer(out_dir, name, split, seed, params, n_books)
    try:
        questions = fill(writer)
        return writer.finish(questions)
    except BaseException:
        writer.abort()
        raise


# --------------------------------------------------------------------------- FairytaleQA series


def _story_title(story: str) -> str:
    """FairytaleQA has no title column; the file name is the title, hyphenated and lower case."""
    words = story.split("-")
    return " ".join(w if i and w in _MINOR_WORDS else w.capitalize() for i, w in enumerate(words))


def _read_csv(path: Path) -> list[dict[str, str]]:
    # Sections contain newlines inside quoted fields, hence csv with newline="".
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _case_insensitive_index(folder: Path) -> dict[str, Path]:
    """File names in FairytaleQA do not always match story_meta's case (e.g. ``Snow-man``)."""
    return {path.name.lower(): path for path in folder.iterdir()}


def build_fairytale_series(
    out_dir: Path,
    split: str = "test",
    origins: tuple[str, ...] = DEFAULT_ORIGINS,
    title_prefix: bool = False,
    data_root: Path | None = None,
    interference_tokens: int = 0,
    split_stories_only: bool = False,
) -> Dataset:
    """One long book per FairytaleQA origin, questions from one split (MiA-Signature style).

    Each book holds *all* of the origin's stories, whatever their split, because the other stories
    are the retrieval interference the benchmark measures; only the questions are filtered by split.
    A question's gold spans are its ``cor_section`` sections inside the merged book. With
    ``title_prefix`` each question names its story, which removes most of that ambiguity.

    ``interference_tokens`` adds whole books of the shared ``books/`` library after the fairy
    books, in path order, until at least that many tokens are added (all of them when the library
    is smaller): recall at scale, where the mindscape grows while the questions and their gold
    spans (in the fairy books, which stay as they are) do not change.

    ``split_stories_only`` keeps only the split's own stories in the books: the training
    collection of ``fairytale-train`` (every origin's train stories), in which no val or test
    story appears, not even as a negative, so a model trained on it has seen no evaluation story.
    """
    if interference_tokens < 0:
        raise DatasetError(f"interference must be 0 or more tokens, got {interference_tokens}")
    if split not in SPLITS:
        raise DatasetError(f"split must be one of {SPLITS}, got {split!r}")
    root = _resolve_root(data_root)
    base = _require(root / "fairytaleqa", root)
    meta_rows = _read_csv(_require(base / "story_meta.csv", root))
    known = {row["origin"] for row in meta_rows}
    unknown = [origin for origin in origins if origin not in known]
    if unknown:
        raise DatasetError(f"unknown FairytaleQA origins {unknown}; story_meta.csv has {sorted(known)}")
    name = "fairytale-series-titled" if title_prefix else "fairytale-series"
    params: dict[str, Any] = {"origins": list(origins), "title_prefix": title_prefix}
    if split_stories_only:
        if split != "train":
            raise DatasetError(f"fairytale-train holds train-split stories only: use --split train, not {split!r}")
        name = "fairytale-train"
        params["split_stories_only"] = True
    library = _interference_books(root, interference_tokens) if interference_tokens else []
    if library:  # only then: the params name the build and its collection, and must stay as before without
        params["interference_tokens"] = interference_tokens
    by_split = base / "data-by-train-split"
    indexes = {
        (kind, s): _case_insensitive_index(_require(by_split / kind / s, root))
        for kind in ("section-stories", "questions")
        for s in SPLITS
    }

    def story_file(kind: str, row: dict[str, str], suffix: str) -> Path:
        key = f"{row['filename']}-{suffix}.csv".lower()
        path = indexes[(kind, row["split"])].get(key)
        if path is None:
            raise FileNotFoundError(f"{by_split / kind / row['split'] / key} is missing (listed in story_meta.csv)")
        return path

    def fill(writer: _Writer) -> list[dict[str, Any]]:
        questions: list[dict[str, Any]] = []
        for origin in origins:
            parts: list[str] = []
            offset = 0
            for row in (r for r in meta_rows if r["origin"] == origin and (r["split"] == split or not split_stories_only)):
                story, title = row["filename"], _story_title(row["filename"])
                if parts:
                    parts.append(PARAGRAPH_SEP)
                    offset += len(PARAGRAPH_SEP)
                parts.append(title)
                offset += len(title)
                # A section id can repeat in the data, so an id maps to every section carrying it.
                spans: dict[str, list[tuple[int, int]]] = {}
                for section in _read_csv(story_file("section-stories", row, "story")):
                    text = section["text"]
                    parts.append(PARAGRAPH_SEP)
                    offset += len(PARAGRAPH_SEP)
                    spans.setdefault(section["section"].strip(), []).append((offset, offset + len(text)))
                    parts.append(text)
                    offset += len(text)
                if row["split"] != split:
                    continue
                for q in _read_csv(story_file("questions", row, "questions")):
                    gold = [
                        {"book": origin, "start": start, "end": end}
                        for sid in q["cor_section"].split(",")
                        for start, end in spans[sid.strip()]
                    ]
                    answers = list(dict.fromkeys(a.strip() for a in (q["answer1"], q["answer4"]) if a.strip()))
                    asked = q["question"].strip()
                    questions.append({
                        "id": f"{story}-{q['question_id']}",
                        "question": f"In {title}: {asked}" if title_prefix else asked,
                        "answers": answers,
                        "gold": gold,
                        "meta": {
                            "story": story,
                            "title": title,
                            "origin": origin,
                            "local-or-sum": q["local-or-sum"],
                            "attribute": q["attribute1"],
                            "attribute2": q["attribute2"] or None,
                            "ex-or-im": q["ex-or-im1"],
                            "cor_section": q["cor_section"],
                        },
                    })
            writer.add_book(origin, "".join(parts))
        for path in library:
            writer.add_book(f"library-{path.parent.name}-{path.stem}", read_source(path))
        return questions

    return _build(out_dir, name, split, None, params, len(origins) + len(library), fill)


def _interference_books(root: Path, tokens: int) -> list[Path]:
    """The library's books in path order, as many as it takes to add ``tokens`` tokens."""
    folder = _require(root / "books", root)
    picked: list[Path] = []
    added = 0
    for path in sorted(folder.rglob("*.txt")):
        if added >= tokens:
            break
        picked.append(path)
        added += count_tokens(read_source(path))
    if not picked:
        raise DatasetError(f"{folder} holds no .txt books to add as interference")
    return picked


# --------------------------------------------------------------------------- synthetic multi-hop


@dataclass(frozen=True)
class _Paragraph:
    title: str
    text: str

    @classmethod
    def clean(cls, title: str, text: str) -> _Paragraph:
        """Single-line title and text, so every paragraph of a document is exactly "Title\ntext"."""
        return cls(" ".join(title.split()), " ".join(text.split()))

    @property
    def formatted(self) -> str:
        return f"{self.title}\n{self.text}"


@dataclass(frozen=True)
class _MultihopQuestion:
    source: str
    qid: str
    question: str
    answers: list[str]
    gold: list[_Paragraph]
    others: list[_Paragraph]
    qtype: str | None


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    """The multi-hop files are JSON Lines except the corpus, which is one JSON array."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return data if isinstance(data, list) else [data]


def _multihop_questions(source: str, records: list[dict[str, Any]]) -> Iterator[_MultihopQuestion]:
    """Questions that carry their context; 2Wiki dev questions without one cannot be placed."""
    for record in records:
        if source == "musique":
            paragraphs = [
                (_Paragraph.clean(p["title"], p["paragraph_text"]), bool(p["is_supporting"]))
                for p in record["paragraphs"]
            ]
            qid, answers = record["id"], [record["answer"], *record.get("answer_aliases", [])]
            qtype = qid.split("__")[0]  # MuSiQue has no type field; the id says "2hop", "3hop1", ...
        else:
            if not record.get("context"):
                continue
            supporting = {title for title, _ in record["supporting_facts"]}
            # HotpotQA sentences carry their leading space, 2Wiki's do not; clean() evens them out.
            paragraphs = [
                (_Paragraph.clean(title, " ".join(sents)), title in supporting) for title, sents in record["context"]
            ]
            qid, answers, qtype = record["_id"], [record["answer"]], record.get("type")
        yield _MultihopQuestion(
            source=source,
            qid=qid,
            question=record["question"].strip(),
            answers=list(dict.fromkeys(a.strip() for a in answers if a and a.strip())),
            gold=[p for p, is_gold in paragraphs if is_gold],
            others=[p for p, is_gold in paragraphs if not is_gold],
            qtype=qtype,
        )


def build_multihop_synth(
    out_dir: Path,
    target_tokens: int = 32000,
    sources: tuple[str, ...] | None = None,
    n_questions: int | None = None,
    seed: int = 0,
    data_root: Path | None = None,
    split: str = "dev",
) -> Dataset:
    """One synthetic long document per multi-hop question (InfMem / MemAgent style).

    A document is the question's gold paragraphs plus distractors drawn in a seeded order from the
    other questions' contexts and the 2Wiki corpus, never one whose title equals a gold title (it
    could hold the answer) and never two distractors with the same title. Distractors are added until
    the next one would pass ``target_tokens``, then everything is shuffled, so the gold lands at a
    seeded, question-specific depth. ``n_questions`` takes the first n questions *of each source* in
    file order, so different seeds vary the documents, not the questions. ``split`` "dev" draws the
    HotpotQA, MuSiQue and 2Wiki dev questions (what reports measure); "train" draws 2Wiki train
    questions, with distractors from their own contexts and the corpus, for tuning.
    """
    files = {"dev": MULTIHOP_FILES, "train": MULTIHOP_TRAIN_FILES}.get(split)
    if files is None:
        raise DatasetError(f"multihop-synth has the splits 'dev' and 'train' (2Wiki train questions, for tuning), not {split!r}")
    sources = tuple(files) if sources is None else sources
    unknown = [s for s in sources if s not in files]
    if unknown:
        raise DatasetError(f"unknown multi-hop sources {unknown} for the {split!r} split; choose from {sorted(files)}")
    if target_tokens <= 0:
        raise DatasetError(f"target_tokens must be positive, got {target_tokens}")
    if n_questions is not None and n_questions <= 0:
        raise DatasetError(f"n_questions must be positive or None (all), got {n_questions}")
    root = _resolve_root(data_root)
    folder = _require(root / "multihop", root)
    every: list[_MultihopQuestion] = []
    questions: list[_MultihopQuestion] = []
    for source in sources:
        records = _read_json_records(_require(folder / files[source], root))
        parsed = list(_multihop_questions(source, records))
        every.extend(parsed)
        questions.extend(parsed[:n_questions])
    corpus_records = _read_json_records(_require(folder / DISTRACTOR_CORPUS, root))
    # One paragraph per title, first seen wins, in a fixed order. The pool comes from every question
    # of the chosen sources, so a question's document does not depend on n_questions.
    by_title: dict[str, _Paragraph] = {}
    contexts = (p for q in every for p in (*q.gold, *q.others))
    corpus = (_Paragraph.clean(r["title"], r["text"]) for r in corpus_records)
    for paragraph in (*contexts, *corpus):
        by_title.setdefault(paragraph.title, paragraph)
    pool = list(by_title.values())
    params = {"target_tokens": target_tokens, "sources": list(sources), "n_questions": n_questions}

    @functools.cache
    def tokens_of(paragraph: _Paragraph) -> int:
        # With its separator: the tokenizer merges "." with the following "\n\n", so counting the
        # two apart would overcount one token per seam and leave documents well short of the target.
        return count_tokens(paragraph.formatted + PARAGRAPH_SEP)

    def fill(writer: _Writer) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for q in questions:
            rng = random.Random(f"{seed}/{q.source}/{q.qid}")
            gold_titles = {p.title.casefold() for p in q.gold}
            order = list(range(len(pool)))
            rng.shuffle(order)
            chosen: list[tuple[_Paragraph, bool]] = [(p, True) for p in q.gold]
            total = sum(tokens_of(p) for p in q.gold)
            for index in order:
                paragraph = pool[index]
                if paragraph.title.casefold() in gold_titles:
                    continue
                cost = tokens_of(paragraph)
                if total + cost > target_tokens:
                    break
                chosen.append((paragraph, False))
                total += cost
            rng.shuffle(chosen)
            book = _safe_name(f"{q.source}-{q.qid}")
            parts, gold, offset = [], [], 0
            for paragraph, is_gold in chosen:
                if parts:
                    parts.append(PARAGRAPH_SEP)
                    offset += len(PARAGRAPH_SEP)
                text = paragraph.formatted
                if is_gold:
                    gold.append({"book": book, "start": offset, "end": offset + len(text)})
                parts.append(text)
                offset += len(text)
            writer.add_book(book, "".join(parts))
            rows.append({
                "id": book,
                "question": q.question,
                "answers": q.answers,
                "gold": gold,
                "meta": {
                    "book": book,
                    "source": q.source,
                    "source_id": q.qid,
                    "type": q.qtype,
                    "gold_titles": [p.title for p in q.gold],
                    "paragraphs": len(chosen),
                    "tokens": writer.sources[-1]["tokens"],
                },
            })
        return rows

    return _build(out_dir, "multihop-synth", split, seed, params, len(questions), fill)


# --------------------------------------------------------------------------- custom collections

_CUSTOM_KEYS = {"id", "question", "answers", "options", "label", "gold", "meta"}
_TEXT_SUFFIXES = {".txt", ".md"}
CLAIM_LABELS = ("TRUE", "FALSE")


def _digest(paths: Iterable[Path]) -> str:
    """Content hash of the inputs, so a reused folder is known to come from the same files."""
    sha = hashlib.sha256()
    for path in paths:
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _validate_custom(
    record: Any, where: str, texts: dict[str, str], seen_ids: set[str], default_id: str
) -> dict[str, Any]:
    """Turn one JSONL record into a question, or say exactly what is wrong with it."""
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
    extra = sorted(set(record) - _CUSTOM_KEYS)
    if extra:
        raise DatasetError(f"{where}: unknown keys {extra}; allowed: {sorted(_CUSTOM_KEYS)}")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: 'question' must be a non-empty string")
    qid = str(record.get("id", default_id))
    if qid in seen_ids:
        raise DatasetError(f"{where}: duplicate id {qid!r}")
    seen_ids.add(qid)
    out: dict[str, Any] = {"id": qid, "question": question.strip()}
    answers, options, label = record.get("answers"), record.get("options"), record.get("label")
    if answers is None and options is None and isinstance(label, str) and label.strip().upper() in CLAIM_LABELS:
        # A claim to verify (NoCha): the question is the claim, the label its truth; meta.pair names its pair.
        out.update(answers=[], claim=True, label=label.strip().upper())
        options = label = None
    elif answers is None and options is None:
        raise DatasetError(f"{where}: give 'answers' (list of strings), 'options' with 'label', or a claim's 'label' "
                           f"({' or '.join(CLAIM_LABELS)})")
    if answers is not None:
        if not _is_str_list(answers) or not any(a.strip() for a in answers):
            raise DatasetError(f"{where}: 'answers' must be a list of strings with at least one non-empty")
        out["answers"] = [a for a in answers if a.strip()]
    else:
        out["answers"] = []
    if options is not None:
        if not _is_str_list(options) or len(options) < 2:
            raise DatasetError(f"{where}: 'options' must be a list of at least two strings")
        letters = [chr(ord("A") + i) for i in range(len(options))]
        if not isinstance(label, str) or label.strip().upper() not in letters:
            raise DatasetError(f"{where}: 'label' must be one of {letters} (the option's letter), got {label!r}")
        out["options"], out["label"] = options, label.strip().upper()
    elif label is not None:
        raise DatasetError(f"{where}: 'label' given without 'options'")
    gold = record.get("gold", [])
    if not isinstance(gold, list):
        raise DatasetError(f"{where}: 'gold' must be a list of {{'book', 'start', 'end'}} objects")
    out["gold"] = []
    for i, span in enumerate(gold):
        if not isinstance(span, dict) or set(span) != {"book", "start", "end"}:
            raise DatasetError(f"{where}: gold[{i}] must be an object with exactly 'book', 'start', 'end'")
        book, start, end = span["book"], span["start"], span["end"]
        if book not in texts:
            raise DatasetError(f"{where}: gold[{i}] names book {book!r}, not one of the files {sorted(texts)}")
        if not (isinstance(start, int) and isinstance(end, int)) or isinstance(start, bool) or isinstance(end, bool):
            raise DatasetError(f"{where}: gold[{i}] start and end must be integers")
        if not 0 <= start < end <= len(texts[book]):
            raise DatasetError(
                f"{where}: gold[{i}] span [{start}, {end}) is not inside {book!r} (0..{len(texts[book])} chars)"
            )
        out["gold"].append({"book": book, "start": start, "end": end})
    meta = record.get("meta", {})
    if not isinstance(meta, dict):
        raise DatasetError(f"{where}: 'meta' must be an object")
    if "pair" in meta and not (out.get("claim") and isinstance(meta["pair"], str) and meta["pair"].strip()):
        raise DatasetError(f"{where}: meta.pair must be a non-empty string, on a claim (a record with label TRUE or FALSE)")
    out["meta"] = meta
    return out


def _check_pairs(questions: Sequence[dict[str, Any]], source: Path) -> None:
    """NoCha pairs: each pair id names exactly two claims, one TRUE and one FALSE."""
    pairs: dict[str, list[str]] = {}
    for q in questions:
        if "pair" in q["meta"]:
            pairs.setdefault(q["meta"]["pair"], []).append(q["label"])
    for pair, labels in pairs.items():
        if sorted(labels) != ["FALSE", "TRUE"]:
            raise DatasetError(f"{source}: pair {pair!r} must hold one TRUE and one FALSE claim, has {labels}")


def _question_files(questions: Path) -> list[Path]:
    """One JSONL file, or every ``*.jsonl`` of a folder in name order (a set kept one file per book)."""
    if questions.is_file():
        return [questions]
    if not questions.is_dir():
        raise DatasetError(f"{questions}: questions file or folder not found")
    files = sorted(p for p in questions.iterdir() if p.is_file() and p.suffix.lower() == ".jsonl")
    if not files:
        raise DatasetError(f"{questions}: no .jsonl files in this folder")
    return files


def build_custom(out_dir: Path, texts_dir: Path, questions_jsonl: Path, split: str = "test") -> Dataset:
    """Any folder of .txt/.md files (one file = one book, by name), or one such file, plus questions:
    a JSONL file, or a folder of them read as one set (ids unique across the files).

    Gold spans name a book by its file stem and index its text as read with ``newline=""``.
    Everything is validated before anything is written, so a typo costs an error message naming
    the file and line, not a silently unscorable data set.
    """
    texts_dir, questions_jsonl = Path(texts_dir), Path(questions_jsonl)
    single = texts_dir.is_file() and texts_dir.suffix.lower() in _TEXT_SUFFIXES
    if not (single or texts_dir.is_dir()):
        raise DatasetError(f"{texts_dir}: not a .txt/.md file or a folder of them")
    question_files = _question_files(questions_jsonl)
    files = [texts_dir] if single else sorted(p for p in texts_dir.iterdir() if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES)
    if not files:
        raise DatasetError(f"{texts_dir}: no .txt or .md files")
    texts: dict[str, str] = {}
    for path in files:
        if path.stem in texts:
            raise DatasetError(f"{path}: book name {path.stem!r} is used by another file in {texts_dir}")
        try:
            texts[path.stem] = read_source(path)
        except UnicodeDecodeError as error:
            raise DatasetError(f"{path}: not UTF-8 text ({error})") from error
    questions: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    for question_file in question_files:
        with question_file.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{question_file}:{line_no}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetError(f"{where}: invalid JSON ({error.msg})") from error
                default_id = f"q{line_no}" if len(question_files) == 1 else f"{question_file.stem}-q{line_no}"
                question = _validate_custom(record, where, texts, seen_ids, default_id)
                book = question["meta"].get("book")
                if book is not None and book not in texts:
                    raise DatasetError(f"{where}: meta.book {book!r} is not one of the files {sorted(texts)}")
                questions.append(question)
    if not questions:
        raise DatasetError(f"{questions_jsonl}: no questions")
    _check_pairs(questions, questions_jsonl)
    params = {
        "texts_dir": str(texts_dir),
        "questions": str(questions_jsonl),
        "sha256": _digest([*files, *question_files]),
    }

    def fill(writer: _Writer) -> list[dict[str, Any]]:
        for book, text in texts.items():
            writer.add_book(book, text)
        return questions

    return _build(out_dir, "custom", split, None, params, len(texts), fill)


BUILDERS: dict[str, Callable[..., Dataset]] = {
    "fairytale-series": build_fairytale_series,
    "fairytale-series-titled": functools.partial(build_fairytale_series, title_prefix=True),
    "fairytale-train": functools.partial(build_fairytale_series, origins=TRAIN_ORIGINS, split_stories_only=True),
    "multihop-synth": build_multihop_synth,
    "custom": build_custom,
}
