"""Graph ``infmem``: PreThink → Retrieve → Write with early stop over a bounded memory (InfMem, Sec. 3.2).

prepare → start_stream → per chunk of ``stream_chunk_tokens`` tokens: prethink (STOP, or SEARCH
with a query and top_k) → on SEARCH retrieve (in-document BM25, current chunk excluded) → write
(retrieved + chunk + memory compressed under ``memory_tokens``). STOP skips the chunk's write;
``stop_after`` consecutive STOPs (1-stop, 3-stop) or the end of the source → answer from memory.

Recursion limit: at most 3 supersteps per chunk, so a run takes at most
3·⌈source tokens / stream_chunk_tokens⌉ + 3 supersteps; the default below (10,000) covers ~16M
tokens at 5,000-token chunks. Pass ``recursion_limit`` in the run's config for anything longer.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mia.nodes.context import InfMemSettings
from mia.nodes.memory import after_prethink, after_write, answer, prethink, retrieve, start_stream, write
from mia.nodes.question import prepare
from mia.nodes.state import InputState, MemoryOutputState, MemoryState

RECURSION_LIMIT = 10_000

builder = StateGraph(MemoryState, context_schema=InfMemSettings, input_schema=InputState, output_schema=MemoryOutputState)
builder.add_node("prepare", prepare)
builder.add_node("start_stream", start_stream)
builder.add_node("prethink", prethink)
builder.add_node("retrieve", retrieve)
builder.add_node("write", write)
builder.add_node("answer", answer)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "start_stream")
builder.add_conditional_edges("start_stream", after_write, ["prethink", "answer"])
builder.add_conditional_edges("prethink", after_prethink, ["retrieve", "prethink", "answer"])
builder.add_edge("retrieve", "write")
builder.add_conditional_edges("write", after_write, ["prethink", "answer"])
builder.add_edge("answer", END)

graph = builder.compile(name="infmem").with_config(recursion_limit=RECURSION_LIMIT)
