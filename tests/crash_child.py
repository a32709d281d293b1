"""What the crash-safety tests run in child processes: a real ingestion that SIGKILLs itself, and
the reads a user could make before rerunning it.

Every child is forked from a multiprocessing fork server that imported this module (and with it
torch, sentence-transformers and Chroma) once, so a child costs a fraction of a second instead of
the ~12 s of imports; no child inherits a Chroma client or a started thread pool. Each call opens
its own Chroma client, as a separate process does.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import chromadb
import numpy as np
import sentence_transformers  # noqa: F401  (stores.embeddings imports it lazily; the fork server must hold it)
from chromadb.api.models.Collection import Collection
from chromadb.config import Settings as ChromaSettings

from mia.stores import mindscape as mindscape_module
from mia.stores.bm25 import ChunkIndex
from mia.stores.embeddings import load_embedder
from mia.stores.ingest import IngestOptions, ingest
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import SummaryCache

OPTIONS = IngestOptions(chunk_size=80, window=3, summarizer="extractive")
WRITE_BATCH = 3
"""Chroma writes of at most 3 rows, so one replacement is a dozen or more separate writes to kill between."""


def client(path: Path) -> Any:
    return chromadb.PersistentClient(path=str(path), settings=ChromaSettings(anonymized_telemetry=False))


def ingest_books(store: Path, cache: Path, paths: list[Path], collection: str, kill_before: int | None = None,
                 pause_before: int | None = None, release: Path | None = None) -> int:
    """Ingest ``paths``; SIGKILL this process just before its ``kill_before``-th Chroma write, or
    wait before its ``pause_before``-th write until the file ``release`` exists (at most 120 s).

    Returns the number of writes made (when not killed), so a test can pick points inside them.
    """
    mindscape_module.WRITE_BATCH = WRITE_BATCH
    writes = 0

    def counted(method: Any) -> Any:
        def write(self: Collection, *args: Any, **kwargs: Any) -> Any:
            nonlocal writes
            writes += 1
            if writes == kill_before:
                os.kill(os.getpid(), signal.SIGKILL)
            if writes == pause_before and release is not None:
                deadline = time.monotonic() + 120
                while not release.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            return method(self, *args, **kwargs)
        return write

    Collection.upsert = counted(Collection.upsert)  # type: ignore[method-assign]
    Collection.delete = counted(Collection.delete)  # type: ignore[method-assign]
    ingest(paths, collection, load_embedder("minilm"), options=OPTIONS, client=client(store),
           cache=SummaryCache(cache), progress=False)
    return writes


def read_everything(store: Path, collection: str, queries: list[str]) -> dict[str, Any]:
    """What a reader sees: the committed books, every chunk a dense or BM25 query returns (with
    its text and whether it is that committed book's exact slice), and ``mia ls``'s counts."""
    chroma = client(store)
    view = Mindscape(collection, chroma)
    embedder = load_embedder("minilm")
    records = view.commits.records()
    texts = {book: view.book_text(book) for book in records}
    returned: set[str] = set()
    for query in queries:
        returned.update(h.id for h in view.search_chunks(np.asarray(embedder.embed_query(query)), 1000))
        returned.update(ChunkIndex.for_collection(view).search(query, 1000))
    chunks = view.chunk_records(sorted(returned))
    foreign = [c["id"] for c in chunks if c["book"] not in records or texts[c["book"]][c["start"] : c["end"]] != c["text"]]
    stats = view.stats()
    return {"orders": {b: r["order"] for b, r in records.items()}, "returned": len(returned), "foreign": foreign,
            "stats_chunks": stats["chunks"], "committed_chunks": sum(int(r["chunks"]) for r in records.values()),
            "unfinished": stats["unfinished"]}


def snapshot(store: Path, collection: str) -> dict[str, Any]:
    """Every row of the collection (ids, texts, metadata, vectors), for :func:`same_rows` with a clean run."""
    view = Mindscape(collection, client(store))

    def rows(target: Collection, vectors: bool = True) -> dict[str, Any]:
        got = target.get(include=["documents", "metadatas", "embeddings"] if vectors else ["documents", "metadatas"])
        out = {}
        for n, i in enumerate(got["ids"]):
            meta = {k: v for k, v in got["metadatas"][n].items() if k != "collection"}
            vector = tuple(float(x) for x in got["embeddings"][n]) if vectors else ()
            out[i] = (got["documents"][n], tuple(sorted(meta.items())), vector)
        return out

    return {"chunks": rows(view.chunks), "summaries": rows(view.summaries), "books": rows(view.books, vectors=False)}


def same_rows(got: dict[str, Any], clean: dict[str, Any]) -> bool:
    """Snapshots equal row for row: the same ids, texts and metadata, and vectors within 1e-5.

    A rerun reuses the stored vectors of unchanged chunks (embedded in other batches, normalised
    again by Chroma), so a vector may differ from the clean run's in its last float32 bits."""
    if {part: {i: row[:2] for i, row in rows.items()} for part, rows in got.items()} != \
            {part: {i: row[:2] for i, row in rows.items()} for part, rows in clean.items()}:
        return False
    return all(np.allclose(row[2], clean[part][i][2], rtol=0, atol=1e-5) for part, rows in got.items() for i, row in rows.items())


def lock_holders(store: Path) -> list[dict[str, Any]]:
    """The writer now holding the store's lock, as its holder file describes it (none: [])."""
    info = store / "mia-writer.holder.json"
    return [json.loads(info.read_text())] if info.exists() else []
