"""Offline tiktoken and token chunking: offsets must reproduce the source exactly.

Every citation, every gold-span Recall@k and every extractive summary indexes the book with the
chunk offsets, so an off-by-one here silently corrupts everything downstream.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest

from mia.stores import tokens
from mia.stores.chunking import Chunk, chunk_text
from mia.stores.tokens import count_tokens, token_spans

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
"""The hash tiktoken itself publishes for cl100k_base (tiktoken_ext.openai_public)."""

SAMPLES = {
    "ascii": "It was a dark and stormy night; the rain fell in torrents.\n\nExcept at occasional intervals...",
    "accents": "Le cœur a ses raisons que la raison ne connaît point. Façade, naïve, Ærø, Ångström.",
    "cjk": "我是一只猫。还没有名字。这是一个很长的中文句子，用来测试分词边界是否正确。日本語のテキストも含む。",
    "emoji": "Family: 👩‍👩‍👧‍👦 party 🎉🎉🎉 flags 🇫🇷🇯🇵 skin 👍🏽 done.",
    "astral": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝐀𝐁𝐂 and 𠀀𠀁 (CJK ext. B)",
    "control": "tabs\tand\r\nwindows newlines\u00a0nbsp\u200bzero-width\u2028line sep",
    "mixed": "Holmes said 「你好」 — then 🙂 «ça va?» and left.\n" * 3,
}


@pytest.fixture
def fresh_tiktoken_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty tiktoken cache folder and a network that fails loudly if anything tries it."""
    cache = tmp_path / "tiktoken"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tiktoken tried to reach the network")

    monkeypatch.setattr("tiktoken.load.read_file", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    return cache


def _cache_file(cache: Path) -> Path:
    return cache / hashlib.sha1(tokens._BLOB_URL.encode()).hexdigest()


def _load_fresh_cl100k():
    """cl100k built from the cache by tiktoken's own loader (not its in-process registry)."""
    import tiktoken
    from tiktoken_ext.openai_public import cl100k_base

    return tiktoken.Encoding(**cl100k_base())


# ---------------------------------------------------------------------------------------------
# tiktoken, offline


def test_cache_file_is_written_and_passes_tiktokens_hash_check(fresh_tiktoken_dir: Path) -> None:
    tokens.ensure_tiktoken_cache()
    target = _cache_file(fresh_tiktoken_dir)
    assert target.is_file()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == CL100K_SHA256
    assert not [p for p in fresh_tiktoken_dir.iterdir() if p != target], "temporary files left behind"
    enc = _load_fresh_cl100k()  # tiktoken verifies the hash; a mismatch would try the (blocked) network
    assert enc.decode(enc.encode_ordinary("Sherlock Holmes, 221B Baker Street")) == "Sherlock Holmes, 221B Baker Street"
    assert enc.encode_ordinary("hello world") == [15339, 1917]  # the published cl100k ids


def test_corrupt_cache_file_is_rewritten_not_trusted(fresh_tiktoken_dir: Path) -> None:
    """A truncated table (e.g. a killed write by an older version) must be repaired, not fetched."""
    target = _cache_file(fresh_tiktoken_dir)
    fresh_tiktoken_dir.mkdir(parents=True)
    target.write_bytes(b"aGVsbG8= 0\n")
    tokens.ensure_tiktoken_cache()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == CL100K_SHA256
    _load_fresh_cl100k()


def test_second_call_reuses_the_cache(fresh_tiktoken_dir: Path) -> None:
    tokens.ensure_tiktoken_cache()
    target = _cache_file(fresh_tiktoken_dir)
    before = target.stat().st_mtime_ns
    tokens.ensure_tiktoken_cache()
    assert target.stat().st_mtime_ns == before


def test_count_tokens_and_truncate() -> None:
    assert count_tokens("") == 0
    assert count_tokens("hello world") == 2
    text = SAMPLES["ascii"]
    cut = tokens.truncate(text, 5)
    assert text.startswith(cut) and count_tokens(cut) == 5
    assert tokens.truncate(text, 10_000) == text


# ---------------------------------------------------------------------------------------------
# token spans


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_token_spans_tile_the_text_exactly(name: str) -> None:
    text = SAMPLES[name]
    spans = token_spans(text)
    assert len(spans) == count_tokens(text)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end == start, "spans must be contiguous"
    assert all(start <= end for start, end in spans)
    assert "".join(text[s:e] for s, e in spans) == text


@pytest.mark.parametrize("name", ["cjk", "emoji", "astral", "mixed"])
def test_token_spans_round_up_to_character_boundaries(name: str) -> None:
    """A token may end inside a multi-byte character; its span then ends after that character.

    So each span end is the smallest character index whose prefix holds every byte of the tokens
    so far: never a split character, never a character dropped.
    """
    text = SAMPLES[name]
    enc = tokens.encoding()
    consumed = 0
    for (_, end), token in zip(token_spans(text), enc.encode_ordinary(text)):
        consumed += len(enc.decode_single_token_bytes(token))
        assert len(text[: end - 1].encode("utf-8")) < consumed <= len(text[:end].encode("utf-8"))
    assert consumed == len(text.encode("utf-8"))


def test_token_spans_of_empty_text() -> None:
    assert token_spans("") == []


# ---------------------------------------------------------------------------------------------
# chunking


def _long_text() -> str:
    paragraphs = [SAMPLES[name] for name in sorted(SAMPLES)] * 6
    return "\n\n".join(f"{i}. {p}" for i, p in enumerate(paragraphs))


def _assert_exact(text: str, chunks: list[Chunk]) -> None:
    for i, chunk in enumerate(chunks):
        assert chunk.index == i
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.text.strip()


@pytest.mark.parametrize("size", [1, 7, 50, 200])
def test_chunks_without_overlap_tile_the_text(size: int) -> None:
    text = _long_text()
    chunks = chunk_text(text, size, chunker="window")
    _assert_exact(text, chunks)
    assert all(c.tokens <= size for c in chunks)
    # Consecutive chunks touch; only whitespace may fall between (a whitespace-only window is dropped).
    assert chunks[0].start == 0 or not text[: chunks[0].start].strip()
    for a, b in zip(chunks, chunks[1:]):
        assert a.end <= b.start and not text[a.end : b.start].strip()
    assert chunks[-1].end == len(text) or not text[chunks[-1].end :].strip()
    assert sum(c.tokens for c in chunks) <= count_tokens(text)


def test_token_counts_add_up_when_no_window_is_blank() -> None:
    text = SAMPLES["ascii"] * 20
    chunks = chunk_text(text, 16, chunker="window")
    assert sum(c.tokens for c in chunks) == count_tokens(text)
    assert "".join(c.text for c in chunks) == text


@pytest.mark.parametrize(("size", "overlap"), [(10, 3), (50, 10), (8, 7)])
def test_overlap_shares_exactly_that_many_tokens(size: int, overlap: int) -> None:
    text = _long_text()
    spans = token_spans(text)
    chunks = chunk_text(text, size, overlap, chunker="window")
    _assert_exact(text, chunks)
    step = size - overlap
    # Window w covers tokens [w·step, w·step + size); compare against the spans directly.
    expected = []
    for first in range(0, len(spans), step):
        last = min(first + size, len(spans))
        expected.append((spans[first][0], spans[last - 1][1]))
        if last == len(spans):
            break
    expected = [(s, e) for s, e in expected if text[s:e].strip()]
    assert [(c.start, c.end) for c in chunks] == expected
    assert all(c.tokens <= size for c in chunks)
    for a, b in zip(chunks, chunks[1:]):
        shared = text[b.start : a.end]
        assert a.end > b.start and count_tokens(shared) >= 1  # a real overlap, in text order


def test_last_window_is_not_a_duplicate_tail() -> None:
    text = " ".join(["word"] * 10)  # 10 tokens: "word" then nine " word"
    chunks = chunk_text(text, 4, 2, chunker="window")
    assert [c.tokens for c in chunks] == [4, 4, 4, 4]
    assert chunks[-1].end == len(text)


@pytest.mark.parametrize("name", ["cjk", "emoji", "astral", "mixed"])
def test_multibyte_chunks_are_exact_at_tiny_sizes(name: str) -> None:
    """Size 1 and 2 put chunk boundaries inside multi-byte characters as often as possible."""
    text = SAMPLES[name] * 3
    for size in (1, 2, 3):
        chunks = chunk_text(text, size, chunker="window")
        _assert_exact(text, chunks)
        between = "".join(text[a.end : b.start] for a, b in zip(chunks, chunks[1:]))
        assert not between.strip()
        # Every non-space character of the text lies in exactly one chunk.
        inside = sum(len(c.text.replace(" ", "").replace("\n", "")) for c in chunks)
        assert inside == len(text.replace(" ", "").replace("\n", ""))


def test_blank_text_gives_no_chunks() -> None:
    assert chunk_text("", 10, chunker="window") == []
    assert chunk_text(" \n\t \n", 2, chunker="window") == []


# ---------------------------------------------------------------------------------------------
# the embedder's own limit


def _word_counter(calls: list[str]):
    """A stand-in for an embedder tokenizer: one model token per whitespace-separated word."""

    def count(text: str) -> int:
        calls.append(text)
        return len(text.split())

    return count


def test_chunks_over_the_model_limit_are_split_further() -> None:
    # Single-letter words are one tiktoken token each, so 64-token chunks hold 64 "model tokens".
    text = " ".join(["a b c d e f g h"] * 40)
    calls: list[str] = []
    plain = chunk_text(text, 64, chunker="window")
    split = chunk_text(text, 64, max_model_tokens=20, count_model_tokens=_word_counter(calls), chunker="window")
    _assert_exact(text, split)
    assert calls, "the model's counter must be consulted"
    assert len(split) > len(plain)
    assert all(len(c.text.split()) <= 20 for c in split)
    assert all(c.tokens <= 64 for c in split)
    # Still a tiling of the text, in order.
    assert "".join(c.text for c in split) == text


def test_chunks_within_the_model_limit_are_not_split() -> None:
    text = SAMPLES["ascii"] * 10
    calls: list[str] = []
    assert chunk_text(text, 30, max_model_tokens=10_000, count_model_tokens=_word_counter(calls), chunker="window") == chunk_text(text, 30, chunker="window")
    assert len(calls) == len(chunk_text(text, 30, chunker="window"))


def test_a_single_token_over_the_model_limit_is_an_error() -> None:
    with pytest.raises(ValueError, match="single token .* exceeds the embedder's limit of 0 tokens"):
        chunk_text("hello world", 5, max_model_tokens=0, count_model_tokens=lambda t: len(t.split()))


@pytest.mark.parametrize(
    ("size", "overlap", "message"),
    [
        (0, 0, "chunk size must be positive, got 0"),
        (-5, 0, "chunk size must be positive, got -5"),
        (10, 10, r"overlap must be in \[0, chunk size\), got 10 with chunk size 10"),
        (10, 11, r"overlap must be in \[0, chunk size\), got 11"),
        (10, -1, r"overlap must be in \[0, chunk size\), got -1"),
    ],
)
def test_invalid_sizes_raise_clear_errors(size: int, overlap: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chunk_text("some text", size, overlap, chunker="window")
