"""Grounded citations: each cited chunk carries the sentence that supports the answer, in book offsets."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.answer import citations, reply_text, supporting_sentence
from tests.test_agent import ANSWER_NOW, run, script  # noqa: F401 - script is a fixture

BOOK = ("Once upon a time there was a farmer. He had carted pears to market. "
        "A bonze asked him for one pear! The farmer refused; the bonze planted a seed.")


def _chunk(n: int, start: int, end: int) -> dict[str, Any]:
    return {"id": f"farmer:c{n:06d}", "book": "farmer", "index": n, "start": start, "end": end, "text": BOOK[start:end]}


CHUNKS = [_chunk(0, 0, 67), _chunk(1, 68, len(BOOK))]


def test_the_sentence_holding_the_answer_is_chosen_with_book_offsets() -> None:
    score, sentence = supporting_sentence(CHUNKS[0], "pears", "What had the farmer carted to market?")
    assert sentence == {"start": 37, "end": 67, "text": "He had carted pears to market."}
    assert BOOK[sentence["start"]:sentence["end"]] == sentence["text"] and score == (1, 3)
    # An answer that shares no word with the passage falls back to the question's words.
    _, fallback = supporting_sentence(CHUNKS[1], "TRUE", "The bonze planted a seed.")
    assert fallback["text"] == "The farmer refused; the bonze planted a seed."
    # Stemmed: "planting" finds "planted"; ties go to the earlier sentence.
    assert supporting_sentence(CHUNKS[1], "planting", "")[1]["text"].endswith("planted a seed.")
    assert supporting_sentence(CHUNKS[0], "nothing matches", "")[1]["text"] == "Once upon a time there was a farmer."


def test_citations_carry_their_supporting_sentence() -> None:
    cited = citations("Pears [1].", CHUNKS, "What had the farmer carted?", "Pears")
    assert [c["n"] for c in cited] == [1] and cited[0]["cited_by_model"]
    assert cited[0]["sentences"] == [{"start": 37, "end": 67, "text": "He had carted pears to market."}]
    # Without markers, the passages whose sentences best support the answer are the sources.
    uncited = citations("a seed", CHUNKS, "What did the bonze plant?")
    assert [c["n"] for c in uncited] == [2, 1] and not uncited[0]["cited_by_model"]
    assert uncited[0]["sentences"][0]["text"] == "The farmer refused; the bonze planted a seed."
    # TRUE / FALSE: the claim (the question) guides, not the word TRUE.
    verified = citations("TRUE", CHUNKS, "He had carted pears to market.", "")
    assert verified[0]["sentences"][0]["text"] == "He had carted pears to market."


def test_the_reply_quotes_each_source() -> None:
    cited = citations("Pears [1].", CHUNKS, "What had the farmer carted?", "Pears")
    assert reply_text("Pears", cited) == "Pears\n\nSources: [1] farmer, chunk 0 (chars 0–67) “He had carted pears to market.”"
    long = [{**cited[0], "sentences": [{"start": 0, "end": 400, "text": "word " * 80}]}]
    quoted = reply_text("x", long).split("“")[1]
    assert len(quoted) == 161 and quoted.endswith("…”")


@pytest.mark.parametrize("graph", ["rag", "mia_rag", "agent", "mia_agent"])
def test_every_graph_grounds_its_answer_inside_a_retrieved_chunk(tiny_collection, script, graph: str) -> None:
    """A supporting sentence for every citation, an exact substring of its book inside a retrieved chunk."""
    if graph in ("agent", "mia_agent"):
        script({**ANSWER_NOW, **({"signature": []} if graph == "agent" else {})}, "A golden goose")
    else:
        script("A golden goose")
    state = run(graph, tiny_collection, top_k=5, step_k=5, max_steps=1)
    assert state["citations"]
    retrieved = {r["id"]: r for r in tiny_collection.store.chunk_records([r["id"] for r in state["retrieved"]])}
    for cite in state["citations"]:
        assert cite["id"] in retrieved and len(cite["sentences"]) >= 1
        chunk = retrieved[cite["id"]]
        for sentence in cite["sentences"]:
            assert chunk["start"] <= sentence["start"] < sentence["end"] <= chunk["end"]
            assert tiny_collection.texts[cite["book"]][sentence["start"]:sentence["end"]] == sentence["text"]
    best = state["citations"][0]["sentences"][0]["text"].lower()
    assert "goose" in best or "golden" in best, best
    assert "“" in state["messages"][-1].text


def test_quoted_sources_stay_out_of_the_follow_up_prompt(script) -> None:
    """A reply quotes document text; condensing a follow-up must not carry it into a prompt unguarded."""
    from langchain_core.messages import AIMessage, HumanMessage

    from nodes.context import Context
    from nodes.qa import standalone_question

    scripted = script("What did the farmer cart to market?")
    quoted = reply_text("Pears", citations("Pears [1].", CHUNKS, "What had the farmer carted?", "Pears"))
    history = [HumanMessage("What had the farmer carted?"), AIMessage(quoted)]
    question, _ = standalone_question(history, "And where to?", Context())
    assert question == "What did the farmer cart to market?"
    assert "Assistant: Pears" in scripted.prompts[0] and "He had carted pears" not in scripted.prompts[0]
