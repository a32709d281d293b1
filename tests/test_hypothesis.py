"""``hypothetical_passage``: the static graphs search with the question and a passage the model wrote
for it. A recording chat model checks the prompt and that retrieval ranks by the combined text, on
the real tiny collection; the embedded reader writes a real passage in the slow test."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage

from mia.graph import cli as mia_cli
from mia.graph.registry import load_graph
from mia.nodes import resources
from mia.nodes.context import context_from
from mia.nodes.hypothesis import MOST_TITLES, PASSAGE_TOKENS, book_titles

PASSAGE = "The fox led the wolf to the farmer's cellar, where the wolf ate until he could not squeeze out again."
QUESTION = "Who was stuck?"


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    """(prompt, max_tokens) of every call; the model writes PASSAGE, then answers "The wolf"."""
    sent: list[tuple[str, int | None]] = []
    asked: list[int | None] = []

    class Recording(GenericFakeChatModel):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            sent.append(("\n".join(m.text for m in messages), asked[-1]))
            return super()._generate(messages, *args, **kwargs)

    replies = iter([AIMessage(PASSAGE), AIMessage("The wolf")] * 4)

    def chat_model(ctx: Any, max_tokens: int | None = None) -> Recording:
        asked.append(max_tokens)
        return Recording(messages=replies)

    monkeypatch.setattr(resources, "chat_model", chat_model)
    return sent


@pytest.mark.parametrize("graph", ["rag", "mia_rag"])
def test_retrieval_ranks_by_the_question_and_the_written_passage(graph: str, tiny_collection, writer) -> None:
    def run(question: str, **settings: Any) -> dict[str, Any]:
        return load_graph(graph).invoke({"question": question}, context=context_from(
            graph, {"collection": tiny_collection.name, "retrieval_only": True, **settings}))

    plain = run(QUESTION)
    assert not writer and plain["usage"].get("llm_calls", 0) == 0
    guided = run(QUESTION, hypothetical_passage=True)
    prompt, max_tokens = writer[0]
    assert len(writer) == 1 and max_tokens == PASSAGE_TOKENS  # retrieval-only: the passage, no answer
    assert f"answers the question: {QUESTION}" in prompt and "<titles>" in prompt
    assert guided["question"] == QUESTION and guided["usage"]["by_node"]["hypothesize"]["llm_calls"] == 1
    combined = run(f"{QUESTION}\n{PASSAGE}")
    assert [r["id"] for r in guided["retrieved"]] == [r["id"] for r in combined["retrieved"]]
    assert guided["retrieved"] != plain["retrieved"]
    assert guided["retrieved"][0]["id"].startswith("fox-and-wolf")
    ctx = context_from(graph, {"collection": tiny_collection.name})
    assert guided["hypothesis"] == PASSAGE and plain["hypothesis"] == ""
    assert f"passage the model wrote for it (hypothetical_passage):\n  {PASSAGE}" in mia_cli._explain(tiny_collection.name, guided, ctx)
    assert "hypothetical_passage" not in mia_cli._explain(tiny_collection.name, plain, ctx)


def test_the_reader_gets_the_question_alone(tiny_collection, writer) -> None:
    state = load_graph("rag").invoke({"question": QUESTION}, context=context_from(
        "rag", {"collection": tiny_collection.name, "hypothetical_passage": True}))
    reader_prompt = writer[1][0]
    assert state["answer"].startswith("The wolf") and PASSAGE not in reader_prompt and QUESTION in reader_prompt
    assert state["usage"]["llm_calls"] == 2


def test_titles_name_each_book_once_and_a_library_by_its_first_titles(tiny_collection) -> None:
    assert book_titles(tiny_collection.store).splitlines() == [  # ingested without cards: the files' names
        "golden goose", "fox and wolf", "how molo stole the lovely rose red"]

    class Library:
        """A collection of seven books, cards for the odd ones."""
        books = [f"book-{n}" for n in range(MOST_TITLES + 2)]
        commits = type("Commits", (), {"ordered": lambda self: Library.books})()

        def book_units(self, books: list[str]) -> dict[str, Any]:
            return {b: type("Unit", (), {"card": json.dumps({"title": b.title(), "author": "A. Writer" if n % 3 else ""})})
                    for n, b in enumerate(books) if n % 2}

    assert book_titles(Library()).splitlines() == [
        "book 0", "Book-1 by A. Writer", "book 2", "Book-3", "book 4", "and 2 more"]


@pytest.mark.slow
def test_the_embedded_reader_writes_a_passage_and_answers(tiny_collection, embedded_model_file, cli) -> None:
    result = cli("ask", "Why did the fox trick the wolf?", "--collection", tiny_collection.name, "--graph", "rag",
                 "--json", "--set", "hypothetical_passage=true", "--set", "max_new_tokens=32")
    assert result.code == 0, result.err
    state = json.loads(result.out)
    written = state["usage"]["by_node"]["hypothesize"]
    assert state["usage"]["llm_calls"] == 2 and written["llm_calls"] == 1
    assert 0 < written["output_tokens"] <= PASSAGE_TOKENS and written["input_tokens"] > 40
    assert state["answer"].strip() and state["citations"]
