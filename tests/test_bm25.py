"""Unit tests for stores/bm25.py: tokenisation, exact windows, search rules and the on-disk cache.

Fast and offline: tiny texts, and a real Chroma mindscape (books only, no embedder) for the
collection-level cache.
"""

from __future__ import annotations

from pathlib import Path

import chromadb
import pytest

from mia.stores.bm25 import BM25Index, source_text, tokenize, window_spans
from mia.stores.mindscape import Mindscape
from mia.stores.tokens import count_tokens


ENGLISH = " ".join(
    f"In village number {i} there lived a {job} named {name} who kept a {thing} in the cellar."
    for i, (job, name, thing) in enumerate([
        ("baker", "Arno", "lantern"), ("miller", "Berta", "goose"), ("smith", "Caspar", "anvil"),
        ("weaver", "Dora", "loom"), ("tailor", "Emil", "needle"), ("cooper", "Frida", "barrel"),
        ("potter", "Gustav", "wheel"), ("fisher", "Hilde", "net"), ("hunter", "Ivo", "horn"),
        ("shepherd", "Jutta", "flute"), ("farmer", "Kurt", "plough"), ("carter", "Lotte", "wagon"),
    ])
)
CHINESE = (
    "从前有一个小女孩，大家都叫她小红帽。有一天，妈妈让她给住在森林另一边的外婆送蛋糕和葡萄酒。"
    "小红帽在路上遇到了一只狼。狼问她要去哪里，她说要去看外婆。狼先跑到外婆家，把外婆吞了下去。"
    "后来一个猎人路过，听见狼在打呼噜，就剪开狼的肚子，救出了小红帽和外婆。"
)


def test_english_tokens_are_lowercase_words_without_stopwords() -> None:
    assert tokenize("The King's GOLD-crown, and 3 crowns!") == ["king", "s", "gold", "crown", "3", "crowns"]


def test_stemmed_tokens_meet_across_word_forms() -> None:
    assert tokenize("The King's GOLD-crown, and 3 crowns!", stem=True) == ["king", "s", "gold", "crown", "3", "crown"]
    assert tokenize("carted", stem=True) == tokenize("carts", stem=True) == tokenize("cart", stem=True) == ["cart"]
    assert tokenize("小红帽 wounded", stem=True) == ["小", "红", "帽", "小红", "红帽", "wound"]  # CJK untouched


def test_chinese_tokens_are_characters_and_bigrams() -> None:
    assert tokenize("小红帽") == ["小", "红", "帽", "小红", "红帽"]
    assert tokenize("Alice在北京。") == ["alice", "在", "北", "京", "在北", "北京"]


def test_windows_are_exact_slices_of_the_requested_size() -> None:
    spans = window_spans(ENGLISH, 40, 10)
    assert spans[0][0] == 0 and spans[-1][1] == len(ENGLISH)
    for (start, end), (next_start, _) in zip(spans, spans[1:]):
        assert next_start < end  # consecutive windows overlap
    assert all(count_tokens(ENGLISH[s:e]) <= 41 for s, e in spans)  # a cut can merge at most one token
    assert len(spans) == -(-(count_tokens(ENGLISH) - 10) // 30)


def test_english_search_finds_the_window_with_the_terms(tmp_path: Path) -> None:
    index = BM25Index.for_text(ENGLISH, 40, 10, tmp_path)
    hits = index.search("who kept the goose?", 3)
    assert hits and "goose" in hits[0].text
    assert all(h.text == ENGLISH[h.start : h.end] for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_chinese_search_finds_the_window_with_the_terms(tmp_path: Path) -> None:
    index = BM25Index.for_text(CHINESE, 30, 5, tmp_path)
    hits = index.search("谁给外婆送蛋糕", 2)
    assert hits and "蛋糕" in hits[0].text
    assert "猎人" in index.search("猎人路过", 1)[0].text


def test_search_excludes_windows_overlapping_the_current_chunk(tmp_path: Path) -> None:
    index = BM25Index.for_text(ENGLISH, 40, 10, tmp_path)
    best = index.search("goose", 1)[0]
    hits = index.search("goose", 10, exclude=(best.start, best.start + 1))
    assert all(h.end <= best.start or h.start >= best.start + 1 for h in hits)
    assert best.id not in [h.id for h in hits]


def test_overlapping_windows_are_near_duplicates(tmp_path: Path) -> None:
    # windows of 40 tokens starting every 10: neighbours share 75% of their text
    index = BM25Index.for_text(ENGLISH, 40, 30, tmp_path)
    hits = index.search("goose miller Berta", 10)
    for i, a in enumerate(hits):
        for b in hits[i + 1 :]:
            assert min(a.end, b.end) - max(a.start, b.start) <= (b.end - b.start) / 2


def test_repeated_passages_are_near_duplicates(tmp_path: Path) -> None:
    licence = "This ebook is for the use of anyone anywhere at no cost and with almost no restrictions whatsoever. " * 4
    half = len(ENGLISH) // 2
    text = f"{ENGLISH[:half]}\n\n{licence}\n\n{ENGLISH[half:]}\n\n{licence}"
    index = BM25Index.for_text(text, 40, 10, tmp_path)
    licence_terms = set(tokenize(licence))
    pure = [i for i in range(len(index)) if set(tokenize(index.window(i).text)) <= licence_terms]
    assert {index.window(i).start > half + len(licence) for i in pure} == {False, True}  # both copies indexed
    hits = index.search("ebook anyone restrictions cost", 10)
    assert sum(set(tokenize(h.text)) <= licence_terms for h in hits) == 1


def test_query_without_known_terms_finds_nothing(tmp_path: Path) -> None:
    index = BM25Index.for_text(ENGLISH, 40, 10, tmp_path)
    assert index.search("the of and", 5) == []
    assert index.search("zeppelin", 5) == []


def test_collection_index_is_rebuilt_only_when_the_source_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIA_HOME", str(tmp_path / "home"))
    store = Mindscape("shelf", chromadb.PersistentClient(str(tmp_path / "chroma")), create=True)
    store.commits.commit("first", ENGLISH, {"order": 0})

    built = BM25Index.for_collection(store, 40, 10)
    assert built.built and built.path.parent == tmp_path / "home" / "bm25" / "shelf"
    stamp = (built.path / "windows.json").stat().st_mtime_ns
    again = BM25Index.for_collection(store, 40, 10)
    assert not again.built and again.path == built.path
    assert (built.path / "windows.json").stat().st_mtime_ns == stamp

    store.commits.commit("second", CHINESE, {"order": 1})
    changed = BM25Index.for_collection(store, 40, 10)
    assert changed.built and changed.path != built.path
    assert source_text(store) == f"# first\n\n{ENGLISH}\n\n# second\n\n{CHINESE}"
    assert "猎人" in changed.search("猎人", 1)[0].text

    other_params = BM25Index.for_collection(store, 50, 10)
    assert other_params.built and other_params.path != changed.path
