"""Adding or removing a book updates the BM25 chunk index and the in-memory summary vectors
incrementally, and the result equals a rebuild from scratch (issue: scale).

The collection is real (MiniLM, extractive summaries, three short FairytaleQA stories); the
rebuild it is compared with is made here from the stored rows alone, with no cache.
"""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import pytest

from mia.stores import bm25 as bm25_module
from mia.stores.bm25 import ChunkIndex, tokenize
from mia.stores.ingest import IngestOptions, book_id, ingest
from mia.stores.chroma import MindscapeError
from mia.stores.mindscape import Mindscape, remove_book
from mia.stores.settings import mia_home
from mia.stores.units import Level, level_of
from tests.conftest import requires_data, write_stories

QUERIES = ("the golden goose and the princess who never laughed", "the fox tricked the wolf", "Molo stole the rose")


def _rebuilt_scores(store: Mindscape, stem: bool) -> tuple[list[str], np.ndarray]:
    """BM25 over every committed chunk, read and tokenized now: what the index must equal."""
    got = store.chunks.get(include=["documents", "metadatas"])
    committed = store.commits.committed()
    pairs = sorted((i, d) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"]) if m["book"] in committed)
    index = bm25s.BM25()
    index.index([tokenize(d, stem=stem) for _, d in pairs], show_progress=False)
    return [i for i, _ in pairs], np.stack([index.get_scores(tokenize(q, stem=stem)) for q in QUERIES])


def _index_scores(index: ChunkIndex) -> np.ndarray:
    return np.stack([index.retriever.get_scores(tokenize(q, stem=index.stem)) for q in QUERIES])


def _assert_index_equals_rebuild(store: Mindscape, stem: bool) -> None:
    index = ChunkIndex.for_collection(store, stem=stem)
    ids, scores = _rebuilt_scores(store, stem)
    assert index.ids == ids
    np.testing.assert_allclose(_index_scores(index), scores, rtol=1e-6)


def _assert_vectors_equal_a_full_read(store: Mindscape) -> None:
    """The in-memory summary and chunk vectors equal the committed rows read now."""
    for collection, level in (("summaries", Level.SESSION), ("chunks", Level.CHUNK)):
        got = getattr(store, collection).get(include=["embeddings", "metadatas"])
        committed = store.commits.committed()
        wanted = {i: np.asarray(e, dtype=np.float32) for i, e, m in zip(got["ids"], got["embeddings"], got["metadatas"])
                  if m["book"] in committed and level_of(m, collection) == level}
        rows, matrix = store.vector_rows(level)
        assert set(rows) == set(wanted)
        for i, vector in wanted.items():
            np.testing.assert_array_equal(matrix[rows[i]], vector)


@pytest.fixture
def growing(tmp_path: Path, minilm) -> tuple[str, list[Path]]:
    """A fresh collection of the first two stories; the third is added by the tests."""
    paths = write_stories(tmp_path / "stories", sections=4)
    name = f"grow-{tmp_path.name[-12:].lower().replace('_', '-')}".strip("-")
    ingest(paths[:2], name, minilm, options=IngestOptions(chunk_size=100, window=4), progress=False)
    return name, paths


@requires_data
@pytest.mark.parametrize("stem", [False, True])
def test_index_after_an_add_and_a_remove_equals_a_rebuild(growing, minilm, monkeypatch, stem: bool) -> None:
    name, paths = growing
    _assert_index_equals_rebuild(Mindscape(name), stem)
    _assert_vectors_equal_a_full_read(Mindscape(name))

    # Adding a book reads and tokenizes that book's chunks only; the others come from the term cache.
    tokenized: list[str] = []
    real = bm25_module.tokenize
    monkeypatch.setattr(bm25_module, "tokenize", lambda text, stem=False: tokenized.append(text) or real(text, stem=stem))
    ingest(paths, name, minilm, options=IngestOptions(chunk_size=100, window=4), progress=False)
    store = Mindscape(name)
    new_book = book_id(paths[2])
    ChunkIndex.for_collection(store, stem=stem)
    assert len(tokenized) == int(store.commits.committed()[new_book]["chunks"])
    monkeypatch.setattr(bm25_module, "tokenize", real)
    _assert_index_equals_rebuild(store, stem)
    _assert_vectors_equal_a_full_read(store)

    remove_book(name, book_id(paths[0]))
    store = Mindscape(name)
    assert sorted(store.commits.committed()) == sorted([book_id(paths[1]), new_book])
    _assert_index_equals_rebuild(store, stem)
    _assert_vectors_equal_a_full_read(store)
    assert all(not i.startswith(f"{book_id(paths[0])}:") for i in ChunkIndex.for_collection(store, stem=stem).ids)

    # One index of this tokenizer stays on disk, and the removed book's cached terms are gone.
    root = mia_home() / "bm25" / name
    names = [p.name for p in (root / "terms" / bm25_module._tokenizer_name(stem)).glob("*.json")]
    assert len(list(root.glob("chunks-*"))) == 1
    assert sorted(n.rsplit("-", 1)[0] for n in names) == sorted([book_id(paths[1]), new_book])


@requires_data
@pytest.mark.parametrize(("collection", "level"), [("summaries", Level.SESSION), ("chunks", Level.CHUNK)])
def test_vector_update_fetches_only_the_changed_book(growing, minilm, monkeypatch, collection: str, level: Level) -> None:
    name, paths = growing
    Mindscape(name).vector_rows(level)
    ingest(paths, name, minilm, options=IngestOptions(chunk_size=100, window=4), progress=False)
    store = Mindscape(name)
    asked: list[object] = []
    real_get = getattr(store, collection).get
    monkeypatch.setattr(getattr(store, collection), "get", lambda **kw: asked.append(kw.get("where")) or real_get(**kw))
    store.vector_rows(level)
    assert asked == [{"book": book_id(paths[2])}]


@requires_data
def test_vectors_read_while_a_writer_works_are_not_kept(growing, monkeypatch) -> None:
    """A book's rows read between another process's reading of the commit rows and its own read of
    the vectors may be half written; such a block serves the call but is not kept, or the book would
    stay half searchable while its commit row, once rewritten the same, matches the cached one."""
    from mia.stores import vector_index

    name, paths = growing
    monkeypatch.setattr(vector_index, "_HELD", type(vector_index._HELD)())
    store = Mindscape(name)
    store.commits.version()  # this instance's snapshot of the commit rows, then a writer works
    book = book_id(paths[0])
    kept = store.chunks.get(where={"book": book}, include=["embeddings", "documents", "metadatas"], limit=1)
    store.chunks.delete(ids=kept["ids"])
    assert kept["ids"][0] not in store.vector_rows(Level.CHUNK)[0]
    store.chunks.upsert(ids=kept["ids"], embeddings=kept["embeddings"], documents=kept["documents"], metadatas=kept["metadatas"])
    assert kept["ids"][0] in Mindscape(name).vector_rows(Level.CHUNK)[0]


@requires_data
def test_vectors_in_memory_are_bounded(growing, monkeypatch) -> None:
    """Least recently used collections leave memory first (deleted ones, never used again, too)."""
    from mia.stores import vector_index

    name, _ = growing
    monkeypatch.setattr(vector_index, "_HELD", type(vector_index._HELD)())
    monkeypatch.setattr(vector_index, "HELD", 1)
    store = Mindscape(name)
    store.vector_rows(Level.CHUNK)
    store.vector_rows(Level.SESSION)
    assert list(vector_index._HELD) == [(str(store.summaries.id), Level.SESSION)]
    _assert_vectors_equal_a_full_read(store)


@requires_data
def test_removing_a_book_hides_it_and_an_unknown_book_is_refused(growing, cli) -> None:
    name, paths = growing
    gone = book_id(paths[1])
    result = cli("rm", name, "--book", "no-such-book")
    assert result.code != 0 and "no book 'no-such-book'" in result.err and "mia ls" in result.err
    assert cli("rm", name, "--book", gone).code == 0
    store = Mindscape(name)
    assert gone not in store.commits.records(pending=True)
    assert store.chunks.get(where={"book": gone})["ids"] == []
    assert store.summaries.get(where={"book": gone})["ids"] == []
    with pytest.raises(MindscapeError, match="no book"):
        remove_book(name, gone)


@requires_data
def test_book_texts_live_outside_the_commit_rows_and_old_collections_are_moved(growing, minilm) -> None:
    """Every node call reads all commit rows; a book's text there would make each question read the
    library. A collection written the old way (text in the commit row) still reads, and its next
    ingestion moves the texts out without rewriting any book."""
    name, paths = growing
    store = Mindscape(name)
    book = book_id(paths[0])
    text = paths[0].read_text(encoding="utf-8")
    assert store.books.get(ids=[book], include=["documents"])["documents"] == [""]
    assert store.book_text(book) == text
    # The old layout: the text in the commit row, no row in __texts.
    record = store.commits.records()[book]
    store.books.upsert(ids=[book], embeddings=[[1.0]], documents=[text], metadatas=[record])
    store.texts.delete(ids=[book])
    assert Mindscape(name).book_text(book) == text
    report = ingest(paths[:2], name, minilm, options=IngestOptions(chunk_size=100, window=4), progress=False)
    assert report.books_written == [] and sorted(report.books_unchanged) == sorted(book_id(p) for p in paths[:2])
    store = Mindscape(name)
    assert store.books.get(ids=[book], include=["documents"])["documents"] == [""]
    assert store.texts.get(ids=[book], include=["documents"])["documents"] == [text]
    assert store.book_text(book) == text and store.commits.records()[book] == record


@requires_data
def test_summary_vectors_skip_a_book_ingested_without_summaries(growing, minilm, tmp_path: Path) -> None:
    name, paths = growing
    Mindscape(name).vector_rows(Level.SESSION)
    ingest(paths[2:], name, minilm, options=IngestOptions(chunk_size=100, window=4, summarizer="none"), progress=False)
    store = Mindscape(name)
    _assert_vectors_equal_a_full_read(store)
    assert not any(i.startswith(f"{book_id(paths[2])}:") for i in store.vector_rows(Level.SESSION)[0])
