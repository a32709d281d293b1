"""``mia demo``: the first answer comes from the chunks alone, the summaries follow, a rerun reuses it all.

Real parts throughout: the embedded chat model answers, MiniLM embeds, Chroma stores. The book is
the opening of the demo novel (the part that holds the demo question's answer), so the run takes
seconds of ingestion instead of minutes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mia.graph import cli as mia_cli
from mia.stores.front_matter import find_body
from tests.conftest import mia, shared_data

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_env(tmp_path: Path, without_harness: dict[str, str]) -> dict[str, str]:
    """The demo's data folder holding the book's opening, a fresh store, and no evaluation harness:
    the demo is the product's main job and must not need it."""
    text = (shared_data() / mia_cli.DEMO_BOOK).read_text(encoding="utf-8")
    body = find_body(text)
    book = tmp_path / "data" / mia_cli.DEMO_BOOK
    book.parent.mkdir(parents=True)
    book.write_text(text[body.start : body.start + 12_000], encoding="utf-8")
    return {**without_harness, "MIA_DATA": str(tmp_path / "data"), "MIA_CHROMA_PATH": str(tmp_path / "chroma")}


@pytest.mark.skipif(not (shared_data() / mia_cli.DEMO_BOOK).is_file(), reason="the demo book is not in the shared data")
def test_demo_answers_from_chunks_first_then_with_summaries(demo_env: dict[str, str], embedded_model_file: Path) -> None:
    first = mia(demo_env, "demo")  # the default summarizer, extractive
    assert first.returncode == 0, first.stderr
    out = first.stdout
    chunks_only, with_summaries = [line for line in out.splitlines() if line.startswith(f"{mia_cli.DEMO_COLLECTION}: 1 book(s) written")]
    assert " 0 summaries" in chunks_only and " 0 summaries" not in with_summaries
    assert "reused" not in chunks_only and "vectors reused" in with_summaries
    order = [out.index(mark) for mark in (chunks_only, "rag reads chunks only, so it answers now", "== rag:", with_summaries, "== mia_rag:")]
    assert order == sorted(order), "rag answers before the summaries are written, mia_rag after"
    assert not re.search(r": 0(text|window) \[", first.stderr), "no empty progress bar for work that is skipped"
    for stage in ("chunks in (no summaries yet)", "first answer (rag)", "session summaries (extractive)", "answer (mia_rag)", "total"):
        assert stage in first.stderr

    again = mia(demo_env, "demo")
    assert again.returncode == 0, again.stderr
    assert f"{mia_cli.DEMO_COLLECTION}: 0 book(s) written, 1 unchanged" in again.stdout
    assert "ingestion (extractive)" in again.stderr and "first answer" not in again.stderr
