"""The names level's builder: one unit per book saying who is who, without a model.

Readers ask about the book as a whole ("who is Rebecca's best friend?"), and no passage retrieved
for such a question need hold the answer. The book's main names (``book_card.name_index``), each with
how often it is mentioned, where in the story it first and last appears, and the names it appears
with most (in the same chunk) say much of who is who. Written after the book is committed, like the
book level, for the book version its hash names; embedded, so the signature can select it.
"""

from __future__ import annotations

import re
from collections import Counter

from mia.stores.book_card import name_index
from mia.stores.embeddings import Embedder
from mia.stores.mindscape import Mindscape
from mia.stores.ingest.options import write_book_units
from mia.stores.units import Level

NAMES = 12
"""Main names per book in its unit."""
WITH = 3
"""Names each is shown with."""


def render(book: str, text: str, chunk_texts: list[str], start: int, end: int) -> str:
    """The unit's text: the book's main names, most mentioned first, each with its mentions, its
    first and last place in the book (as a share of the story) and the names it shares chunks with most."""
    entries = name_index(text, NAMES)
    header = f"Who is who in {book} (its most named names, where they appear in the story, and with whom):"
    if not entries:
        return f"{header}\nno name is mentioned often."
    span = max(end - start, 1)
    # Longest first, each found mention blanked, so "Jane" is not counted inside "Emma Jane".
    patterns = {e.name: re.compile(rf"(?<!\w){re.escape(e.name)}(?!\w)") for e in sorted(entries, key=lambda e: -len(e.name))}
    together: dict[str, Counter[str]] = {e.name: Counter() for e in entries}
    for chunk in chunk_texts:
        present = []
        for name, pattern in patterns.items():
            chunk, found = pattern.subn(" ", chunk)
            present += [name] if found else []
        for name in present:
            together[name].update(other for other in present if other != name)
    lines = [header]
    for e in entries:
        where = f"{100 * (e.first - start) // span}% to {100 * (e.last - start) // span}% of the story"
        often = ", ".join(name for name, _ in together[e.name].most_common(WITH))
        lines.append(f"{e.name}: {e.mentions} mentions, {where}" + (f"; most often with {often}." if often else "."))
    return "\n".join(lines)


def build(store: Mindscape, embedder: Embedder) -> int:
    """Give every committed book a current names unit; a book whose unit is current is skipped, so
    a rerun writes nothing. Returns how many units were written."""
    current = store.book_units(level=Level.NAMES)
    records = store.commits.committed()
    texts = {}
    for book in (b for b in store.commits.ordered() if b not in current):
        text = store.book_text(book)
        start, end = int(records[book].get("body_start", 0)), int(records[book].get("body_end", 0)) or len(text)
        chunks = [r["text"] for r in store.chunk_records(store.book_chunk_ids(book))]
        texts[book] = render(book, text, chunks, start, end)
    write_book_units(store, Level.NAMES, texts, embedder)
    return len(texts)
