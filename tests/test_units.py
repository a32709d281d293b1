"""The memory's levels as data (``stores/units.py``): each level's builder on a small real book, the
schema read back from Chroma, and a store written before levels were metadata.

Real parts only: MiniLM, extractive summaries, a FairytaleQA story, an embedded Chroma in a
temporary folder, and, for the old store, a collection written by the code before this change
(``tests/data/store-before-levels.tgz``: *The Golden Goose*, `mia ingest --cards names --chunk-size
100 --window 4` at main b01d050's successor 1a2f6f1).
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from mia.stores.book_card import BookCard
from mia.stores.ingest import IngestOptions, IngestReport, Source, books, chunks, names, sessions
from mia.stores.ingest.options import Progress
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import SummaryCache
from mia.stores.units import (LEVEL, Level, Unit, book_unit_id, chunk_book, chunk_id, chunk_index, level_of, session_chunks,
                              session_id, session_of)
from tests.conftest import requires_data, story_text

OPTIONS = IngestOptions(chunk_size=100, window=4, summarizer="extractive")
OLD_STORE = Path(__file__).parent / "data" / "store-before-levels.tgz"


def test_ids_and_coverage_from_a_commit_row() -> None:
    """Hand-computed: windows starting at chunks 0, 3 and 7 of a 9-chunk book."""
    record = {"chunks": 9, "summaries": 3, "window_starts": "0,3,7", "window": 4}
    assert chunk_book(chunk_id("a-b", 12)) == "a-b" and chunk_index(chunk_id("a-b", 12)) == 12
    assert [session_of(record, chunk_id("bk", i)) for i in (0, 2, 3, 6, 7, 8)] == [
        session_id("bk", 0), session_id("bk", 0), session_id("bk", 1), session_id("bk", 1), session_id("bk", 2),
        session_id("bk", 2)]
    assert session_chunks(record, session_id("bk", 1)) == [chunk_id("bk", i) for i in (3, 4, 5, 6)]
    assert session_chunks(record, session_id("bk", 2)) == [chunk_id("bk", 7), chunk_id("bk", 8)]
    assert session_chunks(record, session_id("bk", 3)) == [] and session_of(None, chunk_id("bk", 0)) == ""
    # A book ingested before windows were recorded: ``window`` chunks a session.
    assert session_of({"chunks": 9, "summaries": 3, "window": 4}, chunk_id("bk", 8)) == session_id("bk", 2)


def test_a_row_without_a_level_is_read_by_its_collection() -> None:
    assert level_of({LEVEL: "book"}, "summaries") == Level.BOOK
    assert level_of({"book": "x"}, "summaries") == Level.SESSION and level_of({}, "chunks") == Level.CHUNK
    with pytest.raises(ValueError):
        level_of({LEVEL: "chapter"}, "summaries")


@pytest.fixture
def built(tmp_path: Path, minilm, monkeypatch: pytest.MonkeyPatch) -> tuple[Mindscape, Source]:
    """The Golden Goose through the chunk and session builders, written as the pipeline writes it."""
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "chroma"))
    text = story_text("golden-goose")
    source = Source(path=tmp_path / "golden-goose.txt", book="golden-goose", text=text)
    report, progress = IngestReport(collection="levels"), Progress(False)
    book_chunks = chunks.build(source, OPTIONS, minilm, {}, report, progress)
    method = sessions.method(OPTIONS, minilm, "")
    book_sessions = sessions.build(source, book_chunks, OPTIONS, minilm, None, method, SummaryCache(tmp_path / "c.sqlite"),
                                   report, progress)
    store = Mindscape("levels", create=True, embedder=minilm.name)
    store.begin_book(source.book, 0)
    for collection, rows in (("chunks", chunks.rows("levels", source, 0, book_chunks, book_sessions.owners(source.book))),
                             ("summaries", sessions.rows("levels", source, 0, book_sessions, method))):
        store.upsert(collection, rows.ids, rows.vectors, rows.texts, rows.metadatas)
    starts = ",".join(str(w[0].index) for w in book_sessions.windows)
    store.commits.commit(source.book, text, {"order": 0, "hash": "h1", "chunks": len(book_chunks.chunks),
                                             "summaries": len(book_sessions.windows), "window": 4, "window_starts": starts,
                                             "tokens": 1, "body_start": 0, "body_end": len(text)})
    return Mindscape("levels"), source


@requires_data
def test_each_level_is_built_and_read_back_from_chroma(built, minilm) -> None:
    """Chunks are exact slices of the book; each session covers its window's chunks and spans their
    text; the book unit holds the card's one rendering, embedded, and the card itself. Every row
    read back from Chroma names its level, book and span as the builder made them."""
    store, source = built
    ids = store.book_chunk_ids(source.book)
    records = store.chunk_records(ids)
    assert ids == [chunk_id(source.book, i) for i in range(len(ids))] and len(ids) > 8
    for r in records:
        unit = Unit(level_of(r, "chunks"), r["id"], r["book"], (r["start"], r["end"]))
        assert unit == Unit(Level.CHUNK, chunk_id(source.book, r["index"]), source.book, (r["start"], r["end"]))
        assert source.text[r["start"]:r["end"]] == r["text"]
    count = int(store.commits.committed()[source.book]["summaries"])
    sessions_read = store.summary_records([session_id(source.book, j) for j in range(count)])
    assert count == len(sessions_read) == -(-len(ids) // 4)
    for j, s in enumerate(sessions_read):
        members = [c for c, _ in store.session_members([s["id"]])]
        assert s["level"] == Level.SESSION and members == ids[4 * j: 4 * j + 4]
        first, last = store.chunk_records([members[0], members[-1]])
        assert (s["start"], s["end"]) == (first["start"], last["end"])
        assert all(r["summary_id"] == s["id"] for r in store.chunk_records(members))
    assert books.build(store, None, minilm) == {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0}
    unit = store.book_units()[source.book]
    card = BookCard.from_json(unit.card)
    assert unit.id == book_unit_id(source.book) and unit.text == card.text() and card.title
    row = store.summary_records([unit.id])[0]
    assert (row["level"], row["book"], row["start"], row["end"], row["text"]) == (Level.BOOK, source.book, 0,
                                                                                   len(source.text), card.text())
    np.testing.assert_allclose(store.vectors("summaries", [unit.id])[0], minilm.embed_documents([unit.text])[0], atol=1e-6)
    rows, _ = store.vector_rows(Level.SESSION)
    assert sorted(rows) == [s["id"] for s in sessions_read]  # the session index holds the sessions only
    assert store.units_over(ids[:1], (Level.SESSION, Level.BOOK)) == [{Level.SESSION: session_id(source.book, 0),
                                                                        Level.BOOK: unit.id}]
    assert store.units_over(ids[:1], (Level.SESSION,)) == [{Level.SESSION: session_id(source.book, 0)}]


@requires_data
def test_the_book_level_writes_nothing_when_current_and_anew_for_a_new_version(built, minilm, monkeypatch) -> None:
    store, source = built
    books.build(store, None, minilm)
    written: list[list[str]] = []
    real = Mindscape.upsert
    monkeypatch.setattr(Mindscape, "upsert", lambda self, collection, ids, *rest: written.append(list(ids)) or
                        real(self, collection, ids, *rest))
    books.build(Mindscape(store.name), None, minilm)
    assert written == []  # current: a rerun writes nothing
    record = store.commits.committed()[source.book]
    store.commits.commit(source.book, source.text, {**record, "hash": "h2"})  # another version of the book
    assert Mindscape(store.name).book_units() == {}  # the old version's unit is not served
    books.build(Mindscape(store.name), None, minilm)
    assert written == [[book_unit_id(source.book)]]
    assert json.loads(Mindscape(store.name).book_units()[source.book].card)["book"] == source.book


@requires_data
def test_a_store_written_before_levels_opens_and_one_ingestion_completes_it(tmp_path: Path, cli, monkeypatch) -> None:
    """The old store answers as it did; its book units carry no card, so the book level is refused
    with the fix, and rerunning the same `mia ingest` recomputes no chunk's vector and writes the units."""
    with tarfile.open(OLD_STORE) as archive:
        archive.extractall(tmp_path, filter="data")
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "chroma"))
    store = Mindscape("old-format")
    assert store.stats()["books"][0]["card"] is None and store.stats()["books"][0]["chunks"] == 31
    summaries = store.summaries.get(include=["metadatas"])
    assert not any(LEVEL in m for m, i in zip(summaries["metadatas"], summaries["ids"]) if i != book_unit_id("golden-goose"))
    assert not any(LEVEL in m for m in store.chunks.get(include=["metadatas"])["metadatas"])
    rows, _ = store.vector_rows(Level.SESSION)
    assert len(rows) == 8 and book_unit_id("golden-goose") not in rows
    ask = ("ask", "Who got the golden goose?", "--collection", "old-format", "--graph", "mia_rag", "--json",
           "--set", "retrieval_only=true")
    answered = cli(*ask)
    assert answered.code == 0, answered.err
    assert {s["level"] for s in json.loads(answered.out)["signature"]} == {"session"}
    refused = cli(*ask, "--set", "signature_levels=sessions+books")
    assert refused.code == 2 and "needs book units" in refused.err and "rerun `mia ingest`" in refused.err
    source = tmp_path / "golden-goose.txt"
    source.write_text(story_text("golden-goose"), encoding="utf-8")
    done = cli("ingest", str(source), "--collection", "old-format", "--cards", "names", "--chunk-size", "100",
               "--window", "4", "--quiet")
    assert done.code == 0, done.err
    # Its summaries were made by an older extractive method (extractive-v2), so they are written again; every
    # chunk's vector is reused.
    assert "1 book(s) written, 0 unchanged; 31 chunks (31 vectors reused)" in done.out
    both = cli(*ask, "--set", "signature_levels=sessions+books")
    assert both.code == 0, both.err
    assert Mindscape("old-format").book_units()["golden-goose"].text.startswith("Title: ")


@requires_data
def test_the_names_level_says_who_is_who(built, minilm, monkeypatch) -> None:
    """One unit per book at the names level: its main names, where each appears, and with whom;
    embedded; a rerun writes nothing; it covers every chunk of its book beside the session and book units."""
    store, source = built
    assert names.build(store, minilm) == 1 and names.build(Mindscape(store.name), minilm) == 0
    unit = store.book_units(level=Level.NAMES)[source.book]
    row = store.summary_records([unit.id])[0]
    assert row["level"] == Level.NAMES and unit.id == book_unit_id(source.book, Level.NAMES)
    lines = unit.text.splitlines()
    assert lines[0].startswith("Who is who in golden-goose") and lines[1].startswith("Dullhead: ")
    assert re.fullmatch(r"Dullhead: \d+ mentions, \d+% to \d+% of the story; most often with [^.]+\.", lines[1])
    np.testing.assert_allclose(store.vectors("summaries", [unit.id])[0], minilm.embed_documents([unit.text])[0], atol=1e-6)
    books.build(store, None, minilm)
    first = store.book_chunk_ids(source.book)[0]
    over = store.units_over([first], (Level.SESSION, Level.BOOK, Level.NAMES))[0]
    assert over == {Level.SESSION: session_id(source.book, 0), Level.BOOK: book_unit_id(source.book),
                    Level.NAMES: unit.id}


@requires_data
def test_the_reader_reads_the_signature_in_story_order_with_each_units_place(built, minilm, monkeypatch) -> None:
    from mia.nodes import answer

    store, source = built
    books.build(store, None, minilm)
    names.build(store, minilm)
    ids = [session_id(source.book, 2), book_unit_id(source.book, Level.NAMES), session_id(source.book, 0)]
    texts = answer.signature_lines(answer.signature_units(store, ids))
    assert [t.split("]")[0] for t in texts][0] == "[names, the whole of golden-goose"
    assert re.match(r"\[session, 0%–\d+% of golden-goose\] ", texts[1]) and re.match(r"\[session, \d+%–\d+% of", texts[2])
    assert int(re.search(r"(\d+)%–", texts[2]).group(1)) > 0  # the later session reads later
    monkeypatch.setattr(answer, "SIGNATURE_TOKENS", 1)
    assert [t[:8] for t in answer.signature_lines(answer.signature_units(store, ids))] == ["[session"]  # the best unit, even over budget
