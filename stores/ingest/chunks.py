"""The chunk level's builder: a book's text → passages under a token budget, embedded, with what
the injection guard must know of each."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from mia.prompts.injection import encode, instruction_spans, suspect_ranges, within
from mia.stores.chunking import Chunk, chunk_text
from mia.stores.embeddings import Embedder
from mia.stores.front_matter import find_body
from mia.stores.ingest.options import IngestOptions, IngestReport, LevelRows, Progress, embed
from mia.stores.ingest.sources import Source
from mia.stores.units import Level, Unit, chunk_id


@dataclass(frozen=True)
class BookChunks:
    """A book's chunks and their vectors."""

    body: tuple[int, int]
    """The span chunked: the whole text, or the text between Project Gutenberg's header and footer."""
    chunks: list[Chunk]
    vectors: np.ndarray
    cut: list[tuple[int, int]]
    """Instruction-like spans of the body (``prompts.injection``), cut from every prompt."""
    trace: list[tuple[int, int]]
    """The ranges an answer or agent query may not be traced to (the spans, and text around them)."""


def book_span(text: str, options: IngestOptions) -> tuple[int, int]:
    """The part of the file that is chunked: all of it, or what lies between Project Gutenberg's
    header and footer unless they are kept."""
    if options.keep_front_matter:
        return 0, len(text)
    found = find_body(text)
    return found.start, found.end


def chunk_book(text: str, options: IngestOptions, embedder: Embedder) -> tuple[tuple[int, int], list[Chunk]]:
    """The span of the book that is chunked and its chunks, each within the embedder's input limit."""
    body = book_span(text, options)
    chunks = chunk_text(
        text, options.chunk_size, options.overlap, chunker=options.chunker, span=body,
        max_model_tokens=embedder.max_tokens, count_model_tokens=embedder.count_tokens,
    )
    return body, chunks


def build(source: Source, options: IngestOptions, embedder: Embedder, stored: dict[str, np.ndarray],
          report: IngestReport, progress: Progress) -> BookChunks:
    """Chunk and embed a book; a chunk whose text the store already holds (``stored``: text →
    vector) is not embedded again."""
    clock = time.perf_counter()
    body, chunks = chunk_book(source.text, options, embedder)
    report.seconds["chunking"] += time.perf_counter() - clock
    clock = time.perf_counter()
    missing = list(dict.fromkeys(c.text for c in chunks if c.text not in stored))
    known = {**stored, **dict(zip(missing, embed(embedder, missing, f"embedding {source.book}", progress)))}
    report.chunks_reused += sum(c.text in stored for c in chunks)
    report.seconds["embedding"] += time.perf_counter() - clock
    # Found once in the whole body, so a span that a chunk boundary cuts in two is still known to
    # both chunks (their metadata carries their share, chunk-relative).
    text = source.text[body[0]:body[1]]
    spans = instruction_spans(text)  # one pass over the book: the trace ranges include these
    cut = [(s.start + body[0], s.end + body[0]) for s in spans]
    trace = [(a + body[0], b + body[0]) for a, b in suspect_ranges(text, spans)]
    return BookChunks(body, chunks, np.asarray([known[c.text] for c in chunks], dtype=np.float32), cut, trace)


def rows(collection: str, source: Source, order: int, built: BookChunks, sessions: dict[int, str]) -> LevelRows:
    """The chunk rows, each naming its session (``sessions``: chunk index → session id)."""
    ids = [chunk_id(source.book, c.index) for c in built.chunks]
    metadatas = [{**Unit(Level.CHUNK, i, source.book, (c.start, c.end)).metadata(), "collection": collection,
                  "book_order": order, "index": c.index, "tokens": c.tokens, "summary_id": sessions.get(c.index, ""),
                  **_guard_metadata(built.cut, built.trace, c)} for i, c in zip(ids, built.chunks)]
    return LevelRows(ids, built.vectors, [c.text for c in built.chunks], metadatas)


def _guard_metadata(cut: list[tuple[int, int]], trace: list[tuple[int, int]], chunk: Chunk) -> dict[str, str]:
    """``guard_cut`` (cut from prompts) and ``guard_trace`` (outputs may not come from there), only
    for the few chunks that have any."""
    mine = {"guard_cut": encode(within(cut, chunk.start, chunk.end)), "guard_trace": encode(within(trace, chunk.start, chunk.end))}
    return {k: v for k, v in mine.items() if v}
