"""Graph ``mia_agent``: the MiA-Signature agent (Alg. 1).

InitSignature (First-K σ_0 by default) → [Retrieve (E2 with q_t, σ_t) → Update (M_upd, Eq. 5)]
repeated until M_upd decides to answer or N_stop steps are spent → Generate (Eq. 6).
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mia.nodes.agent import generate, init_signature, next_step, prepare, retrieve_with_signature, update_with_signature
from mia.nodes.context import MiaAgentSettings
from mia.nodes.state import AgentState, InputState, OutputState

builder = StateGraph(AgentState, context_schema=MiaAgentSettings, input_schema=InputState, output_schema=OutputState)
builder.add_node("prepare", prepare)
builder.add_node("init_signature", init_signature)
builder.add_node("retrieve", retrieve_with_signature)
builder.add_node("update", update_with_signature)
builder.add_node("generate", generate)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "init_signature")
builder.add_edge("init_signature", "retrieve")
builder.add_edge("retrieve", "update")
builder.add_conditional_edges("update", next_step, {"retrieve": "retrieve", "generate": "generate"})
builder.add_edge("generate", END)

graph = builder.compile(name="mia_agent")
