"""The session level's builder: each window of consecutive chunks → one summary, cached by content,
embedded."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from langchain_core.language_models import BaseChatModel
from tqdm import tqdm

from mia.stores import summaries as summ
from mia.stores.chunking import Chunk
from mia.stores.embeddings import Embedder
from mia.stores.ingest.chunks import BookChunks
from mia.stores.ingest.options import LLM_SUMMARIZERS, IngestOptions, IngestReport, LevelRows, Progress, embed
from mia.stores.ingest.sources import Source
from mia.stores.summaries import SummaryCache
from mia.stores.units import Level, Unit, session_id


@dataclass(frozen=True)
class BookSessions:
    """A book's sessions: each one's chunks, summary and vector, in book order."""

    windows: list[list[Chunk]]
    texts: list[str]
    vectors: np.ndarray

    def owners(self, book: str) -> dict[int, str]:
        """Chunk index → the id of the session that holds it."""
        return {c.index: session_id(book, j) for j, window in enumerate(self.windows) for c in window}


def method(options: IngestOptions, embedder: Embedder, model_name: str) -> str:
    """What a summary depends on besides its text: the summarizer, its model, and for extractive
    summaries (picked with the chunk vectors) the embedder."""
    return {
        "llm": lambda: summ.llm_method(model_name),
        "llm-excerpt": lambda: f"{summ.llm_method(model_name)}:{summ.EXCERPT}:{embedder.name}",
        "extractive": lambda: f"{summ.EXTRACTIVE}:{embedder.name}",
        "none": lambda: "none",
    }[options.summarizer]()


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




def build(source: Source, chunks: BookChunks, options: IngestOptions, embedder: Embedder, llm: BaseChatModel | None,
          summary_method: str, cache: SummaryCache, report: IngestReport, progress: Progress) -> BookSessions:
    """Summarise every window (from the cache when its text and method were summarised before) and
    embed the summaries; no sessions under the ``none`` summarizer."""
    windows = session_windows(chunks.chunks, options) if options.summarizer != "none" else []
    texts: list[str] = []
    clock = time.perf_counter()
    for j, window in enumerate(tqdm(windows, desc=f"summarising {source.book}", unit="window",
                                    disable=not progress.bars or not windows, leave=False)):
        window_text = source.text[window[0].start : window[-1].end]
        key = summ.cache_key(window_text, summary_method)
        text = cache.get(key)
        if text is not None:
            report.summaries_from_cache += 1
        else:
            if options.summarizer in LLM_SUMMARIZERS:
                excerpt = options.summarizer == "llm-excerpt"
                passage = summ.excerpt([c.text for c in window], embedder) if excerpt else window_text
                written, _ = summ.llm_summary(llm, passage, source.book, j + 1, len(windows), excerpt=excerpt)
                text, check = summ.grounded(written, window_text)
                report.llm_calls += 1
                report.faithfulness[Level.SESSION].add(check)
            # Extractive, or nothing faithful left of the model's: the window's sentences, copied.
            text = text or summ.extractive_summary([c.text for c in window], chunks.vectors[window[0].index : window[-1].index + 1])
            cache.put(key, text)
        texts.append(text or window_text[:500])
        progress.tell(f"summarising {source.book}", j + 1, len(windows))
    report.seconds["summarising"] += time.perf_counter() - clock
    clock = time.perf_counter()
    vectors = embed(embedder, texts, f"embedding summaries {source.book}", progress)
    report.seconds["embedding"] += time.perf_counter() - clock
    return BookSessions(windows, texts, vectors)


def rows(collection: str, source: Source, order: int, built: BookSessions, summary_method: str) -> LevelRows:
    ids = [session_id(source.book, j) for j in range(len(built.windows))]
    metadatas = [{**Unit(Level.SESSION, i, source.book, (w[0].start, w[-1].end)).metadata(), "collection": collection,
                  "book_order": order, "window": j, "first_chunk": w[0].index, "last_chunk": w[-1].index,
                  "method": summary_method} for j, (i, w) in enumerate(zip(ids, built.windows))]
    return LevelRows(ids, built.vectors, built.texts, metadatas)
