"""Graph ``ingest``: build or update a collection through the server.

Input ``{"paths": [...], "uploads": [...], "collection": NAME, "summarizer": "extractive" | "llm" |
"llm-excerpt" | "none", "cards": "llm" | "names" | "none"}`` with paths relative to the ingest root (``MIA_INGEST_ROOT``, default the
data root) and uploads named as stored in the collection's upload folder (``$MIA_HOME/uploads/NAME``,
where the web page puts the files it sends). A server must not read whatever file a caller names,
so every path, and every file inside a named folder, is resolved and checked to lie under its root
before anything is read (``stores.paths``). Progress goes out as custom stream events
``{"event": "ingest_progress", "stage", "done", "total"}``: the web page's progress bar, and what
any client joining the run's stream sees.

Ingesting inside the server process is also what keeps the embedded Chroma safe: it is not
process-safe, and the server is the one process that writes to it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, TypedDict

from langchain_core.runnables import RunnableLambda
from langgraph.config import get_stream_writer
from langgraph.constants import TAG_NOSTREAM
from langgraph.graph import END, START, StateGraph

from mia.stores.book_card import DEFAULT_CARDS, CardMode
from mia.stores.ingest import SUPPORTED_SUFFIXES, IngestOptions, Summarizer, ingest_sources
from mia.stores.paths import ingest_files


class IngestInput(TypedDict, total=False):
    paths: list[str]
    uploads: list[str]
    collection: str
    summarizer: Summarizer
    cards: CardMode


class IngestOutput(TypedDict, total=False):
    collection: str
    books_written: list[str]
    books_unchanged: list[str]
    chunks: int
    summaries: int
    tokens: int
    llm_calls: int
    summaries_from_cache: int
    chunks_reused: int
    seconds: dict[str, float]


class IngestState(IngestInput, IngestOutput, total=False):
    pass


def run_ingest(state: IngestState) -> dict[str, Any]:
    """Check every path against its root, then ingest exactly the files that passed the check."""
    collection = state.get("collection") or ""
    files = ingest_files(collection, state.get("paths") or [], state.get("uploads") or [], SUPPORTED_SUFFIXES)
    writer = get_stream_writer()  # progress as custom stream events (stream_mode "custom", Studio)
    report = ingest_sources(files, collection, IngestOptions(summarizer=state.get("summarizer") or IngestOptions.summarizer),
                            cards=state.get("cards") or DEFAULT_CARDS, progress=False,
                            on_progress=lambda stage, done, total: writer({"event": "ingest_progress", "stage": stage, "done": done, "total": total}))
    return asdict(report)


builder = StateGraph(IngestState, input_schema=IngestInput, output_schema=IngestOutput)
# Summaries are not answer tokens: the tag keeps a summarising LLM out of "messages" streams.
builder.add_node("ingest", RunnableLambda(run_ingest).with_config(tags=[TAG_NOSTREAM]))
builder.add_edge(START, "ingest")
builder.add_edge("ingest", END)

graph = builder.compile(name="ingest")
