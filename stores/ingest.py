"""Ingestion: text files → a mindscape (chunks + session summaries, embedded, in Chroma).

Idempotent and restartable by construction: every input is validated before anything is
written; a book whose recorded hash matches is skipped without any model call; a book is written
under deterministic ids between a pending record (which keeps its place in the series) and its
committed record, so a run killed at any point leaves only rows that readers ignore and the next
run deletes and rewrites, in the same order.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence, get_args

import numpy as np
from langchain_core.language_models import BaseChatModel
from tqdm import tqdm

from mia.prompts.injection import encode, instruction_spans, suspect_ranges, within
from mia.stores import summaries as summ
from mia.stores.book_card import DEFAULT_CARDS, CardMode, write_cards
from mia.stores.chunking import CHUNKERS, Chunk, Chunker, chunk_text
from mia.stores.embeddings import Embedder, load_embedder
from mia.stores.front_matter import find_body
from mia.stores.mindscape import PENDING, Mindscape, MindscapeError, chroma_client, list_mindscapes, session_id, validate_name
from mia.stores.settings import Settings
from mia.stores.summaries import SummaryCache
from mia.stores.tokens import count_tokens
from mia.stores.writer_lock import settings_store_path, store_path, writer_lock

SUPPORTED_SUFFIXES = (".txt", ".md")
EMBED_BATCH = 64
Summarizer = Literal["llm", "llm-excerpt", "extractive", "none"]
SUMMARIZERS: tuple[Summarizer, ...] = get_args(Summarizer)
LLM_SUMMARIZERS = ("llm", "llm-excerpt")
"""The summarizers that call the chat model."""
WindowUnit = Literal["chunks", "tokens"]


class InputError(ValueError):
    """Bad input to ingestion; the message names the problem and the fix."""


@dataclass(frozen=True)
class Source:
    path: Path
    book: str
    text: str


@dataclass(frozen=True)
class IngestOptions:
    chunk_size: int = 200
    overlap: int = 0
    window: int = 20
    # Extractive by default: it retrieves as well as whole-window LLM summaries on the fairy-tale series
    # (val and test, paired) and costs no LLM time, where the LLM pays ~1 prompt token per source token.
    summarizer: Summarizer = "extractive"
    # Structure chunks keep a reader's unit (paragraph, section) whole: they find the gold section itself
    # more often (strict recall) than fixed windows, which plain recall credits for every section they straddle.
    chunker: Chunker = "structure"
    keep_front_matter: bool = False
    window_unit: WindowUnit = "chunks"

    def validate(self) -> None:
        if self.chunk_size <= 0:
            raise InputError(f"--chunk-size must be positive, got {self.chunk_size}")
        if not 0 <= self.overlap < self.chunk_size:
            raise InputError(f"--overlap must be at least 0 and below --chunk-size ({self.chunk_size}), got {self.overlap}")
        if self.window <= 0:
            raise InputError(f"--window must be positive, got {self.window}")
        if self.summarizer not in SUMMARIZERS:
            raise InputError(f"--summarizer must be one of {', '.join(SUMMARIZERS)}, got {self.summarizer!r}")
        if self.window_unit not in ("chunks", "tokens"):
            raise InputError(f"--window-unit must be chunks or tokens, got {self.window_unit!r}")
        if self.chunker not in CHUNKERS:
            raise InputError(f"--chunker must be one of {', '.join(CHUNKERS)}, got {self.chunker!r}")


@dataclass
class IngestReport:
    collection: str
    books_written: list[str] = field(default_factory=list)
    books_unchanged: list[str] = field(default_factory=list)
    chunks: int = 0
    summaries: int = 0
    tokens: int = 0
    llm_calls: int = 0
    summaries_from_cache: int = 0
    chunks_reused: int = 0
    """Chunks whose vector was taken from the book's stored rows instead of being embedded again."""
    seconds: dict[str, float] = field(default_factory=lambda: {"chunking": 0.0, "embedding": 0.0, "summarising": 0.0, "writing": 0.0})


def book_id(path: Path) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-")
    return slug or "book"


def decode_text(name: str, data: bytes) -> str:
    """A source file's text, or :class:`InputError` saying why it is not one: the one rule for files
    named on the command line and files uploaded to the server."""
    if b"\x00" in data:
        raise InputError(f"{name}: looks binary (contains NUL bytes); only plain-text files can be ingested")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not valid UTF-8 (byte {exc.start}); re-encode it, e.g. `iconv -f latin1 -t utf-8`") from exc
    if not text.strip():
        raise InputError(f"{name}: file is empty; remove it from the inputs")
    return text


def collect_sources(paths: Sequence[str | Path]) -> list[Source]:
    """Read and check every input before anything is written (one file is one book)."""
    if not paths:
        raise InputError("no input paths given: pass one or more .txt/.md files or folders")
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise InputError(f"{path}: no such file or folder; check the path")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_SUFFIXES)
            if not found:
                raise InputError(f"{path}: folder holds no .txt or .md files; point at a folder of text files")
            files.extend(found)
        elif path.suffix.lower() not in SUPPORTED_SUFFIXES:
            raise InputError(f"{path}: not a .txt or .md file; convert it to plain text first")
        else:
            files.append(path)
    sources: list[Source] = []
    seen: dict[str, Path] = {}
    for path in files:
        text = decode_text(str(path), path.read_bytes())
        book = book_id(path)
        if book in seen and seen[book] != path:
            raise InputError(f"{path} and {seen[book]} would both be book {book!r}; rename one of them")
        seen[book] = path
        sources.append(Source(path=path, book=book, text=text))
    return sources


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


ProgressHook = Callable[[str, int, int], None]
"""Called as ``(stage, done, total)`` while ingestion runs: stage ``books``, then per book
``embedding BOOK``, ``summarising BOOK`` and ``embedding summaries BOOK``. The terminal shows tqdm
bars; a server (the web page's live bar) passes a hook, since its process has no terminal."""


@dataclass(frozen=True)
class _Progress:
    bars: bool
    hook: ProgressHook | None = None

    def tell(self, stage: str, done: int, total: int) -> None:
        if self.hook is not None:
            self.hook(stage, done, total)


def _embed(embedder: Embedder, texts: list[str], desc: str, progress: _Progress) -> np.ndarray:
    out: list[np.ndarray] = []
    # No bar for nothing to do (every vector reused, no summaries asked for): an empty "0text" bar reads as a stall.
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress.bars or not texts, leave=False) as bar:
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            out.append(embedder.embed_documents(batch))
            bar.update(len(batch))
            progress.tell(desc, start + len(batch), len(texts))
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


def ingest(
    paths: Sequence[str | Path],
    collection: str,
    embedder: Embedder,
    *,
    options: IngestOptions = IngestOptions(),
    llm: BaseChatModel | None = None,
    client: Any | None = None,
    cache: SummaryCache | None = None,
    progress: bool = True,
    on_progress: ProgressHook | None = None,
) -> IngestReport:
    """Ingestion with models and a store the caller already holds (evaluations and benchmarks that
    reuse one embedder across many collections, tests with a scripted chat model); applications
    ingest through :func:`ingest_sources`, which loads what the options need."""
    sources = _checked_sources(paths, collection, options)
    if options.summarizer in LLM_SUMMARIZERS and llm is None:
        raise InputError(f"the {options.summarizer} summarizer needs a chat model; pass --summarizer extractive to ingest without one")
    client = client if client is not None else chroma_client()
    with writer_lock(store_path(client)):
        return _ingest(sources, collection, embedder, options, llm, client, cache, _Progress(progress, on_progress))


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
    cannot be opened. The chat model is loaded only for a summarizer or ``cards`` mode that calls
    it. Book cards (``stores.book_card``) are written last, once every book is committed.
    """
    from mia.stores.chat import load_chat_model  # looked up per call, so a test can stand in for the model

    if cards not in get_args(CardMode):
        raise InputError(f"unknown book card mode {cards!r}: use one of {', '.join(get_args(CardMode))}")
    sources = _checked_sources(paths, collection, options)
    settings = Settings()
    with writer_lock(settings_store_path(settings)):
        client = chroma_client(settings)
        llm = load_chat_model() if options.summarizer in LLM_SUMMARIZERS or cards == "llm" else None
        embedder = load_embedder(embedder_spec)
        report = _ingest(sources, collection, embedder, options, llm, client, None, _Progress(progress, on_progress))
        if cards != "none" and collection in list_mindscapes(client):
            progress_hook = _Progress(progress, on_progress)
            progress_hook.tell("book cards", 0, 1)
            write_cards(Mindscape(collection, client), llm if cards == "llm" else None, progress=progress,
                        embedder=embedder)
            progress_hook.tell("book cards", 1, 1)
        return report


def _checked_sources(paths: Sequence[str | Path], collection: str, options: IngestOptions) -> list[Source]:
    """The sources to ingest, after the checks that refuse bad input before any store or model opens."""
    validate_name(collection)
    options.validate()
    return collect_sources(paths)


def _ingest(sources: list[Source], collection: str, embedder: Embedder, options: IngestOptions,
            llm: BaseChatModel | None, client: Any, cache: SummaryCache | None, progress: _Progress) -> IngestReport:
    existing = Mindscape(collection, client) if collection in list_mindscapes(client) else None
    if existing is not None and existing.embedder and existing.embedder != embedder.name:
        raise MindscapeError(
            f"collection {collection!r} was built with embedder {existing.embedder!r}, not {embedder.name!r}: "
            f"use a new collection name or `mia rm {collection}` first"
        )
    if existing is not None:
        existing.move_texts_out()
    records = existing.book_records(pending=True) if existing else {}
    next_order = max((int(r["order"]) for r in records.values()), default=-1) + 1
    cache = cache or SummaryCache()
    # Extractive summaries are picked with the chunk vectors, so they depend on the embedder too.
    method = {
        "llm": lambda: summ.llm_method(_model_name(llm)),
        "llm-excerpt": lambda: f"{summ.llm_method(_model_name(llm))}:{summ.EXCERPT}:{embedder.name}",
        "extractive": lambda: f"{summ.EXTRACTIVE}:{embedder.name}",
        "none": lambda: "none",
    }[options.summarizer]()
    report = IngestReport(collection=collection)
    mindscape = existing
    for done, source in enumerate(tqdm(sources, desc="books", unit="book", disable=not progress.bars or len(sources) < 2)):
        progress.tell("books", done, len(sources))
        digest = _book_hash(source, options, book_span(source.text, options), embedder.name, method)
        record = records.get(source.book)
        if record and not record.get(PENDING) and record.get("hash") == digest:
            report.books_unchanged.append(source.book)
            continue
        order = int(record["order"]) if record else next_order
        next_order += 0 if record else 1
        stored = mindscape.stored_chunk_vectors(source.book) if mindscape is not None and record else {}
        prepared = _prepare_book(source, embedder, llm, options, method, cache, report, progress, stored)
        # Created only now, when there is something to write: a run that fails while chunking,
        # embedding or summarising (an unreachable endpoint) leaves no empty collection behind.
        if mindscape is None:
            mindscape = Mindscape(collection, client, create=True, embedder=embedder.name)
        _write_book(mindscape, source, prepared, order, digest, options, method, report)
    progress.tell("books", len(sources), len(sources))
    return report


def _model_name(llm: BaseChatModel | None) -> str:
    from mia.stores.chat import chat_model_name

    return chat_model_name(llm) if llm is not None else ""


def book_span(text: str, options: IngestOptions) -> tuple[int, int]:
    """The part of the file that is chunked: all of it, or what lies between Project Gutenberg's
    header and footer unless they are kept."""
    if options.keep_front_matter:
        return 0, len(text)
    found = find_body(text)
    return found.start, found.end


def chunk_book(text: str, options: IngestOptions, embedder: Embedder) -> tuple[tuple[int, int], list[Chunk]]:
    """The span of the book that is chunked (without Project Gutenberg's header and footer unless
    they are kept) and its chunks, each within the embedder's input limit."""
    body = book_span(text, options)
    chunks = chunk_text(
        text, options.chunk_size, options.overlap, chunker=options.chunker, span=body,
        max_model_tokens=embedder.max_tokens, count_model_tokens=embedder.count_tokens,
    )
    return body, chunks


def session_windows(chunks: list[Chunk], options: IngestOptions) -> list[list[Chunk]]:
    """The chunks of each session summary, in order: W chunks each, or, counted in tokens, as many
    consecutive chunks as fit in W × chunk_size tokens (never none), so that a summary covers the
    same length of text whether the chunks came out long or short."""
    if options.window_unit == "chunks":
        return [chunks[i : i + options.window] for i in range(0, len(chunks), options.window)]
    budget = options.window * options.chunk_size
    windows: list[list[Chunk]] = []
    total = 0
    for chunk in chunks:
        if not windows or total + chunk.tokens > budget:
            windows.append([])
            total = 0
        windows[-1].append(chunk)
        total += chunk.tokens
    return windows


@dataclass(frozen=True)
class _PreparedBook:
    """Everything computed for a book before the first write: chunks, summaries and their vectors."""

    chunks: list[Chunk]
    body: tuple[int, int]
    """The span chunked: the whole text, or the text between Project Gutenberg's header and footer."""
    chunk_vectors: np.ndarray
    windows: list[list[Chunk]]
    summary_texts: list[str]
    summary_vectors: np.ndarray


def _prepare_book(
    source: Source, embedder: Embedder, llm: BaseChatModel | None, options: IngestOptions, method: str,
    cache: SummaryCache, report: IngestReport, progress: _Progress, stored: dict[str, np.ndarray],
) -> _PreparedBook:
    clock = time.perf_counter()
    body, chunks = chunk_book(source.text, options, embedder)
    report.seconds["chunking"] += time.perf_counter() - clock

    clock = time.perf_counter()
    missing = list(dict.fromkeys(c.text for c in chunks if c.text not in stored))
    known = {**stored, **dict(zip(missing, _embed(embedder, missing, f"embedding {source.book}", progress)))}
    chunk_vectors = np.asarray([known[c.text] for c in chunks], dtype=np.float32)
    report.chunks_reused += sum(c.text in stored for c in chunks)
    report.seconds["embedding"] += time.perf_counter() - clock

    windows = session_windows(chunks, options) if options.summarizer != "none" else []
    summary_texts: list[str] = []
    clock = time.perf_counter()
    for j, window in enumerate(tqdm(windows, desc=f"summarising {source.book}", unit="window", disable=not progress.bars or not windows, leave=False)):
        window_text = source.text[window[0].start : window[-1].end]
        key = summ.cache_key(window_text, method)
        text = cache.get(key)
        if text is not None:
            report.summaries_from_cache += 1
        elif options.summarizer in LLM_SUMMARIZERS:
            excerpt = options.summarizer == "llm-excerpt"
            passage = summ.excerpt([c.text for c in window], embedder) if excerpt else window_text
            text, _ = summ.llm_summary(llm, passage, source.book, j + 1, len(windows), excerpt=excerpt)
            report.llm_calls += 1
            cache.put(key, text)
        else:
            text = summ.extractive_summary([c.text for c in window], chunk_vectors[window[0].index : window[-1].index + 1])
            cache.put(key, text)
        summary_texts.append(text or window_text[:500])
        progress.tell(f"summarising {source.book}", j + 1, len(windows))
    report.seconds["summarising"] += time.perf_counter() - clock

    clock = time.perf_counter()
    summary_vectors = _embed(embedder, summary_texts, f"embedding summaries {source.book}", progress)
    report.seconds["embedding"] += time.perf_counter() - clock
    return _PreparedBook(chunks, body, chunk_vectors, windows, summary_texts, summary_vectors)


def _write_book(
    mindscape: Mindscape, source: Source, prepared: _PreparedBook, order: int, digest: str,
    options: IngestOptions, method: str, report: IngestReport,
) -> None:
    """Replace the book's rows between marking it pending and committing it (its record goes last)."""
    clock = time.perf_counter()
    chunks, windows = prepared.chunks, prepared.windows
    summary_ids = [session_id(source.book, j) for j in range(len(windows))]
    owner = {c.index: summary_ids[j] for j, window in enumerate(windows) for c in window}
    # Instruction-like text is found once in the whole body, so a span that a chunk boundary cuts
    # in two is still known to both chunks (their metadata carries their share, chunk-relative).
    start, end = prepared.body
    body = source.text[start:end]
    spans = instruction_spans(body)  # one pass over the book: the trace ranges include these
    cut = [(s.start + start, s.end + start) for s in spans]
    trace = [(a + start, b + start) for a, b in suspect_ranges(body, spans)]
    chunk_meta = [{**_chunk_metadata(mindscape.name, source.book, order, c, owner.get(c.index, "")),
                   **_guard_metadata(cut, trace, c)} for c in chunks]
    mindscape.begin_book(source.book, order)
    mindscape.upsert("chunks", [f"{source.book}:c{c.index:06d}" for c in chunks], prepared.chunk_vectors, [c.text for c in chunks], chunk_meta)
    if windows:
        summary_meta = [
            {"collection": mindscape.name, "book": source.book, "book_order": order, "window": j,
             "first_chunk": w[0].index, "last_chunk": w[-1].index, "start": w[0].start, "end": w[-1].end, "method": method}
            for j, w in enumerate(windows)
        ]
        mindscape.upsert("summaries", summary_ids, prepared.summary_vectors, prepared.summary_texts, summary_meta)
    tokens = count_tokens(body)
    mindscape.commit_book(source.book, source.text, {
        "order": order, "hash": digest, "file": source.path.name, "chunks": len(chunks), "summaries": len(windows),
        "tokens": tokens, "chunk_size": options.chunk_size, "overlap": options.overlap, "window": options.window,
        "summarizer": method, "chunker": options.chunker, "body_start": start, "body_end": end,
        "window_unit": options.window_unit, "window_starts": ",".join(str(w[0].index) for w in windows),
        "left_out_tokens": count_tokens(source.text[:start]) + count_tokens(source.text[end:]),
        "instruction_spans": len(cut),
    })
    report.seconds["writing"] += time.perf_counter() - clock
    report.books_written.append(source.book)
    report.chunks += len(chunks)
    report.summaries += len(windows)
    report.tokens += tokens


def _guard_metadata(cut: list[tuple[int, int]], trace: list[tuple[int, int]], chunk: Chunk) -> dict[str, str]:
    """``guard_cut`` (cut from prompts) and ``guard_trace`` (outputs may not come from there), only
    for the few chunks that have any."""
    mine = {"guard_cut": encode(within(cut, chunk.start, chunk.end)), "guard_trace": encode(within(trace, chunk.start, chunk.end))}
    return {k: v for k, v in mine.items() if v}


def _chunk_metadata(collection: str, book: str, order: int, chunk: Chunk, summary_id: str) -> dict[str, Any]:
    return {
        "collection": collection, "book": book, "book_order": order, "index": chunk.index,
        "start": chunk.start, "end": chunk.end, "tokens": chunk.tokens, "summary_id": summary_id,
    }
