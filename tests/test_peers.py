"""The peers (evals/peers.py): chunks and offsets checked by hand, rankings on tiny texts, and a
retrieval-only run that scores them beside a graph by the same rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mia.evals import peers, runner
from mia.evals.datasets import build_custom
from mia.stores.tokens import count_tokens

TEXT = ("The cat sat.\n\nThe dog ran.\n\n\nA bird flew over the old red barn today.\n  \n"
        "One two three four five six seven eight nine ten eleven twelve.\n\nEnd.\n")


def test_paragraphs_split_on_blank_lines_with_exact_offsets() -> None:
    # 0..12 "The cat sat.", 14..26 "The dog ran.", three newlines, 29..69 the bird, a line of spaces
    # between newlines is blank too, 73..136 the count, 138..142 "End.", the final newline left out.
    assert peers.paragraphs(TEXT) == [(0, 12), (14, 26), (29, 69), (73, 136), (138, 142)]
    assert peers.paragraphs("\n\n  \n") == []


def test_bm25_chunks_merge_paragraphs_up_to_the_budget_by_hand() -> None:
    # cl100k: "The cat sat." and "The dog ran." 4 tokens each, 8 with the blank line between them; the
    # bird's sentence 10; the count 13, over the budget, so cut after its tenth token ("ten"); its
    # last 3 tokens (" eleven twelve.") then merge with "End." (5 tokens in all).
    assert [count_tokens(TEXT[s:e]) for s, e in peers.paragraphs(TEXT)] == [4, 4, 10, 13, 2]
    chunks = peers.bm25_chunks(TEXT, 10)
    assert chunks == [(0, 26, 8), (29, 69, 10), (73, 121, 10), (121, 142, 5)]
    assert [TEXT[s:e] for s, e, _ in chunks] == [
        "The cat sat.\n\nThe dog ran.",
        "A bird flew over the old red barn today.",
        "One two three four five six seven eight nine ten",
        " eleven twelve.\n\nEnd.",
    ]
    assert all(count_tokens(TEXT[s:e]) == n for s, e, n in chunks)
    # a budget of 8 still holds the first two paragraphs together, 7 does not
    assert peers.bm25_chunks(TEXT, 8)[0] == (0, 26, 8)
    assert peers.bm25_chunks(TEXT, 7)[:2] == [(0, 12, 4), (14, 26, 4)]


STORY = ("The miller lived by the river with his three sons.\n\n"
         "One winter the youngest son found a golden key under the old mill wheel.\n\n"
         "The king announced that whoever made the princess laugh would marry her.\n")
TALE = "A wolf and a fox shared a cave in the mountains.\n\nThe fox stole butter from the farmer.\n"


def _books(folder: Path) -> list[tuple[str, Path]]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "story.txt").write_text(STORY, encoding="utf-8")
    (folder / "tale.txt").write_text(TALE, encoding="utf-8")
    return [("story", folder / "story.txt"), ("tale", folder / "tale.txt")]


def test_bm25_ranks_the_paragraph_holding_the_query_words_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    books = _books(tmp_path)
    settings = peers.settings("bm25", {"chunk_size": "15"}, depth=100)  # paragraphs of 12, 15, 13; 12, 8 tokens: each alone
    assert settings == {"chunk_size": 15, "top_k": 100}
    index = peers.open_index("bm25", books, settings, embedder=None)  # bm25 embeds nothing
    assert index.size == 5
    hits = index.search("Where was the golden key found?", 5)
    start = STORY.index("One winter")
    assert (hits[0].book, hits[0].start, hits[0].end) == ("story", start, STORY.index("\n\nThe king"))
    assert hits[0].tokens == count_tokens(STORY[hits[0].start:hits[0].end])
    assert index.search("what did the fox steal", 1)[0].book == "tale"
    assert len(index.search("fox", 50)) == 5  # deeper than the index: every chunk, once
    with monkeypatch.context() as patch:
        patch.setattr(peers.Bm25Peer, "build", staticmethod(lambda *args: pytest.fail("a cached index was built again")))
        again = peers.open_index("bm25", books, settings, embedder=None)
    assert again.version == index.version and again.size == index.size  # the cached index, keyed by texts and parameters
    other = peers.open_index("bm25", books, {**settings, "chunk_size": 200}, embedder=None)
    assert other.version != index.version and other.size == 2  # each book in one chunk


def test_peer_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown setting.*for peer langchain"):
        peers.settings("langchain", {"chunk_size": "100"}, depth=100)
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        peers.settings("bm25", {"top_k": "0"}, depth=100)


def test_langchain_splits_keep_exact_offsets() -> None:
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()
    text = "\n\n".join(" ".join(words[(i + j) % len(words)] for j in range(40 + 7 * i)) + "." for i in range(12))
    splits = peers.langchain_splits([("book", text)])
    assert len(splits) > 5
    for split in splits:
        start = split.metadata["start_index"]
        assert text[start:start + len(split.page_content)] == split.page_content
        assert len(split.page_content) <= peers.SPLITTER["chunk_size"] and split.metadata["book"] == "book"
    starts = [s.metadata["start_index"] for s in splits]
    assert starts == sorted(starts) and starts[0] == 0


def test_peers_refused_outside_retrieval_only() -> None:
    with pytest.raises(ValueError, match="bm25: peers retrieve but do not answer; add --retrieval-only"):
        runner.expand_variants(["rag", "bm25"], {}, {}, retrieval_only=False, summarizer="extractive")
    rag, bm25, chain = runner.expand_variants(["rag", "bm25", "langchain"], {"chunk_size": "120"}, {},
                                              retrieval_only=True, summarizer="extractive")
    assert bm25.peer and bm25.retrieval_only and bm25.settings == {"chunk_size": 120, "top_k": runner.RANKING_DEPTH}
    assert chain.settings == {"top_k": runner.RANKING_DEPTH}  # the recipe's own splitter: chunk_size is not its
    assert rag.ingest.chunk_size == bm25.ingest.chunk_size == 120 and rag.context.top_k == runner.RANKING_DEPTH
    assert len({rag.fingerprint, bm25.fingerprint, chain.fingerprint}) == 3


@pytest.mark.slow
def test_langchain_ranks_with_minilm(tmp_path: Path, minilm) -> None:
    index = peers.open_index("langchain", _books(tmp_path), peers.settings("langchain", {}, depth=100), minilm)
    assert index.size == 2  # each book is under 1,000 characters: one split each
    hits = index.search("Which animals lived together in a cave?", 2)
    assert [h.book for h in hits] == ["tale", "story"]
    assert (hits[0].start, hits[0].end) == (0, len(TALE.rstrip())) and hits[0].tokens == count_tokens(TALE.rstrip())
    assert index.search("Who would marry the princess?", 1)[0].book == "story"


@pytest.mark.slow
def test_peers_run_beside_a_graph_and_are_scored_the_same_way(tmp_path: Path) -> None:
    """``mia eval --systems rag,bm25,langchain --retrieval-only`` on two hand-written books."""
    books = _books(tmp_path / "texts")
    gold = STORY.index("One winter"), STORY.index("\n\nThe king")
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "key", "question": "Where did the youngest son find the golden key?",
                                     "answers": ["under the old mill wheel"],
                                     "gold": [{"book": "story", "start": gold[0], "end": gold[1]}]}) + "\n", encoding="utf-8")
    dataset = build_custom(tmp_path / "dataset", tmp_path / "texts", questions)
    assert [b for b, _ in books] == dataset.books
    results = runner.run_eval(str(dataset.dir), None, ["rag", "bm25", "langchain"], retrieval_only=True,
                              out=tmp_path / "out", settings={"chunk_size": "15"}, progress=False)
    by_system = {r["system"]: r for r in results.records}
    for name, record in by_system.items():
        assert len(record["tokens"]) == len(record["retrieved"]) > 0, name
        assert record["scores"]["strict_recall@500tok"] <= record["scores"]["recall@500tok"], name
    # bm25's five paragraph chunks: the key's paragraph first, whole, so every recall is 100
    assert by_system["bm25"]["retrieved"][0] == f"story:{gold[0]}"
    assert all(by_system["bm25"]["scores"][m] == 100.0 for m in ("recall@1", "strict_recall@1", "strict_recall@500tok"))
    # langchain's one split per book holds the whole gold paragraph, which the strict rule credits too
    assert by_system["langchain"]["scores"]["recall@1"] == by_system["langchain"]["scores"]["strict_recall@1"] == 100.0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Peers: what a user would write" in text and "`RecursiveCharacterTextSplitter(chunk_size=1000" in text
    assert "## Recall at equal retrieved tokens" in text and "| bm25 |" in text
    assert "Paired difference in recall at equal retrieved tokens against `rag`" in text
    assert "`bm25`: peer" in text
