"""Answer generation shared by every graph: prompt assembly, answer formats, citations, usage."""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

from mia import prompts
from mia.nodes.context import AnswerFormat, CommonSettings, PassageOrder, RetrievalSettings
from mia.nodes.state import merge_usage
from mia.prompts import injection
from mia.stores.bm25 import tokenize
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import sentence_spans
from mia.stores.tokens import count_tokens
from mia.stores.units import Level

FORMAT_RULES: dict[str, str] = {
    "open": "Answer with a short phrase of a few words, then cite the passages you used as [1], [2], ... "
    "If the material does not contain the answer, say so briefly.",
    "choice": "Answer with the letter of the correct option only.",
    "verify": "Answer TRUE if the claim is supported by the material and FALSE otherwise, with that one word only.",
}
NO_RELIABLE_ANSWER = "The passages give no reliable answer: the only matching text reads as an instruction, not as content."
NOTHING_FOUND = "Nothing found: the source was read, and nothing in it was kept as relevant to the question."
_CITE = re.compile(r"\[(\d{1,3})\]")
LETTERS = "ABCDEFGHIJ"


def options_for(state: dict[str, Any], ctx: CommonSettings) -> list[str]:
    """Answer options matter only to multiple choice; on a thread they may be an earlier turn's."""
    return list(state.get("options") or []) if ctx.answer_format == "choice" else []


def usage_of(message: BaseMessage, node: str) -> dict[str, Any]:
    """One LLM call's usage, in the shape the ``usage`` state reducer adds up."""
    meta = getattr(message, "usage_metadata", None) or {}
    counts = {"llm_calls": 1, "input_tokens": int(meta.get("input_tokens", 0)), "output_tokens": int(meta.get("output_tokens", 0))}
    return {**counts, "by_node": {node: dict(counts)}}


def reading_order(chunks: Sequence[dict[str, Any]], order: PassageOrder,
                  books: Callable[[], Sequence[str]]) -> list[dict[str, Any]]:
    """The chunks as the generator reads them. ``document`` restores story order (DOS RAG, arXiv
    2506.03989): a reader follows events, and who "I" is, better in the order they were written than
    in score order. ``books`` gives the collection's book order (asked only for that order); a book
    missing from it goes last, by name."""
    if order == "score":
        return list(chunks)
    rank = {book: n for n, book in enumerate(books())}
    return sorted(chunks, key=lambda c: (rank.get(c["book"], len(rank)), c["book"], int(c["start"])))


def passages_block(chunks: Sequence[dict[str, Any]], guard: bool = True) -> str:
    """Chunks numbered [1]..[n] with their book and position, each fenced as data."""
    return "\n".join(
        prompts.fence(c["text"], guard=guard, cut=injection.decode(c.get("guard_cut", "")), n=i + 1, book=c["book"],
                      position=f"chunk {c['index']}")
        for i, c in enumerate(chunks)
    )


def book_cards(store: Mindscape, chunks: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The cards (``stores.book_card``) of the books the chunks come from, in the order they first
    appear, as ``{"book", "id", "text"}`` (the book unit that holds the card, and its one rendering);
    a book without a current card has none."""
    books = list(dict.fromkeys(c["book"] for c in chunks))
    found = store.book_units(books)
    return [{"book": b, "id": found[b].id, "text": found[b].text} for b in books if b in found]


def reader_input(store: Mindscape, ids: Sequence[str], ctx: RetrievalSettings, *,
                 texts: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The chunks ``ids`` as the generator reads them (``reading_order``) and the book cards it is
    given with them (none unless ``book_card``): one place, so every graph and ``--explain`` agree
    on what the generator got. ``texts=False`` fetches the chunks' metadata only."""
    chunks = reading_order(store.chunk_records(ids, documents=texts), ctx.passage_order, store.commits.ordered)
    return chunks, (book_cards(store, chunks) if ctx.book_card else [])


SIGNATURE_TOKENS = 1500
"""The most the signature's units add to the reader's prompt; the signature's last units give way first."""


def signature_units(store: Mindscape, ids: Sequence[str]) -> list[dict[str, Any]]:
    """The signature's units as the reader reads them: in story order (sessions and parts by their
    place in their book, the whole-book units first), each with ``where`` it stands ("session,
    12%–15% of rebecca-of-sunnybrook-farm"), within ``SIGNATURE_TOKENS``; ``{id, book, level, where,
    text}`` each, so an answer can cite the one that holds it."""
    records = store.summary_records(ids)
    committed = store.commits.committed()
    kept, used = [], 0
    for r in records:  # the signature's order: its best units first
        used += count_tokens(r["text"])
        if kept and used > SIGNATURE_TOKENS:
            break
        kept.append(r)

    def place(r: dict[str, Any]) -> tuple[int, str]:
        record = committed.get(r["book"], {})
        if r["level"] not in (Level.SESSION, Level.PART):
            return -1, f"{r['level']}, the whole of {r['book']}"
        if "body_end" not in record:  # a book ingested before its span was recorded: no share to give
            return int(r["start"]), f"{r['level']} of {r['book']}"
        start, end = int(record.get("body_start", 0)), int(record["body_end"])
        share = lambda at: 100 * (int(at) - start) // max(end - start, 1)  # noqa: E731
        return share(r["start"]), f"{r['level']}, {share(r['start'])}%–{share(r['end'])}% of {r['book']}"

    placed = sorted(((place(r), r) for r in kept), key=lambda p: (p[1]["book"], p[0][0]))
    return [{"id": r["id"], "book": r["book"], "level": str(r["level"]), "where": where, "text": r["text"]}
            for (_, where), r in placed]


def signature_lines(units: Sequence[dict[str, Any]]) -> list[str]:
    """The units as the prompt shows them: each headed by its place."""
    return [f"[{u['where']}] {u['text']}" for u in units]


def memory_block(signature: Sequence[str] = (), evidence: Sequence[str] = (), guard: bool = True,
                 cards: Sequence[dict[str, str]] = ()) -> str:
    # A card is written by a model from the book's text: document data, guarded like it.
    parts = [prompts.fence(card["text"], tag="book", guard=guard) for card in cards]
    if signature:
        parts.append(prompts.fence("\n".join(signature), tag="signature", guard=guard))
    if evidence:
        # Facts and memories are the model's own notes, written from guarded passages: not cut.
        parts.append(prompts.fence("\n".join(f"- {e}" for e in evidence), tag="evidence", guard=False))
    return "".join(p + "\n" for p in parts)


BOOK_NOTE = " A card describing each book as a whole (narrator, main characters, plot) may come between <book> tags."
"""Added to the answer prompt's list of material only when cards are given, so prompts without them are unchanged."""


def answer_messages(question: str, chunks: Sequence[dict[str, Any]], fmt: AnswerFormat,
                    options: Sequence[str] = (), signature: Sequence[str] = (), evidence: Sequence[str] = (),
                    guard: bool = True, cards: Sequence[dict[str, str]] = ()) -> list[BaseMessage]:
    option_text = "".join(f"\n{LETTERS[i]}. {o}" for i, o in enumerate(options[: len(LETTERS)]))
    return prompts.messages(
        "answer",
        format_rule=FORMAT_RULES[fmt],
        book_note=BOOK_NOTE if cards else "",
        memory=memory_block(signature, evidence, guard, cards),
        passages=passages_block(chunks, guard),
        question=question,
        options=option_text,
    )


_YES_NO = re.compile(r"\s*(yes|no)\s*(?:[,.;:!]|$)", flags=re.IGNORECASE)
_POLAR = re.compile(r"\s*(is|are|was|were|do|does|did|has|have|had|can|could|will|would|should|shall|may|might|must)\b",
                    flags=re.IGNORECASE)
_NEGATION = re.compile(r"\b(not|never|neither|nor|both)\b|n't\b", flags=re.IGNORECASE)
_WORD = re.compile(r"\S+")
_OPTIONS = re.compile(r",\s*([^,]+?)\s+or\s+([^,]+?)\s*\?\s*$")
_PARENTHESIS = re.compile(r"\s*\([^)]*\)")
_ABBREVIATION = re.compile(r"^(?:[A-Z]|Dr|Mr|Mrs|Ms|St|Jr|Sr|Mt|Ft|Gen|Col|Capt|Lt|Sgt|Rev|Prof)\.$")
_POSSESSIVE = re.compile(r"['’]s$")
_FUNCTION = frozenset({"than", "both", "also", "then", "while", "whose", "whom", "which", "who", "what", "where", "when",
                       "he", "she", "it", "they", "him", "her", "his", "its", "them", "their"})
_COPULA = frozenset({"is", "was", "are", "were"})
_EXPLAINED = re.compile(r"\s*(why|how(?!\s+(many|much|old|long|far|tall|big)\b))\b", flags=re.IGNORECASE)
_JOINERS = frozenset({"of", "de", "da", "di", "du", "del", "der", "den", "van", "von", "la", "le", "ibn", "bin", "al", "and", "the"})
TRIM_OVER_WORDS = 4
"""``trimmed`` leaves open answers of at most this many words as they are."""


def trimmed(answer: str, question: str) -> str:
    """The words of an open answer that answer, without the question the model restated around them.

    A yes/no reply to a yes/no question is its first word; a reply to "which …, A or B?" that names one of the two is
    that one; a reply that opens with a new name followed by "is"/"was" is that name. Otherwise,
    when the reply restates the question before saying one new thing, and that thing is a name,
    number or date, the answer is that run of words the question does not hold (stemmed terms; a
    run ends at a comma or full stop, and nothing new may follow it in its clause), widened over
    the capitalised words of the name it belongs to, so "The band Rush released a song called Counterparts" asked "Which band
    released a song called Counterparts?" becomes "Rush", and "Edward Baring's father is Sir
    Francis Baring" becomes "Sir Francis Baring". A why/how question's answer, an answer that says
    nothing the question does not, and one that is already short stay whole. Deterministic and
    free: it never asks the model again, so it cannot change which answer was given, only how much
    of the question comes back around it.
    """
    if _POLAR.match(question) and (match := _YES_NO.match(answer)) and len(answer.split()) > 1:
        return match.group(1).capitalize()
    if (options := _OPTIONS.search(question)) is not None and not _NEGATION.search(answer):
        bare = [(o, _PARENTHESIS.sub("", o).strip()) for o in options.groups()]
        named = [o for o, b in bare if b and _says(answer, b)]
        if len(named) == 1:
            return named[0]
    words = _WORD.findall(answer)
    if len(words) <= TRIM_OVER_WORDS or _EXPLAINED.match(question):
        return answer
    asked = set(tokenize(question, stem=True))
    terms = [[t for t in tokenize(_POSSESSIVE.sub("", w.strip(",.;:!?\"'()")), stem=True) if t not in _FUNCTION] for w in words]
    new = [any(term not in asked for term in t) for t in terms]
    ends = lambda i: words[i].endswith((",", ".", ";", ":")) and not _ABBREVIATION.match(words[i])  # noqa: E731
    named = lambda i: words[i][:1].isupper() or words[i][:1].isdigit()  # noqa: E731
    if not any(new):
        return answer
    first = new.index(True)
    if first == 0 and named(0):
        # "Chiang Hsiao-wu is the eldest son of …" asked "Who is …?": the new name it opens with.
        last = 0
        while last + 1 < len(words) and not ends(last) and (named(last + 1) or words[last + 1].casefold() in _JOINERS):
            last += 1
        subject = " ".join(words[:last + 1]).strip(" ,.;:")
        return subject if last + 1 < len(words) and words[last + 1].casefold() in _COPULA and named(last) else answer
    if first < 2:
        return answer  # nothing restated before it: a reply in the model's own words
    last = first
    while not ends(last) and last + 1 < len(words):
        if new[last + 1] or named(last + 1):
            last += 1
        elif not terms[last + 1] or words[last + 1].casefold() in _JOINERS:
            if last + 2 < len(words) and (new[last + 2] or named(last + 2)) and not ends(last + 1):
                last += 2
            else:
                break
        else:
            break
    while first > 0 and named(first) and not ends(first - 1) and (
            named(first - 1) or (first > 1 and words[first - 1].casefold() in _JOINERS and named(first - 2) and not ends(first - 2))):
        first -= 1 if named(first - 1) else 2
    # The answer is the one new thing said: a clause that goes on to say more stays whole.
    rest = next((i for i in range(last, len(words)) if ends(i)), len(words) - 1)
    if any(new[last + 1:rest + 1]):
        return answer
    # Only a name, a number or a date is cut out; an explanation in the model's words, or a run
    # that holds a copula (a clause, not a name), stays whole.
    cut = words[first:last + 1]
    return " ".join(cut).strip(" ,.;:") if named(first) and not _COPULA & {w.casefold() for w in cut} else answer


def _says(text: str, phrase: str) -> bool:
    """Whether ``text`` holds ``phrase`` as whole words ("Rush" is not in "Rushmore"), any case."""
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, flags=re.IGNORECASE) is not None


def _with_markers(phrase: str, numbers: Sequence[str | int]) -> str:
    """A cut answer followed by the reply's citation markers, each once, in their order."""
    return f"{phrase} " + "".join(f"[{n}]" for n in dict.fromkeys(numbers))


def _ask(llm: BaseChatModel, messages: list[BaseMessage], fmt: AnswerFormat, question: str,
         node: str) -> tuple[str, str | None, dict[str, Any]]:
    """One answer: (the reply with [n] markers, its message id, usage). An open reply is cut with
    ``trimmed``, which costs no model call and keeps the reply's citation markers."""
    raw = llm.invoke(messages)
    text, usage = raw.text.strip(), usage_of(raw, node)
    said = normalise_answer(text, fmt)
    if fmt == "open" and (short := trimmed(said, question)) != said:
        text = _with_markers(short, _CITE.findall(text))
    return text.strip(), raw.id, usage


def cut_ranges(chunk: dict[str, Any]) -> list[tuple[int, int]]:
    """The chunk's instruction spans, chunk-relative: those found in its book at ingestion and any
    found in its own text (a collection ingested before spans were recorded)."""
    found = injection.decode(chunk.get("guard_cut", "")) + [(s.start, s.end) for s in injection.instruction_spans(chunk["text"])]
    return sorted(set(found))


def removed_spans(chunks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the guard cut text out of the passages, in book offsets (for --explain and the API)."""
    return [{"n": i + 1, "id": c["id"], "book": c["book"], "spans": [[c["start"] + a, c["start"] + b] for a, b in spans]}
            for i, c in enumerate(chunks) if (spans := cut_ranges(c))]


def normalise_answer(text: str, fmt: AnswerFormat, n_options: int = 0) -> str:
    """The scored answer: a letter, TRUE/FALSE, or the phrase without citation markers."""
    text = text.strip()
    if fmt == "choice":
        valid = LETTERS[: max(n_options, 1) if n_options else len(LETTERS)]
        match = re.search(rf"\b([{valid}])\b", text.upper())
        return match.group(1) if match else text[:1].upper()
    if fmt == "verify":
        upper = text.upper()
        if "FALSE" in upper or re.search(r"\bNO\b", upper):
            return "FALSE"
        return "TRUE" if ("TRUE" in upper or re.search(r"\bYES\b", upper)) else "FALSE"
    return re.sub(r"\s+", " ", _CITE.sub("", text)).strip(" .")


SOURCES_MARKER = "\n\nSources:"
"""Joins the answer and its sources in the chat reply (``reply_text``)."""
UNCITED_SOURCES = 3
"""Passages shown as sources when the model cites none: those whose sentences best support the answer."""
QUOTE_CHARS = 160
"""Longest quote of a supporting sentence in the chat reply (the citation carries it whole)."""


SUPPORT_SENTENCES = 3
"""Most consecutive sentences a citation may quote: an answer said over neighbouring sentences
("John … Lawrence Cavendish") is supported by them together."""


def supporting_sentence(chunk: dict[str, Any], answer: str, question: str) -> tuple[tuple[int, int], dict[str, Any]]:
    """The chunk's sentence, or shortest run of up to ``SUPPORT_SENTENCES`` consecutive sentences,
    that best supports the answer, and its score.

    Scored by the answer's terms it holds (stemmed words, stopwords dropped), then fewer sentences,
    then the question's terms: a short answer ("Afghanistan") is found in the sentence that says it,
    and an answer that shares no word with the passage (TRUE, a paraphrase) falls back to the
    sentence nearest the question. Ties go to the earlier sentence. Offsets are the book's, so
    ``text == book[start:end]``.
    """
    text = chunk["text"]
    wanted, asked = set(tokenize(answer, stem=True)), set(tokenize(question, stem=True))
    spans = sentence_spans(text) or [(0, len(text))]
    terms = [set(tokenize(text[a:b], stem=True)) for a, b in spans]
    best_key, best = (-1, 0, 0), spans[0]
    for i in range(len(spans)):
        held: set[str] = set()
        for j in range(i, min(i + SUPPORT_SENTENCES, len(spans))):
            held |= terms[j]
            key = (len(wanted & held), i - j, len(asked & held))
            if key > best_key:
                best_key, best = key, (spans[i][0], spans[j][1])
    return (best_key[0], best_key[2]), {"start": chunk["start"] + best[0], "end": chunk["start"] + best[1],
                                        "text": text[best[0]:best[1]]}


def citations(answer_text: str, chunks: Sequence[dict[str, Any]], question: str = "", answer: str | None = None) -> list[dict[str, Any]]:
    """Chunks the model cited as [n], each with the sentence in it that supports the answer.

    Small models often omit markers; the passages given whose sentences best support the answer
    (``supporting_sentence``; retrieval order breaks ties) are then the honest provenance, marked as
    not cited by the model. They also cite a neighbour of the right passage (a heading, the table of
    contents): a cited passage with no sentence (or short run of them) that holds all of the answer's words gives its place
    to the best passage given that has one (``moved_from`` names the model's number), and
    ``holds_answer`` says of each citation whether its sentence holds them. ``answer`` is what the
    answer says (a phrase, an option's text, or "" when only the question can guide, as for TRUE /
    FALSE); by default the reply without its markers.
    """
    answer = _CITE.sub("", answer_text) if answer is None else answer
    support = [supporting_sentence(c, answer, question) for c in chunks]
    needed = len(set(tokenize(answer, stem=True)))
    holds = [needed > 0 and score[0] == needed for score, _ in support]
    cited = [n - 1 for n in dict.fromkeys(int(n) for n in _CITE.findall(answer_text)) if 1 <= n <= len(chunks)]
    by_model = bool(cited)
    best_first = sorted(range(len(chunks)), key=lambda i: (-support[i][0][0], -support[i][0][1], i))
    moved: dict[int, int] = {}
    for k, i in enumerate(cited):
        better = next((j for j in best_first if holds[j] and j not in cited), None) if not holds[i] else None
        if better is not None:
            cited[k], moved[better] = better, i
    indices = cited or best_first[:UNCITED_SOURCES]
    return [
        {"n": i + 1, "id": chunks[i]["id"], "book": chunks[i]["book"], "chunk": chunks[i]["index"],
         "start": chunks[i]["start"], "end": chunks[i]["end"], "cited_by_model": by_model, "sentences": [support[i][1]],
         "holds_answer": holds[i], **({"moved_from": moved[i] + 1} if i in moved else {})}
        for i in indices
    ]


def card_citations(cards: Sequence[dict[str, str]], answer: str) -> list[dict[str, Any]]:
    """A card the answer draws on, cited by its line that holds the most of the answer's terms
    (stemmed, stopwords dropped): "Narrator: John H. Watson (first person)" for "Dr. Watson". A card
    sharing no term with the answer is not cited; nor is any card for an answer that says nothing
    (TRUE/FALSE, no reliable answer)."""
    wanted = set(tokenize(answer, stem=True))
    cites = []
    for card in cards:
        lines = [(len(wanted & set(tokenize(line, stem=True))), line) for line in card["text"].splitlines()
                 if not line.startswith("Most named:")]  # a count of mentions says nothing about the answer
        best = max(lines, key=lambda pair: pair[0], default=(0, ""))  # ties: the earlier line
        if best[0]:
            cites.append({"n": "card", "id": card["id"], "book": card["book"], "card": True,
                          "cited_by_model": False, "sentences": [{"text": best[1]}]})
    return cites


def summary_citations(units: Sequence[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """The signature unit the reader was given whose sentence holds every word of the answer
    (stemmed, stopwords dropped), cited by that sentence: "who narrates" is answered by the story,
    not by a passage. The first such unit in the signature's reading order; none when no unit holds
    the answer, or the answer says nothing."""
    needed = set(tokenize(answer, stem=True))
    for unit in units if needed else ():
        for a, b in sentence_spans(unit["text"]):
            if needed <= set(tokenize(unit["text"][a:b], stem=True)):
                return [{"n": "summary", "id": unit["id"], "book": unit["book"], "level": unit["level"], "where": unit["where"],
                         "cited_by_model": False, "holds_answer": True, "sentences": [{"text": unit["text"][a:b]}]}]
    return []


def reply_text(answer: str, cites: Sequence[dict[str, Any]]) -> str:
    """The chat reply: the answer with its sources and the sentence each supports it with,
    readable in any chat frontend."""
    if not cites:
        return answer

    def quote(c: dict[str, Any]) -> str:
        said = " ".join(c["sentences"][0]["text"].split()) if c.get("sentences") else ""
        return f" “{said[:QUOTE_CHARS - 1] + '…' if len(said) > QUOTE_CHARS else said}”" if said else ""

    sources = "; ".join(f"[card] {c['book']}'s card{quote(c)}" if c.get("card") else
                        f"[summary] {c['where']}{quote(c)}" if c["n"] == "summary" else
                        f"[{c['n']}] {c['book']}, chunk {c['chunk']} (chars {c['start']}–{c['end']}){quote(c)}" for c in cites)
    return f"{answer}{SOURCES_MARKER} {sources}"


def without_sources(reply: str) -> str:
    """A chat reply without its sources: their quotes are document text, which must not reach a
    prompt unguarded as if it were the conversation."""
    return reply.split(SOURCES_MARKER, 1)[0]


def without_material(answer: str) -> dict[str, Any]:
    """The state update of an answer given without asking the model, since it had nothing to read:
    a model asked about nothing invents a name (a 1.5B did, from an empty memory)."""
    return {"answer": answer, "citations": [], "messages": [AIMessage(content=answer)], "usage": {}, "guard": {}}


def generate(llm: BaseChatModel, question: str, chunks: Sequence[dict[str, Any]], fmt: AnswerFormat,
             options: Sequence[str] = (), signature: Sequence[dict[str, Any]] = (), evidence: Sequence[str] = (),
             node: str = "generate", guard: bool = True, cards: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    """Answer and the state update every graph's final node returns.

    With ``guard``, an open answer traced to an instruction in the material (``injection.planted``)
    is rejected: the model answers once more without the suspect sentences, and if that answer is
    traced too, the reply says no reliable answer was found. Clean material never pays the retry.
    """
    lines = signature_lines(signature)
    text, message_id, usage = _ask(llm, answer_messages(question, chunks, fmt, options, lines, evidence, guard, cards),
                                   fmt, question, node)
    answer = normalise_answer(text, fmt, len(options))
    report: dict[str, Any] = {"removed": removed_spans(chunks)} if guard else {}
    material = [c["text"] for c in chunks] + lines + [c["text"] for c in cards]  # the source's text, not the model's notes
    known = [injection.decode(c.get("guard_trace", "")) for c in chunks]
    if guard and fmt == "open" and injection.planted(answer, material, (question,), known):
        report["rejected"] = [answer]
        stripped = [{**c, "text": injection.strip_suspect(c["text"], trace)} for c, trace in zip(chunks, known)]
        text, message_id, retry_usage = _ask(
            llm, answer_messages(question, stripped, fmt, options, [injection.strip_suspect(t) for t in lines], evidence,
                                 guard, [{**c, "text": injection.strip_suspect(c["text"])} for c in cards]), fmt, question, node)
        usage = merge_usage(usage, retry_usage)
        answer = normalise_answer(text, fmt, len(options))
        if injection.planted(answer, material, (question,), known):
            report["rejected"].append(answer)
            text = answer = NO_RELIABLE_ANSWER
    # Support is sought for what the answer says: the phrase, the chosen option's text, or (TRUE /
    # FALSE) the claim itself, which is the question.
    said = (answer if fmt == "open" and answer != NO_RELIABLE_ANSWER
            else options[LETTERS.index(answer)] if fmt == "choice" and len(answer) == 1 and answer in LETTERS[:len(options)] else "")
    cites = citations(text, chunks, question, said)
    summary = summary_citations(signature, said)
    # A summary that holds the answer's words leads when no passage given holds them: its place in the story is the source.
    cites = (summary + cites if summary and not any(c["holds_answer"] for c in cites) else cites + summary) + card_citations(cards, said)
    for cite in cites:  # the reply's markers follow a citation moved to the passage that holds the answer
        if "moved_from" in cite:
            text = text.replace(f"[{cite['moved_from']}]", f"[{cite['n']}]")
    return {
        "answer": answer,
        "citations": cites,
        "messages": [AIMessage(content=reply_text(answer if fmt != "open" else text, cites), id=message_id)],
        "usage": usage,
        "guard": report,
    }
