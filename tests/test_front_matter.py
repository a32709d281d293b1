"""A table of contents (and the title page before it) is front matter: recognised on the shared
books that have one, so it is neither retrieved nor cited; books without one keep their opening."""

from __future__ import annotations

import pytest

from mia.stores.front_matter import contents_end, find_body
from tests.conftest import shared_data

# (book, what its body now opens with): the first heading after the table.
WITH_CONTENTS = [
    ("books/holmes/a_study_in_scarlet.txt", "A STUDY IN SCARLET.\n\n\n\n\nPART I."),
    ("books/poirot/the_mysterious_affair_at_styles.txt", "CHAPTER I.\nI GO TO STYLES"),
    ("books/christie/the_secret_adversary.txt", "PROLOGUE\n\nIT was 2 p.m."),
    ("books/holmes/the_valley_of_fear.txt", "PART I\nThe Tragedy of Birlstone"),
    ("books/holmes/the_sign_of_the_four.txt", "Chapter I\nThe Science of Deduction"),
    ("literaryqa/texts/rebecca_of_sunnybrook_farm.txt", "I\n\n\"WE ARE SEVEN\""),
]
WITHOUT = ["books/austen/emma.txt", "literaryqa/texts/siddhartha.txt", "literaryqa/texts/the_picture_of_dorian_gray.txt",
           # A cast of characters in wrapped prose follows its table: nothing is cut rather than too much.
           "books/poirot/the_mystery_of_the_blue_train.txt",
           # A preface comes before its table: the book keeps both rather than lose the preface.
           "books/holmes/the_case_book_of_sherlock_holmes.txt"]


def _text(book: str) -> str:
    path = shared_data() / book
    if not path.is_file():
        pytest.skip(f"{path} is not in the shared data")
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(("book", "opening"), WITH_CONTENTS)
def test_a_table_of_contents_is_left_out(book: str, opening: str) -> None:
    text = _text(book)
    body = find_body(text)
    assert text[body.start:].lstrip().startswith(opening)
    assert "contents" in text[:body.start].lower() and body.end > body.start + len(text) // 2


@pytest.mark.parametrize("book", WITHOUT)
def test_a_book_without_one_keeps_its_opening(book: str) -> None:
    text = _text(book)
    body = find_body(text)
    assert contents_end(text, body.start, body.end) is None


def test_hand_made_tables() -> None:
    table = "Title\n\nContents\n\nI. The Start\nII. The Middle\nIII. The End\n\nI. The Start\n\nIt began.\n"
    assert table[contents_end(table, 0, len(table)):].startswith("I. The Start\n\nIt began.")
    # "Contents" in prose, followed by wrapped text: not a table.
    prose = "The contents\nContents\nof the box were\nthree apples and\na pear.\nThe contents\n"
    assert contents_end(prose, 0, len(prose)) is None
    # Fewer than three entries before a repeat, or no repeat at all: nothing is cut.
    assert contents_end("Contents\nOne\nOne\nTwo\n", 0, 21) is None
    assert contents_end("Contents\nOne\nTwo\nThree\nFour\n", 0, 28) is None
    # A table after a preface (more than a title page before it) is left alone, preface and all.
    prefaced = "A preface. " * 200 + "\n" + table
    assert contents_end(prefaced, 0, len(prefaced)) is None
