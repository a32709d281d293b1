"""Session summaries: one per window of W consecutive chunks, cached by content.

The cache key is a hash of (window text, prompt version, model), stored in a small SQLite file
under MIA_HOME, so re-ingesting unchanged text never calls the model again, whichever collection
it goes into, while a new prompt or model gets fresh summaries.

A summary the chat model writes is faithful by construction (``grounded``): its decoding is bounded
and penalises repeats, a sentence that repeats an earlier one is dropped, and so is a sentence that
names a person or place its window never names (a 1.5B reader gave Holmes a companion "Murray"
and looped on one sentence eight times). ``Faithfulness`` counts what the model wrote and what
was kept, for the reports.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from langchain_core.language_models import BaseChatModel

from mia import prompts
from mia.stores.embeddings import Embedder
from mia.stores.settings import mia_home, writable_dir
from mia.stores.tokens import count_tokens, truncate

SUMMARY_WORDS = 120
SUMMARY_TOKENS = 240
"""The reply's budget, about twice ``SUMMARY_WORDS`` in tokens: a summary that loops is cut there."""
FREQUENCY_PENALTY = 0.4
"""Each use of a token lowers its next one's odds: the loops a small model falls into fade."""
DECODING = "grounded-v1"
"""Bump when the decoding or the grounding of LLM summaries changes: part of their cache key."""
EXTRACTIVE = "extractive-v3"  # bump when the extractive method changes: it is part of the cache key
EXCERPT = "excerpt-v1"  # the same for the excerpt an llm-excerpt summary is written from
EXCERPT_TOKENS = 800
"""The excerpt's budget: about a fifth of a default window (20 chunks of 200 tokens), so the
summary's prompt costs about a quarter of what the whole window's does."""
EXCERPT_SCOPE = "(The passage is excerpts of this part, in order; … marks text left out between them.)\n"
# A sentence ends at . ! ? followed by whitespace (or the end), or at CJK 。！？ (CJK text has no
# spaces); closing quotes and brackets after the mark belong to the sentence they close.
_SENTENCE_END = re.compile(r"(?:[.!?][\"'”’)\]]*(?=\s|$)|[。！？][\"'”’」』）)\]]*)")
ABBREVIATED_TITLES = frozenset({"Mr", "Mrs", "Ms", "Dr", "St", "Mme", "Mlle", "Messrs"})
"""Titles written with a full stop that ends no sentence: "Mr. Holmes" is one sentence's words."""
# A full stop after one of them, or after a capital initial ("John H. Watson"; not "I"), goes on.
_ABBREVIATION_BEFORE = re.compile(r"(?:\b(?:" + "|".join(sorted(ABBREVIATED_TITLES)) + r")|\b[A-HJ-Z])$")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``text``, without surrounding whitespace: quoting
    ``text[start:end]`` quotes the source exactly (extractive summaries, grounded citations). The
    full stop of "Mr." or of an initial ends no sentence, so a name is never cut in two."""
    spans, start = [], 0
    ends = [m.end() for m in _SENTENCE_END.finditer(text)
            if not (m.group() == "." and _ABBREVIATION_BEFORE.search(text, max(0, m.start() - 8), m.start()))]
    for end in ends + [len(text)]:
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        if piece.strip():
            spans.append((start + lead, start + len(piece.rstrip())))
        start = end
    return spans


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, verbatim (so an extractive summary quotes its window exactly)."""
    return [text[a:b] for a, b in sentence_spans(text)]


class SummaryCache:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or mia_home() / "summaries.sqlite"
        writable_dir(self.path.parent, "MIA_HOME")
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS summaries (key TEXT PRIMARY KEY, text TEXT NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, key: str) -> str | None:
        with self._connect() as db:
            row = db.execute("SELECT text FROM summaries WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, text: str) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO summaries (key, text) VALUES (?, ?)", (key, text))


def cache_key(window_text: str, method: str) -> str:
    return hashlib.sha256(f"{method}\n{window_text}".encode()).hexdigest()


def llm_method(model_name: str) -> str:
    return f"llm:{model_name}:{prompts.version('summary')}:{DECODING}"


def llm_summary(llm: BaseChatModel, passage: str, book: str, part: int, parts: int,
                excerpt: bool = False) -> tuple[str, dict[str, int]]:
    """Summarise one window (or its :func:`excerpt`) with the chat model, under a bounded decoding
    that penalises repeats; returns the model's text (not yet ``grounded``) and the call's token usage."""
    return write(llm, "summary", SUMMARY_TOKENS, book=book, part=str(part), parts=str(parts), passage=prompts.fence(passage),
                 scope=EXCERPT_SCOPE if excerpt else "", words=str(SUMMARY_WORDS))


def write(llm: BaseChatModel, template: str, max_tokens: int, **values: str) -> tuple[str, dict[str, int]]:
    """One summary of the written memory (a session, a part, a book's story) from ``prompts/TEMPLATE.md``,
    under the decoding every level shares: a token budget that cuts a loop, and a frequency penalty
    that fades it. Returns the model's text (not yet ``grounded``) and the call's token usage."""
    reply = llm.invoke(prompts.messages(template, **values), max_tokens=max_tokens, frequency_penalty=FREQUENCY_PENALTY)
    usage = reply.usage_metadata or {}
    return reply.text.strip(), {"input_tokens": usage.get("input_tokens", 0), "output_tokens": usage.get("output_tokens", 0)}


def excerpt(chunk_texts: list[str], embedder: Embedder, budget: int = EXCERPT_TOKENS) -> str:
    """The sentences of a window closest to its centroid, about ``budget`` tokens, in text order.

    The chat model's prompt cost is the source it reads, so it reads this instead of the whole
    window. No chunk gives more than twice its share of the budget, so the excerpt spans the
    window's events instead of dwelling on its most typical scene; the dropped text between picked
    sentences is marked with an ellipsis.
    """
    found = [(i, sentence) for i, text in enumerate(chunk_texts) for sentence in sentences(text)]
    if not found:
        return ""
    vectors = embedder.embed_documents([sentence for _, sentence in found])
    scores = vectors @ vectors.mean(axis=0)
    cap = 2 * budget / len(chunk_texts)
    used = [0] * len(chunk_texts)
    total, picked = 0, []
    for k in np.argsort(-scores, kind="stable"):
        chunk, length = found[k][0], count_tokens(found[k][1])
        if total + length <= budget and used[chunk] + length <= cap:
            picked.append(int(k))
            total += length
            used[chunk] += length
    if not picked:  # every sentence is longer than a chunk's share: the window's opening instead
        return truncate(" ".join(chunk_texts), budget)
    order = sorted(picked)
    return " ".join(
        found[k][1] if k == (order[n - 1] + 1 if n else 0) else f"… {found[k][1]}" for n, k in enumerate(order)
    )


def extractive_summary(chunk_texts: list[str], chunk_vectors: np.ndarray, sentences_per_chunk: int = 2, chunks: int = 3) -> str:
    """A no-LLM summary: the opening sentences of the chunks closest to the window's centroid.

    It reuses the chunk vectors already computed for the window, so it costs no extra embedding
    pass; the chunks nearest the centroid are the window's most typical content.
    """
    centroid = chunk_vectors.mean(axis=0)
    nearest = sorted(np.argsort(-(chunk_vectors @ centroid))[:chunks])
    picked = []
    for i in nearest:
        picked.append(" ".join(sentences(chunk_texts[i])[:sentences_per_chunk]))
    return " … ".join(picked)


@dataclass
class Faithfulness:
    """What the model wrote against what it read: the names it used and how many its source names,
    the sentences that repeated an earlier one, and the sentences dropped (for either fault)."""

    names: int = 0
    grounded: int = 0
    sentences: int = 0
    repeated: int = 0
    dropped: int = 0

    def add(self, other: Faithfulness) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def share(self) -> float:
        """The share of names that occur in the text summarised (1 when there are none)."""
        return self.grounded / self.names if self.names else 1.0


_CAPITALISED = re.compile(r"(?<![\w'’])[A-Z][a-z][\w'’-]*")


def _names(sentence: str, source: str) -> list[str]:
    """The capitalised words of a sentence that name someone or somewhere: every one but its first
    word, and the first too when the source never uses it in lower case ("Later" is a word, "Murray"
    a name), unless it reads as an opener (followed by a comma, or an adverb in -ly: "Overall,",
    "Eventually")."""
    found = []
    for match in _CAPITALISED.finditer(sentence):
        word = match.group().rstrip("'’").removesuffix("'s").removesuffix("’s")
        if not sentence[:match.start()].strip(" \"“‘(-*•"):  # it opens the sentence
            opener = sentence[match.end():match.end() + 1] == "," or word.endswith("ly")  # "Meanwhile,", "Eventually"
            if opener or re.search(rf"(?<!\w){re.escape(word.lower())}(?!\w)", source):
                continue
        found.append(word)
    return found


def grounded(summary: str, source: str) -> tuple[str, Faithfulness]:
    """The summary without its sentences that repeat an earlier one or name a person or place
    (a capitalised word) that ``source``, the text it summarises, never writes; and the counts."""
    check = Faithfulness()
    kept: list[str] = []
    seen: set[str] = set()
    for sentence in sentences(summary):
        check.sentences += 1
        key = " ".join(re.findall(r"\w+", sentence.casefold()))
        names = _names(sentence, source)
        missing = [w for w in names if not re.search(rf"(?<!\w){re.escape(w)}(?!\w)", source)]
        check.names += len(names)
        check.grounded += len(names) - len(missing)
        if key in seen:
            check.repeated += 1
        if key in seen or missing:
            check.dropped += 1
            continue
        seen.add(key)
        kept.append(sentence)
    return " ".join(kept), check
