"""What the generator reads, on a real collection (MiniLM, Chroma) with a recording chat model: the
cards of its passages' books when ``book_card`` is on, and the passages in story order under
``passage_order=document``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage

from mia.graph.registry import load_graph
from mia.nodes import resources
from mia.nodes.context import context_from
from mia.stores.book_card import BookCard
from mia.stores.ingest import books
from mia.stores.mindscape import Mindscape
from mia.stores.units import book_unit_id


@pytest.fixture
def prompts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every prompt the generator is sent, in order; it answers "A goose"."""
    sent: list[str] = []

    class Recording(GenericFakeChatModel):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            sent.append("\n".join(m.text for m in messages))
            return super()._generate(messages, *args, **kwargs)

    monkeypatch.setattr(resources, "chat_model", lambda ctx, max_tokens=None: Recording(messages=iter([AIMessage("A goose")] * 8)))
    return sent


def test_the_generator_reads_the_cards_of_its_passages_books_only_when_asked(tiny_collection, minilm, prompts: list[str]) -> None:
    store = Mindscape(tiny_collection.name)
    book = store.commits.ordered()[0]
    card = BookCard(book=book, title="The Golden Goose", author="", narrator="", first_person=False,
                    characters=[{"name": "Dummling", "aliases": [], "role": "the youngest son"}])
    books.write(store, [card], minilm)
    seen = []
    try:
        for graph in ("rag", "mia_rag"):
            for given in (False, True):
                state = load_graph(graph).invoke({"question": "Who got the golden goose?"}, context=context_from(
                    graph, {"collection": tiny_collection.name, "book_card": given}))
                with_card = book in {r["id"].rsplit(":c", 1)[0] for r in state["retrieved"]}
                seen.append(with_card)
                assert ("<book>\nTitle: The Golden Goose" in prompts[-1]) == (given and with_card), (graph, given)
                assert ("between <book> tags" in prompts[-1]) == (given and with_card)
    finally:
        store.summaries.delete(ids=[book_unit_id(book)])
    assert any(seen)  # the card's book was among the passages' books


def test_document_order_gives_the_passages_in_story_order(tiny_collection, prompts: list[str]) -> None:
    store = Mindscape(tiny_collection.name)
    rank = {book: n for n, book in enumerate(store.commits.ordered())}
    for order in ("score", "document"):
        state = load_graph("rag").invoke({"question": "Who got the golden goose?"}, context=context_from(
            "rag", {"collection": tiny_collection.name, "passage_order": order}))
        given = [(rank[book], int(index)) for book, index in re.findall(r'<source n="\d+" book="([^"]+)" position="chunk (\d+)"', prompts[-1])]
        chunks = store.chunk_records([r["id"] for r in state["retrieved"]], documents=False)
        assert len(given) == len(chunks) == 10
        if order == "score":
            assert given == [(rank[c["book"]], int(c["index"])) for c in chunks]  # the ranking's order
            assert given != sorted(given)  # which is not story order here, so the test can tell them apart
        else:
            assert given == sorted(given)
        assert state["retrieved"][0]["id"] == chunks[0]["id"]  # the ranking itself is unchanged
