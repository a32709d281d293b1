"""Graph ``rag``: query-only retrieval → answer. The baseline every MiA variant is compared with.

The query is the question, or with ``hypothetical_passage`` the question and a passage the model
wrote for it (``nodes.hypothesis``): a search aid either graph may use, not part of the signature.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mia.nodes.context import RagSettings
from mia.nodes.hypothesis import hypothesize
from mia.nodes.qa import after_retrieval, generate, retrieve
from mia.nodes.question import prepare
from mia.nodes.state import InputState, OutputState, QAState

builder = StateGraph(QAState, context_schema=RagSettings, input_schema=InputState, output_schema=OutputState)
builder.add_node("prepare", prepare)
builder.add_node("hypothesize", hypothesize)
builder.add_node("retrieve", retrieve)
builder.add_node("generate", generate)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "hypothesize")
builder.add_edge("hypothesize", "retrieve")
builder.add_conditional_edges("retrieve", after_retrieval, {"generate": "generate", "end": END})
builder.add_edge("generate", END)

graph = builder.compile(name="rag")
