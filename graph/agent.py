"""Graph ``agent``: the MiA agent's loop without a signature (the paper's "Agent w/o signature").

Retrieve (query only, q_t) → Update (decision, q_{t+1}, new evidence) repeated up to N_stop
steps → Generate. No σ in its state, and it never reads a summary.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mia.nodes.agent import generate, next_step, prepare, retrieve, update_without_signature
from mia.nodes.context import AgentSettings
from mia.nodes.state import AgentState, InputState, OutputState

builder = StateGraph(AgentState, context_schema=AgentSettings, input_schema=InputState, output_schema=OutputState)
builder.add_node("prepare", prepare)
builder.add_node("retrieve", retrieve)
builder.add_node("update", update_without_signature)
builder.add_node("generate", generate)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "retrieve")
builder.add_edge("retrieve", "update")
builder.add_conditional_edges("update", next_step, {"retrieve": "retrieve", "generate": "generate"})
builder.add_edge("generate", END)

graph = builder.compile(name="agent")
