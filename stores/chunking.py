"""Chunking with exact character offsets: fixed token windows, or chunks that follow the text.

Fixed windows (``chunker="window"``, the default) cut every ``chunk_size`` tiktoken tokens, wherever
the count falls; they reproduce the chunks of every report made before the other chunker existed,
token for token, and retrieve best on the fairy-tale validation split (``evals/results/chunking-*``).

Structure-aware chunks (``chunker="structure"``) follow the text: headings start sections, and
paragraphs and sentences are kept whole where they fit. The splitting itself is
``langchain-text-splitters``' recursive splitter (paragraphs, then sentences, lines and words, small
neighbours merged up to the token budget); what is ours is finding headings and keeping offsets exact.

Sizes are tiktoken tokens, so they mean the same thing for every embedder. Each chunk is also checked
against the embedder's own tokenizer and split further when it would exceed the model's input limit,
because an embedder that silently truncates its input loses the end of every long chunk without any
error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Literal

from langchain_text_splitters import RecursiveCharacterTextSplitter

from mia.stores.tokens import count_tokens, token_spans

Chunker = Literal["structure", "window"]
CHUNKERS: tuple[str, ...] = ("structure", "window")

_BLANK_LINE = r"\n[ \t\r\f\v]*\n"
# A sentence ends at . ! ? (and any closing quotes or brackets) followed by white space, or at CJK
# 。！？, which need no space after them.
_SENTENCE_END = r"(?<=[.!?])[\"'”’)\]]*\s+|(?<=[。！？])[\"'”’」』）)\]]*"
_SEPARATORS = [_BLANK_LINE, _SENTENCE_END, r"\n", r"[ \t]+", ""]
_BLOCK = re.compile(r"\S(?:.*?\S)?(?=" + _BLANK_LINE + r"|\s*\Z)", re.DOTALL)

_HEADING_WORD = re.compile(
    r"(?:chapter|book|part|volume|vol\.|act|scene|section|stave|canto|letter|prologue|epilogue|preface|"
    r"introduction|contents|appendix|conclusion)(?:\s+[\w]+)?[.:]?$",
    re.IGNORECASE,
)
_NUMBERED = re.compile(r"([IVXLCDM]+|\d{1,3})(?:[.)](?:\s|$)|$)")
_CJK_HEADING = re.compile(r"第[一二三四五六七八九十百千零〇\d]+[章回节節卷部篇]")
_MINOR_WORDS = frozenset(
    "a an and as at by de for from in into of on or the to with von van la le du des".split()
)
_SENTENCE_PUNCTUATION = tuple(".,;:!?\"'”’)…-—")


ModelLimit = tuple[int, Callable[[str], int]] | None
"""The embedder's input limit and its token counter, or None to skip the check."""


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int  # character offsets in the book: text == book[start:end]
    end: int
    text: str
    tokens: int  # tiktoken tokens


def chunk_text(
    text: str,
    chunk_size: int = 200,
    overlap: int = 0,
    *,
    chunker: Chunker = "window",
    span: tuple[int, int] | None = None,
    max_model_tokens: int | None = None,
    count_model_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Chunks of ``text[span]`` (the whole text by default) with offsets into ``text`` itself.

    ``span`` is how front and back matter stay out of the chunks while citations still point into
    the original file.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk_size}")
    if not 0 <= overlap < chunk_size:
        raise ValueError(f"overlap must be in [0, chunk size), got {overlap} with chunk size {chunk_size}")
    if chunker not in CHUNKERS:
        raise ValueError(f"chunker must be one of {', '.join(CHUNKERS)}, got {chunker!r}")
    first, last = span if span is not None else (0, len(text))
    region = text[first:last]
    limit = (max_model_tokens, count_model_tokens) if max_model_tokens is not None and count_model_tokens else None
    cut = _structure_pieces if chunker == "structure" else _window_pieces
    chunks: list[Chunk] = []
    for start, end, tokens in cut(region, chunk_size, overlap, limit):
        chunks.append(Chunk(len(chunks), first + start, first + end, region[start:end], tokens))
    return chunks


# --------------------------------------------------------------------------- fixed windows


def _window_pieces(text: str, chunk_size: int, overlap: int, limit: ModelLimit) -> list[tuple[int, int, int]]:
    """Consecutive ``chunk_size``-token windows, ``chunk_size - overlap`` tokens apart; a window over
    the model's limit is halved by tokens until it fits. Blank windows are dropped."""
    spans = token_spans(text)
    windows: list[tuple[int, int]] = []  # token index ranges
    for first in range(0, len(spans), chunk_size - overlap):
        last = min(first + chunk_size, len(spans))
        windows.append((first, last))
        if last == len(spans):
            break
    out: list[tuple[int, int, int]] = []
    pending = list(reversed(windows))
    while pending:
        first, last = pending.pop()
        start, end = spans[first][0], spans[last - 1][1]
        piece = text[start:end]
        if not piece.strip():
            continue
        if limit is not None and limit[1](piece) > limit[0]:
            if last - first == 1:
                raise ValueError(f"a single token at characters {start}-{end} exceeds the embedder's limit of {limit[0]} tokens")
            middle = (first + last) // 2
            pending.extend([(middle, last), (first, middle)])
            continue
        out.append((start, end, last - first))
    return out


# --------------------------------------------------------------------------- structure


def is_heading(block: str) -> bool:
    """Whether a blank-line separated block reads as a heading: a chapter or part line, a numbered
    title, an all-capitals line, or one short title-cased line with no sentence punctuation.

    Wrongly taking a short line for a heading costs one early chunk break. Missing a heading leaves
    it at the end of the previous chunk, which is the failure this exists to prevent.
    """
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    if not lines or len(lines) > 3 or any(len(line) > 80 for line in lines):
        return False
    joined = " ".join(lines)
    words = joined.split()
    if len(words) > 12:
        return False
    if _CJK_HEADING.match(lines[0]):
        return True
    cased = [c for c in joined if c.upper() != c.lower()]
    if not cased:
        return False
    if len(cased) >= 2 and all(c.isupper() for c in cased):
        return True
    if _HEADING_WORD.match(lines[0]) or _NUMBERED.match(lines[0]):
        return True
    if len(lines) > 1 or joined.endswith(_SENTENCE_PUNCTUATION) or not joined[0].isalnum():
        return False
    significant = [w for w in words if w.lower() not in _MINOR_WORDS]
    return bool(significant) and all(w[0].isupper() or w[0].isdigit() for w in significant)


def sections(text: str) -> list[tuple[int, int, int]]:
    """``(start, body, end)`` spans that each begin at a heading (or at the text's start), the
    heading run being ``text[start:body]``, so a heading is never merged into the end of the
    previous chunk. Consecutive headings (a chapter number and its title, a table of contents)
    form one run."""
    found: list[list[int]] = []  # [start, body]
    previous_was_heading = False
    for match in _BLOCK.finditer(text):
        heading = is_heading(match.group())
        if not found or heading and not previous_was_heading:
            found.append([match.start(), match.start()])
        if heading:
            found[-1][1] = match.end()
        previous_was_heading = heading
    ends = [start for start, _ in found[1:]] + [len(text)]
    return [(start, body, end) for (start, body), end in zip(found, ends)]


@lru_cache(maxsize=8)
def _splitter(chunk_size: int, overlap: int) -> RecursiveCharacterTextSplitter:
    return RecursiveCharacterTextSplitter(
        separators=_SEPARATORS,
        is_separator_regex=True,
        keep_separator="end",
        chunk_size=chunk_size,
        chunk_overlap=overlap,
        length_function=count_tokens,
    )


def _split(text: str, chunk_size: int, overlap: int) -> list[tuple[int, int]]:
    """The splitter returns chunk texts (stripped slices of its input); each is found again in
    order, so every offset is exact by construction."""
    spans: list[tuple[int, int]] = []
    floor = 0
    for piece in _splitter(chunk_size, overlap).split_text(text):
        at = text.find(piece, floor)
        if at < 0:
            raise RuntimeError(f"the text splitter returned text not found in its input near character {floor}")
        spans.append((at, at + len(piece)))
        floor = at + len(piece) if overlap == 0 else at + 1
    return spans


def _structure_spans(text: str, chunk_size: int, overlap: int) -> list[tuple[int, int]]:
    """Each section's body split under the budget, its heading run glued to the first chunk: that
    chunk is cut to the budget left after the heading, so the heading never stands alone unless the
    run alone fills the budget (a long table of contents, split like any text)."""
    spans: list[tuple[int, int]] = []
    for start, body, end in sections(text):
        pieces = [(body + s, body + e) for s, e in _split(text[body:end], chunk_size, overlap)]
        head_tokens = count_tokens(text[start:body]) if body > start else 0
        if not pieces or head_tokens >= chunk_size:
            pieces = [(start + s, start + e) for s, e in _split(text[start:body], chunk_size, overlap)] + pieces
        elif head_tokens:
            first_start, first_end = pieces[0]
            if count_tokens(text[start:first_end]) > chunk_size:
                cut = _split(text[first_start:first_end], chunk_size - head_tokens, 0)
                pieces[:1] = [(first_start + s, first_start + e) for s, e in cut]
            pieces[0] = (start, pieces[0][1])
        spans.extend(pieces)
    return spans


def _structure_pieces(text: str, chunk_size: int, overlap: int, limit: ModelLimit) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for start, end in _structure_spans(text, chunk_size, overlap):
        for s, e in _fit(text, start, end, chunk_size, limit):
            out.append((s, e, count_tokens(text[s:e])))
    return out


def _fit(text: str, start: int, end: int, size: int, limit: ModelLimit) -> list[tuple[int, int]]:
    """A span the embedder would truncate is cut again at half the budget, still on sentence and
    word boundaries; only a run with no boundary left is halved by tokens."""
    piece = text[start:end]
    if limit is None or limit[1](piece) <= limit[0]:
        return [(start, end)]
    parts = _split(piece, size // 2, 0) if size > 1 else []
    if len(parts) <= 1:
        tokens = token_spans(piece)
        if len(tokens) == 1:
            raise ValueError(f"a single token at characters {start}-{end} exceeds the embedder's limit of {limit[0]} tokens")
        middle = tokens[len(tokens) // 2][0]
        parts = [(0, middle), (middle, len(piece))]
    return [span for s, e in parts for span in _fit(text, start + s, start + e, max(1, size // 2), limit)
            if text[span[0]:span[1]].strip()]
