"""The memory's units: one schema for chunks, sessions and books, read by every part of MiA.

A mindscape is a hierarchy over each book, built bottom-up by ingestion (``stores/ingest``, one
builder a level): **chunks** (passages), **sessions** (a summary of a window of consecutive chunks),
**parts** (a summary the chat model writes of every few consecutive session summaries) and three
units over each whole book: **story** (the plot of the whole book, written from its parts: the top of
the written tree, built bottom-up along the story as RAPTOR builds its tree by similarity),
**books** (its card's text) and **names** (who is who: its main names, where in the story each
appears, and with whom). Every stored row carries its level in
its metadata, so the selection's coverage, E2's filter and the reader ask a unit its level, never
its id. Ids are made here, and parsed here only for a position (chunk i, session j of a book),
which the store turns into coverage from the book's commit row without a query.

Rows written before levels were metadata lack the field: in ``__chunks`` they are chunks, in
``__summaries`` sessions (book units always carried it), which ``level_of`` reads as such.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal, Mapping

LEVEL = "level"
"""The metadata field that holds a row's level."""


class Level(StrEnum):
    """A level of the memory, lowest first."""

    CHUNK = "chunk"
    SESSION = "session"
    PART = "part"
    STORY = "story"
    BOOK = "book"
    NAMES = "names"


WHOLE_BOOK_LEVELS = (Level.STORY, Level.BOOK, Level.NAMES)
"""The levels with one unit per book, written after the book is committed (``stores/ingest/story.py``,
``books.py``, ``names.py``): each carries the hash of the book version it was made for."""

WRITTEN_ABOVE_SESSIONS = (Level.PART, Level.STORY)
"""The written tree above the sessions (``stores/ingest/story.py``): a book's parts are current when
its story unit is, which is written after them and records how many sessions a part holds."""

BUILT_BY = {
    Level.PART: "--summarizer llm-excerpt (or llm)", Level.STORY: "--summarizer llm-excerpt (or llm)",
    Level.BOOK: "--cards names (or llm)", Level.NAMES: "any `mia ingest`",
}
"""How a user gets a level's units written, for the message that says they are missing."""

SignatureLevels = Literal["sessions", "sessions+books", "sessions+names", "sessions+books+names",
                          "sessions+parts+story", "sessions+parts+story+names"]
SIGNATURE_LEVELS: dict[str, tuple[Level, ...]] = {
    "sessions": (Level.SESSION,), "sessions+books": (Level.SESSION, Level.BOOK),
    "sessions+names": (Level.SESSION, Level.NAMES), "sessions+books+names": (Level.SESSION, Level.BOOK, Level.NAMES),
    "sessions+parts+story": (Level.SESSION, Level.PART, Level.STORY),
    "sessions+parts+story+names": (Level.SESSION, Level.PART, Level.STORY, Level.NAMES),
}
"""The ``signature_levels`` setting's values and the levels each lets the signature choose from."""


def level_of(metadata: Mapping[str, Any] | None, collection: str) -> Level:
    """The level of a row of ``collection`` (``chunks`` or ``summaries``)."""
    recorded = (metadata or {}).get(LEVEL)
    if recorded:
        return Level(recorded)
    return Level.CHUNK if collection == "chunks" else Level.SESSION


@dataclass(frozen=True)
class Unit:
    """One unit of the memory: its level, id, book, and the characters of the book it spans."""

    level: Level
    id: str
    book: str
    span: tuple[int, int] = (0, 0)

    def metadata(self) -> dict[str, Any]:
        """The fields every stored row of a unit carries (a builder adds its own beside them)."""
        return {LEVEL: str(self.level), "book": self.book, "start": self.span[0], "end": self.span[1]}


def chunk_id(book: str, index: int) -> str:
    """The id of chunk ``index`` of ``book``; a book id never holds ``:`` (``ingest.book_id``)."""
    return f"{book}:c{index:06d}"


def session_id(book: str, window: int) -> str:
    """The id of session ``window`` of ``book``."""
    return f"{book}:s{window:05d}"


def part_id(book: str, part: int) -> str:
    """The id of part ``part`` of ``book``."""
    return f"{book}:p{part:04d}"


def part_of(session: str, sessions_per_part: int) -> str:
    """The id of the part that holds ``session`` (a ``session_id``), its book's parts holding
    ``sessions_per_part`` consecutive sessions each."""
    book, j = session_parts(session)
    return part_id(book, j // sessions_per_part) if j is not None else ""


def book_unit_id(book: str, level: Level = Level.BOOK) -> str:
    """The id of ``book``'s unit at a whole-book level (a book id never holds ``#``)."""
    return f"{book}#{level}"


def chunk_book(chunk: str) -> str:
    """The book of a chunk id."""
    return chunk.rpartition(":c")[0]


def chunk_index(chunk: str) -> int:
    """The position of a chunk in its book, from its id."""
    return int(chunk.rpartition(":c")[2])


def session_parts(summary_id: str) -> tuple[str, int | None]:
    """(book, window) of a session id; window None for an id not made by ``session_id``."""
    book, sep, window = summary_id.rpartition(":s")
    return (book, int(window)) if sep and window.isdigit() else (book, None)


def neighbour_sessions(summary_id: str, radius: int) -> list[str]:
    """The ids of the sessions within ``radius`` windows of ``summary_id`` in its book, itself
    included, in book order (``book:s00012`` → ``book:s00011 … book:s00013`` at radius 1). Ids past
    the book's last session name no chunk, so readers of members skip them; an id not made by
    ``session_id`` has no neighbours but itself."""
    book, j = session_parts(summary_id)
    if j is None:
        return [summary_id]
    return [session_id(book, i) for i in range(max(0, j - radius), j + radius + 1)]


# ---- coverage from a book's commit row: which session holds a chunk, which chunks a session ---------
# Ingestion records where each window starts (``window_starts``); books ingested before windows
# could be counted in tokens have ``window`` chunks a session.

def session_of(record: Mapping[str, Any] | None, chunk: str) -> str:
    """The session of ``chunk`` in the book ``record`` commits: the last window starting at or
    before it; "" for a book without sessions (or no record)."""
    if record is None or int(record.get("summaries", 0)) == 0:
        return ""
    starts, index = _window_starts(record), chunk_index(chunk)
    return session_id(chunk_book(chunk), bisect.bisect_right(starts, index) - 1 if starts else index // int(record["window"]))


def session_chunks(record: Mapping[str, Any] | None, summary_id: str) -> list[str]:
    """The chunks of session ``summary_id`` in book order: from its window's start up to the next
    window's; none for an id past the book's last session (or no record)."""
    book, j = session_parts(summary_id)
    if record is None or j is None or j >= int(record.get("summaries", 0)):
        return []
    chunks, starts = int(record["chunks"]), _window_starts(record)
    if starts:
        start, stop = starts[j], starts[j + 1] if j + 1 < len(starts) else chunks
    else:
        start, stop = j * int(record["window"]), min((j + 1) * int(record["window"]), chunks)
    return [chunk_id(book, i) for i in range(start, stop)]


def _window_starts(record: Mapping[str, Any]) -> tuple[int, ...]:
    return _parse_starts(str(record.get("window_starts", "")))


@lru_cache(maxsize=4096)
def _parse_starts(joined: str) -> tuple[int, ...]:
    """Parsed once per distinct row: ``session_of`` runs on every retrieval."""
    return tuple(int(i) for i in joined.split(",")) if joined else ()
