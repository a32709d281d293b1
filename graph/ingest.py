"""Graph ``ingest``: build or update a collection through the server.

Input ``{"paths": [...], "collection": NAME, "summarizer": "extractive" | "llm" | "llm-excerpt" | "none"}`` with
paths relative to the ingest root (``MIA_INGEST_ROOT``, default the data root). A server must not
read whatever file a caller names, so every path, and every file inside a named folder, is
resolved and checked to lie under that root before anything is read (``stores.paths``).

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

from stores.chat import load_chat_model
from stores.embeddings import load_embedder
from stores.ingest import LLM_SUMMARIZERS, SUPPORTED_SUFFIXES, IngestOptions, Summarizer, ingest
from stores.paths import files_under, ingest_root


class IngestInput(TypedDict, total=False):
    paths: list[str]
    collection: str
    summarizer: Summarizer


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
    """Check the paths, then ingest exactly the files that passed the check."""
    options = IngestOptions(summarizer=state.get("summarizer") or IngestOptions.summarizer)
    options.validate()
    files = files_under(ingest_root(), state.get("paths") or [], SUPPORTED_SUFFIXES)
    llm = load_chat_model() if options.summarizer in LLM_SUMMARIZERS else None
    writer = get_stream_writer()  # progress as custom stream events (stream_mode "custom", Studio)
    report = ingest(files, state.get("collection") or "", load_embedder(), options=options, llm=llm, progress=False,
                    on_progress=lambda stage, done, total: writer({"event": "ingest_progress", "stage": stage, "done": done, "total": total}))
    return asdict(report)


builder = StateGraph(IngestState, input_schema=IngestInput, output_schema=IngestOutput)
# Summaries are not answer tokens: the tag keeps a summarising LLM out of "messages" streams.
builder.add_node("ingest", RunnableLambda(run_ingest).with_config(tags=[TAG_NOSTREAM]))
builder.add_edge(START, "ingest")
builder.add_edge("ingest", END)

graph = builder.compile(name="ingest")
