"""The mindscape in Chroma: the small façade the nodes, ingestion and the harness use.

One mindscape NAME is four Chroma collections in cosine space: ``NAME__chunks`` (the chunk level),
``NAME__summaries`` (the units above it: sessions, parts and whole-book units, each row naming its level,
``stores/units.py``), ``NAME__books`` (the commit rows, ``stores/commits.py``) and ``NAME__texts``
(the books' texts). Which chunks a unit covers is read from the book's commit row, not queried;
the vectors questions read are held per process (``stores/vector_index.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from mia.stores.chroma import COSINE, MindscapeError, chroma_client, list_mindscapes, validate_name
from mia.stores.commits import PENDING, BookNotCommitted, Commits
from mia.stores.units import (LEVEL, WHOLE_BOOK_LEVELS, Level, book_unit_id, chunk_book, level_of, part_of,
                              session_chunks, session_of, session_parts)
from mia.stores.vector_index import ChunkHit, LevelVectors, level_vectors, nearest
from mia.stores.writer_lock import collection_writer, store_path

# Chroma rejects larger single writes (~5461 records on SQLite); stay well below it.
WRITE_BATCH = 2000


@dataclass(frozen=True)
class BookUnit:
    """A book's unit at a whole-book level; at the book level, its card (JSON) and the card's one
    rendering, which the reader, the signature, `mia ls`, ``--explain`` and the web page show."""

    id: str
    book: str
    text: str
    metadata: dict[str, Any]
    """The unit's row as stored: its level's own fields (a story's ``sessions_per_part`` and ``parts``)."""

    @property
    def card(self) -> str:
        return str(self.metadata.get("card", ""))


class Mindscape:
    """Read and write access to one named mindscape."""

    def __init__(self, name: str, client: Any | None = None, *, create: bool = False, embedder: str = "") -> None:
        self.name = validate_name(name)
        self.client = client if client is not None else chroma_client()
        meta = {**COSINE, "embedder": embedder} if create else None
        get = self.client.get_or_create_collection if create else self.client.get_collection
        kwargs = {"metadata": meta} if create else {}
        # No embedding function (Chroma's default downloads a model): vectors are passed. Opened by name, not
        # looked up in a listing: every node call opens its collection, and a listing costs per collection.
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
        self.commits = Commits(self.books, lambda: self.texts)

    @property
    def texts(self) -> Any:
        """The ``__texts`` collection, created on first use: collections written before it existed lack it."""
        if self._texts is None:
            self._texts = self.client.get_or_create_collection(f"{self.name}__texts", embedding_function=None, metadata=COSINE)
        return self._texts

    def book_text(self, book: str) -> str:
        return self._book(book)[0]

    def book_body(self, book: str) -> str:
        """The book without its Project Gutenberg header and footer (as chunked), for the streaming
        agents; books ingested before front matter was recognised have no span and are whole."""
        text, record = self._book(book)
        return text[int(record.get("body_start", 0)) : int(record.get("body_end", len(text)))]

    def _book(self, book: str) -> tuple[str, dict[str, Any]]:
        try:
            return self.commits.text(book)
        except BookNotCommitted:
            raise MindscapeError(f"collection {self.name!r} has no committed book {book!r}: it is being written "
                                 "(or its ingestion was interrupted); rerun `mia ingest` to finish it") from None

    def book_units(self, books: Sequence[str] | None = None, level: Level = Level.BOOK) -> dict[str, BookUnit]:
        """The current units of a whole-book ``level`` of committed books (all of them by default):
        one made for another version of its book is left out, as is a book without one (and, at the
        book level, a unit without its card: written before units held cards)."""
        committed = self.commits.committed()
        wanted = [b for b in dict.fromkeys(committed if books is None else books) if b in committed]
        if not wanted:
            return {}
        got = self.summaries.get(ids=[book_unit_id(b, level) for b in wanted], include=["documents", "metadatas"])
        return {m["book"]: BookUnit(i, m["book"], text, m)
                for i, text, m in zip(got["ids"], got["documents"], got["metadatas"])
                if (m.get("card") or level != Level.BOOK) and str(committed[m["book"]].get("hash")) == m.get("hash")}

    def chunk_records(self, ids: Sequence[str], *, documents: bool = True) -> list[dict[str, Any]]:
        """Metadata (and text) of chunks, in the order asked."""
        return self._records(self.chunks, ids, documents)

    def summary_records(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """Metadata (``level`` among it) and text of summary units, in the order asked."""
        return [{**r, LEVEL: level_of(r, "summaries")} for r in self._records(self.summaries, ids, True)]

    def _records(self, collection: Any, ids: Sequence[str], documents: bool) -> list[dict[str, Any]]:
        if not ids:
            return []
        got = collection.get(ids=list(ids), include=["metadatas", "documents"] if documents else ["metadatas"])
        committed = self.commits.committed()
        texts = got.get("documents") or [None] * len(got["ids"])
        # ids are deterministic: a book being rewritten reuses them, so only committed books count
        by_id = {i: {"id": i, **m, **({"text": d} if documents else {})}
                 for i, m, d in zip(got["ids"], got["metadatas"], texts) if m.get("book") in committed}
        return [by_id[i] for i in ids if i in by_id]

    def vector_rows(self, level: Level) -> tuple[dict[str, int], np.ndarray]:
        """All committed vectors of ``level`` (chunks or sessions) as one matrix with its id → row map."""
        held = self._index(Level(level))
        return held.rows, held.matrix

    def _index(self, level: Level) -> LevelVectors:
        collection = "chunks" if level == Level.CHUNK else "summaries"
        return level_vectors(getattr(self, collection), collection, level, self.commits.version(), self.commits.committed())

    def vectors(self, collection: str, ids: Sequence[str]) -> np.ndarray:
        """Stored vectors in the order asked (``collection`` is ``chunks`` or ``summaries``): from the
        matrix held in memory, and from Chroma by id for units above the sessions."""
        if not ids:
            return np.zeros((0, 0), dtype=np.float32)
        rows, matrix = self.vector_rows(Level.CHUNK if collection == "chunks" else Level.SESSION)
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

    def book_chunk_ids(self, book: str) -> list[str]:
        """The ids of the chunks stored for ``book``, committed or not, in book order."""
        got = self.chunks.get(where={"book": book}, include=["metadatas"])
        return [i for _, i in sorted((m["index"], i) for i, m in zip(got["ids"], got["metadatas"]))]

    def search_chunks(self, vector: np.ndarray, k: int, *, vectors: bool = False,
                      owners: bool = False) -> list[ChunkHit]:
        """The k committed chunks nearest by cosine similarity, exactly (``vector_index.nearest``);
        optionally with their vectors and their sessions π(c)."""
        held = self._index(Level.CHUNK)
        query = np.asarray(vector, dtype=np.float32).ravel()
        if held.ids and query.shape[0] != held.matrix.shape[1]:
            raise MindscapeError(
                f"collection {self.name!r} holds {held.matrix.shape[1]}-dimensional vectors of embedder "
                f"{self.embedder!r} but the query has {query.shape[0]}: ask with that embedder (`mia ls` names it)"
            )
        top = nearest(held, query, k)
        ids = [held.ids[n] for n, _ in top]
        sessions = self.summary_of(ids) if owners else [""] * len(ids)
        return [ChunkHit(i, cosine, s, held.matrix[n] if vectors else None)
                for i, (n, cosine), s in zip(ids, top, sessions)]

    # ---- coverage: which units hold a chunk, from the books' commit rows --------------------
    def summary_of(self, chunk_ids: Sequence[str]) -> list[str]:
        """π(c), each chunk's session ("" for a book without sessions or not committed), from the
        books' commit rows (``units.session_of``), as the chunk's ``summary_id`` metadata holds."""
        committed = self.commits.committed()
        return [session_of(committed.get(chunk_book(c)), c) for c in chunk_ids]

    def units_over(self, chunk_ids: Sequence[str], levels: Sequence[Level]) -> list[dict[Level, str]]:
        """Per chunk, the unit of each of ``levels`` (above the chunks) that covers it, lowest level
        first: with several levels coverage overlaps, the paper's overcomplete memory. A book's parts
        count once its story is current (written after them, it records how they were cut)."""
        books = [chunk_book(c) for c in chunk_ids]
        sessions = self.summary_of(chunk_ids)
        whole = {level: self.book_units(books, level) for level in (*levels, *((Level.STORY,) if Level.PART in levels else ()))
                 if level in WHOLE_BOOK_LEVELS}
        stories = whole.get(Level.STORY, {})
        found = []
        for book, session in zip(books, sessions):
            units = {Level.SESSION: session if Level.SESSION in levels else ""}
            if Level.PART in levels and session and book in stories:
                units[Level.PART] = part_of(session, int(stories[book].metadata.get("sessions_per_part", 1)))
            units.update({level: whole[level][book].id for level in levels if level in whole and book in whole[level]})
            found.append({level: unit for level, unit in units.items() if unit})
        return found

    def session_members(self, summary_ids: Sequence[str]) -> list[tuple[str, str]]:
        """(chunk id, session id) of every committed chunk in the given sessions, session by session,
        each in book order, from the commit rows (``units.session_chunks``): a metadata query to
        Chroma cost 4.5 ms a question, most of the trained head's E2."""
        committed = self.commits.committed()
        return [(c, s) for s in summary_ids for c in session_chunks(committed.get(session_parts(s)[0]), s)]

    def stats(self) -> dict[str, Any]:
        rows = self.commits.records(pending=True)
        records = {b: r for b, r in rows.items() if not r.get(PENDING)}
        units, stories = self.book_units(list(records)), self.book_units(list(records), Level.STORY)
        count = lambda key: sum(int(r[key]) for r in records.values())  # noqa: E731
        return {
            "collection": self.name,
            "embedder": self.embedder,
            "books": [
                {"book": b, "order": r["order"], "chunks": r["chunks"], "summaries": r["summaries"], "tokens": r["tokens"],
                 "chunker": r.get("chunker", "window"), "left_out_tokens": r.get("left_out_tokens", 0),
                 "instruction_spans": r.get("instruction_spans", 0),
                 "card": json.loads(units[b].card) if b in units else None, "card_text": units[b].text if b in units else "",
                 "parts": int(stories[b].metadata.get("parts", 0)) if b in stories else 0,
                 "story": stories[b].text if b in stories else ""}
                for b, r in sorted(records.items(), key=lambda item: item[1]["order"])
            ],
            "chunks": count("chunks"), "summaries": count("summaries"), "tokens": count("tokens"),
            # Rows of an ingestion that is running or was killed: invisible to queries until committed.
            "unfinished": {"books": sorted(set(rows) - set(records)), "chunks": max(self.chunks.count() - count("chunks"), 0)},
        }

    # ---- writes (ingestion's builders, under the writer lock) -------------------------------
    def begin_book(self, book: str, order: int) -> None:
        """Mark the book pending at ``order`` and remove its units of every level."""
        self.commits.begin(book, order)
        self.chunks.delete(where={"book": book})
        self.summaries.delete(where={"book": book})

    def upsert(self, collection: str, ids: Sequence[str], vectors: np.ndarray,
               documents: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
        target = getattr(self, collection)
        for start in range(0, len(ids), WRITE_BATCH):
            end = start + WRITE_BATCH
            target.upsert(ids=list(ids[start:end]), embeddings=np.asarray(vectors[start:end], dtype=np.float32).tolist(),
                          documents=list(documents[start:end]), metadatas=list(metadatas[start:end]))


def remove_book(name: str, book: str, client: Any | None = None) -> None:
    """Take one book out of a collection. The book is first turned pending (readers stop seeing it
    at once, and an interrupted removal leaves rows they ignore), then its rows go, its commit row last."""
    client = client if client is not None else chroma_client()
    with collection_writer(store_path(client), name):
        store = Mindscape(name, client)
        records = store.commits.records(pending=True)
        if book not in records:
            raise MindscapeError(f"collection {name!r} has no book {book!r} (its books: {', '.join(sorted(records)) or 'none'}); "
                                 f"`mia ls` lists them")
        store.begin_book(book, int(records[book]["order"]))
        store.commits.remove(book)
