"""Book cards: the model-free name index and narration measure on hand-made text, the card's JSON and
its token bound, the cache and the fallback with scripted chat models, and one slow test where the
embedded model writes the card of A Study in Scarlet."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import BaseMessage

from mia.stores.book_card import (
    CARD_TOKENS,
    FIRST_PERSON_AT,
    NAMES,
    BookCard,
    NameEntry,
    build_card,
    first_person_share,
    name_index,
)
from mia.stores.summaries import SummaryCache
from mia.stores.tokens import count_tokens
from tests.conftest import shared_data

STUDY = shared_data() / "books" / "holmes" / "a_study_in_scarlet.txt"

PARAGRAPH = ("Mr. Holmes met Watson in London. Then Holmes left. The doctor stayed with Lady Brandon of Ashby. "
             "Watson said that Sherlock Holmes was odd.")

BOOK = """The Project Gutenberg eBook of Tiny Tale

Title: Tiny Tale

Author: Jane Doe

*** START OF THE PROJECT GUTENBERG EBOOK TINY TALE ***

TINY TALE

I came to the inn at Dunmore late. Mr. Brown kept it, and my room was cold. I asked Brown for a
fire, and he said, “There is no wood, Mr. Hale.” I told Brown that I would pay. Brown went out to Ellen
Grey, his neighbour, and came back with wood.

*** END OF THE PROJECT GUTENBERG EBOOK TINY TALE ***

Project Gutenberg is a registered trademark. Project Gutenberg volunteers. Project Gutenberg.
"""

REPLY = {
    "narrator": "Mr. Hale", "title": "Tiny Tale", "author": "Jane Doe",
    "characters": [{"name": "Mr. Brown", "role": "the innkeeper", "aliases": ["Brown", "Brown Brown"]},
                   {"name": "Ellen Grey", "role": "his neighbour", "aliases": ["Mr. Brown"]},
                   {"name": "Holster", "role": "invented", "aliases": []},
                   {"name": "Ellen", "role": "the neighbour", "aliases": []}],
    "places": ["Dunmore"], "time": "winter",
    "outline": ["A traveller reaches a cold inn.", "Brown fetches wood from his neighbour."],
}


class ScriptedChat(FakeListChatModel):
    """A fake chat model that records the prompts it is given: how the tests count model calls."""

    prompts: list[list[BaseMessage]] = []

    def _call(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> str:
        self.prompts.append(messages)
        return super()._call(messages, *args, **kwargs)


def scripted(*replies: str) -> ScriptedChat:
    return ScriptedChat(responses=list(replies), prompts=[])


def test_name_index_counts_mid_sentence_runs_and_merges_titled_names() -> None:
    index = {e.name: e for e in name_index(PARAGRAPH)}
    holmes = PARAGRAPH.index("Holmes left")
    assert index["Holmes"] == NameEntry("Holmes", 2, PARAGRAPH.index("Mr. Holmes"), holmes)  # "Mr. Holmes" merged
    assert index["Watson"] == NameEntry("Watson", 2, PARAGRAPH.index("Watson"), PARAGRAPH.rindex("Watson"))
    assert index["Lady Brandon of Ashby"].mentions == 1  # a title and a joiner inside one run
    assert index["Sherlock Holmes"].first == PARAGRAPH.index("Sherlock")
    assert "Then" not in index and "The" not in index  # capitalised only at a sentence start
    assert [e.name for e in name_index(PARAGRAPH)][:2] == ["Holmes", "Watson"]  # ties: first mentioned first
    assert len(name_index(PARAGRAPH, limit=3)) == 3


def test_name_index_reads_the_body_and_skips_calendar_words_and_contractions() -> None:
    text = BOOK.replace("late.", "late on a Monday in May. I’ll stay, I said.")
    names = [e.name for e in name_index(text)]
    assert names[0] == "Brown"
    assert "Ellen Grey" in names and "Dunmore" in names
    assert not {"Project Gutenberg", "Monday", "May", "I’ll", "I", "TINY TALE"} & set(names)
    entry = name_index(text)[0]
    assert text[entry.first:].startswith("Mr. Brown") and text[entry.last:].startswith("Brown went")


def test_first_person_share_counts_narration_not_dialogue() -> None:
    first = "I walked home. My friend met me. “He is late,” she said. \"He always is,\" said I."
    assert first_person_share(first) == pytest.approx(4 / 5)  # I, My, me, I against she
    third = "He walked home. “I am tired, my dear,” he said. \"Me too,\" she smiled at him."
    assert first_person_share(third) == 0.0
    assert first_person_share("No pronouns here.") == 0.0
    assert first_person_share(first) >= FIRST_PERSON_AT > first_person_share(third)


def card() -> BookCard:
    return BookCard(
        book="tiny", title="Tiny Tale", author="Jane Doe", narrator="the traveller", first_person=True,
        characters=[{"name": f"Person {n}", "aliases": [f"P{n}"], "role": "someone in the story " * 3}
                    for n in range(8)],
        places=["Dunmore", "the inn"], time="winter",
        outline=["A long step of the plot that goes on and on with many words in it. " * 3] * 6,
        names=[NameEntry(f"Name{n}", 50 - n, n, 100 + n) for n in range(20)], method="llm:fake:0123",
    )


def test_card_round_trips_through_json_and_its_text_keeps_the_bound() -> None:
    full = card()
    assert BookCard.from_json(full.to_json()) == full
    assert json.loads(full.to_json())["names"][0] == {"name": "Name0", "mentions": 50, "first": 0, "last": 100}
    text = full.text()
    assert count_tokens(text) <= CARD_TOKENS
    assert text.startswith("Title: Tiny Tale\nAuthor: Jane Doe\nNarrator: the traveller (first person)\n")
    assert "Person 0 (someone in the story" in text and "also 'P0'" in text and "Most named: Name0 (50)" in text


def test_without_a_model_the_card_has_the_header_narration_and_names() -> None:
    built, usage = build_card("tiny", BOOK, ["summary"], None)
    assert (built.title, built.author, built.first_person, built.method) == ("Tiny Tale", "Jane Doe", True, NAMES)
    assert built.names[0].name == "Brown" and not built.narrator and not built.characters
    assert usage == {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0}
    assert "Narration: first person, narrator not identified" in built.text()
    headless, _ = build_card("plain", "He went home. Anna Karl waved at him.", [], None)
    assert (headless.title, headless.author, headless.first_person) == ("plain", "", False)


def test_the_model_card_is_grounded_fenced_and_cached(tmp_path: Path) -> None:
    cache = SummaryCache(tmp_path / "cache.sqlite")
    llm = scripted(json.dumps(REPLY), json.dumps({**REPLY, "narrator": "Captain Nemo"}))
    built, usage = build_card("tiny", BOOK, ["Brown fetches wood.", "The end."], llm, cache)
    assert usage["llm_calls"] == 1 and built.method.startswith("llm:")
    assert built.narrator == "Mr. Hale" and built.places == ["Dunmore"]
    # invented people and aliases, and another character's name as an alias, are left out; a part
    # of an earlier character's name is that character's alias
    assert built.characters == [{"name": "Mr. Brown", "role": "the innkeeper", "aliases": ["Brown"]},
                                {"name": "Ellen Grey", "role": "his neighbour", "aliases": ["Ellen"]}]
    prompt = "\n".join(m.text for m in llm.prompts[0])
    assert '<source part="opening">' in prompt and "Brown (4)" in prompt
    assert "[part 1 of 2] Brown fetches wood." in prompt
    assert "who is \"I\"?" in prompt and "Project Gutenberg is a registered" not in prompt

    again, usage = build_card("tiny", BOOK, ["Brown fetches wood.", "The end."], llm, cache)
    assert again == built and usage["llm_calls"] == 0 and len(llm.prompts) == 1
    changed, _ = build_card("tiny", BOOK.replace("cold", "damp"), ["Brown fetches wood.", "The end."], llm, cache)
    assert len(llm.prompts) == 2 and changed.narrator == ""  # a narrator the book never names is left out


def test_the_author_shared_aliases_and_unknown_or_repeated_places_are_left_out() -> None:
    reply = {**REPLY, "narrator": "Jane Doe",
             "characters": [{"name": "Mr. Brown", "role": "the innkeeper", "aliases": ["Mr. Hale", "Brown"]},
                            {"name": "Ellen Grey", "role": "his neighbour", "aliases": ["Mr. Hale"]}],
             "places": ["Dunmore", "dunmore", "Atlantis", "the inn"]}
    built, _ = build_card("tiny", BOOK, [], scripted(json.dumps(reply)))
    assert built.first_person and built.narrator == ""  # the author's name is on the title page only
    in_body = BOOK.replace("TINY TALE\n\nI came", "TINY TALE\n\nby Jane Doe\n\nI came")
    assert "by Jane Doe" in in_body
    assert build_card("tiny", in_body, [], scripted(json.dumps(reply)))[0].narrator == ""  # nor the author named in it
    assert built.characters == [{"name": "Mr. Brown", "role": "the innkeeper", "aliases": ["Brown"]},
                                {"name": "Ellen Grey", "role": "his neighbour", "aliases": []}]
    assert built.places == ["Dunmore", "the inn"]


def test_a_third_person_book_has_no_narrator_whatever_the_model_says() -> None:
    text = "He came to the inn late. Brown kept it, and his room was cold. Brown went out for wood."
    built, _ = build_card("inn", text, [], scripted(json.dumps({**REPLY, "narrator": "Brown"})))
    assert not built.first_person and built.narrator == "" and built.text().splitlines()[2] == "Narration: third person"


def test_an_unparseable_reply_gives_the_model_free_card() -> None:
    built, usage = build_card("tiny", BOOK, [], scripted("the narrator is Brown, I think"))
    assert built.method.startswith(f"{NAMES} (llm:") and "unparseable" in built.method
    assert built.names[0].name == "Brown" and not built.narrator and usage["llm_calls"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not STUDY.is_file(), reason=f"shared books not found under {STUDY.parent}; set MIA_DATA")
def test_the_embedded_model_names_watson_as_the_narrator(embedded_model_file: Path) -> None:
    from mia.stores.chat import load_chat_model
    from mia.stores.front_matter import find_body

    text = STUDY.read_text(encoding="utf-8")
    body = find_body(text)
    paragraphs = [p.strip() for p in text[body.start:body.end].split("\n\n")
                  if len(p.strip()) > 200 and sum(c.islower() for c in p) > 0.6 * len(p)]
    summaries = [" ".join(p.split()) for p in paragraphs[::40]]  # extractive stand-ins, through the book
    started = time.perf_counter()
    built, usage = build_card("a_study_in_scarlet", text, summaries, load_chat_model(), None)
    print(f"\ncard in {time.perf_counter() - started:.1f}s, {usage}\n{built.text()}")
    assert built.method.startswith("llm:") and built.first_person
    assert "Watson" in built.narrator
    named = [c["name"] for c in built.characters] + [e.name for e in built.names]
    assert any("Sherlock Holmes" in name for name in named)
    assert count_tokens(built.text()) <= CARD_TOKENS


def test_ingestion_writes_cards_last_reuses_them_and_rewrites_them_when_the_book_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """`mia ingest --cards names`: each committed book gets a card for its version; an unchanged
    rerun builds none; a changed book gets a new one; `mia ls` shows it."""
    from mia.stores import book_card
    from mia.stores.mindscape import Mindscape
    from mia.stores.units import book_unit_id

    built: list[str] = []
    real = book_card.build_card

    def counting(book: str, *args: Any, **kwargs: Any) -> Any:
        built.append(book)
        return real(book, *args, **kwargs)

    monkeypatch.setattr(book_card, "build_card", counting)
    # A store of its own: `mia ls` below must list this collection only, whatever other tests ingested.
    monkeypatch.setenv("MIA_CHROMA_PATH", str(tmp_path / "chroma"))
    source = tmp_path / "tiny_tale.txt"
    source.write_text(BOOK, encoding="utf-8")
    assert cli("ingest", str(source), "--collection", "cards-test", "--cards", "names", "--quiet").code == 0
    store = Mindscape("cards-test")
    card = BookCard.from_json(store.book_units()["tiny-tale"].card)
    assert built == ["tiny-tale"] and card.title == "Tiny Tale" and card.method == NAMES
    assert store.book_units(["tiny-tale"])["tiny-tale"].id == book_unit_id("tiny-tale")  # the level above the sessions
    assert cli("ingest", str(source), "--collection", "cards-test", "--cards", "names", "--quiet").code == 0
    assert built == ["tiny-tale"]  # current: not built again
    source.write_text(BOOK.replace("Tiny Tale", "Small Tale"), encoding="utf-8")
    assert cli("ingest", str(source), "--collection", "cards-test", "--cards", "none", "--quiet").code == 0
    assert Mindscape("cards-test").book_units() == {}  # the card (unit) of the old version is not served
    listing = cli("ls")
    assert "card:" not in listing.out
    assert cli("ingest", str(source), "--collection", "cards-test", "--cards", "names", "--quiet").code == 0
    assert built == ["tiny-tale", "tiny-tale"]
    assert BookCard.from_json(Mindscape("cards-test").book_units()["tiny-tale"].card).title == "Small Tale"
    unit = Mindscape("cards-test").summary_records([book_unit_id("tiny-tale")])
    assert unit and unit[0]["text"].startswith("Title: Small Tale")
    explained = cli("ask", "Who keeps the inn?", "--collection", "cards-test", "--explain", "--set", "book_card=true",
                    "--set", "retrieval_only=true")
    assert explained.code == 0, explained.err
    assert "Book cards given to the generator:\n  Title: Small Tale" in explained.out
    assert "card: Title: Small Tale" in cli("ls").out
    assert cli("rm", "cards-test").code == 0


def test_an_outline_step_copied_from_the_book_and_a_made_up_year_are_dropped() -> None:
    from mia.stores.book_card import _Grounding

    grounded = _Grounding("In the year 1878 I took my degree of Doctor of Medicine of the University of London, and went on.")
    assert grounded.copied("In the year 1878 I took my degree of Doctor of Medicine")  # eight words and more, verbatim
    assert not grounded.copied("Watson takes his medical degree in London in 1878.")  # own words
    assert grounded.years("1878") and grounded.years("late Victorian London") and not grounded.years("1919-1920")
