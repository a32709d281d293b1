"""Token chunking with exact character offsets.

Chunks are windows of tiktoken tokens, so sizes mean the same thing for every embedder; each chunk
is also checked against the embedder's own tokenizer and split further when it would exceed the
model's input limit, because an embedder silently truncating its input loses the end of every
long chunk without any error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from stores.tokens import token_spans


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
    max_model_tokens: int | None = None,
    count_model_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    if chunk_size <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk_size}")
    if not 0 <= overlap < chunk_size:
        raise ValueError(f"overlap must be in [0, chunk size), got {overlap} with chunk size {chunk_size}")
    spans = token_spans(text)
    windows: list[tuple[int, int]] = []  # token index ranges
    step = chunk_size - overlap
    for first in range(0, len(spans), step):
        last = min(first + chunk_size, len(spans))
        windows.append((first, last))
        if last == len(spans):
            break
    chunks: list[Chunk] = []
    pending = list(reversed(windows))
    while pending:
        first, last = pending.pop()
        start, end = spans[first][0], spans[last - 1][1]
        piece = text[start:end]
        if not piece.strip():
            continue
        if max_model_tokens is not None and count_model_tokens is not None:
            if count_model_tokens(piece) > max_model_tokens:
                if last - first == 1:
                    raise ValueError(
                        f"a single token at characters {start}-{end} exceeds the embedder's limit of {max_model_tokens} tokens"
                    )
                middle = (first + last) // 2
                pending.extend([(middle, last), (first, middle)])
                continue
        chunks.append(Chunk(index=len(chunks), start=start, end=end, text=piece, tokens=last - first))
    return chunks
