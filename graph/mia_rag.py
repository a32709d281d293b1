"""Graph ``mia_rag``: static MiA-RAG (Sec. 3.2.2).

Step-0 query-only retrieval of K0 chunks → InitSignature (coverage-aware greedy selection of
K_sum session summaries, App. A) → retrieval conditioned on query + signature (the trained signature
head by default, the paper's Eq. 4 with sig_strategy centroid or mia) → answer.
The query may carry a hypothetical passage (``hypothetical_passage``), as ``rag``'s may.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mia.nodes.context import MiaRagSettings
from mia.nodes.hypothesis import hypothesize
from mia.nodes.qa import after_retrieval, generate_with_signature, init_signature, retrieve_with_signature
from mia.nodes.question import prepare
from mia.nodes.state import InputState, OutputState, QAState

builder = StateGraph(QAState, context_schema=MiaRagSettings, input_schema=InputState, output_schema=OutputState)
builder.add_node("prepare", prepare)
builder.add_node("hypothesize", hypothesize)
builder.add_node("init_signature", init_signature)
builder.add_node("retrieve", retrieve_with_signature)
builder.add_node("generate", generate_with_signature)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "hypothesize")
builder.add_edge("hypothesize", "init_signature")
builder.add_edge("init_signature", "retrieve")
builder.add_conditional_edges("retrieve", after_retrieval, {"generate": "generate", "end": END})
builder.add_edge("generate", END)

graph = builder.compile(name="mia_rag")
