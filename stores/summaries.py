"""Session summaries: one per window of W consecutive chunks, cached by content.

The cache key is a hash of (window text, prompt version, model), stored in a small SQLite file
under MIA_HOME, so re-ingesting unchanged text never calls the model again, whichever collection
it goes into, while a new prompt or model gets fresh summaries.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path

import numpy as np
from langchain_core.language_models import BaseChatModel

import prompts
from stores.settings import mia_home

SUMMARY_WORDS = 120
EXTRACTIVE = "extractive-v1"
_SENTENCE = re.compile(r"(?<=[.!?。！？])[\"'”’)\]]*\s+")


class SummaryCache:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or mia_home() / "summaries.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
    return f"llm:{model_name}:{prompts.version('summary')}"


def llm_summary(llm: BaseChatModel, window_text: str, book: str, part: int, parts: int) -> tuple[str, dict[str, int]]:
    """Summarise one window with the chat model; returns the text and the call's token usage."""
    reply = llm.invoke(
        prompts.messages(
            "summary",
            book=book,
            part=str(part),
            parts=str(parts),
            passage=prompts.fence(window_text),
            words=str(SUMMARY_WORDS),
        )
    )
    usage = reply.usage_metadata or {}
    return reply.text.strip(), {"input_tokens": usage.get("input_tokens", 0), "output_tokens": usage.get("output_tokens", 0)}


def extractive_summary(chunk_texts: list[str], chunk_vectors: np.ndarray, sentences_per_chunk: int = 2, chunks: int = 3) -> str:
    """A no-LLM summary: the opening sentences of the chunks closest to the window's centroid.

    It reuses the chunk vectors already computed for the window, so it costs no extra embedding
    pass; the chunks nearest the centroid are the window's most typical content.
    """
    centroid = chunk_vectors.mean(axis=0)
    nearest = sorted(np.argsort(-(chunk_vectors @ centroid))[:chunks])
    picked = []
    for i in nearest:
        sentences = [s.strip() for s in _SENTENCE.split(chunk_texts[i].strip()) if s.strip()]
        picked.append(" ".join(sentences[:sentences_per_chunk]))
    return " … ".join(picked)
