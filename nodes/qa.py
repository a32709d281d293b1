"""Nodes of the static graphs: ``rag`` (E1 → generate) and ``mia_rag`` (E1 → InitSignature → E2 → generate)."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from mia.nodes import resources
from mia.nodes.answer import generate as answer_with
from mia.nodes.answer import options_for, reader_input, signature_units
from mia.nodes.context import (MiaRagSettings, RagSettings, StaticSettings)
from mia.nodes.retrieval import Fusion, as_scored, query_only, signature_ranking
from mia.nodes.signature_init import initial_signature
from mia.nodes.state import QAState


def retrieve(state: QAState, runtime: Runtime[RagSettings]) -> dict[str, Any]:
    """Query-only RAG: the top_k chunks by the query vector."""
    ctx = runtime.context
    store = resources.mindscape(ctx)
    search = search_text(state)
    query_vec = resources.embedder(store).embed_query(search)
    hits = query_only(store, query_vec, ctx.top_k, text=search, fusion=Fusion.of(ctx),
                      depth=ctx.candidates, for_signature=False)
    return {"retrieved": as_scored(hits)}


def init_signature(state: QAState, runtime: Runtime[MiaRagSettings]) -> dict[str, Any]:
    """Step 0 (E1, K0 candidates) and the signature selected from the summaries they light up."""
    return initial_signature(search_text(state), runtime.context)


def retrieve_with_signature(state: QAState, runtime: Runtime[MiaRagSettings]) -> dict[str, Any]:
    """E2 over the whole collection, conditioned on the question and the signature (``sig_strategy``); on the
    snapshot step 0 read, so the books' rows and the vectors it fetched are not read again."""
    ctx = runtime.context
    store = resources.mindscape(ctx, state.get("snapshot", ""))
    embedder = resources.embedder(store)
    search = search_text(state)
    query_vec = embedder.embed_query(search)
    summary_ids = [s["id"] for s in state["signature"]]
    hits = signature_ranking(ctx, store, embedder, search, query_vec, summary_ids, ctx.top_k)
    return {"retrieved": [h.as_dict() for h in hits]}


def search_text(state: QAState) -> str:
    """What the retrieval nodes search with: the question, then the passage the model wrote for it
    under ``hypothetical_passage`` (``hypothesis.hypothesize``)."""
    return "\n".join(filter(None, (state["question"], state.get("hypothesis"))))


def after_retrieval(state: QAState, runtime: Runtime[StaticSettings]) -> str:
    """Route to the generator unless the run only wants the rankings."""
    return "end" if runtime.context.retrieval_only else "generate"


def generate(state: QAState, runtime: Runtime[RagSettings]) -> dict[str, Any]:
    """Answer from the retrieved chunks alone."""
    return _answer(state, runtime.context, with_signature=False)


def generate_with_signature(state: QAState, runtime: Runtime[MiaRagSettings]) -> dict[str, Any]:
    """Answer from the retrieved chunks, and the signature's summaries under answer_inputs chunks+sig."""
    return _answer(state, runtime.context, with_signature=runtime.context.answer_inputs == "chunks+sig")


def _answer(state: QAState, ctx: RagSettings | MiaRagSettings, with_signature: bool) -> dict[str, Any]:
    store = resources.mindscape(ctx)
    chunks, cards = reader_input(store, [r["id"] for r in state.get("retrieved", [])], ctx)
    sig_ids = [s["id"] for s in state.get("signature") or []] if with_signature else []
    signature = signature_units(store, sig_ids) if sig_ids else []
    return answer_with(resources.chat_model(ctx), state["question"], chunks, ctx.answer_format,
                       options_for(state, ctx), signature=signature, guard=ctx.injection_guard,
                       cards=cards)

