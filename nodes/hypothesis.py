"""A hypothetical passage to search with (HyDE, Gao et al. 2022), for the static graphs.

A reader's question names what it asks about, not the words the book answers in: "Who buys
Sunnybrook Farm?" is answered by a passage about "the railroad". The chat model, told which book the
question is about, writes a few sentences that could answer it; its guesses are often wrong, but they
are in the book's register and bring the words a passage that answers would use. Retrieval then
searches with the question and that passage together (the embedder and BM25 alike); the reader still
gets the question alone. On the 117 literaryqa dev questions it raised the share whose reference
words reach the reader by 4-5 points, but the 1.5B reader's answers only within noise, for about 3.4 s
more per answer; so it is off by default (evals/README.md, "A hypothetical passage to search with").
"""

from __future__ import annotations

import json
from typing import Any

from langgraph.runtime import Runtime

from mia import prompts
from mia.nodes import resources
from mia.nodes.answer import usage_of
from mia.nodes.context import StaticSettings
from mia.nodes.state import QAState
from mia.stores.mindscape import Mindscape

PASSAGE_TOKENS = 96
"""Enough for the two or three sentences asked for; a passage that runs on is cut, not waited for."""
FREQUENCY_PENALTY = 0.5
"""Fades a loop of the small model's ("the river ... the river ...") that would weigh one word in BM25."""
MOST_TITLES = 5
"""Titles named to the model; a library's hundredth title tells it nothing about the question."""


def hypothesize(state: QAState, runtime: Runtime[StaticSettings]) -> dict[str, Any]:
    """Under ``hypothetical_passage``, the passage the model writes for the question, which retrieval
    searches with after the question (``qa.search_text``); nothing otherwise."""
    ctx = runtime.context
    question = state["question"]
    if not ctx.hypothetical_passage:
        return {}
    titles = prompts.fence(book_titles(resources.mindscape(ctx)), tag="titles", guard=ctx.injection_guard)
    llm = resources.chat_model(ctx, PASSAGE_TOKENS).with_config(tags=["nostream"])
    reply = llm.invoke(prompts.messages("hypothesis", titles=titles, question=question),
                       frequency_penalty=FREQUENCY_PENALTY)
    return {"hypothesis": reply.text.strip(), "usage": usage_of(reply, "hypothesize")}


def book_titles(store: Mindscape) -> str:
    """"Title by Author" of the collection's first books, one a line, from their cards (the Project
    Gutenberg header); a book ingested without a card by its file's name."""
    books = store.commits.ordered()
    cards = {book: json.loads(unit.card) for book, unit in store.book_units(books[:MOST_TITLES]).items()}
    lines = [_title(cards[book]) if book in cards else book.replace("-", " ") for book in books[:MOST_TITLES]]
    more = len(books) - MOST_TITLES
    return "\n".join(lines + ([f"and {more} more"] if more > 0 else []))


def _title(card: dict[str, Any]) -> str:
    return f"{card['title']} by {card['author']}" if card.get("author") else card["title"]
