"""BM25 (``bm25s``) over a mindscape, cached on disk: in-document windows and whole chunks.

InfMem's Retrieve step searches the very document being streamed, in windows of ``window``
tiktoken tokens overlapping by ``overlap`` tokens (the paper's 500/100). Windows are cut from
``stores.tokens.token_spans`` so each one is an exact character slice ``source[start:end]``: a
hit can be mapped back to the text and compared with the chunk being read.

The index lives under ``MIA_HOME/bm25/<collection>/<key>/`` where the key hashes the source text,
the window parameters and the tokenizer version: re-asking a question never re-indexes, and any
change to the source (a book added or re-ingested) or to the parameters builds a fresh index.

``ChunkIndex`` is the lexical half of ``retriever=hybrid``: BM25 over the stored chunks
themselves, so its hits are chunk ids that fuse with the dense ranking. It is keyed by the
collection's version (the books' content hashes), so adding, re-ingesting or removing a book gives
a new index. That update is incremental: each book's terms are kept on disk under its content
hash, so only the books that changed are read from Chroma and tokenized; the BM25 matrix itself is
recomputed over all chunks, because every book's IDF changes with the collection (that step costs a
small share of reading and tokenizing, measured by ``mia bench scale``).

Tokenisation (one rule for every language, so a mixed English/Chinese collection works):
words of letters and digits are lowercased and kept whole unless they are English stopwords;
runs of CJK characters become their single characters plus their adjacent bigrams — unigrams
for recall, bigrams for the precision that Chinese words (mostly two characters) need. The chunk
index may also reduce each word to its Snowball English stem (PyStemmer), so "carted" meets
"cart" and "wounded" meets "wound": the ``bm25_stemming`` setting, on by default since it was
chosen on the fairy-tale train and validation questions. InfMem's
in-document windows keep whole words, as measured in its reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import STOPWORDS_EN

from mia.stores.mindscape import Mindscape
from mia.stores.settings import mia_home
from mia.stores.tokens import token_spans

TOKENIZER_VERSION = "words+cjk12-v1"
STEMMED = "+snowball-en"
"""Appended to the tokenizer's name (and so to the chunk index's key) when words are stemmed."""


def _tokenizer_name(stem: bool) -> str:
    """The name a chunk index is keyed and labelled by, so indexes of the two rules never mix."""
    return TOKENIZER_VERSION + (STEMMED if stem else "")
# CJK ideographs (unified, extension A, compatibility), kana and hangul syllables.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RUN = re.compile(rf"^[{_CJK}]+$")
_STOPWORDS = frozenset(STOPWORDS_EN)
# A hit is a near-duplicate of a kept one when this share of its distinct terms occur in it.
DUPLICATE_CONTAINMENT = 0.8


@dataclass(frozen=True)
class Window:
    """One retrieval unit: ``text == source[start:end]``."""

    id: int
    start: int
    end: int
    text: str
    score: float


_LOCAL = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    """One stemmer per thread: PyStemmer's objects are not thread-safe, and the server answers in threads."""
    stemmer = getattr(_LOCAL, "stemmer", None)
    if stemmer is None:
        stemmer = _LOCAL.stemmer = Stemmer.Stemmer("english")
    return stemmer


def tokenize(text: str, *, stem: bool = False) -> list[str]:
    """BM25 terms of ``text`` (see the module docstring for the rule), words stemmed with ``stem``."""
    terms: list[str] = []
    stem_word = _stemmer().stemWord if stem else None
    for run in _TOKEN.findall(text.lower()):
        if _CJK_RUN.match(run):
            terms.extend(run)
            terms.extend(run[i : i + 2] for i in range(len(run) - 1))
        elif run not in _STOPWORDS:
            terms.append(stem_word(run) if stem_word else run)
    return terms


def source_text(store: Mindscape) -> str:
    """The collection's source: its books in order, each under a ``# book`` header, blank-line separated.

    InfMem and MemAgent stream and search this one text, so both see the books in the same order
    and character offsets mean the same thing to the streamer and to the index.
    """
    return "\n\n".join(f"# {book}\n\n{store.book_body(book).strip()}" for book in store.commits.ordered())


def window_spans(text: str, window: int, overlap: int) -> list[tuple[int, int]]:
    """Character ranges of consecutive ``window``-token windows, each starting ``window - overlap`` tokens on."""
    if window <= 0 or not 0 <= overlap < window:
        raise ValueError(f"BM25 windows need window > 0 and 0 <= overlap < window, got {window} and {overlap}")
    spans = token_spans(text)
    out: list[tuple[int, int]] = []
    for first in range(0, len(spans), window - overlap):
        last = min(first + window, len(spans))
        out.append((spans[first][0], spans[last - 1][1]))
        if last == len(spans):
            break
    return out


class BM25Index:
    """BM25 over the windows of one source text; built once per (source, window, overlap)."""

    def __init__(self, source: str, spans: list[tuple[int, int]], retriever: bm25s.BM25, *, built: bool, path: Path) -> None:
        self.source = source
        self.spans = spans
        self.retriever = retriever
        self.built = built  # True when this call built the index, False when it was loaded
        self.path = path

    @classmethod
    def for_collection(cls, store: Mindscape, window: int = 500, overlap: int = 100) -> BM25Index:
        """The index of a mindscape's source, cached beside it under ``MIA_HOME/bm25/<collection>/``."""
        return cls.for_text(source_text(store), window, overlap, mia_home() / "bm25" / store.name)

    @classmethod
    def for_text(cls, source: str, window: int, overlap: int, root: Path) -> BM25Index:
        """Load the index of ``source`` from ``root/<key>`` or build and save it there."""
        key = hashlib.sha256(f"{TOKENIZER_VERSION}|{window}|{overlap}\n{source}".encode()).hexdigest()[:20]
        path = root / key
        built = not (path / "windows.json").exists()
        if built:
            _build(source, window, overlap, path)
        retriever, spans = _load(str(path))
        return cls(source, spans, retriever, built=built, path=path)

    def __len__(self) -> int:
        return len(self.spans)

    def window(self, window_id: int, score: float = 0.0) -> Window:
        start, end = self.spans[window_id]
        return Window(window_id, start, end, self.source[start:end], score)

    def search(self, query: str, k: int, exclude: tuple[int, int] | None = None) -> list[Window]:
        """The ``k`` best windows for ``query`` that score above zero, in rank order.

        Skipped: windows overlapping the character range ``exclude`` (the chunk being read, which
        the caller already has), and near-duplicates of a window already returned — one whose
        character overlap with it exceeds half its own length (overlapping windows), or at least
        80% of whose distinct terms occur in it (a passage repeated in the source, such as the
        same licence text at the end of every book of a series, or a short tail of one).
        """
        terms = tokenize(query)
        if not terms or k <= 0:
            return []
        scores = self.retriever.get_scores(terms)
        kept: list[tuple[Window, frozenset[str]]] = []
        for window_id in np.argsort(-scores, kind="stable"):
            score = float(scores[window_id])
            if score <= 0 or len(kept) == k:
                break
            hit = self.window(int(window_id), score)
            if exclude is not None and hit.start < exclude[1] and exclude[0] < hit.end:
                continue
            hit_terms = frozenset(tokenize(hit.text))
            if not any(_near_duplicate(hit, hit_terms, other, other_terms) for other, other_terms in kept):
                kept.append((hit, hit_terms))
        return [hit for hit, _ in kept]


def _near_duplicate(hit: Window, hit_terms: frozenset[str], other: Window, other_terms: frozenset[str]) -> bool:
    shared = min(hit.end, other.end) - max(hit.start, other.start)
    if shared * 2 > hit.end - hit.start:
        return True
    return bool(hit_terms) and len(hit_terms & other_terms) >= DUPLICATE_CONTAINMENT * len(hit_terms)


def _build(source: str, window: int, overlap: int, path: Path) -> None:
    """Index into a private folder and rename it into place, so a killed or concurrent build
    never leaves a half-written index where a later run would load it."""
    spans = window_spans(source, window, overlap)
    retriever = bm25s.BM25()
    retriever.index([tokenize(source[start:end]) for start, end in spans], show_progress=False)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    retriever.save(str(tmp), show_progress=False)
    (tmp / "windows.json").write_text(json.dumps({
        "tokenizer": TOKENIZER_VERSION, "window": window, "overlap": overlap,
        "source_chars": len(source), "spans": spans,
    }))
    try:
        tmp.rename(path)
    except OSError:  # another process finished the same index first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


@lru_cache(maxsize=8)
def _load(path: str) -> tuple[bm25s.BM25, list[tuple[int, int]]]:
    """Indexes are immutable once renamed into place, so one load per process suffices."""
    retriever = bm25s.BM25.load(path, show_progress=False)
    meta = json.loads((Path(path) / "windows.json").read_text())
    return retriever, [(int(s), int(e)) for s, e in meta["spans"]]


class ChunkIndex:
    """BM25 over every chunk of a collection; hits are chunk ids."""

    def __init__(self, ids: list[str], retriever: bm25s.BM25, stem: bool) -> None:
        self.ids = ids
        self.retriever = retriever
        self.stem = stem

    @classmethod
    def for_collection(cls, store: Mindscape, *, stem: bool = False) -> ChunkIndex:
        """Load the index of the collection's current chunks, or build it beside the window indexes;
        one index per tokenizer (words whole or stemmed)."""
        version = store.commits.version()
        key = hashlib.sha256(f"{_tokenizer_name(stem)}|chunks\n{version!r}".encode()).hexdigest()[:20]
        path = mia_home() / "bm25" / store.name / f"chunks-{key}"
        if not (path / "chunks.json").exists():
            return cls(*_build_chunks(store, path, version, stem), stem)
        return cls(*_load_chunks(str(path)), stem)

    def search(self, query: str, k: int) -> list[str]:
        """Ids of the ``k`` best chunks for ``query`` that score above zero, best first."""
        terms = tokenize(query, stem=self.stem)
        if not terms or k <= 0 or not self.ids:
            return []
        scores = self.retriever.get_scores(terms)
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.ids[i] for i in order if scores[i] > 0]


def _build_chunks(store: Mindscape, path: Path, version: tuple[Any, ...], stem: bool) -> tuple[list[str], bm25s.BM25]:
    """Index the committed chunks from each book's cached terms; saved under ``path`` (named by
    ``version``) only if no writer changed the books while they were read, since the rows read
    could then mix two versions. Chunks are ordered by id, as a build from scratch orders them, so
    the index (and every score) is the same however many of its books came from the cache."""
    pairs = sorted(
        (pair for book, record in store.commits.committed().items() for pair in _book_terms(store, book, record, stem)),
        key=lambda pair: pair[0],
    )
    retriever = bm25s.BM25()
    if pairs:
        retriever.index([terms for _, terms in pairs], show_progress=False)
    ids = [i for i, _ in pairs]
    if Mindscape(store.name, store.client).commits.version() != version:
        return ids, retriever
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if pairs:
        retriever.save(str(tmp), show_progress=False)
    (tmp / "chunks.json").write_text(json.dumps({"tokenizer": _tokenizer_name(stem), "ids": ids}))
    try:
        tmp.rename(path)
    except OSError:  # another process finished the same index first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(store, path, stem)
    return ids, retriever


def _prune(store: Mindscape, current: Path, stem: bool) -> None:
    """Delete this tokenizer's indexes of earlier versions and the terms of books no longer
    committed, so a library grown one book at a time keeps one index on disk, not one per add.
    A process still using an older index holds it in memory (``_load_chunks``), not on disk."""
    name = _tokenizer_name(stem)
    for old in current.parent.glob("chunks-*"):
        meta = old / "chunks.json"
        if old != current and meta.exists() and json.loads(meta.read_text()).get("tokenizer") == name:
            shutil.rmtree(old, ignore_errors=True)
    keep = {f"{book}-{str(r.get('hash', ''))[:24]}.json" for book, r in store.commits.committed().items()}
    for old in (current.parent / "terms" / name).glob("*.json"):
        if old.name not in keep:
            old.unlink(missing_ok=True)


def _book_terms(store: Mindscape, book: str, record: dict[str, Any], stem: bool) -> list[tuple[str, list[str]]]:
    """(chunk id, BM25 terms) of one committed book, read from Chroma and tokenized once per
    content hash. A committed book's rows change only under a new hash (ingestion rewrites a book
    while it is pending and commits the new hash last), so the hash names its rows exactly."""
    digest = str(record.get("hash", ""))
    cached = mia_home() / "bm25" / store.name / "terms" / _tokenizer_name(stem) / f"{book}-{digest[:24]}.json"
    if digest and cached.exists():
        return [(i, terms) for i, terms in json.loads(cached.read_text())]
    got = store.chunks.get(where={"book": book}, include=["documents"])
    pairs = [(i, tokenize(text, stem=stem)) for i, text in zip(got["ids"], got["documents"])]
    if digest and len(pairs) == int(record.get("chunks", -1)):  # a full read of the committed rows
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(pairs))
        tmp.replace(cached)
    return pairs


@lru_cache(maxsize=8)
def _load_chunks(path: str) -> tuple[list[str], bm25s.BM25]:
    ids = json.loads((Path(path) / "chunks.json").read_text())["ids"]
    return ids, (bm25s.BM25.load(path, show_progress=False) if ids else bm25s.BM25())
