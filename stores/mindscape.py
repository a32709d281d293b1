"""The mindscape in Chroma: chunks, session summaries and books of one named collection.

One mindscape NAME is four Chroma collections, ``NAME__chunks``, ``NAME__summaries``,
``NAME__books`` and ``NAME__texts``, all in cosine space. Every chunk carries its ``summary_id`` and
every summary its chunk range, so the chunk→summary map (π) and its inverse are plain metadata
queries. A book's row in ``__books`` is its commit marker: ingestion first turns it into a *pending*
row (keeping the book's place in the series), then replaces the rows, then commits it. Readers see
committed books only: the chunks of a pending or unrecorded book (an ingestion killed half way, or
still running) are never returned, counted or indexed, and the next ingestion replaces them.

A book's full text lives in ``__texts``, not in its commit row: every node call reads all the
commit rows, and Chroma loads a row's document with its metadata, so texts there made each
question read the whole library (`mia bench scale`). Collections written before keep the text in
the commit row until their next ingestion moves it (``move_texts_out``); readers take either.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlparse

import numpy as np

from mia.stores.settings import Settings, offline_environment, writable_dir
from mia.stores.writer_lock import store_path, writer_lock

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,48}[a-z0-9]$")
SUFFIXES = ("__chunks", "__summaries", "__books", "__texts")
PENDING = "pending"
"""Metadata flag of a book row whose chunks and summaries are being replaced."""
# Chroma rejects larger single writes (~5461 records on SQLite); stay well below it.
WRITE_BATCH = 2000
_COSINE = {"hnsw:space": "cosine"}


@dataclass(frozen=True)
class _Vectors:
    """One chunks or summaries collection's committed vectors, kept per process (``vector_rows``)."""

    version: tuple[Any, ...]
    ids: list[str]
    rows: dict[str, int]
    matrix: np.ndarray
    norms: np.ndarray
    """Each row's length, for exact cosines whatever the embedder's normalisation."""
    books: dict[str, tuple[tuple[Any, ...], int, int]]
    """Per committed book: the commit row its block was read under, and the block's rows."""


# Keyed by the Chroma collection's id, which a re-created collection never reuses; least recently
# used first out, so deleted and long unused collections leave memory.
_VECTOR_ROWS: OrderedDict[str, _Vectors] = OrderedDict()
VECTOR_COLLECTIONS = 16
_VECTOR_LOCK = threading.Lock()


class MindscapeError(ValueError):
    """A user-facing problem with a collection: the message says what is wrong and what to do."""


def validate_name(name: str) -> str:
    if not NAME_PATTERN.match(name or "") or "__" in name:
        raise MindscapeError(
            f"invalid collection name {name!r}: use 2-50 characters, lowercase letters, digits, '-' or '_', "
            "starting and ending with a letter or digit, and no '__'"
        )
    return name


@lru_cache(maxsize=4)
def _client(path: str, url: str) -> Any:
    offline_environment()
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
    if url:
        parsed = urlparse(url)
        if not parsed.hostname:
            raise MindscapeError(f"MIA_CHROMA_URL={url!r} is not a URL like http://127.0.0.1:8000")
        return chromadb.HttpClient(
            host=parsed.hostname,
            port=parsed.port or (443 if parsed.scheme == "https" else 8000),
            ssl=parsed.scheme == "https",
            settings=chroma_settings,
        )
    store = writable_dir(Path(path), "MIA_CHROMA_PATH or MIA_HOME")
    return chromadb.PersistentClient(path=str(store), settings=chroma_settings)


def chroma_client(settings: Settings | None = None) -> Any:
    settings = settings or Settings()
    return _client(str(settings.resolved_chroma_path), settings.chroma_url)


def list_mindscapes(client: Any) -> list[str]:
    names = {c if isinstance(c, str) else c.name for c in client.list_collections()}
    return sorted(n.removesuffix("__books") for n in names if n.endswith("__books"))


@dataclass(frozen=True)
class ChunkHit:
    """A search hit; on request it also carries what InitSignature and rescoring need (its session
    π(c) and its stored vector)."""

    id: str
    score: float
    summary_id: str = ""
    vector: np.ndarray | None = field(default=None, repr=False, compare=False)
    cosine: float | None = None
    """Its cosine to the query when ``score`` is another (a fused score); None when ``score`` is it."""


class Mindscape:
    """Read and write access to one named mindscape."""

    def __init__(self, name: str, client: Any | None = None, *, create: bool = False, embedder: str = "") -> None:
        self.name = validate_name(name)
        self.client = client if client is not None else chroma_client()
        meta = {**_COSINE, "embedder": embedder} if create else None
        get = self.client.get_or_create_collection if create else self.client.get_collection
        kwargs = {"metadata": meta} if create else {}
        # Chroma's default embedding function downloads a model: pass vectors ourselves, always.
        # Opened by name, not looked up in a listing: every node call opens its collection, and
        # listing all of a store's collections costs in proportion to how many it holds.
        try:
            self.books = get(f"{name}__books", embedding_function=None, **kwargs)
            self.chunks = get(f"{name}__chunks", embedding_function=None, **kwargs)
            self.summaries = get(f"{name}__summaries", embedding_function=None, **kwargs)
            self._texts = get(f"{name}__texts", embedding_function=None, **kwargs) if create else None
        except Exception:  # noqa: BLE001 - the class differs between the embedded and the HTTP client
            if create or self.name in list_mindscapes(self.client):
                raise
            known = ", ".join(list_mindscapes(self.client)) or "none yet"
            raise MindscapeError(
                f"unknown collection {name!r} (known: {known}): create it with `mia ingest PATH --collection {name}`"
            ) from None
        recorded = (self.chunks.metadata or {}).get("embedder", "")
        if create and embedder and recorded and recorded != embedder:
            raise MindscapeError(
                f"collection {name!r} was built with embedder {recorded!r}, not {embedder!r}: "
                f"use a new collection name or `mia rm {name}` first"
            )
        self.embedder = recorded or embedder
        # The books' commit rows, read at most once per instance (``version``): an instance is a
        # snapshot for one node call, or one run's step 0 and E2 (``nodes.resources.share``); writes
        # through it forget the rows, other writers need a new instance.
        self._books: dict[str, dict[str, Any]] | None = None
        self._uncommitted: int | None = None
        self._count: int | None = None

    # ---- books -----------------------------------------------------------------------------
    def book_records(self, *, pending: bool = False) -> dict[str, dict[str, Any]]:
        """The committed books' rows; with ``pending``, also those of books being (re)written, which
        only ingestion needs (to keep their order and to know they must be rewritten)."""
        got = self.books.get(include=["metadatas"])
        rows = {i: dict(m) for i, m in zip(got["ids"], got["metadatas"])}
        return rows if pending else {b: r for b, r in rows.items() if not r.get(PENDING)}

    def book_text(self, book: str) -> str:
        return self._book_row(book)[0]

    def book_body(self, book: str) -> str:
        """The book without its Project Gutenberg header and footer (as chunked), for the streaming
        agents; books ingested before front matter was recognised have no span and are whole."""
        text, record = self._book_row(book)
        return text[int(record.get("body_start", 0)) : int(record.get("body_end", len(text)))]

    def _book_row(self, book: str) -> tuple[str, dict[str, Any]]:
        got = self.books.get(ids=[book], include=["documents", "metadatas"])
        if not got["ids"] or got["metadatas"][0].get(PENDING):
            raise MindscapeError(f"collection {self.name!r} has no committed book {book!r}: "
                                 "it is being written (or its ingestion was interrupted); rerun `mia ingest` to finish it")
        text = got["documents"][0]  # set only in collections written before texts had their own collection
        if not text:
            stored = self.texts.get(ids=[book], include=["documents"])
            text = stored["documents"][0] if stored["ids"] else ""
        return text, got["metadatas"][0]

    @property
    def texts(self) -> Any:
        """The ``__texts`` collection, created on first use: collections written before it existed lack it."""
        if self._texts is None:
            self._texts = self.client.get_or_create_collection(f"{self.name}__texts", embedding_function=None, metadata=_COSINE)
        return self._texts

    def put_card(self, book: str, card_json: str, book_hash: str) -> None:
        """Store a book's card (``stores.book_card``) beside its text, for the book version ``book_hash``
        names: a card is written after the book is committed (off the path to the first answer), so
        it cannot share the commit row's atomicity; the hash lets readers ignore a stale one."""
        self.texts.upsert(ids=[card_id(book)], embeddings=[[1.0]], documents=[card_json],
                          metadatas=[{"book": book, "hash": book_hash}])

    def _current(self, rows: Any, row_id: Callable[[str], str], books: Sequence[str] | None) -> dict[str, tuple[str, str]]:
        """book → (id, text) of the per-book row ``row_id`` names in ``rows``, for committed books (all of
        them by default) whose row was made for their committed version: rows written after a book's
        commit (cards, book units) cannot share its atomicity, so their hash tells a stale one."""
        committed = self.committed_books()
        wanted = [b for b in dict.fromkeys(committed if books is None else books) if b in committed]
        if not wanted:
            return {}
        got = rows.get(ids=[row_id(b) for b in wanted], include=["documents", "metadatas"])
        return {m["book"]: (i, d) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"])
                if m and str(committed[m["book"]].get("hash")) == m.get("hash")}

    def cards(self, books: Sequence[str] | None = None) -> dict[str, str]:
        """The current cards (JSON) of committed books (all of them by default): one made for another
        version of its book is left out, as is a book without a card."""
        return {book: text for book, (_, text) in self._current(self.texts, card_id, books).items()}

    def put_book_unit(self, book: str, text: str, vector: np.ndarray, book_hash: str) -> None:
        """Store the book's unit of the mindscape's upper level (its card as text, embedded) beside
        its session summaries, for the book version ``book_hash`` names. It is a summary row, so
        every reader of summaries' texts (the reader's signature, ``--explain``, the web page) shows
        it, and a rewrite of the book removes it with the sessions."""
        self.upsert("summaries", [book_unit_id(book)], np.asarray([vector]), [text],
                    [{"book": book, "level": "book", "hash": book_hash}])

    def book_units(self, books: Sequence[str]) -> dict[str, str]:
        """book → the id of its current book unit, for those of ``books`` that have one (made for the
        committed version of the book)."""
        return {book: unit for book, (unit, _) in self._current(self.summaries, book_unit_id, books).items()}

    def ordered_books(self) -> list[str]:
        records = self.book_records()
        return sorted(records, key=lambda b: records[b]["order"])

    # ---- reads -----------------------------------------------------------------------------
    def chunk_records(self, ids: Sequence[str], *, documents: bool = True) -> list[dict[str, Any]]:
        """Metadata (and text) of chunks, in the order asked."""
        if not ids:
            return []
        include = ["metadatas", "documents"] if documents else ["metadatas"]
        got = self.chunks.get(ids=list(ids), include=include)
        committed = self.committed_books()
        by_id = {
            i: {"id": i, **m, **({"text": d} if documents else {})}
            for i, m, d in zip(got["ids"], got["metadatas"], got.get("documents") or [None] * len(got["ids"]))
            if m.get("book") in committed  # ids are deterministic: a book being rewritten reuses them
        }
        return [by_id[i] for i in ids if i in by_id]

    def summary_records(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        got = self.summaries.get(ids=list(ids), include=["metadatas", "documents"])
        committed = self.committed_books()
        by_id = {i: {"id": i, **m, "text": d} for i, m, d in zip(got["ids"], got["metadatas"], got["documents"])
                 if m.get("book") in committed}
        return [by_id[i] for i in ids if i in by_id]

    def vectors(self, collection: str, ids: Sequence[str]) -> np.ndarray:
        """Stored vectors in the order asked (``collection`` is ``chunks`` or ``summaries``): from the
        matrix kept in memory, and from Chroma by id for what it lacks (book units)."""
        if not ids:
            return np.zeros((0, 0), dtype=np.float32)
        rows, matrix = self.vector_rows(collection)
        missing = [i for i in dict.fromkeys(ids) if i not in rows]
        if not missing:
            return matrix[[rows[i] for i in ids]]
        got = getattr(self, collection).get(ids=missing, include=["embeddings"])
        by_id = dict(zip(got["ids"], got["embeddings"]))
        return np.asarray([matrix[rows[i]] if i in rows else by_id[i] for i in ids], dtype=np.float32)

    def stored_chunk_vectors(self, book: str) -> dict[str, np.ndarray]:
        """The vectors of the book's stored chunks keyed by chunk text, committed or not: a rewrite
        whose chunks did not change (another summarizer or window, a rerun after a kill) embeds none
        of them again. The collection's single embedder made every one of them."""
        got = self.chunks.get(where={"book": book}, include=["documents", "embeddings"])
        return {text: np.asarray(vector, dtype=np.float32) for text, vector in zip(got["documents"], got["embeddings"])}

    def version(self) -> tuple[Any, ...]:
        """Changes whenever a book is added, replaced or removed: its commit row carries the content
        hash and the chunking options, and is turned pending first and committed last by every ingestion.
        Read once per instance (an instance lives for one node call, or one run's step 0 and E2)."""
        if self._books is None:
            self._books = self.book_records(pending=True)
        return tuple(sorted((b, tuple(sorted(r.items()))) for b, r in self._books.items()))

    def committed_books(self) -> dict[str, dict[str, Any]]:
        """This instance's snapshot of the committed books' rows."""
        self.version()
        return {b: r for b, r in self._books.items() if not r.get(PENDING)}

    def uncommitted_chunks(self) -> int:
        """How far the stored chunks are from the committed books' counts (0 unless an ingestion is
        running or was killed). Committed books hold exactly the chunks their rows count, because
        their rows are replaced only while the book is pending; so one count answers it."""
        if self._uncommitted is None:
            expected = sum(int(r.get("chunks", 0)) for r in self.committed_books().values())
            # Fewer rows than counted means a book was turned pending after this snapshot: filter too.
            self._uncommitted = abs(self.stored_chunks() - expected)
        return self._uncommitted

    def stored_chunks(self) -> int:
        """Chunk rows in Chroma, committed or not: counted once per instance, like the book rows."""
        if self._count is None:
            self._count = self.chunks.count()
        return self._count

    def committed_filter(self, where: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """``where`` narrowed to committed books when uncommitted chunks exist; as it was otherwise,
        so that the usual case costs Chroma no metadata filter."""
        if not self.uncommitted_chunks():
            return where
        only = {"book": {"$in": sorted(self.committed_books()) or [""]}}
        return {"$and": [where, only]} if where else only

    def vector_rows(self, collection: str) -> tuple[dict[str, int], np.ndarray]:
        """All committed vectors of ``collection`` (``chunks`` or ``summaries``) as one matrix with
        its id → row map, kept in memory while the books are unchanged.

        Every question reads vectors: InitSignature and the centroid read summaries' vectors, step 0
        and E2 the vectors of their chunk candidates (to select, and to score BM25's hits exactly).
        Read from Chroma each time, the summaries cost several times the greedy selection itself, and
        against a Chroma server the chunk vectors were the largest part of E2 (`mia bench scale`).
        After a book is added, replaced or removed, only the books whose commit row changed are read
        again, one book per read, so no response holds the library; the others' blocks are reused and
        the update costs what changed. The price is memory: 4 bytes per dimension per row (1.5 KB a
        chunk with MiniLM, 19 MB for the 2.4M-token books library), for the ``VECTOR_COLLECTIONS``
        collections used last; and a fresh process's first question reads the whole collection
        (the index update of `mia bench scale`: 2.0 s for those 2.4M tokens).
        """
        held = self._vectors(collection)
        return held.rows, held.matrix

    def _vectors(self, collection: str) -> _Vectors:
        key, version = str(getattr(self, collection).id), self.version()
        with _VECTOR_LOCK:  # threads of one server asking at once read the library once
            held = _VECTOR_ROWS.get(key)
            if held is not None and held.version == version:
                _VECTOR_ROWS.move_to_end(key)
                return held
            committed = self.committed_books()
            rows_of = {b: row for b, row in version if b in committed}
            blocks: list[tuple[list[str], np.ndarray]] = []
            spans: dict[str, tuple[tuple[Any, ...], int, int]] = {}
            complete, at = True, 0
            for book, row in rows_of.items():
                if held is not None and book in held.books and held.books[book][0] == row:
                    _, start, stop = held.books[book]
                    ids, matrix = held.ids[start:stop], held.matrix[start:stop]
                else:
                    got = getattr(self, collection).get(where={"book": book}, include=["embeddings"])
                    # ids name the book's order; a book unit is read by id (``book_units``), never ranked
                    order = sorted((n for n, i in enumerate(got["ids"]) if not is_book_unit(i)), key=lambda n: got["ids"][n])
                    ids = [got["ids"][n] for n in order]  # a book ingested without summaries has none
                    matrix = (np.asarray(got["embeddings"], dtype=np.float32).reshape(len(got["ids"]), -1)[order] if ids
                              else np.zeros((0, 0), dtype=np.float32))
                    # A writer may have turned the book pending since its row was read: a block that
                    # lacks rows its commit row counts serves this call but is not kept.
                    complete &= len(ids) == int(dict(row).get(collection, len(ids)))
                blocks.append((ids, matrix))
                spans[book] = (row, at, at + len(ids))
                at += len(ids)
            ids = [i for block_ids, _ in blocks for i in block_ids]
            mats = [m for block_ids, m in blocks if block_ids]
            matrix = np.concatenate(mats) if mats else np.zeros((0, 0), dtype=np.float32)
            matrix.flags.writeable = False
            norms = np.linalg.norm(matrix, axis=1) if ids else np.zeros(0, dtype=np.float32)
            held = _Vectors(version, ids, {i: n for n, i in enumerate(ids)}, matrix, norms, spans)
            if complete:
                _VECTOR_ROWS[key] = held
                _VECTOR_ROWS.move_to_end(key)
                while len(_VECTOR_ROWS) > VECTOR_COLLECTIONS:
                    _VECTOR_ROWS.popitem(last=False)
            return held

    def session_members(self, summary_ids: Sequence[str]) -> list[tuple[str, str]]:
        """(chunk id, summary id) of every committed chunk in the given sessions: session by session,
        each in book order.

        Read from the books' commit rows, as ``summary_of`` reads the inverse: session j of a book
        holds its chunks from ``window_starts[j]`` up to the next window's start (``j·window`` up to
        ``(j + 1)·window`` for books ingested before windows could be counted in tokens). A metadata
        query to Chroma cost 4.5 ms a question, most of the trained head's E2."""
        committed = self.committed_books()
        out: list[tuple[str, str]] = []
        for summary_id in summary_ids:
            book, j = _session_parts(summary_id)
            record = committed.get(book)
            if record is None or j is None or j >= int(record.get("summaries", 0)):
                continue
            chunks = int(record["chunks"])
            starts = _window_starts(record)
            if starts:
                start, stop = starts[j], starts[j + 1] if j + 1 < len(starts) else chunks
            else:
                start, stop = j * int(record["window"]), min((j + 1) * int(record["window"]), chunks)
            out.extend((f"{book}:c{i:06d}", summary_id) for i in range(start, stop))
        return out

    def book_summary_ids(self, book: str) -> list[str]:
        """The ids of a committed book's session summaries, in book order (from its commit row)."""
        record = self.committed_books().get(book)
        return [session_id(book, j) for j in range(int(record.get("summaries", 0)))] if record else []

    def chunks_of_summary(self, summary_id: str) -> list[str]:
        got = self.chunks.get(where={"summary_id": summary_id}, include=["metadatas"])
        pairs = sorted(zip(got["ids"], got["metadatas"]), key=lambda p: p[1]["index"])
        return [i for i, _ in pairs]

    def book_chunk_ids(self, book: str) -> list[str]:
        got = self.chunks.get(where={"book": book}, include=["metadatas"])
        pairs = sorted(zip(got["ids"], got["metadatas"]), key=lambda p: p[1]["index"])
        return [i for i, _ in pairs]

    def search_chunks(self, vector: np.ndarray, k: int, *, vectors: bool = False,
                      owners: bool = False) -> list[ChunkHit]:
        """The k committed chunks nearest by cosine similarity, exactly, over the vectors kept in
        memory (``vector_rows``); optionally with those vectors and their sessions π(c).

        Exact, not Chroma's HNSW index: the index missed near neighbours, and which it missed
        changed from one process to the next, so two runs of the recall-at-scale command ranked
        129 of its 3,492 rankings (3.7%) differently (evals/README). With the vectors in memory
        already, one matrix product is exact, repeatable, and no round trip to a server. Ties go to
        the earlier row (books in name order)."""
        held = self._vectors("chunks")
        if k <= 0 or not held.ids:
            return []
        query = np.asarray(vector, dtype=np.float32).ravel()
        if query.shape[0] != held.matrix.shape[1]:
            raise MindscapeError(
                f"collection {self.name!r} holds {held.matrix.shape[1]}-dimensional vectors of embedder "
                f"{self.embedder!r} but the query has {query.shape[0]}: ask with that embedder (`mia ls` names it)"
            )
        cosine = (held.matrix @ query) / np.maximum(held.norms * float(np.linalg.norm(query)), 1e-12)
        k = min(k, len(held.ids))
        # The k best, and every row tied with the k-th, so that the earlier rows win the cut too.
        tied = np.flatnonzero(cosine >= cosine[np.argpartition(-cosine, k - 1)[k - 1]])
        top = tied[np.lexsort((tied, -cosine[tied]))][:k]
        ids = [held.ids[n] for n in top]
        sessions = self.summary_of(ids) if owners else [""] * len(ids)
        stored = list(held.matrix[top]) if vectors else [None] * len(ids)
        return [ChunkHit(i, float(cosine[n]), s, e) for i, n, s, e in zip(ids, top, sessions, stored)]

    def summary_of(self, chunk_ids: Sequence[str]) -> list[str]:
        """π(c) of each chunk, from its id and its book's commit row: ingestion names chunk i of a
        book ``BOOK:c{i:06d}`` and its session ``BOOK:s{j:05d}``, j the last window starting at or
        before i (the row's ``window_starts``; ``i // window`` for books ingested before windows could
        be counted in tokens). The chunk's ``summary_id`` metadata holds the same value. "" for a book
        without summaries or not committed."""
        committed = self.committed_books()  # read once per instance
        out = []
        for chunk_id in chunk_ids:
            book, _, index = chunk_id.rpartition(":c")
            record = committed.get(book)
            if record is None or int(record.get("summaries", 0)) == 0:
                out.append("")
                continue
            starts = _window_starts(record)
            window = bisect.bisect_right(starts, int(index)) - 1 if starts else int(index) // int(record["window"])
            out.append(session_id(book, window))
        return out

    def stats(self) -> dict[str, Any]:
        rows = self.book_records(pending=True)
        records = {b: r for b, r in rows.items() if not r.get(PENDING)}
        pending = sorted(set(rows) - set(records))
        cards = self.cards(list(records))
        return {
            "collection": self.name,
            "embedder": self.embedder,
            "books": [
                {"book": b, "order": records[b]["order"], "chunks": records[b]["chunks"],
                 "summaries": records[b]["summaries"], "tokens": records[b]["tokens"],
                 "chunker": records[b].get("chunker", "window"), "left_out_tokens": records[b].get("left_out_tokens", 0),
                 "instruction_spans": records[b].get("instruction_spans", 0),
                 "card": json.loads(cards[b]) if b in cards else None}
                for b in sorted(records, key=lambda b: records[b]["order"])
            ],
            "chunks": sum(int(r["chunks"]) for r in records.values()),
            "summaries": sum(int(r["summaries"]) for r in records.values()),
            "tokens": sum(int(r["tokens"]) for r in records.values()),
            # Rows of an ingestion that is running or was killed: invisible to queries until committed.
            "unfinished": {"books": pending, "chunks": max(self.chunks.count() - sum(int(r["chunks"]) for r in records.values()), 0)},
        }

    # ---- writes ----------------------------------------------------------------------------
    def begin_book(self, book: str, order: int) -> None:
        """Mark the book pending at ``order`` and remove its chunks and summaries.

        One upsert swaps the committed row for the pending one, so readers stop seeing the book
        before any of its rows change, and a run killed from here on keeps the book's place.
        """
        self._books, self._uncommitted, self._count = None, None, None
        # Chroma's upsert merges metadata: the old fields stay beside the flag, the hash is cleared.
        self.books.upsert(ids=[book], embeddings=[[1.0]], documents=[""], metadatas=[{"order": order, "hash": "", PENDING: True}])
        self.chunks.delete(where={"book": book})
        self.summaries.delete(where={"book": book})

    def upsert(self, collection: str, ids: Sequence[str], vectors: np.ndarray,
               documents: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
        target = getattr(self, collection)
        self._count = None
        for start in range(0, len(ids), WRITE_BATCH):
            end = start + WRITE_BATCH
            target.upsert(
                ids=list(ids[start:end]),
                embeddings=np.asarray(vectors[start:end], dtype=np.float32).tolist(),
                documents=list(documents[start:end]),
                metadatas=list(metadatas[start:end]),
            )

    def commit_book(self, book: str, text: str, metadata: dict[str, Any]) -> None:
        """Store the text, then the commit row (last: until it lands the book is pending)."""
        self._books, self._uncommitted, self._count = None, None, None
        # Neither collection holds a meaningful vector; a constant unit vector keeps Chroma happy.
        self.texts.upsert(ids=[book], embeddings=[[1.0]], documents=[text])
        self.books.upsert(ids=[book], embeddings=[[1.0]], documents=[""], metadatas=[{**metadata, PENDING: False}])

    def move_texts_out(self) -> int:
        """Move texts that collections written before ``__texts`` existed keep in their commit rows;
        each text is written to ``__texts`` before its row is emptied, so no moment lacks it.
        Returns how many moved."""
        got = self.books.get(include=["documents", "metadatas"])
        old = [(i, d, m) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"]) if d]
        if old:
            self._books = None
            self.texts.upsert(ids=[i for i, _, _ in old], embeddings=[[1.0]] * len(old), documents=[d for _, d, _ in old])
            self.books.upsert(ids=[i for i, _, _ in old], embeddings=[[1.0]] * len(old), documents=[""] * len(old),
                              metadatas=[m for _, _, m in old])
        return len(old)


def neighbour_sessions(summary_id: str, radius: int) -> list[str]:
    """The ids of the sessions within ``radius`` windows of ``summary_id`` in its book, itself
    included, in book order (``book:s00012`` → ``book:s00011 … book:s00013`` at radius 1). Ids past
    the book's last session name no chunk, so ``session_members`` skips them; an id not in the
    ``book:sNNNNN`` form has no neighbours but itself."""
    book, j = _session_parts(summary_id)
    if j is None:
        return [summary_id]
    return [session_id(book, i) for i in range(max(0, j - radius), j + radius + 1)]


def card_id(book: str) -> str:
    """The id of ``book``'s card in ``__texts`` (a book id never holds ``#``: ``ingest.book_id``)."""
    return f"{book}#card"


def chunk_book(chunk_id: str) -> str:
    """The book of a chunk id (``BOOK:c{i:06d}``)."""
    return chunk_id.rpartition(":c")[0]


def book_unit_id(book: str) -> str:
    """The id of ``book``'s unit in ``__summaries``, the level above its sessions."""
    return f"{book}#book"


def is_book_unit(summary_id: str) -> bool:
    return summary_id.endswith("#book")


def session_id(book: str, window: int) -> str:
    """The id ingestion gives session ``window`` of ``book``."""
    return f"{book}:s{window:05d}"


def _session_parts(summary_id: str) -> tuple[str, int | None]:
    """(book, window) of a session id; window None when the id is not in the ``book:sNNNNN`` form."""
    book, sep, window = summary_id.rpartition(":s")
    return (book, int(window)) if sep and window.isdigit() else (book, None)


def _window_starts(record: dict[str, Any]) -> tuple[int, ...]:
    return _parse_starts(str(record.get("window_starts", "")))


@lru_cache(maxsize=4096)
def _parse_starts(joined: str) -> tuple[int, ...]:
    """Parsed once per distinct row: ``summary_of`` runs on every retrieval."""
    return tuple(int(i) for i in joined.split(",")) if joined else ()


def delete_mindscape(name: str, client: Any | None = None) -> None:
    client = client if client is not None else chroma_client()
    validate_name(name)
    with writer_lock(store_path(client)):
        _delete(name, client)


def remove_book(name: str, book: str, client: Any | None = None) -> None:
    """Take one book out of a collection. The book is first turned pending (readers stop seeing it
    at once, and an interrupted removal leaves rows they ignore), then its rows go, its commit row last."""
    client = client if client is not None else chroma_client()
    with writer_lock(store_path(client)):
        store = Mindscape(name, client)
        records = store.book_records(pending=True)
        if book not in records:
            raise MindscapeError(f"collection {name!r} has no book {book!r} (its books: {', '.join(sorted(records)) or 'none'}); "
                                 f"`mia ls` lists them")
        store.begin_book(book, int(records[book]["order"]))
        store.texts.delete(ids=[book, card_id(book)])
        store.books.delete(ids=[book])


def _delete(name: str, client: Any) -> None:
    if name not in list_mindscapes(client):
        raise MindscapeError(f"unknown collection {name!r}: `mia ls` lists the collections")
    for suffix in SUFFIXES:
        try:
            client.delete_collection(f"{name}{suffix}")
        except Exception:  # noqa: BLE001 - a partly created mindscape may lack some collections
            pass


def batched(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
