"""The commit protocol of a mindscape: a book's row in ``__books`` is its commit marker.

Ingestion first turns a book's row into a *pending* row (keeping the book's place in the series),
then replaces the book's units, then commits the row. Readers see committed books only: the units
of a pending or unrecorded book (an ingestion killed half way, or still running) are never
returned, counted or indexed, and the next ingestion replaces them. Units written after a book is
committed (its book-level unit) cannot share that atomicity: they carry the hash of the book version
they were made for, and readers ignore a stale one.

A book's full text lives in ``__texts``, not in its commit row: every node call reads all the
commit rows, and Chroma loads a row's document with its metadata, so texts there made each question
read the whole library (`mia bench scale`). Collections written before keep the text in the commit
row until their next ingestion moves it (``move_texts_out``); readers take either.
"""

from __future__ import annotations

from typing import Any, Callable

PENDING = "pending"
"""Metadata flag of a book row whose units are being replaced."""
_UNIT = [[1.0]]
"""Neither collection holds a meaningful vector; a constant unit vector keeps Chroma happy."""

Version = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


class BookNotCommitted(LookupError):
    """The book is being written, was interrupted, or is not in the collection."""


class Commits:
    """The books' commit rows and texts of one mindscape, read at most once per instance: an
    instance is a snapshot for one node call, or one run's step 0 and E2 (``nodes.resources.share``);
    writes through it forget the rows, other writers need a new instance."""

    def __init__(self, books: Any, texts: Callable[[], Any]) -> None:
        self.books = books
        self._texts = texts
        self._rows: dict[str, dict[str, Any]] | None = None

    def records(self, *, pending: bool = False) -> dict[str, dict[str, Any]]:
        """The committed books' rows, read now; with ``pending``, also those of books being
        (re)written, which only ingestion needs (to keep their order and to know they must be rewritten)."""
        got = self.books.get(include=["metadatas"])
        rows = {i: dict(m) for i, m in zip(got["ids"], got["metadatas"])}
        return rows if pending else {b: r for b, r in rows.items() if not r.get(PENDING)}

    def version(self) -> Version:
        """Changes whenever a book is added, replaced or removed: its commit row carries the content
        hash and the chunking options, and is turned pending first and committed last by every ingestion."""
        if self._rows is None:
            self._rows = self.records(pending=True)
        return tuple(sorted((b, tuple(sorted(r.items()))) for b, r in self._rows.items()))

    def committed(self) -> dict[str, dict[str, Any]]:
        """This snapshot's committed books' rows."""
        self.version()
        assert self._rows is not None
        return {b: r for b, r in self._rows.items() if not r.get(PENDING)}

    def ordered(self) -> list[str]:
        records = self.records()
        return sorted(records, key=lambda b: records[b]["order"])

    def text(self, book: str) -> tuple[str, dict[str, Any]]:
        """The book's text and commit row."""
        got = self.books.get(ids=[book], include=["documents", "metadatas"])
        if not got["ids"] or got["metadatas"][0].get(PENDING):
            raise BookNotCommitted(book)
        text = got["documents"][0]  # set only in collections written before texts had their own collection
        if not text:
            stored = self._texts().get(ids=[book], include=["documents"])
            text = stored["documents"][0] if stored["ids"] else ""
        return text, got["metadatas"][0]

    def begin(self, book: str, order: int) -> None:
        """Turn the book pending at ``order``: one upsert swaps the committed row for the pending one,
        so readers stop seeing the book before any of its units change, and a run killed from here
        on keeps the book's place. Chroma's upsert merges metadata: the old fields stay beside the
        flag, the hash is cleared."""
        self._rows = None
        self.books.upsert(ids=[book], embeddings=_UNIT, documents=[""], metadatas=[{"order": order, "hash": "", PENDING: True}])

    def commit(self, book: str, text: str, metadata: dict[str, Any]) -> None:
        """Store the text, then the commit row (last: until it lands the book is pending)."""
        self._rows = None
        self._texts().upsert(ids=[book], embeddings=_UNIT, documents=[text])
        self.books.upsert(ids=[book], embeddings=_UNIT, documents=[""], metadatas=[{**metadata, PENDING: False}])

    def remove(self, book: str) -> None:
        """Drop a pending book's text (and any row of it ``__texts`` holds), then its commit row."""
        self._rows = None
        self._texts().delete(ids=[book])
        self._texts().delete(where={"book": book})
        self.books.delete(ids=[book])

    def move_texts_out(self) -> int:
        """Move texts that collections written before ``__texts`` existed keep in their commit rows;
        each text is written to ``__texts`` before its row is emptied, so no moment lacks it.
        Returns how many moved."""
        got = self.books.get(include=["documents", "metadatas"])
        old = [(i, d, m) for i, d, m in zip(got["ids"], got["documents"], got["metadatas"]) if d]
        if old:
            self._rows = None
            self._texts().upsert(ids=[i for i, _, _ in old], embeddings=_UNIT * len(old), documents=[d for _, d, _ in old])
            self.books.upsert(ids=[i for i, _, _ in old], embeddings=_UNIT * len(old), documents=[""] * len(old),
                              metadatas=[m for _, _, m in old])
        return len(old)
