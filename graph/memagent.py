"""Graph ``memagent``: the MemAgent streaming baseline (InfMem paper, Sec. 2 and App. B).

prepare → start_stream → update_memory (once per ``stream_chunk_tokens`` chunk of the source,
a loop) → answer. Each update overwrites a memory bounded at ``memory_tokens`` tokens; the answer
sees only the final memory.

Recursion limit: a run takes ⌈source tokens / stream_chunk_tokens⌉ + 3 supersteps; the default
below (10,000) covers ~50M tokens at 5,000-token chunks. Pass ``recursion_limit`` in the run's
config for anything longer.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mia.nodes.context import MemAgentSettings
from mia.nodes.memory import after_update, answer, start_stream, update_memory
from mia.nodes.question import prepare
from mia.nodes.state import InputState, MemoryOutputState, MemoryState

RECURSION_LIMIT = 10_000

builder = StateGraph(MemoryState, context_schema=MemAgentSettings, input_schema=InputState, output_schema=MemoryOutputState)
builder.add_node("prepare", prepare)
builder.add_node("start_stream", start_stream)
builder.add_node("update_memory", update_memory)
builder.add_node("answer", answer)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "start_stream")
builder.add_conditional_edges("start_stream", after_update, ["update_memory", "answer"])
builder.add_conditional_edges("update_memory", after_update, ["update_memory", "answer"])
builder.add_edge("answer", END)

graph = builder.compile(name="memagent").with_config(recursion_limit=RECURSION_LIMIT)
