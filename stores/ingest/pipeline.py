"""The ingestion pipeline: the one way into a mindscape, calling each level's builder in turn.

Idempotent and restartable by construction: every input is validated before anything is written;
a book whose recorded hash matches is skipped without any model call; a book's chunks and sessions
(``chunks``, ``sessions``) are written under deterministic ids between a pending record (which keeps
its place in the series) and its committed record (``stores/commits.py``), so a run killed at any
point leaves only rows that readers ignore and the next run deletes and rewrites, in the same order.
The levels above (``story``'s parts and story, ``books``, ``names``) are written once every book is
committed, so the first answer never waits for them.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Sequence, get_args

from langchain_core.language_models import BaseChatModel
from tqdm import tqdm

from mia.stores.book_card import DEFAULT_CARDS, CardMode
from mia.stores.chroma import MindscapeError, chroma_client, list_mindscapes, validate_name
from mia.stores.commits import PENDING
from mia.stores.embeddings import Embedder, load_embedder
from mia.stores.ingest import books, chunks, names, sessions, story
from mia.stores.ingest.chunks import book_span
from mia.stores.ingest.options import LLM_SUMMARIZERS, IngestOptions, IngestReport, Progress, ProgressHook
from mia.stores.ingest.sources import InputError, Source, collect_sources
from mia.stores.mindscape import Mindscape
from mia.stores.settings import Settings
from mia.stores.summaries import SummaryCache
from mia.stores.tokens import count_tokens
from mia.stores.writer_lock import collection_writer, settings_store_path, store_path


def ingest(
    paths: Sequence[str | Path],
    collection: str,
    embedder: Embedder,
    *,
    options: IngestOptions = IngestOptions(),
    llm: BaseChatModel | None = None,
    cards: CardMode = "none",
    card_model: BaseChatModel | None = None,
    client: Any | None = None,
    cache: SummaryCache | None = None,
    progress: bool = True,
    on_progress: ProgressHook | None = None,
) -> IngestReport:
    """Ingestion with models and a store the caller already holds (evaluations and benchmarks that
    reuse one embedder across many collections, tests with a scripted chat model); applications
    ingest through :func:`ingest_sources`, which loads what the options need. ``llm`` writes the
    summaries of an LLM summarizer; ``card_model`` (default ``llm``) the cards under ``cards=llm``."""
    sources = _checked_sources(paths, collection, options, cards)
    if options.summarizer in LLM_SUMMARIZERS and llm is None:
        raise InputError(f"the {options.summarizer} summarizer needs a chat model; pass --summarizer extractive to ingest without one")
    card_model = card_model or llm
    if cards == "llm" and card_model is None:
        raise InputError("--cards llm needs a chat model; pass --cards names to write cards without one")
    client = client if client is not None else chroma_client()
    with collection_writer(store_path(client), collection):
        return _ingest(sources, collection, embedder, options, llm, client, cache, Progress(progress, on_progress),
                       cards, card_model if cards == "llm" else None)


def ingest_sources(
    paths: Sequence[str | Path],
    collection: str,
    options: IngestOptions = IngestOptions(),
    *,
    embedder_spec: str = "",
    cards: CardMode = DEFAULT_CARDS,
    progress: bool = True,
    on_progress: ProgressHook | None = None,
) -> IngestReport:
    """Ingest into the store the settings name, loading the models ``options`` need: the one way the
    command line, the server's ``ingest`` graph and the test servers ingest, so they cannot drift.

    Everything that can be refused cheaply is refused before a model loads (seconds, or minutes for
    the chat model): bad options, name or sources, a store another writer holds, a store that
    cannot be opened. The chat model is loaded only for a summarizer or ``cards`` mode that calls it.
    """
    from mia.stores.chat import load_chat_model  # looked up per call, so a test can stand in for the model

    sources = _checked_sources(paths, collection, options, cards)
    settings = Settings()
    with collection_writer(settings_store_path(settings), collection, settings):
        client = chroma_client(settings)
        llm = load_chat_model() if options.summarizer in LLM_SUMMARIZERS or cards == "llm" else None
        embedder = load_embedder(embedder_spec)
        return _ingest(sources, collection, embedder, options, llm, client, None, Progress(progress, on_progress),
                       cards, llm if cards == "llm" else None)


def _checked_sources(paths: Sequence[str | Path], collection: str, options: IngestOptions, cards: CardMode) -> list[Source]:
    """The sources to ingest, after the checks that refuse bad input before any store or model opens."""
    if cards not in get_args(CardMode):
        raise InputError(f"unknown book card mode {cards!r}: use one of {', '.join(get_args(CardMode))}")
    validate_name(collection)
    options.validate()
    return collect_sources(paths)


def _ingest(sources: list[Source], collection: str, embedder: Embedder, options: IngestOptions,
            llm: BaseChatModel | None, client: Any, cache: SummaryCache | None, progress: Progress,
            cards: CardMode, card_model: BaseChatModel | None) -> IngestReport:
    store = Mindscape(collection, client) if collection in list_mindscapes(client) else None
    if store is not None and store.embedder and store.embedder != embedder.name:
        raise MindscapeError(
            f"collection {collection!r} was built with embedder {store.embedder!r}, not {embedder.name!r}: "
            f"use a new collection name or `mia rm {collection}` first"
        )
    if store is not None:
        store.commits.move_texts_out()
    records = store.commits.records(pending=True) if store else {}
    next_order = max((int(r["order"]) for r in records.values()), default=-1) + 1
    cache = cache or SummaryCache()
    method = sessions.method(options, embedder, _model_name(llm))
    report = IngestReport(collection=collection)
    for done, source in enumerate(tqdm(sources, desc="books", unit="book", disable=not progress.bars or len(sources) < 2)):
        progress.tell("books", done, len(sources))
        digest = _book_hash(source, options, book_span(source.text, options), embedder.name, method)
        record = records.get(source.book)
        if record and not record.get(PENDING) and record.get("hash") == digest:
            report.books_unchanged.append(source.book)
            continue
        order = int(record["order"]) if record else next_order
        next_order += 0 if record else 1
        stored = store.stored_chunk_vectors(source.book) if store is not None and record else {}
        book_chunks = chunks.build(source, options, embedder, stored, report, progress)
        book_sessions = sessions.build(source, book_chunks, options, embedder, llm, method, cache, report, progress)
        # Created only now, when there is something to write: a run that fails while chunking,
        # embedding or summarising (an unreachable endpoint) leaves no empty collection behind.
        if store is None:
            store = Mindscape(collection, client, create=True, embedder=embedder.name)
        _write_book(store, source, book_chunks, book_sessions, order, digest, options, method, report)
    progress.tell("books", len(sources), len(sources))
    if store is not None and llm is not None and options.summarizer in LLM_SUMMARIZERS:
        story.build(store, llm, embedder, cache, report, progress)
    if cards != "none" and store is not None:
        progress.tell("book cards", 0, 1)
        books.build(store, card_model, embedder, cache, progress=progress.bars)
        progress.tell("book cards", 1, 1)
    if store is not None:
        names.build(store, embedder)
    return report


def _write_book(store: Mindscape, source: Source, book_chunks: chunks.BookChunks, book_sessions: sessions.BookSessions,
                order: int, digest: str, options: IngestOptions, method: str, report: IngestReport) -> None:
    """Replace the book's chunks and sessions between marking it pending and committing it (its record goes last)."""
    clock = time.perf_counter()
    store.begin_book(source.book, order)
    chunk_rows = chunks.rows(store.name, source, order, book_chunks, book_sessions.owners(source.book))
    store.upsert("chunks", chunk_rows.ids, chunk_rows.vectors, chunk_rows.texts, chunk_rows.metadatas)
    if book_sessions.windows:
        session_rows = sessions.rows(store.name, source, order, book_sessions, method)
        store.upsert("summaries", session_rows.ids, session_rows.vectors, session_rows.texts, session_rows.metadatas)
    start, end = book_chunks.body
    tokens = count_tokens(source.text[start:end])
    windows = book_sessions.windows
    store.commits.commit(source.book, source.text, {
        "order": order, "hash": digest, "file": source.path.name, "chunks": len(book_chunks.chunks),
        "summaries": len(windows), "tokens": tokens, "chunk_size": options.chunk_size, "overlap": options.overlap,
        "window": options.window, "summarizer": method, "chunker": options.chunker, "body_start": start, "body_end": end,
        "window_unit": options.window_unit, "window_starts": ",".join(str(w[0].index) for w in windows),
        "left_out_tokens": count_tokens(source.text[:start]) + count_tokens(source.text[end:]),
        "instruction_spans": len(book_chunks.cut),
    })
    report.seconds["writing"] += time.perf_counter() - clock
    report.books_written.append(source.book)
    report.chunks += len(book_chunks.chunks)
    report.summaries += len(windows)
    report.tokens += tokens


def _model_name(llm: BaseChatModel | None) -> str:
    from mia.stores.chat import chat_model_name

    return chat_model_name(llm) if llm is not None else ""


def _book_hash(source: Source, options: IngestOptions, body: tuple[int, int], embedder: str, summary_method: str) -> str:
    """What the book's rows depend on. The options added later enter the key only where they change
    the rows (another chunker, windows counted in tokens, front matter left out of this file), so a
    book ingested before they existed, whose rows they leave as they were, is not rewritten."""
    extra = "".join([
        f"|chunker={options.chunker}" if options.chunker != "window" else "",
        f"|window_unit={options.window_unit}" if options.window_unit != "chunks" else "",
        f"|body={body[0]}-{body[1]}" if body != (0, len(source.text)) else "",
    ])
    key = f"{options.chunk_size}|{options.overlap}|{options.window}|{embedder}|{summary_method}{extra}\n{source.text}"
    return hashlib.sha256(key.encode()).hexdigest()


