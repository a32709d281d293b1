"""The vector index: each level's committed vectors as one matrix per process, searched exactly.

Every question reads vectors: InitSignature and the centroid read the sessions' vectors, step 0 and
E2 the vectors of their chunk candidates (to select, and to score BM25's hits exactly). Read from
Chroma each time, the summaries cost several times the greedy selection itself, and against a
Chroma server the chunk vectors were the largest part of E2 (`mia bench scale`). So a level's
vectors are held here while the books are unchanged. After a book is added, replaced or removed,
only the books whose commit row changed are read again, one book per read, so no response holds
the library; the others' blocks are reused and the update costs what changed. The price is memory:
4 bytes per dimension per row (1.5 KB a chunk with MiniLM, 19 MB for the 2.4M-token books library),
for the ``HELD`` level matrices used last; and a fresh process's first question reads the whole
collection (the index update of `mia bench scale`: 2.0 s for those 2.4M tokens).

Search is exact, not Chroma's HNSW index: the index missed near neighbours, and which it missed
changed from one process to the next, so two runs of the recall-at-scale command ranked 129 of its
3,492 rankings (3.7%) differently (evals/README). With the vectors in memory already, one matrix
product is exact, repeatable, and no round trip to a server.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from mia.stores.units import Level, level_of

HELD = 16
"""How many level matrices a process keeps, least recently used first out."""
COUNTED_BY = {Level.CHUNK: "chunks", Level.SESSION: "summaries"}
"""The commit row's field that counts a book's rows of a level (units above sessions are not counted)."""

BookRow = tuple[tuple[str, Any], ...]
"""A book's commit row as the store's version holds it (sorted items)."""


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


@dataclass(frozen=True)
class LevelVectors:
    """One level's committed vectors: ids in book order (books in the version's order)."""

    version: tuple[tuple[str, BookRow], ...]
    ids: list[str]
    rows: dict[str, int]
    matrix: np.ndarray
    norms: np.ndarray
    """Each row's length, for exact cosines whatever the embedder's normalisation."""
    books: dict[str, tuple[BookRow, int, int]]
    """Per committed book: the commit row its block was read under, and the block's rows."""


# Keyed by the Chroma collection's id, which a re-created collection never reuses, and the level.
_HELD: OrderedDict[tuple[str, Level], LevelVectors] = OrderedDict()
_LOCK = threading.Lock()


def level_vectors(collection: Any, name: str, level: Level, version: tuple[tuple[str, BookRow], ...],
                  committed: Mapping[str, Any]) -> LevelVectors:
    """The committed vectors of ``level`` in the Chroma ``collection`` (named ``chunks`` or
    ``summaries``), for the store's ``version`` (its books' commit rows) of which ``committed``
    names the committed books."""
    key = (str(collection.id), level)
    with _LOCK:  # threads of one server asking at once read the library once
        held = _HELD.get(key)
        if held is not None and held.version == version:
            _HELD.move_to_end(key)
            return held
        blocks: list[tuple[list[str], np.ndarray]] = []
        spans: dict[str, tuple[BookRow, int, int]] = {}
        complete, at = True, 0
        for book, row in version:
            if book not in committed:
                continue
            if held is not None and book in held.books and held.books[book][0] == row:
                _, start, stop = held.books[book]
                ids, matrix = held.ids[start:stop], held.matrix[start:stop]
            else:
                got = collection.get(where={"book": book}, include=["embeddings", "metadatas"])
                # ids name the book's order (``units``); a book without summaries has none
                order = sorted((n for n, m in enumerate(got["metadatas"]) if level_of(m, name) == level),
                               key=lambda n: got["ids"][n])
                ids = [got["ids"][n] for n in order]
                matrix = (np.asarray(got["embeddings"], dtype=np.float32).reshape(len(got["ids"]), -1)[order] if ids
                          else np.zeros((0, 0), dtype=np.float32))
                # A writer may have turned the book pending since its row was read: a block that
                # lacks rows its commit row counts serves this call but is not kept.
                counted = dict(row).get(COUNTED_BY.get(level, ""), len(ids))
                complete &= len(ids) == int(counted)
            blocks.append((ids, matrix))
            spans[book] = (row, at, at + len(ids))
            at += len(ids)
        ids = [i for block_ids, _ in blocks for i in block_ids]
        mats = [m for block_ids, m in blocks if block_ids]
        matrix = np.concatenate(mats) if mats else np.zeros((0, 0), dtype=np.float32)
        matrix.flags.writeable = False
        norms = np.linalg.norm(matrix, axis=1) if ids else np.zeros(0, dtype=np.float32)
        held = LevelVectors(version, ids, {i: n for n, i in enumerate(ids)}, matrix, norms, spans)
        if complete:
            _HELD[key] = held
            _HELD.move_to_end(key)
            while len(_HELD) > HELD:
                _HELD.popitem(last=False)
        return held


def nearest(held: LevelVectors, query: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(row, cosine) of the ``k`` rows nearest to ``query``, best first; ties go to the earlier row
    (books in the version's order), so a ranking is the same in every process."""
    if k <= 0 or not held.ids:
        return []
    cosine = (held.matrix @ query) / np.maximum(held.norms * float(np.linalg.norm(query)), 1e-12)
    k = min(k, len(held.ids))
    # The k best, and every row tied with the k-th, so that the earlier rows win the cut too.
    tied = np.flatnonzero(cosine >= cosine[np.argpartition(-cosine, k - 1)[k - 1]])
    top = tied[np.lexsort((tied, -cosine[tied]))][:k]
    return [(int(n), float(cosine[n])) for n in top]
