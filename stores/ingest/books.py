"""The book level's builder: one unit over each whole book, its card (``stores.book_card``) as text.

Run after the books are committed, so a card never delays the chunks a first answer reads; so the
unit cannot share its book's commit: it carries the hash of the book version it was made for, and
readers ignore a stale one. The unit row holds the card (JSON) and its one rendering
(``BookCard.text``), which is what the signature selects and embeds, the reader reads, and `mia ls`,
``--explain`` and the web page show.
"""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel
from tqdm import tqdm

from mia.stores import book_card
from mia.stores.book_card import BookCard, llm_method
from mia.stores.chat import chat_model_name
from mia.stores.embeddings import Embedder
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import SummaryCache
from mia.stores.ingest.options import write_book_units
from mia.stores.units import Level, session_id


def build(store: Mindscape, llm: BaseChatModel | None, embedder: Embedder, cache: SummaryCache | None = None,
          progress: bool = False) -> dict[str, int]:
    """Give every committed book of ``store`` a current unit, its card made with ``llm`` (None:
    model-free). A book whose unit is current (made for this version of the book, by this method)
    is skipped, so a rerun writes nothing, and a changed book gets a new one. Returns the summed
    token usage of the cards."""
    made = {book: BookCard.from_json(unit.card).method for book, unit in store.book_units().items()}
    # Any current card serves a model-free request; a model's request wants that model's card (or
    # its recorded failure, "names-v1 (llm:… unparseable)", which a rerun would only repeat).
    wanted = None if llm is None else llm_method(chat_model_name(llm))
    records = store.commits.committed()
    usage = {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0}
    books = [b for b in store.commits.ordered() if b not in made or (wanted is not None and wanted not in made[b])]
    cards: list[BookCard] = []
    for book in tqdm(books, desc="book cards", unit="book", disable=not progress or not books):
        sessions = [session_id(book, j) for j in range(int(records[book].get("summaries", 0)))]
        summaries = [r["text"] for r in store.summary_records(sessions)]
        card, used = book_card.build_card(book, store.book_text(book), summaries, llm, cache or SummaryCache())
        cards.append(card)
        usage = {k: usage[k] + used[k] for k in usage}
    write(store, cards, embedder)
    return usage


def write(store: Mindscape, cards: list[BookCard], embedder: Embedder) -> None:
    """Store each card as its book's unit: the card's one rendering, embedded, and the card."""
    write_book_units(store, Level.BOOK, {card.book: card.text() for card in cards}, embedder,
                     {card.book: {"card": card.to_json()} for card in cards})
