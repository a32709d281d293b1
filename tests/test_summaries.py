"""Session summaries written from an excerpt of their window (``--summarizer llm-excerpt``).

The excerpt is what the chat model reads instead of the whole window, so what must hold is that
it stays within its token budget, quotes the window's own sentences in their order, spreads over
the window's chunks, and marks what it leaves out; and that ingestion sends it (not the window) to
the model, under a cache key of its own. The real MiniLM picks the sentences; a scripted chat
model records what it is sent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult

from mia.graph import cli as mia_cli
from mia.stores import summaries as summ
from mia.stores.book_card import DEFAULT_CARDS, CardMode
from mia.stores.ingest import SUMMARIZERS, IngestOptions, ingest
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import SummaryCache, excerpt, sentences
from mia.stores.tokens import count_tokens
from tests.conftest import requires_data, write_stories
from tests.test_ingest import ScriptedSummarizer

pytestmark = requires_data


class RecordingSummarizer(ScriptedSummarizer):
    """The scripted summarizer, keeping every prompt it was sent."""

    prompts: list[str] = []

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.prompts = [*self.prompts, messages[-1].text]
        return super()._generate(messages, stop, run_manager, **kwargs)


def _window(tmp_path: Path) -> list[str]:
    """Twenty chunks of a real story, three whole sentences each (so each sentence has one owner)."""
    text = write_stories(tmp_path, ("golden-goose",))[0].read_text(encoding="utf-8")
    found = sentences(text)
    assert len(found) >= 60
    return [" ".join(found[i : i + 3]) for i in range(0, 60, 3)]


def test_a_title_or_an_initial_ends_no_sentence() -> None:
    text = "Mr. John Cavendish came. Dr. Bauerstein left! John H. Watson wrote. It was I. Mrs. Inglethorp said “Go.” Done"
    assert sentences(text) == ["Mr. John Cavendish came.", "Dr. Bauerstein left!", "John H. Watson wrote.", "It was I.",
                               "Mrs. Inglethorp said “Go.”", "Done"]
    # Offsets quote the text exactly, and a title inside a longer word is no title ("HUMMR." ends).
    assert [text[a:b] for a, b in summ.sentence_spans(text)] == sentences(text)
    assert sentences("IT WAS THE HUMMR. And then.") == ["IT WAS THE HUMMR.", "And then."]


def test_excerpt_keeps_the_windows_sentences_in_order_within_budget(tmp_path: Path, minilm) -> None:
    chunks = _window(tmp_path)
    budget = 300
    got = excerpt(chunks, minilm, budget=budget)
    pieces = [p.strip() for p in got.split("…") if p.strip()]
    assert count_tokens(got.replace("…", "")) <= budget + len(pieces)  # joining spaces may merge a token or two
    all_sentences = [s for text in chunks for s in sentences(text)]
    flat = " ".join(all_sentences)
    position = 0
    for piece in pieces:  # every piece is a run of the window's sentences, in the window's order
        found = flat.find(piece, position)
        assert found >= 0, piece
        position = found + len(piece)
    assert got.count("…") >= 1 and len(got) < len(" ".join(chunks)) / 2


def test_excerpt_spreads_over_the_window(tmp_path: Path, minilm) -> None:
    """No chunk gives more than twice its share of the budget."""
    chunks = _window(tmp_path)
    budget = 400
    got = excerpt(chunks, minilm, budget=budget)
    cap = 2 * budget / len(chunks)
    picked = [p.strip() for p in re.split(r" ?… ?", got) if p.strip()]
    per_chunk = [0] * len(chunks)
    for sentence in (s for piece in picked for s in sentences(piece)):
        owner = next(i for i, text in enumerate(chunks) if sentence in sentences(text))
        per_chunk[owner] += count_tokens(sentence)
    assert max(per_chunk) <= cap
    assert sum(1 for used in per_chunk if used) >= len(chunks) // 3


def test_excerpt_of_sentences_longer_than_any_share_is_the_windows_opening(minilm) -> None:
    long_sentence = " ".join(f"word{i}" for i in range(200)) + "."
    got = excerpt([long_sentence, long_sentence], minilm, budget=50)
    assert count_tokens(got) == 50 and long_sentence.startswith(got)


def test_llm_excerpt_ingestion_sends_the_excerpt_under_its_own_cache_key(tmp_path: Path, minilm) -> None:
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"), settings=ChromaSettings(anonymized_telemetry=False))
    books = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    cache = SummaryCache(tmp_path / "summaries.sqlite")
    whole, part = RecordingSummarizer(), RecordingSummarizer()
    # Fixed windows: 20 chunks of 60 tokens make a first window longer than the excerpt's budget.
    ingest(books, "whole", minilm, options=IngestOptions(chunk_size=60, window=20, summarizer="llm", chunker="window"), llm=whole,
           client=client, cache=cache, progress=False)
    ingest(books, "part", minilm, options=IngestOptions(chunk_size=60, window=20, summarizer="llm-excerpt", chunker="window"),
           llm=part,
           client=client, cache=cache, progress=False)
    assert whole.calls == part.calls >= 1, "the excerpt's summaries come from their own cache entries"
    sessions = Mindscape("part", client).commits.records()["golden-goose"]["summaries"]  # their calls come first, the tree's after
    for full, short in zip(whole.prompts[:sessions], part.prompts[:sessions]):
        assert summ.EXCERPT_SCOPE.strip() in short and summ.EXCERPT_SCOPE.strip() not in full
        passages = [re.search(r"<source>\n(.*?)\n</source>", prompt, flags=re.DOTALL).group(1) for prompt in (full, short)]
        whole_tokens, excerpt_tokens = (count_tokens(p) for p in passages)
        markers = 2 * passages[1].count("…")  # the budget counts the quoted sentences, not the gap marks
        assert excerpt_tokens <= min(summ.EXCERPT_TOKENS, whole_tokens) + markers
    assert count_tokens(whole.prompts[0]) > summ.EXCERPT_TOKENS + 200, "the first window is longer than the budget"
    method = Mindscape("part", client).commits.records()["golden-goose"]["summarizer"]
    assert summ.EXCERPT in method and minilm.name in method


def test_cli_offers_every_summarizer_with_the_stores_default() -> None:
    assert mia_cli.SUMMARIZER_CHOICES == SUMMARIZERS
    assert mia_cli.DEFAULT_SUMMARIZER == IngestOptions.summarizer
    assert mia_cli.DEFAULT_CHUNKER == IngestOptions.chunker
    assert mia_cli.CARD_CHOICES == get_args(CardMode) and mia_cli.DEFAULT_CARDS == DEFAULT_CARDS


@pytest.mark.parametrize("summarizer", ["llm-excerpt", "extractive"])
def test_eval_sweeps_the_summarizer_as_an_ingestion_option(summarizer: str) -> None:
    from mia.evals.runner import expand_variants

    variants = expand_variants(["mia_rag"], {}, {"summarizer": ["extractive", summarizer]}, retrieval_only=True,
                               summarizer="extractive")
    assert [v.ingest.summarizer for v in variants] == ["extractive", summarizer]
    assert "summarizer" not in variants[0].settings


def test_grounding_drops_invented_names_and_repeated_sentences() -> None:
    """Hand-made: the 1.5B's faults on A Study in Scarlet (an invented companion, a looped sentence)."""
    source = ("Sherlock Holmes met Dr. Watson at Baker Street. Later they went to Lauriston Gardens, where Gregson "
              "waited for them in the rain.")
    written = ("Sherlock Holmes and his companion, Murray, meet at Baker Street. Later they meet Gregson. They meet "
               "again at Baker Street. They meet again at Baker Street! Watson is there.")
    kept, check = summ.grounded(written, source)
    assert kept == "Later they meet Gregson. They meet again at Baker Street. Watson is there."
    # A sentence's first word counts as a name only where the source never writes it in lower case:
    # "They" does not count ("they" is in the source), "Later" does (and is there).
    assert (check.sentences, check.repeated, check.dropped) == (5, 1, 2)
    assert check.names - check.grounded == 1 and 0 < check.share < 1  # Murray alone is not in the source
    again, recheck = summ.grounded(kept, source)
    assert again == kept and recheck.share == 1.0 and recheck.dropped == 0
    assert summ.grounded("", source) == ("", summ.Faithfulness())
    # An opener the window never writes is not a name: "Overall," and "Eventually" keep their sentences,
    # as does a bullet's first word; an invented name opening a sentence does not.
    openers = "Overall, Holmes waited. Eventually Gregson came. - Meanwhile, Watson slept. Murray left."
    assert summ.grounded(openers, source)[0] == "Overall, Holmes waited. Eventually Gregson came. - Meanwhile, Watson slept."


@pytest.mark.slow
def test_the_embedded_model_writes_a_bounded_grounded_summary_of_a_real_window(embedded_model_file: Path) -> None:
    from mia.stores.chat import load_chat_model
    from mia.stores.front_matter import find_body
    from tests.conftest import shared_data

    path = shared_data() / "books/holmes/a_study_in_scarlet.txt"
    if not path.is_file():
        pytest.skip(f"{path} is not in the shared data")
    text = path.read_text(encoding="utf-8")
    start = find_body(text).start
    window = text[start:start + 6000]
    written, usage = summ.llm_summary(load_chat_model(), window, "a-study-in-scarlet", 1, 20)
    kept, check = summ.grounded(written, window)
    assert usage["output_tokens"] <= summ.SUMMARY_TOKENS
    assert kept and summ.grounded(kept, window)[1].share == 1.0
    keys = [" ".join(re.findall(r"\w+", s.casefold())) for s in sentences(kept)]
    assert len(keys) == len(set(keys))  # no sentence twice
    print(f"\n{written}\n-> kept {len(sentences(kept))} of {check.sentences} sentences, names {check.grounded}/{check.names}")
