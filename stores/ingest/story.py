"""The written tree above the sessions: each book's **parts** and its **story**, written bottom-up
along the story by the chat model.

A part is a summary of ``SESSIONS_PER_PART`` consecutive session summaries; the story is the plot
of the whole book written from its parts (who is who, what happens, how it ends), the unit the
questions readers ask about a book as a whole need and no retrieved passage holds. Like RAPTOR's
tree, each level summarises the one below it, but the groups follow the story instead of
clustering by similarity: a part is a stretch of the book, so its place in the story is known.

Built for the books whose sessions the chat model wrote, after every book is committed (the first
answer never waits for it), book by book. Each summary is cached by its input and method, so a run
killed halfway resumes where it stopped; a book's part rows are written before its story unit,
which records how parts were cut and so marks the tree complete (``Mindscape.units_over``). Each
summary is ``grounded`` against the book text it spans: a sentence naming someone or somewhere that
text never names, or repeating an earlier one, is dropped, and the counts go to the report.
"""

from __future__ import annotations

import time
from typing import Any

from langchain_core.language_models import BaseChatModel
from tqdm import tqdm

from mia import prompts
from mia.stores import summaries as summ
from mia.stores.chat import chat_model_name
from mia.stores.embeddings import Embedder
from mia.stores.ingest.options import IngestReport, Progress, embed, write_book_units
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import SummaryCache
from mia.stores.tokens import truncate
from mia.stores.units import Level, Unit, part_id, session_id

SESSIONS_PER_PART = 5
"""Sessions a part summarises: 5 default windows are ~20k tokens of book, a few chapters."""
PART_WORDS, PART_TOKENS = 150, 300
STORY_WORDS, STORY_TOKENS = 250, 500
STORY_INPUT_TOKENS = 3000
"""The most of the parts' text the story's prompt holds; each part gives an equal share when they exceed it."""


def methods(model_name: str) -> tuple[str, str]:
    """What a part and a story depend on besides their input: model, prompt, decoding."""
    return tuple(f"llm:{model_name}:{prompts.version(t)}:{summ.DECODING}" for t in ("part", "story"))  # type: ignore[return-value]


def written_books(store: Mindscape, records: dict[str, dict[str, Any]]) -> list[str]:
    """The committed books (``records``, their commit rows) whose session summaries the chat model
    wrote, in the store's order."""
    return [b for b in store.commits.ordered()
            if str(records[b].get("summarizer", "")).startswith("llm:") and int(records[b].get("summaries", 0))]


def build(store: Mindscape, llm: BaseChatModel, embedder: Embedder, cache: SummaryCache, report: IngestReport,
          progress: Progress) -> int:
    """Give every book with written sessions a current story and its parts; a book whose story is
    current (for this version of the book and this method) is skipped, so a rerun writes nothing.
    Returns how many books were written."""
    part_method, story_method = methods(chat_model_name(llm))
    current, records = store.book_units(level=Level.STORY), store.commits.committed()
    books = [b for b in written_books(store, records) if b not in current or current[b].metadata.get("method") != story_method]
    clock = time.perf_counter()
    for done, book in enumerate(tqdm(books, desc="writing parts and story", unit="book",
                                     disable=not progress.bars or not books, leave=False)):
        progress.tell("writing parts and story", done, len(books))
        _build_book(store, book, records[book], llm, embedder, cache, report, (part_method, story_method), progress)
        report.stories += 1
    progress.tell("writing parts and story", len(books), len(books))
    report.seconds["story"] += time.perf_counter() - clock
    return len(books)


def _build_book(store: Mindscape, book: str, record: dict[str, Any], llm: BaseChatModel, embedder: Embedder,
                cache: SummaryCache, report: IngestReport, method: tuple[str, str], progress: Progress) -> None:
    sessions = store.summary_records([session_id(book, j) for j in range(int(record["summaries"]))])
    text = store.book_text(book)
    groups = [sessions[i : i + SESSIONS_PER_PART] for i in range(0, len(sessions), SESSIONS_PER_PART)]
    parts: list[str] = []
    for k, group in enumerate(groups):
        passage = "\n".join(f"[section {SESSIONS_PER_PART * k + n + 1}] {s['text']}" for n, s in enumerate(group))
        span_text = text[int(group[0]["start"]) : int(group[-1]["end"])]
        parts.append(_written(llm, cache, report, Level.PART, method[0], passage, [s["text"] for s in group], span_text, PART_TOKENS,
                              book=book, part=str(k + 1), parts=str(len(groups)), words=str(PART_WORDS)))
        report.parts += 1
        progress.tell(f"writing parts of {book}", k + 1, len(groups))
    share = STORY_INPUT_TOKENS // max(len(parts), 1)
    passage = "\n".join(f"[part {k + 1} of {len(parts)}] {truncate(p, share)}" for k, p in enumerate(parts))
    body = text[int(record.get("body_start", 0)) : int(record.get("body_end", 0)) or len(text)]
    story = _written(llm, cache, report, Level.STORY, method[1], passage, parts, body, STORY_TOKENS,
                     book=book, parts=str(len(parts)), words=str(STORY_WORDS))
    _write(store, book, record, groups, parts, embedder, method[0], progress)
    write_book_units(store, Level.STORY, {book: story}, embedder,
                     {book: {"method": method[1], "sessions_per_part": SESSIONS_PER_PART, "parts": len(parts)}})


def _written(llm: BaseChatModel, cache: SummaryCache, report: IngestReport, level: Level, method: str, passage: str,
             below: list[str], source: str, max_tokens: int, **values: str) -> str:
    """One summary of ``level`` from ``passage`` (the summaries ``below`` it, labelled), cached by
    passage and method, grounded against ``source`` (the book text it spans). When grounding leaves
    nothing, the summaries below, cut to the summary's budget: faithful by construction."""
    key = summ.cache_key(passage, method)
    cached = cache.get(key)
    if cached is not None:
        report.written_from_cache += 1
        return cached
    template = "part" if level == Level.PART else "story"
    written, _ = summ.write(llm, template, max_tokens, passage=prompts.fence(passage), **values)
    kept, check = summ.grounded(written, source)
    report.llm_calls += 1
    report.faithfulness[level].add(check)
    text = kept or truncate(" ".join(below), max_tokens)
    cache.put(key, text)
    return text


def _write(store: Mindscape, book: str, record: dict[str, Any], groups: list[list[dict[str, Any]]], parts: list[str],
           embedder: Embedder, method: str, progress: Progress) -> None:
    """The book's part rows, each spanning its sessions' text and chunks, for this version of the book."""
    units = [Unit(Level.PART, part_id(book, k), book, (int(g[0]["start"]), int(g[-1]["end"]))) for k, g in enumerate(groups)]
    vectors = embed(embedder, parts, f"embedding parts {book}", progress)
    store.upsert("summaries", [u.id for u in units], vectors, parts, [
        {**u.metadata(), "hash": str(record.get("hash")), "part": k, "first_session": g[0]["id"], "last_session": g[-1]["id"],
         "first_chunk": int(g[0]["first_chunk"]), "last_chunk": int(g[-1]["last_chunk"]), "method": method}
        for k, (u, g) in enumerate(zip(units, groups))])

