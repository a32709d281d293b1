"""Nodes of the static graphs: ``rag`` (E1 → generate) and ``mia_rag`` (E1 → InitSignature → E2 → generate)."""

from __future__ import annotations

import uuid
from typing import Any, Sequence

import numpy as np

from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime

from mia import prompts
from mia.nodes import resources
from mia.nodes.answer import generate as answer_with
from mia.nodes.answer import options_for, reader_input, usage_of, without_sources
from mia.nodes.context import (CommonSettings, MiaRagSettings, RagSettings, SignatureGraphSettings, SignatureSettings,
                               StaticSettings)
from mia.nodes.retrieval import Fusion, as_scored, query_only, signature_ranking
from mia.nodes.signature import coverage_aware, first_k, summary_pool
from mia.nodes.state import QAState
from mia.stores.mindscape import ChunkHit, chunk_book


class QuestionError(ValueError):
    """The run has no usable question."""


def question_of(state: dict[str, Any]) -> str:
    """The question this run asks: a human message not answered yet, else the explicit ``question``.

    On a thread the state keeps the previous turn; a trailing human message that an earlier run
    already took (``asked_id``) is not new, so ``{"question": ...}`` then wins.
    """
    question = (state.get("question") or "").strip()
    messages = state.get("messages") or []
    last = messages[-1] if messages else None
    if isinstance(last, HumanMessage) and last.id != state.get("asked_id") and last.text.strip():
        question = last.text.strip()
    if not question:
        raise QuestionError("empty question: send a non-empty `question` or a human message")
    return question


def prepare(state: QAState, runtime: Runtime[CommonSettings]) -> dict[str, Any]:
    """Start a new question: fix it in the state and clear the previous turn's results on a thread.

    A follow-up on a thread ("and who was his wife?") is rewritten into a standalone question from
    the earlier turns, since retrieval only sees the question; the first turn costs no LLM call.
    """
    question = question_of(state)
    update: dict[str, Any] = {"usage": {"reset": True}, "signature": [], "step0": [], "snapshot": "",
                              "retrieved": [], "citations": [], "answer": ""}
    messages = state.get("messages") or []
    last = messages[-1] if messages else None
    if isinstance(last, HumanMessage) and last.id != state.get("asked_id") and last.text.strip() == question:
        update["asked_id"] = last.id
        if any(m.type == "ai" for m in messages[:-1]):
            question, usage = standalone_question(messages[:-1], question, runtime.context)
            update["usage"] = {"reset": True, **usage}
    else:
        asked = HumanMessage(content=question, id=str(uuid.uuid4()))
        update["messages"] = [asked]
        update["asked_id"] = asked.id
    update["question"] = question
    return update


def standalone_question(history: list[Any], question: str, ctx: CommonSettings) -> tuple[str, dict[str, Any]]:
    turns = "\n".join(f"{'User' if m.type == 'human' else 'Assistant'}: {without_sources(m.text)}" for m in history[-6:])
    llm = resources.chat_model(ctx, max_tokens=96).with_config(tags=["nostream"])
    # The conversation is the user's own words (and answers): nothing in it is cut as an instruction.
    reply = llm.invoke(prompts.messages("condense", conversation=prompts.fence(turns, tag="conversation", guard=False), question=question))
    rewritten = reply.text.strip().strip('"') or question
    return rewritten, usage_of(reply, "prepare")


def retrieve(state: QAState, runtime: Runtime[RagSettings]) -> dict[str, Any]:
    """Query-only RAG: the top_k chunks by the query vector."""
    ctx = runtime.context
    store = resources.mindscape(ctx)
    query_vec = resources.embedder(store).embed_query(state["question"])
    hits = query_only(store, query_vec, ctx.top_k, text=state["question"], fusion=Fusion.of(ctx),
                      depth=ctx.candidates, for_signature=False)
    return {"retrieved": as_scored(hits)}


def init_signature(state: QAState, runtime: Runtime[MiaRagSettings]) -> dict[str, Any]:
    """Step 0 (E1, K0 candidates) and the signature selected from the summaries they light up."""
    return initial_signature(state["question"], runtime.context)


def initial_signature(question: str, ctx: SignatureGraphSettings) -> dict[str, Any]:
    """σ_0 and the step-0 ranking."""
    store = resources.mindscape(ctx)
    query_vec = resources.embedder(store).embed_query(question)
    step0 = query_only(store, query_vec, ctx.k0, text=question, fusion=Fusion.of(ctx), depth=ctx.candidates)
    return {"step0": as_scored(step0), "signature": select_signature(store, question, query_vec, step0, ctx),
            "snapshot": resources.share(store)}


def select_signature(store: Any, question: str, query_vec: Any, step0: Sequence[ChunkHit],
                     ctx: SignatureGraphSettings) -> list[dict[str, Any]]:
    """InitSignature (``signature_init``) over the ranked step-0 hits. Under ``signature_levels``
    sessions+books a chunk is covered by its session and by its book's unit, the paper's overcomplete
    memory: coverage then overlaps, and a book unit competes with the sessions it spans."""
    covered = [h for h in step0 if h.summary_id]
    if step0 and not covered:
        raise resources.MindscapeError(
            f"collection {store.name!r} has no session summaries: re-ingest it with --summarizer llm or extractive"
        )
    books = [chunk_book(h.id) for h in covered]
    units = store.book_units(books) if ctx.signature_levels == "sessions+books" else {}
    if covered and ctx.signature_levels == "sessions+books" and not units:
        raise resources.MindscapeError(
            f"signature_levels sessions+books needs book units, and the books of collection {store.name!r} that the "
            "question reached have none: rerun `mia ingest` on them (--cards names or llm) to write them"
        )
    ranked_summaries = [[h.summary_id, units[book]] if book in units else h.summary_id for h, book in zip(covered, books)]
    if ctx.signature_init == "first_k":
        picks = first_k(ranked_summaries, ctx.k_sum)
    else:
        pool, coverage = summary_pool(ranked_summaries)
        e_q, summary_vecs, chunk_vecs = selection_vectors(store, ctx, question, query_vec, pool, covered)
        picks = coverage_aware(e_q, pool, summary_vecs, chunk_vecs, coverage, k=ctx.k_sum,
                               lambdas=(ctx.lambda_q, ctx.lambda_c, ctx.lambda_d))
    return [{"id": p.summary_id, "gain": round(p.gain, 6), "relevance": round(p.relevance, 6),
             "coverage": round(p.coverage, 6), "diversity": round(p.diversity, 6)} for p in picks]


def selection_vectors(store: Any, ctx: SignatureSettings, question: str, query_vec: np.ndarray, pool: Sequence[str],
                      covered: Sequence[ChunkHit]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e_q, summary vectors, chunk vectors) for the selection objective: the collection's own
    vectors, or those of ``selection_embedder`` (the paper's BGE-M3), which embeds the question,
    the pool's summaries and the step-0 chunks afresh: one encoder pass of about K0 + |pool| texts
    per question, worth a GPU."""
    if not ctx.selection_embedder:
        return query_vec, store.vectors("summaries", pool), np.stack([h.vector for h in covered])
    encoder = resources.selection_embedder(ctx)
    summaries = [r["text"] for r in store.summary_records(pool)]
    chunks = [r["text"] for r in store.chunk_records([h.id for h in covered])]
    return encoder.embed_query(question), encoder.embed_documents(summaries), encoder.embed_documents(chunks)


def retrieve_with_signature(state: QAState, runtime: Runtime[MiaRagSettings]) -> dict[str, Any]:
    """E2 over the whole collection, conditioned on the question and the signature (``sig_strategy``); on the
    snapshot step 0 read, so the books' rows and the vectors it fetched are not read again."""
    ctx = runtime.context
    store = resources.mindscape(ctx, state.get("snapshot", ""))
    embedder = resources.embedder(store)
    query_vec = embedder.embed_query(state["question"])
    summary_ids = [s["id"] for s in state["signature"]]
    hits = signature_ranking(ctx, store, embedder, state["question"], query_vec, summary_ids, ctx.top_k)
    return {"retrieved": [h.as_dict() for h in hits]}


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
    signature = [r["text"] for r in store.summary_records(sig_ids)] if sig_ids else []
    return answer_with(resources.chat_model(ctx), state["question"], chunks, ctx.answer_format,
                       options_for(state, ctx), signature=signature, guard=ctx.injection_guard,
                       cards=cards)

