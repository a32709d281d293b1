"""Peers: the retrieval a user would write in a few lines with a popular library, run on the same
questions and texts, and scored by the same rules, as MiA's graphs (issue 44).

Each peer is a recipe, not a tuned system: it is built from its library's documented calls, not from
MiA's retrieval code (MiA's chunks, BM25 tokenizer, fusion or vector store), and its whole recipe is
written in the report (``recipe``). Peers have no answer step, so the runner takes them in
retrieval-only runs only.

A peer indexes the texts the runner ingests: each data set book's file, decoded as ingestion decodes
it (``collect_sources``), whole, front matter included, as a user loading the file would have it. Every
chunk keeps its character offsets in its book, so gold-span recall scores a peer exactly as it scores
a graph, and its tiktoken count, so recall at N tokens does too. An index is built once per set of
books (a data set, or a question's own book) and cached under ``MIA_HOME/peers`` by a hash of the
recipe's parameters, the embedder and the texts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bm25s
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_text_splitters import RecursiveCharacterTextSplitter

from mia.stores.embeddings import Embedder
from mia.stores.ingest import IngestOptions, collect_sources
from mia.stores.settings import mia_home
from mia.stores.tokens import count_tokens, token_spans

PEERS = ("bm25", "langchain")
READS: dict[str, frozenset[str]] = {"bm25": frozenset({"top_k", "chunk_size"}), "langchain": frozenset({"top_k"})}
"""The settings each peer takes: its depth, and bm25 its chunk budget (the ingestion option's name,
so ``--set chunk_size=120`` gives MiA's chunks and bm25's the same budget)."""
SPLITTER = {"chunk_size": 1000, "chunk_overlap": 200, "add_start_index": True}
"""LangChain's RAG tutorial's splitter, as documented (characters, not tokens)."""
STOPWORDS = "en"
"""bm25s's own English stopword list (its default)."""
_BLANK_LINES = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class PeerChunk:
    """One retrieved unit: ``text[start:end]`` of ``book``, with its tiktoken count."""

    id: str
    book: str
    start: int
    end: int
    tokens: int


class PeerIndex(ABC):
    """What the runner asks of a peer: a ranking of its chunks for a question."""

    def __init__(self, version: str, size: int) -> None:
        self.version = version
        """Digest of the recipe's parameters and the texts: results made on other texts are not reused."""
        self.size = size
        """Chunks indexed: a ranking that returned them all has a defined recall at any depth."""

    @abstractmethod
    def search(self, question: str, k: int) -> list[PeerChunk]:
        """The best ``k`` chunks, best first."""


def settings(peer: str, raw: dict[str, Any], depth: int) -> dict[str, int]:
    """A peer's resolved settings (``READS``) from loose ``--set`` values: ``top_k`` (default
    ``depth``) and, for bm25, ``chunk_size`` (default: ingestion's). A setting the peer does not
    take is refused, as ``context_from`` refuses one a graph does not read."""
    unknown = sorted(set(raw) - READS[peer])
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} for peer {peer}; it reads {', '.join(sorted(READS[peer]))}")
    defaults = {"top_k": depth, "chunk_size": IngestOptions().chunk_size}
    resolved = {}
    for name in sorted(READS[peer]):
        try:
            resolved[name] = int(raw.get(name, defaults[name]))
        except ValueError as exc:
            raise ValueError(f"setting {name}={raw[name]!r} is not a valid int") from exc
        if resolved[name] < 1:
            raise ValueError(f"invalid setting: {name} must be at least 1")
    return resolved


def recipe(peer: str, peer_settings: dict[str, int], embedder: Embedder) -> str:
    """The peer's whole recipe in a sentence or two, for the report."""
    if peer == "bm25":
        return (f"BM25 from `bm25s` {bm25s.__version__} with its defaults (`bm25s.BM25()`: Lucene's BM25, k1 1.5, b 0.75) "
                f"over each book's paragraphs (split on blank lines), merged in order while a chunk holds at most "
                f"{peer_settings['chunk_size']} tiktoken cl100k tokens (a longer paragraph is cut into windows of that "
                f"many tokens); chunks and questions tokenized by `bm25s.tokenize(texts, stopwords=\"{STOPWORDS}\")` "
                "(lower-cased words of two or more letters or digits, bm25s's English stopwords, no stemming), ranked by "
                f"`BM25.retrieve(k={peer_settings['top_k']})`.")
    limit = f"; it reads at most {embedder.max_tokens} word pieces of a chunk" if embedder.max_tokens else ""
    return ("LangChain's RAG tutorial recipe: one `Document` per book, "
            f"`RecursiveCharacterTextSplitter({', '.join(f'{k}={v}' for k, v in SPLITTER.items())}).split_documents` "
            "(chunks of at most 1,000 characters overlapping by up to 200), embedded into an `InMemoryVectorStore` "
            f"by the collection's embedder ({embedder.name}{limit}), ranked by "
            f"`similarity_search(question, k={peer_settings['top_k']})` (cosine over every chunk).")


# --------------------------------------------------------------------------- bm25


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(start, end) of each paragraph: the text between blank lines, its surrounding white space left out."""
    spans, start = [], 0
    for end, after in [*((m.start(), m.end()) for m in _BLANK_LINES.finditer(text)), (len(text), len(text))]:
        piece = text[start:end]
        if piece.strip():
            spans.append((start + len(piece) - len(piece.lstrip()), start + len(piece.rstrip())))
        start = after
    return spans


def bm25_chunks(text: str, chunk_size: int) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of the bm25 peer's chunks of ``text``: paragraphs merged in order while
    the merged slice (the blank lines between them included) holds at most ``chunk_size`` tokens.
    A paragraph longer than that is first cut into windows of ``chunk_size`` tokens, so no chunk is
    far over the budget MiA's chunks keep."""
    pieces: list[tuple[int, int]] = []
    for start, end in paragraphs(text):
        if count_tokens(text[start:end]) <= chunk_size:
            pieces.append((start, end))
            continue
        spans = token_spans(text[start:end])
        pieces += [(start + spans[i][0], start + spans[min(i + chunk_size, len(spans)) - 1][1])
                   for i in range(0, len(spans), chunk_size)]
    chunks: list[tuple[int, int, int]] = []
    for start, end in pieces:
        if chunks and (merged := count_tokens(text[chunks[-1][0]:end])) <= chunk_size:
            chunks[-1] = (chunks[-1][0], end, merged)
        else:
            chunks.append((start, end, count_tokens(text[start:end])))
    return chunks


class Bm25Peer(PeerIndex):
    """``bm25``: bm25s over merged paragraphs (``recipe``)."""

    def __init__(self, folder: Path, version: str) -> None:
        self.chunks = [PeerChunk(**c) for c in json.loads((folder / "chunks.json").read_text(encoding="utf-8"))]
        self.retriever = bm25s.BM25.load(str(folder), show_progress=False)
        super().__init__(version, len(self.chunks))

    @staticmethod
    def build(folder: Path, texts: Sequence[tuple[str, str]], chunk_size: int) -> None:
        chunks = [PeerChunk(f"{book}:{start}", book, start, end, tokens)
                  for book, text in texts for start, end, tokens in bm25_chunks(text, chunk_size)]
        by_book = dict(texts)
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize([by_book[c.book][c.start:c.end] for c in chunks], stopwords=STOPWORDS,
                                       show_progress=False), show_progress=False)
        retriever.save(str(folder), show_progress=False)
        (folder / "chunks.json").write_text(json.dumps([asdict(c) for c in chunks]), encoding="utf-8")

    def search(self, question: str, k: int) -> list[PeerChunk]:
        query = bm25s.tokenize([question], stopwords=STOPWORDS, show_progress=False)
        found, _ = self.retriever.retrieve(query, k=min(k, self.size), show_progress=False)
        return [self.chunks[int(i)] for i in found[0]]


# --------------------------------------------------------------------------- langchain


def langchain_splits(texts: Sequence[tuple[str, str]]) -> list[Document]:
    """The recipe's splits of each (book, text): ``start_index`` is the split's offset in its book."""
    splitter = RecursiveCharacterTextSplitter(**SPLITTER)
    return splitter.split_documents([Document(page_content=text, metadata={"book": book}) for book, text in texts])


class LangChainPeer(PeerIndex):
    """``langchain``: the splitter and an in-memory vector store (``recipe``)."""

    def __init__(self, folder: Path, version: str, embedder: Embedder) -> None:
        self.store = InMemoryVectorStore.load(str(folder / "store.json"), embedder.model)
        super().__init__(version, len(self.store.store))

    @staticmethod
    def build(folder: Path, texts: Sequence[tuple[str, str]], embedder: Embedder) -> None:
        splits = langchain_splits(texts)
        for split in splits:  # bookkeeping for recall at N tokens; retrieval never reads it
            split.metadata["tokens"] = count_tokens(split.page_content)
        store = InMemoryVectorStore(embedding=embedder.model)
        store.add_documents(splits, ids=[f"{s.metadata['book']}:{s.metadata['start_index']}" for s in splits])
        store.dump(str(folder / "store.json"))

    def search(self, question: str, k: int) -> list[PeerChunk]:
        return [PeerChunk(str(doc.id), doc.metadata["book"], doc.metadata["start_index"],
                          doc.metadata["start_index"] + len(doc.page_content), int(doc.metadata["tokens"]))
                for doc in self.store.similarity_search(question, k=k)]


# --------------------------------------------------------------------------- building and caching


def open_index(peer: str, books: Sequence[tuple[str, Path]], peer_settings: dict[str, int],
               embedder: Embedder | None) -> PeerIndex:
    """``peer``'s index of ``books`` ((data set book name, file) pairs), built on first use and
    cached under ``MIA_HOME/peers``; bm25's key holds its chunk budget and bm25s's version,
    langchain's the embedder (bm25 needs none), both the texts' digests."""
    texts = [(book, collect_sources([path])[0].text) for book, path in books]
    if peer == "bm25":
        chunk_size = peer_settings["chunk_size"]
        folder, version = _folder(peer, {"chunk_size": chunk_size, "stopwords": STOPWORDS, "bm25s": bm25s.__version__}, texts)
        _cached(folder, lambda tmp: Bm25Peer.build(tmp, texts, chunk_size))
        return Bm25Peer(folder, version)
    if embedder is None:
        raise ValueError("the langchain peer embeds with the collection's embedder: pass one")
    model = embedder  # narrowed to Embedder for the closure below
    folder, version = _folder(peer, {**SPLITTER, "embedder": model.name}, texts)
    _cached(folder, lambda tmp: LangChainPeer.build(tmp, texts, model))
    return LangChainPeer(folder, version, model)


def _folder(peer: str, params: dict[str, Any], texts: Sequence[tuple[str, str]]) -> tuple[Path, str]:
    """Where an index of ``texts`` under ``params`` is cached, and the version results are keyed by."""
    key = json.dumps([peer, params, [(book, hashlib.sha256(text.encode()).hexdigest()) for book, text in texts]])
    digest = hashlib.sha256(key.encode()).hexdigest()
    return mia_home() / "peers" / f"{peer}-{digest[:16]}", digest[:12]


def _cached(folder: Path, build: Callable[[Path], None]) -> None:
    """Make ``folder`` with ``build`` unless it exists: built in a temporary sibling and renamed, so
    a killed build never leaves a folder that looks finished."""
    if folder.is_dir():
        return
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process finished the same index first
        shutil.rmtree(tmp)
