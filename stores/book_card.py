"""Book cards: a compact description of a whole book for a small reader model.

Retrieved chunks answer questions about a scene, not about the book: a chunk of a first-person novel
says "I … rooms" and nothing in it tells the reader that "I" is Dr. Watson. A card (title, author,
narrator, main characters with their aliases and roles, places, time, the plot in order, the most
named names) gives the reader that whole-book context in a few hundred tokens.

Two parts: what is computed from the text without a model (a proper-name index, the share of
first-person narration, the Project Gutenberg title and author), always; and, with a chat model,
one structured call that reads the book's opening, the name index and session summaries sampled
through the book, and writes the rest; the names it writes are checked against the book, since a
small model invents people and aliases a reader would trust. Model-made cards are cached with the session summaries, by
content, so re-ingesting an unchanged book never calls the model again.
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_left
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from mia import prompts
from mia.stores.chat import chat_model_name, json_call
from mia.stores.chunking import is_heading
from mia.stores.front_matter import find_body
from mia.stores.summaries import ABBREVIATED_TITLES, SummaryCache, cache_key, sentence_spans
from mia.stores.tokens import count_tokens, truncate

NAMES = "names-v1"
"""The model-free method: a card's ``method`` without a model, and part of every card's cache key
(the model's prompt holds the name index, so a new index method needs new cards)."""
GROUNDING = "grounding-v4"
"""The checks of a model's card against its book (``_Grounding``): part of the cache key, so a card
cached under other checks is made again."""
FIRST_PERSON_AT = 0.15
"""First-person share of narration pronouns from which a book counts as told in the first person.
Measured on the 26 shared books: the first-person ones (Watson's, Hastings's, Dr. Sheppard's)
score 0.24-0.53, their narrators still saying "he" and "she" of everyone else (A Study in Scarlet,
whose second part is told in the third person, 0.24); the third-person ones 0.00-0.05 (the "I" of
dialogue the quote pairing misses). The Valley of Fear, Watson's first part and a longer
third-person second, scores 0.09 and counts as third person."""
CARD_TOKENS = 350
"""The bound of :meth:`BookCard.text`: the card rides along with every question's context."""
OPENING_TOKENS = 1200
"""The book's opening in the prompt: title page, dedication, preface and first pages, where a
first-person narrator is most often named ("Reminiscences of John H. Watson, M.D.")."""
SUMMARY_TOKENS = 1500
"""Session summaries in the prompt, sampled evenly through the book: how the plot goes."""
SUMMARY_PIECE_TOKENS = 200
"""At most this much of each sampled summary, so one long summary cannot crowd out the others."""
REPLY_TOKENS = 450
"""The reply's bound; the schema's length limits keep a complete card under it."""

TITLES = ABBREVIATED_TITLES | frozenset({
    "Miss", "Lord", "Lady", "Sir", "Madame", "Monsieur", "Mademoiselle", "Captain", "Colonel", "Major", "General",
    "Inspector", "Professor", "Doctor", "Father", "Aunt", "Uncle", "Prince", "Princess", "King", "Queen", "Duke",
    "Duchess", "Count", "Countess", "Baron", "Baroness"})
"""Words that make the next capitalised word a name's part ("Mr. Holmes", "Lady Brandon"); never a
name alone. The abbreviated ones come from the sentence splitter, which lets their full stop go on."""
JOINERS = frozenset({"de", "du", "da", "di", "del", "della", "des", "la", "le", "of", "van", "von", "der", "den",
                     "ter", "y", "bin", "ibn"})
"""Lower-case words that join capitalised words into one name ("Bank of England", "Vincent van
Gogh"), only between two of them."""
STOPLIST = frozenset({
    "I", "God", "Chapter", "Part", "Book", "Volume", "Contents", "Preface", "Introduction", "Epilogue",
    "Prologue", "Appendix", "Finis", "End",
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
})
"""Capitalised words that are not names of people or places: calendar words, book structure."""

_WORD = re.compile(r"[^\W\d_](?:[\w'’-]*[^\W_])?")
# A sentence also starts at a paragraph start, which catches unpunctuated headings ("THE
# PREFACE\n\nThe artist ..."), and a quotation starts like one ("he said, “Good morning.”").
_PARAGRAPH = re.compile(r"\n[ \t]*\r?\n\s*")
_OPEN_QUOTE = re.compile(r"(?:[“‘]|(?:^|(?<=\s))\")$")
_RUN_GAP = re.compile(r"[ \t]*\r?\n?[ \t]*")
_DIALOGUE = re.compile(r"“[^”]*(?:”|$)|\"[^\"]*(?:\"|$)")
_FIRST = re.compile(r"\b(?:I|[Mm]e|[Mm]y|[Mm]ine|[Mm]yself)\b")
_THIRD = re.compile(r"\b(?:[Hh]e|[Ss]he|[Hh]im|[Hh]er|[Hh]is|[Hh]ers|[Hh]imself|[Hh]erself)\b")
_YEAR = re.compile(r"\b1[0-9]{3}\b|\b20[0-9]{2}\b")
_HEADER_FIELD = r"^[ \t]*{field}:[ \t]*(\S[^\n]*?)[ \t]*$"


@dataclass(frozen=True)
class NameEntry:
    """A proper name and where the book mentions it: how often says who matters, the offsets say
    where a character enters and leaves the story."""

    name: str
    mentions: int
    first: int
    last: int
    """Start offsets of the first and the last mention, into the text the index was built from."""


def _sentence_initial(body: str, starts: list[int]) -> set[int]:
    """Indices (into the word list whose starts are ``starts``) of words that begin a sentence, a
    paragraph or a quotation."""
    begins = [a for a, _ in sentence_spans(body)]
    begins += [m.end() for m in _PARAGRAPH.finditer(body)]
    # A sentence span may open with "(", "_" or a quote: its first word is the first one after.
    initial = {bisect_left(starts, a) for a in begins}
    initial.update(i for i, s in enumerate(starts) if _OPEN_QUOTE.search(body, max(0, s - 2), s))
    return initial


def _kind(word: str, after: str) -> str:
    """title, initial, name (a capitalised word), joiner or other; ``after`` is the next character."""
    if word in TITLES:
        return "title"
    if len(word) == 1 and word.isupper() and word != "I" and after == ".":
        return "initial"
    if re.match(r"I['’]", word):  # "I’ll", "I'm"
        return "other"
    if word[0].isupper() and any(c.islower() for c in word) and word not in STOPLIST:
        return "name"
    return "joiner" if word in JOINERS else "other"


def name_index(text: str, limit: int = 20) -> list[NameEntry]:
    """The most mentioned proper names of ``text``, most first (ties: first mentioned first).

    A name is a run of capitalised words on one line or across one line break, possibly with
    titles ("Mr.", "Lady"), initials ("John H. Watson") and joiners ("Bank of England") inside;
    possessives count as the name ("Holmes’s"). A capitalised word that starts a sentence (or a
    paragraph, or a quotation) counts as a name only if the book writes it capitalised
    mid-sentence more often than in lower case, so "The" and "When" are never names while
    "Holmes laughed." is a mention of Holmes. Variants are merged in one cheap way: a titled name
    ("Mr. Holmes", "Dr. Watson") counts toward the bare name when the bare name also occurs on its
    own; full names ("Sherlock Holmes") stay separate entries, for the model (or the reader) to see
    both. Only the book's body counts (Project Gutenberg's licence would rank "Project Gutenberg"
    first); offsets still point into ``text``.
    """
    body = find_body(text)
    segment = text[body.start:body.end]
    found_words = list(_WORD.finditer(segment))
    starts = [m.start() for m in found_words]
    words = [re.sub(r"['’]s$", "", m.group()) for m in found_words]
    dotted = [segment[m.end():m.end() + 1] == "." for m in found_words]
    kinds = [_kind(w, "." if d else "") for w, d in zip(words, dotted)]
    initial = _sentence_initial(segment, starts)
    lower = Counter(w for w in words if w[0].islower())
    capitalised_mid = Counter(w for i, (w, k) in enumerate(zip(words, kinds)) if k == "name" and i not in initial)
    for i in initial:
        if i < len(words) and kinds[i] == "name" and capitalised_mid[words[i]] <= lower[words[i].lower()]:
            kinds[i] = "other"  # "The", "When": capitalised only because a sentence starts with them

    def joinable(i: int) -> bool:
        """Only spaces and at most one line break since the previous word (and an abbreviation's dot)."""
        abbreviation = dotted[i - 1] and (kinds[i - 1] == "initial" or words[i - 1] in ABBREVIATED_TITLES)
        return _RUN_GAP.fullmatch(segment, found_words[i - 1].end() + abbreviation, starts[i]) is not None

    def label(i: int) -> str:
        abbreviation = dotted[i] and (kinds[i] == "initial" or words[i] in ABBREVIATED_TITLES)
        return words[i] + ("." if abbreviation else "")

    found: dict[str, list[int]] = {}
    run: list[int] = []

    def close() -> None:
        while run and kinds[run[-1]] != "name":  # a run ends with a name, never "of" or "Mr."
            run.pop()
        if run:
            found.setdefault(" ".join(label(i) for i in run), []).append(body.start + starts[run[0]])
        run.clear()

    for i, kind in enumerate(kinds):
        if kind == "other" or not (run and joinable(i)):
            close()
        if kind in ("name", "title", "initial") or (kind == "joiner" and run and kinds[run[-1]] in ("name", "joiner")):
            run.append(i)
    close()

    for name in list(found):
        parts = name.split()
        titled = next(k for k, part in enumerate(parts + [""]) if part.rstrip(".") not in TITLES)
        bare = " ".join(parts[titled:])
        if titled and bare in found:
            found[bare].extend(found.pop(name))
    entries = [NameEntry(name, len(at), min(at), max(at)) for name, at in found.items()]
    return sorted(entries, key=lambda e: (-e.mentions, e.first))[:limit]


def first_person_share(text: str) -> float:
    """Share of the narration's personal pronouns that are first-person singular (I, me, my, mine,
    myself) rather than third-person (he, she, him, her, his, hers, himself, herself); 0.0 without
    any.

    Dialogue is left out: characters say "I" in every novel. A quotation runs from an opening
    quote to its closing quote or to the end of its paragraph, where an unclosed quote ends by
    convention (a speech over several paragraphs reopens each one), so one missing quote cannot
    flip the rest of the book. Only the book's body counts, as in :func:`name_index`.
    """
    body = find_body(text)
    narration = " ".join(_DIALOGUE.sub(" ", p) for p in _PARAGRAPH.split(text[body.start:body.end]))
    first = len(_FIRST.findall(narration))
    third = len(_THIRD.findall(narration))
    return first / (first + third) if first + third else 0.0


@dataclass
class BookCard:
    """A book's card. Without a chat model only ``title`` and ``author`` (from a Project Gutenberg
    header, else the book's name), ``first_person`` and ``names`` are filled (method "names-v1");
    narrator, characters, places, time and outline need the model ("llm:<model>:<prompt version>:<checks>")."""

    book: str
    title: str
    author: str
    narrator: str
    first_person: bool
    characters: list[dict[str, Any]] = field(default_factory=list)
    places: list[str] = field(default_factory=list)
    time: str = ""
    outline: list[str] = field(default_factory=list)
    names: list[NameEntry] = field(default_factory=list)
    method: str = NAMES

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str) -> BookCard:
        values = json.loads(data)
        values["names"] = [NameEntry(**entry) for entry in values["names"]]
        return cls(**values)

    def text(self, max_tokens: int = CARD_TOKENS) -> str:
        """The card as the reader sees it, within ``max_tokens``: the most-named list, then the
        plot's last steps, then the minor characters give way first."""
        characters, outline, names = len(self.characters), len(self.outline), min(len(self.names), 12)
        while True:
            card = self._render(characters, outline, names)
            if count_tokens(card) <= max_tokens:
                return card
            if names > 5:
                names -= 1
            elif outline > 3:
                outline -= 1
            elif characters > 3:
                characters -= 1
            elif names or outline or characters:
                names, outline, characters = max(names - 1, 0), max(outline - 1, 0), max(characters - 1, 0)
            else:
                return truncate(card, max_tokens)

    def _render(self, characters: int, outline: int, names: int) -> str:
        lines = [f"Title: {self.title}", f"Author: {self.author}"]
        person = "first person" if self.first_person else "third person"
        if self.narrator:
            lines.append(f"Narrator: {self.narrator} ({person})")
        else:
            lines.append(f"Narration: {person}" + (", narrator not identified" if self.first_person else ""))
        if characters:
            lines.append("Main characters: " + "; ".join(_character(c) for c in self.characters[:characters]))
        if self.places:
            lines.append("Places: " + "; ".join(self.places))
        if self.time:
            lines.append(f"Time: {self.time}")
        if outline:
            lines.append("Plot: " + " ".join(f"{n}. {step}" for n, step in enumerate(self.outline[:outline], 1)))
        if names:
            lines.append("Most named: " + ", ".join(f"{e.name} ({e.mentions})" for e in self.names[:names]))
        return "\n".join(lines)


def _character(entry: dict[str, Any]) -> str:
    details = [entry.get("role", "")] + [f"also '{a}'" for a in entry.get("aliases", []) if a]
    details = [d for d in details if d]
    return entry["name"] + (f" ({'; '.join(details)})" if details else "")


class _Character(BaseModel):
    name: str = Field(json_schema_extra={"maxLength": 40})
    role: str = Field(json_schema_extra={"maxLength": 60})
    aliases: list[str] = Field(json_schema_extra={"maxItems": 2, "items": {"type": "string", "maxLength": 30}})


class _Reply(BaseModel):
    """The model's card. The length limits live in the JSON schema only: they bound llama.cpp's
    grammar, so a complete reply fits :data:`REPLY_TOKENS`, while an endpoint that writes longer
    strings is still parsed (:meth:`BookCard.text` bounds what the reader sees)."""

    narrator: str = Field(json_schema_extra={"maxLength": 60})
    title: str = Field(json_schema_extra={"maxLength": 80})
    author: str = Field(json_schema_extra={"maxLength": 60})
    characters: list[_Character] = Field(json_schema_extra={"maxItems": 6})
    places: list[str] = Field(json_schema_extra={"maxItems": 4, "items": {"type": "string", "maxLength": 40}})
    time: str = Field(json_schema_extra={"maxLength": 60})
    outline: list[str] = Field(json_schema_extra={"maxItems": 5, "items": {"type": "string", "maxLength": 140}})


def _header(text: str, name: str) -> str:
    """A Project Gutenberg header line ("Title: A Study in Scarlet"), searched before the body."""
    body = find_body(text)
    found = re.search(_HEADER_FIELD.format(field=name), text[:body.start] or text[:5000], flags=re.MULTILINE)
    return found.group(1) if found else ""


def _sample(summaries: list[str], budget: int = SUMMARY_TOKENS) -> list[tuple[int, str]]:
    """(part number, summary) for as many summaries as fit ``budget``, evenly spaced through the
    book, so the plot is seen from beginning to end rather than its first parts in full."""
    pieces = [truncate(s.strip(), SUMMARY_PIECE_TOKENS) for s in summaries]
    sizes = [count_tokens(p) for p in pieces]
    for k in range(len(pieces), 0, -1):
        picked = sorted({round(i * (len(pieces) - 1) / max(k - 1, 1)) for i in range(k)})
        if sum(sizes[i] for i in picked) <= budget:
            return [(i + 1, pieces[i]) for i in picked]
    return []


class _Grounding:
    """Names a small model wrote, checked against the book: it invents people ("Holster") and
    aliases ("Sherlock Holmes Holmes") that a reader would then trust."""

    def __init__(self, text: str) -> None:
        self.lowered = text.lower()
        self.words = set(_WORD.findall(self.lowered))
        self.flat = " ".join(self.lowered.split())
        self.words_and_numbers = set(re.findall(r"\w+", self.lowered))

    def name(self, name: str) -> bool:
        """Every word of the name occurs in the book ("Dr. John Watson" for "JOHN H. WATSON, M.D.")."""
        words = _WORD.findall(name.lower())
        return bool(words) and all(w in self.words for w in words)

    def copied(self, sentence: str, run: int = 8) -> bool:
        """Whether the sentence quotes ``run`` or more consecutive words of the book: a small model
        asked for the plot in its own words copies the opening instead, which is no outline."""
        words = sentence.lower().split()
        return any(" ".join(words[i:i + run]) in self.flat for i in range(len(words) - run + 1))

    def years(self, text: str) -> bool:
        """Every year ``text`` names occurs in the book: a small model makes up a time ("1919-1920")."""
        return all(year in self.words_and_numbers for year in _YEAR.findall(text))

    def alias(self, alias: str, name: str) -> bool:
        """The alias occurs in the book as written, and is not the name itself."""
        alias = " ".join(alias.split()).lower()
        return bool(alias) and alias != " ".join(name.split()).lower() and alias in self.lowered


def _characters(reply: list[_Character], grounded: _Grounding) -> list[dict[str, Any]]:
    """The model's characters that the book names, each once: a character whose name is part of an
    earlier one's ("Dorian" after "Dorian Gray") becomes its alias, another character's name is no
    alias, and a role every character shares (a small model repeats the first) is dropped."""
    people: list[dict[str, Any]] = []
    for c in reply:
        name = " ".join(c.name.split())
        if not grounded.name(name):
            continue
        same = next((p for p in people if set(name.lower().split()) <= set(p["name"].lower().split())), None)
        if same is None:
            people.append({"name": name, "role": " ".join(c.role.split()), "aliases": list(c.aliases)})
        else:
            same["aliases"].insert(0, name)
    names = {p["name"].lower() for p in people}
    roles = Counter(p["role"].lower() for p in people)
    # An alias the model gives two characters names neither for sure (a small model repeats one
    # alias down the list: "also 'Miss Maxwell'" for four people).
    claimed = Counter(a for p in people for a in {" ".join(a.split()).lower() for a in p["aliases"]})
    for p in people:
        p["role"] = p["role"] if roles[p["role"].lower()] == 1 else ""
        aliases = [" ".join(a.split()) for a in p["aliases"]]
        p["aliases"] = [a for n, a in enumerate(aliases) if grounded.alias(a, p["name"])
                        and a.lower() not in names and a not in aliases[:n] and claimed[a.lower()] == 1]
    return people


def _is_author(name: str, author: str) -> bool:
    """Whether ``name`` shares the author's surname: a small model names the author as the narrator
    (Agatha Christie for Hastings), and the title page names the author in the body too. A memoir's
    narrator is its author, and then the card says the narrator is not identified, not a wrong one."""
    surname = _WORD.findall(author.lower())[-1:]
    return bool(surname) and surname[0] in _WORD.findall(name.lower())


def _opening(text: str, budget: int = OPENING_TOKENS) -> str:
    """The body's first ``budget`` tokens without its table of contents (a block of four or more
    heading lines): a small model copies a contents list into the plot instead of reading on."""
    body = find_body(text)
    blocks = [b.strip() for b in _PARAGRAPH.split(text[body.start:body.end]) if b.strip()]
    kept = [b for b in blocks if not (len(lines := b.splitlines()) >= 4 and all(is_heading(line) for line in lines))]
    return truncate("\n\n".join(kept), budget)


def _model_free(book: str, text: str, share: float) -> BookCard:
    return BookCard(book=book, title=_header(text, "Title") or book, author=_header(text, "Author"), narrator="",
                    first_person=share >= FIRST_PERSON_AT, names=name_index(text))


def llm_method(model_name: str) -> str:
    """A model card's provenance: the model, its prompt and the checks its names passed, so a card
    made under older checks is no longer current (ingestion makes it again)."""
    return f"llm:{model_name}:{prompts.version('book_card')}:{GROUNDING}"


def build_card(book: str, text: str, summaries: list[str], llm: BaseChatModel | None,
               cache: SummaryCache | None = None) -> tuple[BookCard, dict[str, int]]:
    """The book's card and the token usage it cost (``input_tokens``, ``output_tokens``,
    ``llm_calls``).

    The model-free parts are always computed (milliseconds). With a model, one call fills in the
    rest, from the opening, the name index and sampled summaries; a reply that does not parse
    gives the model-free card, its method saying which model failed, so ingestion never stops on a
    small model's bad JSON. Model-made cards, failed ones included (the call is deterministic and
    would fail again), are cached by the text, the summaries and the method.
    """
    usage = {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0}
    share = first_person_share(text)
    card = _model_free(book, text, share)
    if llm is None:
        return card, usage
    method = llm_method(chat_model_name(llm))
    digest = hashlib.sha256((text + "\n".join(summaries)).encode()).hexdigest()
    key = cache_key(digest, f"{method}|{NAMES}|{GROUNDING}")
    if cache is not None and (cached := cache.get(key)) is not None:
        return BookCard.from_json(cached), usage

    parts = _sample(summaries)
    messages = prompts.messages(
        "book_card",
        book=book,
        title=card.title,
        author=card.author or "unknown",
        share=f"{share:.0%}",
        person="first" if card.first_person else "third",
        names=prompts.fence(", ".join(f"{e.name} ({e.mentions})" for e in card.names),
                            tag="names"),
        opening=prompts.fence(_opening(text), part="opening"),
        summaries=prompts.fence("\n".join(f"[part {n} of {len(summaries)}] {s}" for n, s in parts),
                                part="summaries") if parts else "(no summaries)",
    )
    bounded = llm.model_copy(update={"max_tokens": REPLY_TOKENS}) if "max_tokens" in type(llm).model_fields else llm
    reply, message = json_call(bounded, messages, _Reply)
    used = message.usage_metadata or {}
    usage = {"input_tokens": used.get("input_tokens", 0), "output_tokens": used.get("output_tokens", 0), "llm_calls": 1}
    if reply is None:
        card.method = f"{NAMES} ({method} unparseable)"
    else:
        if card.title == book:  # a Gutenberg header's title and author are the file's own word
            card.title = reply.title.strip() or book
        card.author = card.author or reply.author.strip()
        # Checked against the body: a name only the title page holds is the author's, and a small
        # model names the author as the narrator (Agatha Christie for Hastings).
        body = find_body(text)
        grounded = _Grounding(text[body.start:body.end])
        # The measure outweighs a small model, which names the author as a third-person book's narrator.
        card.narrator = (reply.narrator.strip() if card.first_person and grounded.name(reply.narrator)
                         and not _is_author(reply.narrator, card.author) else "")
        card.characters = _characters(reply.characters, grounded)
        places = [" ".join(p.split()) for p in reply.places]
        card.places = [p for n, p in enumerate(places) if p and grounded.name(p)
                       and p.lower() not in {q.lower() for q in places[:n]}]
        card.time = reply.time.strip() if grounded.years(reply.time) else ""
        card.outline = [s.strip() for s in reply.outline if s.strip() and not grounded.copied(s)]
        card.method = method
    if cache is not None:
        cache.put(key, card.to_json())
    return card, usage


CardMode = Literal["llm", "names", "none"]
"""How ingestion writes book cards: with the chat model, without a model (names, narration), or not."""
DEFAULT_CARDS: CardMode = "names"
"""Without a model: milliseconds a book, so every collection has a card to show; the chat model's
card costs about a minute a book with the embedded model and is asked for with ``--cards llm``."""
