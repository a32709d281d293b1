"""The written tree above the sessions (``stores/ingest/story.py``): parts and each book's story.

What must hold: a book whose sessions the chat model wrote gets a part per ``SESSIONS_PER_PART``
consecutive sessions, spanning their text, and then its story, which marks the tree complete; a
chunk is covered by its session, its part and its story; a rerun calls no model and writes nothing,
a changed book gets a new tree, a run killed halfway resumes from the cache; what a summary names
that its span of the book never does is dropped and counted; a book with extractive sessions gets
no tree. A scripted chat model drives control flow; the embedded model writes a real book's tree
(slow). Real MiniLM and a real Chroma throughout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from mia.nodes.answer import signature_lines, signature_units, summary_citations
from mia.stores.ingest import IngestOptions, ingest
from mia.stores.ingest import story
from mia.stores.mindscape import Mindscape
from mia.stores.summaries import SummaryCache, sentences
from mia.stores.units import Level, part_id, session_id
from tests.conftest import requires_data, write_stories
from tests.test_ingest import ForbiddenChat, ScriptedSummarizer, client  # noqa: F401 - the fixture

pytestmark = requires_data

OPTIONS = IngestOptions(chunk_size=60, window=2, summarizer="llm", chunker="window")
"""Small windows, so one real story makes a dozen sessions: three parts."""


class Inventing(ScriptedSummarizer):
    """Writes parts and stories that add a person the book never names."""

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if "Summarise this part of the book in at most" in messages[-1].text and "sections in story order" not in messages[-1].text:
            return super()._generate(messages, stop, run_manager, **kwargs)  # a session
        self.calls += 1
        words = re.search(r"<source>\n(.*?)\n</source>", messages[-1].text, flags=re.DOTALL).group(1).split()[2:10]
        text = f"the goose is golden and {' '.join(words).lower()}. then Murray the detective arrives."
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


class FailingAfter(ScriptedSummarizer):
    """Stands for a run killed mid-way: the call after ``allowed`` raises."""

    allowed: int = 0

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if self.calls >= self.allowed:
            raise KeyboardInterrupt("killed")
        return super()._generate(messages, stop, run_manager, **kwargs)


def _ingest(paths: list[Path], client: Any, llm: Any, cache: SummaryCache, options: IngestOptions = OPTIONS,
            collection: str = "tree") -> Any:
    from mia.stores.embeddings import load_embedder

    return ingest(paths, collection, load_embedder(""), options=options, llm=llm, client=client, cache=cache, progress=False)


def test_parts_and_story_cover_the_written_sessions_and_a_rerun_writes_nothing(tmp_path: Path, client: Any) -> None:
    paths = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    cache = SummaryCache(tmp_path / "s.sqlite")
    report = _ingest(paths, client, ScriptedSummarizer(), cache)
    store = Mindscape("tree", client)
    sessions = int(store.commits.committed()["golden-goose"]["summaries"])
    parts = -(-sessions // story.SESSIONS_PER_PART)
    assert sessions > 2 * story.SESSIONS_PER_PART and report.parts == parts and report.stories == 1
    assert report.llm_calls == sessions + parts + 1
    rows = store.summary_records([part_id("golden-goose", k) for k in range(parts)])
    members = store.summary_records([session_id("golden-goose", j) for j in range(sessions)])
    for k, row in enumerate(rows):
        group = members[k * story.SESSIONS_PER_PART : (k + 1) * story.SESSIONS_PER_PART]
        assert row["level"] == Level.PART and (row["start"], row["end"]) == (group[0]["start"], group[-1]["end"])
        assert row["first_chunk"] == group[0]["first_chunk"] and row["last_chunk"] == group[-1]["last_chunk"]
    unit = store.book_units(level=Level.STORY)["golden-goose"]
    assert unit.metadata["parts"] == parts and unit.text
    chunks = store.book_chunk_ids("golden-goose")
    covered = store.units_over(chunks, (Level.SESSION, Level.PART, Level.STORY))
    for chunk, units in zip(chunks, covered):
        j = int(units[Level.SESSION].rpartition(":s")[2])
        assert units[Level.PART] == part_id("golden-goose", j // story.SESSIONS_PER_PART)
        assert units[Level.STORY] == "golden-goose#story"
        assert list(units) == [Level.SESSION, Level.PART, Level.STORY]  # lowest level first
    again = _ingest(paths, client, ForbiddenChat(), cache)
    assert again.llm_calls == again.parts == again.stories == 0


def test_a_killed_run_resumes_from_the_cache_and_a_changed_book_gets_a_new_tree(tmp_path: Path, client: Any) -> None:
    paths = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    first = _ingest(paths, client, ScriptedSummarizer(), SummaryCache(tmp_path / "first.sqlite"))
    sessions, parts = first.summaries, first.parts
    # Another collection and cache, killed after its sessions and one part: the book is committed, its tree is not.
    cache = SummaryCache(tmp_path / "s.sqlite")
    with pytest.raises(KeyboardInterrupt):
        _ingest(paths, client, FailingAfter(allowed=sessions + 1), cache, collection="again")
    store = Mindscape("again", client)
    assert "golden-goose" in store.commits.committed() and not store.book_units(level=Level.STORY)
    assert store.units_over(store.book_chunk_ids("golden-goose")[:1], (Level.SESSION, Level.PART))[0].keys() == {Level.SESSION}
    resumed = _ingest(paths, client, ScriptedSummarizer(), cache, collection="again")
    assert resumed.llm_calls == (parts - 1) + 1 and resumed.stories == 1, "the part written before the kill is reused"
    old = store.book_units(level=Level.STORY)["golden-goose"]
    paths[0].write_text(paths[0].read_text(encoding="utf-8") + "\n\nAnd the goose flew away over the hills.\n", encoding="utf-8")
    changed = _ingest(paths, client, ScriptedSummarizer(), cache, collection="again")
    # The last window, the last part and the story changed; every other summary comes from the cache.
    assert changed.llm_calls == 3 and changed.stories == 1
    new = Mindscape("again", client).book_units(level=Level.STORY)["golden-goose"]  # a new reader: a store reads one snapshot
    assert new.metadata["hash"] != old.metadata["hash"]


def test_what_a_written_summary_names_that_its_span_never_does_is_dropped_and_counted(tmp_path: Path, client: Any) -> None:
    paths = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    report = _ingest(paths, client, Inventing(), SummaryCache(tmp_path / "s.sqlite"))
    store = Mindscape("tree", client)
    texts = [r["text"] for r in store.summary_records([part_id("golden-goose", 0), "golden-goose#story"])]
    assert texts and all(t and "Murray" not in t for t in texts)
    for level in (Level.PART, Level.STORY):
        check = report.faithfulness[level]
        assert check.names > check.grounded and check.dropped >= 1


def test_extractive_sessions_get_no_written_tree_and_a_signature_that_needs_one_says_how(tmp_path: Path, client: Any) -> None:
    from mia.nodes.context import MiaRagSettings
    from mia.nodes.retrieval import query_only
    from mia.nodes.signature_init import select_signature
    from mia.stores.chroma import MindscapeError
    from mia.stores.embeddings import load_embedder

    paths = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    report = _ingest(paths, client, None, SummaryCache(tmp_path / "s.sqlite"),
                     IngestOptions(chunk_size=60, window=2, summarizer="extractive", chunker="window"))
    assert report.stories == 0 and not Mindscape("tree", client).book_units(level=Level.STORY)
    store, question = Mindscape("tree", client), "Who finds the golden goose?"
    ctx = MiaRagSettings(collection="tree", signature_levels="sessions+parts+story")
    query_vec = load_embedder("").embed_query(question)
    with pytest.raises(MindscapeError, match="needs part units.*--summarizer llm-excerpt"):
        select_signature(store, question, query_vec, query_only(store, query_vec, ctx.k0), ctx)


def test_the_reader_reads_parts_in_story_order_with_their_place(tmp_path: Path, client: Any) -> None:
    paths = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    _ingest(paths, client, ScriptedSummarizer(), SummaryCache(tmp_path / "s.sqlite"))
    store = Mindscape("tree", client)
    units = signature_units(store, [part_id("golden-goose", 1), session_id("golden-goose", 0), "golden-goose#story"])
    read = signature_lines(units)
    assert read[0].startswith("[story, the whole of golden-goose]")
    assert read[1].startswith("[session, 0%") and re.match(r"\[part, \d+%–\d+% of golden-goose\]", read[2])
    # An answer a unit's sentence holds cites that unit, by the sentence; one no unit holds cites none.
    word = next(w for w in re.findall(r"[a-z]{6,}", units[2]["text"]) if w not in units[0]["text"] + units[1]["text"])
    cite = summary_citations(units, word)
    assert [c["id"] for c in cite] == [part_id("golden-goose", 1)] and word in cite[0]["sentences"][0]["text"]
    assert summary_citations(units, "zeppelin") == []


@pytest.mark.slow
def test_the_embedded_model_writes_a_grounded_tree_of_a_real_story(tmp_path: Path, client: Any, embedded_model_file: Path) -> None:
    from mia.stores.chat import load_chat_model

    paths = write_stories(tmp_path / "books", ("golden-goose",), sections=8)
    options = IngestOptions(chunk_size=120, window=2, summarizer="llm-excerpt", chunker="window")
    report = _ingest(paths, client, load_chat_model(), SummaryCache(tmp_path / "s.sqlite"), options)
    store = Mindscape("tree", client)
    text = store.book_text("golden-goose")
    tree = store.book_units(level=Level.STORY)["golden-goose"]
    parts = store.summary_records([part_id("golden-goose", k) for k in range(tree.metadata["parts"])])
    assert report.stories == 1 and len(parts) == report.parts >= 2
    for unit in [*parts, {"text": tree.text, "start": 0, "end": len(text)}]:
        keys = [" ".join(re.findall(r"\w+", s.casefold())) for s in sentences(unit["text"])]
        assert keys and len(keys) == len(set(keys)), "no summary repeats a sentence"
    for level in (Level.PART, Level.STORY):
        assert report.faithfulness[level].sentences >= 1
    print(f"\nstory: {tree.text}\nfaithfulness: {report.faithfulness}")
