"""Structure-aware chunking and Project Gutenberg front matter, on real books and on hand-made text.

Citations and gold-span recall index the book with chunk offsets, so every test here checks
``text[start:end] == chunk.text`` besides what it is about.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from mia.stores.chunking import Chunk, chunk_text, is_heading, sections
from mia.stores.front_matter import find_body
from mia.stores.tokens import count_tokens
from tests.conftest import shared_data

BOOKS = shared_data() / "books"
STUDY = BOOKS / "holmes" / "a_study_in_scarlet.txt"
requires_books = pytest.mark.skipif(not STUDY.is_file(), reason=f"shared books not found under {BOOKS}; set MIA_DATA")

WINDOW_REFERENCE = {
    # sha256 of "start,end,tokens" lines and the chunk count, from the fixed-window chunker as it was
    # before structure-aware chunking (git show 80ded57:stores/chunking.py), on A Study in Scarlet.
    (200, 0, None): ("965e6f27087457091c1e05e896a1f0bf47022379430d4b475d78c2d0c6d66287", 310),
    (64, 16, 30): ("cc2d339558c5c9a79ffc8515bbf19bbc3502fa98329524fa7505c84dc59ac7fe", 2581),
}


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8-sig")


def _assert_exact(text: str, chunks: list[Chunk]) -> None:
    for i, chunk in enumerate(chunks):
        assert chunk.index == i
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.text.strip()
        assert chunk.tokens == count_tokens(chunk.text)
    for a, b in zip(chunks, chunks[1:]):
        assert a.end <= b.start


def _words(limit_calls: list[str] | None = None):
    """A stand-in embedder tokenizer: one model token per whitespace-separated word."""

    def count(text: str) -> int:
        if limit_calls is not None:
            limit_calls.append(text)
        return len(text.split())

    return count


def _digest(chunks: list[Chunk]) -> tuple[str, int]:
    lines = "".join(f"{c.start},{c.end},{c.tokens}\n" for c in chunks)
    return hashlib.sha256(lines.encode()).hexdigest(), len(chunks)


# --------------------------------------------------------------------------- hand-made text

STORY = (
    "THE MILLER'S DAUGHTER\n\n"
    "Once upon a time a miller lived by the river. He had one daughter, and she was clever.\n\n"
    "The king rode past one day and stopped at the mill. He asked for water, and the girl brought it.\n\n"
    "CHAPTER II\n"
    "THE KING'S TEST\n\n"
    "The king said: “Spin this straw into gold by morning.” The girl wept all night long.\n\n"
    "In the morning a little man came to the door. He spun the straw, and asked for her ring.\n"
)


def test_a_heading_starts_its_chunk_and_paragraphs_stay_whole() -> None:
    chunks = chunk_text(STORY, 200, chunker="structure")
    _assert_exact(STORY, chunks)
    assert [c.text.split("\n")[0] for c in chunks] == ["THE MILLER'S DAUGHTER", "CHAPTER II"]
    # The budget would hold the whole story; the heading still breaks it, and takes its title along.
    assert count_tokens(STORY) < 200
    assert chunks[1].text.startswith("CHAPTER II\nTHE KING'S TEST\n\nThe king said")


def test_small_neighbours_merge_up_to_the_budget_and_never_split_a_paragraph() -> None:
    paragraphs = [f"Paragraph {i} tells of the {i}th brother, who went out to seek his fortune." for i in range(40)]
    text = "\n\n".join(paragraphs)
    budget = 60
    chunks = chunk_text(text, budget, chunker="structure")
    _assert_exact(text, chunks)
    assert all(c.tokens <= budget for c in chunks)
    # Every paragraph lies whole inside one chunk, and chunks hold several of them.
    for p in paragraphs:
        start = text.index(p)
        assert any(c.start <= start and start + len(p) <= c.end for c in chunks), p
    assert len(chunks) < len(paragraphs) / 2


def test_an_oversize_paragraph_is_cut_at_sentence_ends() -> None:
    sentences = [f"The {i}th sentence of this long paragraph says one thing, then another." for i in range(30)]
    text = " ".join(sentences)
    chunks = chunk_text(text, 50, chunker="structure")
    _assert_exact(text, chunks)
    assert len(chunks) > 1 and all(c.tokens <= 50 for c in chunks)
    assert all(c.text.endswith("another.") for c in chunks)


CJK = "".join(
    f"第{n}章 山中的狐狸\n\n"
    + "".join(f"从前有一只狐狸住在山里，它每天都去河边喝水，第{n}章第{i}句。" for i in range(12))
    + "\n\n"
    + "".join(f"后来狐狸遇见了一只狼，狼问它要去哪里？第{i}问。" for i in range(12))
    + "\n\n"
    for n in "一二三"
)


def test_cjk_text_keeps_exact_offsets_and_cuts_at_its_own_sentence_ends() -> None:
    chunks = chunk_text(CJK, 120, chunker="structure")
    _assert_exact(CJK, chunks)
    assert all(c.tokens <= 120 for c in chunks)
    assert sum(c.text.startswith("第") and "章" in c.text[:4] for c in chunks) == 3  # each chapter heads a chunk
    assert all(c.text[-1] in "。？" for c in chunks)


def test_no_chunk_is_over_the_embedders_limit() -> None:
    text = "\n\n".join(" ".join(["a b c d e f g h"] * 8) + "." for _ in range(10))  # 64-word paragraphs
    calls: list[str] = []
    chunks = chunk_text(text, 200, max_model_tokens=20, count_model_tokens=_words(calls), chunker="structure")
    _assert_exact(text, chunks)
    assert calls and all(len(c.text.split()) <= 20 for c in chunks)
    assert chunk_text(text, 200, max_model_tokens=10_000, count_model_tokens=_words(), chunker="structure") == chunk_text(text, 200, chunker="structure")


def test_overlap_repeats_text_between_neighbours() -> None:
    text = " ".join(f"Sentence {i} is here." for i in range(200))
    chunks = chunk_text(text, 40, 10, chunker="structure")
    _assert_exact_overlapping(text, chunks)
    assert all(b.start < a.end for a, b in zip(chunks, chunks[1:]))


def _assert_exact_overlapping(text: str, chunks: list[Chunk]) -> None:
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
    assert all(a.start < b.start for a, b in zip(chunks, chunks[1:]))


@pytest.mark.parametrize(
    ("block", "heading"),
    [
        ("CHAPTER I.\nMR. SHERLOCK HOLMES.", True),
        ("Chapter 3", True),
        ("XII. The Adventure of the Copper Beeches", True),
        ("The Big Bird Dan", True),
        ("PART I.", True),
        ("第三章 归来", True),
        ("“Yes,” said he.", False),
        ("It was a dark night.", False),
        ("I went home", False),
        ("* * * * *", False),
        ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home\nand happy disposition, seemed to unite", False),
    ],
)
def test_heading_detection(block: str, heading: bool) -> None:
    assert is_heading(block) is heading


def test_sections_begin_at_headings_and_keep_heading_runs_together() -> None:
    text = "Preface text here.\n\nCONTENTS\n\nI. One\n\nII. Two\n\nBody of the book.\n\nCHAPTER I\n\nMore body."
    starts = [text[s:e].split("\n")[0] for s, _, e in sections(text)]
    assert starts == ["Preface text here.", "CONTENTS", "CHAPTER I"]


# --------------------------------------------------------------------------- fixed windows, as before


@requires_books
@pytest.mark.parametrize("key", sorted(WINDOW_REFERENCE, key=str))
def test_fixed_windows_reproduce_the_chunks_of_earlier_reports(key: tuple[int, int, int | None]) -> None:
    size, overlap, limit = key
    text = _read(STUDY)
    extra = {"max_model_tokens": limit, "count_model_tokens": _words()} if limit else {}
    chunks = chunk_text(text, size, overlap, chunker="window", **extra)
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
    assert _digest(chunks) == WINDOW_REFERENCE[key]


# --------------------------------------------------------------------------- real books


def _shared_books() -> list[Path]:
    return sorted(BOOKS.glob("*/*.txt")) if BOOKS.is_dir() else []


@requires_books
@pytest.mark.parametrize("path", _shared_books(), ids=lambda p: p.stem)
def test_gutenberg_matter_is_found_in_every_shared_book(path: Path) -> None:
    text = _read(path)
    body = find_body(text)
    inside = text[body.start : body.end]
    assert re.search(r"START OF (THE|THIS) PROJECT GUTENBERG", inside, re.I) is None
    assert re.search(r"END OF (THE|THIS) PROJECT GUTENBERG|Project Gutenberg License|gutenberg\.org", inside, re.I) is None
    if "PROJECT GUTENBERG" in text.upper():
        assert body.left_out > 10_000  # header and licence footer
    else:
        assert body.left_out == 0  # a plain text (the Austen novels) is kept whole


@requires_books
def test_a_real_book_chunks_exactly_without_its_licence() -> None:
    text = _read(STUDY)
    body = find_body(text)
    chunks = chunk_text(text, 200, span=(body.start, body.end), chunker="structure")
    _assert_exact(text, chunks)
    assert body.start <= chunks[0].start and chunks[-1].end <= body.end
    assert chunks[0].text.startswith("A STUDY IN SCARLET")
    assert not any("Gutenberg" in c.text for c in chunks)
    assert all(c.tokens <= 201 for c in chunks)
    # Every chapter heading starts a chunk, or follows only other headings at its start ("PART II." above
    # "CHAPTER I.").
    headings = [m.start() for m in re.finditer(r"^CHAPTER [IVX]+\.", text, re.M)]
    assert len(headings) == 14
    for h in headings:
        (chunk,) = [c for c in chunks if c.start <= h < c.end]
        before = [block for block in re.split(r"\n\s*\n", text[chunk.start : h]) if block.strip()]
        assert all(is_heading(block) for block in before), before
    # Nothing of the body is lost between chunks but white space.
    covered = "".join(text[a.end : b.start] for a, b in zip(chunks, chunks[1:]))
    assert not covered.strip()
