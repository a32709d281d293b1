"""How a collection is built (``IngestOptions``), what a run did (``IngestReport``), and what every
level's builder shares: progress, batched embedding, and the rows a level writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, get_args

import numpy as np
from tqdm import tqdm

from mia.stores.chunking import CHUNKERS, Chunker
from mia.stores.embeddings import Embedder
from mia.stores.ingest.sources import InputError
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import Faithfulness
from mia.stores.units import WRITTEN_ABOVE_SESSIONS, Level, Unit, book_unit_id

EMBED_BATCH = 64
Summarizer = Literal["llm", "llm-excerpt", "extractive", "none"]
SUMMARIZERS: tuple[Summarizer, ...] = get_args(Summarizer)
LLM_SUMMARIZERS = ("llm", "llm-excerpt")
"""The summarizers that call the chat model."""
WindowUnit = Literal["chunks", "tokens"]


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
    faithfulness: dict[Level, Faithfulness] = field(
        default_factory=lambda: {level: Faithfulness() for level in (Level.SESSION, *WRITTEN_ABOVE_SESSIONS)})
    """Per level, what the chat model's summaries named and repeated, and what grounding dropped (this run's calls)."""
    parts: int = 0
    """Part summaries written or taken from the cache (the written tree above the sessions)."""
    stories: int = 0
    """Books whose story (the top of the written tree) this run wrote."""
    written_from_cache: int = 0
    """Parts and stories taken from the summary cache (``summaries_from_cache`` counts the sessions')."""
    seconds: dict[str, float] = field(default_factory=lambda: {"chunking": 0.0, "embedding": 0.0, "summarising": 0.0,
                                                               "writing": 0.0, "story": 0.0})


ProgressHook = Callable[[str, int, int], None]
"""Called as ``(stage, done, total)`` while ingestion runs: stage ``books``, then per book
``embedding BOOK``, ``summarising BOOK`` and ``embedding summaries BOOK``. The terminal shows tqdm
bars; a server (the web page's live bar) passes a hook, since its process has no terminal."""


@dataclass(frozen=True)
class Progress:
    bars: bool
    hook: ProgressHook | None = None

    def tell(self, stage: str, done: int, total: int) -> None:
        if self.hook is not None:
            self.hook(stage, done, total)


def embed(embedder: Embedder, texts: list[str], desc: str, progress: Progress) -> np.ndarray:
    out: list[np.ndarray] = []
    # No bar for nothing to do (every vector reused, no summaries asked for): an empty "0text" bar reads as a stall.
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress.bars or not texts, leave=False) as bar:
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            out.append(embedder.embed_documents(batch))
            bar.update(len(batch))
            progress.tell(desc, start + len(batch), len(texts))
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)




@dataclass(frozen=True)
class LevelRows:
    """The rows one level's builder writes for a book: ids, vectors, texts and metadata (each with
    the unit's ``level``, ``stores/units.py``), in book order."""

    ids: list[str]
    vectors: np.ndarray
    texts: list[str]
    metadatas: list[dict[str, Any]]


def write_book_units(store: Mindscape, level: Level, texts: dict[str, str], embedder: Embedder,
                     extra: dict[str, dict[str, Any]] | None = None) -> None:
    """Store ``texts`` (book → text) as the books' units of a whole-book ``level``, embedded in one
    call, each for the committed version of its book (its hash), with ``extra`` metadata per book."""
    if not texts:
        return
    records = store.commits.committed()
    units = [Unit(level, book_unit_id(book, level), book,
                  (int(records[book].get("body_start", 0)), int(records[book].get("body_end", 0)))) for book in texts]
    store.upsert("summaries", [u.id for u in units], embedder.embed_documents(list(texts.values())), list(texts.values()),
                 [{**u.metadata(), "hash": str(records[u.book].get("hash")), **(extra or {}).get(u.book, {})}
                  for u in units])
