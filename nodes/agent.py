"""Nodes of the iterative agents: ``mia_agent`` (Alg. 1 of the MiA-Signature paper) and ``agent``.

State at step t is (q_t, σ_t, E_t) plus the retrieved P_t. One structured call to M_upd (Eq. 5)
returns the decision, q_{t+1}, σ_{t+1} and new facts. The model refers to passages and summaries
by short labels (C1.., S1..) that are mapped back to store ids here, so it never writes ids or
summary text: whatever it invents outside those labels is dropped and counted, and output that
cannot be used at all leaves the state unchanged (decision: continue), so a small or confused
model degrades the run but never breaks it. ``agent`` is the same loop without σ: it never reads
summaries.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime
from pydantic import BaseModel, BeforeValidator, Field

from mia import prompts
from mia.nodes import resources
from mia.nodes.answer import generate as answer_with
from mia.nodes.answer import options_for, reader_input, signature_units, usage_of
from mia.nodes.context import AgentGraphSettings, AgentSettings, MiaAgentSettings
from mia.nodes.question import prepare as prepare_question
from mia.nodes.signature_init import initial_signature
from mia.nodes.retrieval import Fusion, as_scored, query_only, signature_ranking
from mia.nodes.state import AgentState
from mia.prompts.injection import decode, planted
from mia.stores.chat import json_call


def _as_list(value: Any) -> Any:
    """Repair a common small-model slip: a comma-separated string where a list of labels belongs."""
    if isinstance(value, str):
        return [part.strip() for part in value.replace(";", ",").split(",") if part.strip()]
    return value


Labels = Annotated[list[str], BeforeValidator(_as_list)]


# Bounds written into the JSON schema only. The embedded model decodes under the schema's grammar,
# which enforces them: left unbounded, a 0.5B model listed facts until the 512-token cap, and a reply
# cut there is not JSON (every Update of a multi-hop run failed that way). Validation ignores them,
# so an endpoint's longer reply still parses. Worst case within them: about 350 tokens.
UPDATE_TOKENS = 512
_TEXT = {"maxLength": 200}
_QUERY = {"maxLength": 160}
_FACTS = {"maxItems": 4}
_CITES = {"maxItems": 3}
_SIGNATURE = {"maxItems": 8}


class Fact(BaseModel):
    fact: str = Field(json_schema_extra=_TEXT)
    chunks: Labels = Field(default_factory=list, json_schema_extra=_CITES)


class UpdateOutput(BaseModel):
    """M_upd's reply; every field has a default so partial JSON still parses (and is repaired)."""

    decision: Literal["answer", "continue"] = "continue"
    next_query: str = Field("", json_schema_extra=_QUERY)
    signature: Labels = Field(default_factory=list, json_schema_extra=_SIGNATURE)
    new_evidence: list[Fact] = Field(default_factory=list, json_schema_extra=_FACTS)


class NoSignatureUpdate(BaseModel):
    decision: Literal["answer", "continue"] = "continue"
    next_query: str = Field("", json_schema_extra=_QUERY)
    new_evidence: list[Fact] = Field(default_factory=list, json_schema_extra=_FACTS)


def prepare(state: AgentState, runtime: Runtime[AgentGraphSettings]) -> dict[str, Any]:
    """q_0 = q, E_0 = ∅, t = 0."""
    update = prepare_question(state, runtime)
    return {**update, "query": update["question"], "evidence": [], "step": 0, "decision": "",
            "update_failures": 0, "trajectory": [None]}


def init_signature(state: AgentState, runtime: Runtime[MiaAgentSettings]) -> dict[str, Any]:
    """σ_0 from the step-0 query-only pool; First-K by default in the agent (App. A)."""
    return initial_signature(state["question"], runtime.context)


def retrieve(state: AgentState, runtime: Runtime[AgentGraphSettings]) -> dict[str, Any]:
    """P_t: the step_k chunks for q_t alone (``agent``, and ``mia_agent`` while σ_t is empty)."""
    ctx = runtime.context
    store = resources.mindscape(ctx)
    query_vec = resources.embedder(store).embed_query(state["query"])
    hits = query_only(store, query_vec, ctx.step_k, text=state["query"], fusion=Fusion.of(ctx), depth=ctx.candidates,
                      for_signature=False)
    return {"retrieved": as_scored(hits)}


def retrieve_with_signature(state: AgentState, runtime: Runtime[MiaAgentSettings]) -> dict[str, Any]:
    """P_t: E2 with (q_t, σ_t)."""
    summary_ids = [s["id"] for s in state.get("signature") or []]
    if not summary_ids:
        return retrieve(state, runtime)
    ctx = runtime.context
    store = resources.mindscape(ctx)
    embedder = resources.embedder(store)
    query_vec = embedder.embed_query(state["query"])
    hits = signature_ranking(ctx, store, embedder, state["query"], query_vec, summary_ids, ctx.step_k)
    return {"retrieved": [h.as_dict() for h in hits]}


def _labelled(prefix: str, ids: list[str]) -> dict[str, str]:
    return {f"{prefix}{i + 1}": id_ for i, id_ in enumerate(ids)}


def update(state: AgentState, ctx: AgentGraphSettings, *, k_sum: int) -> dict[str, Any]:
    """M_upd (Eq. 5): (d_t, q_{t+1}, σ_{t+1}, E_{t+1}) from (q_t, σ_t, P_t, E_t, H_t); σ has at most
    ``k_sum`` summaries, and a ``k_sum`` of 0 is the loop without a signature (``agent``)."""
    with_signature = k_sum > 0
    store = resources.mindscape(ctx)
    chunks = store.chunk_records([r["id"] for r in state["retrieved"]])
    chunk_labels = _labelled("C", [c["id"] for c in chunks])
    sig_ids = [s["id"] for s in state.get("signature") or []]
    if with_signature:
        # H_t: the summaries of the retrieved chunks, offered beside σ_t for the refined signature.
        candidates = list(dict.fromkeys(sig_ids + [c["summary_id"] for c in chunks if c.get("summary_id")]))
        summary_labels = _labelled("S", candidates)
        summaries = {r["id"]: r["text"] for r in store.summary_records(candidates)}
    else:
        summary_labels, summaries = {}, {}
    messages = _update_messages(state, ctx, chunks, chunk_labels, sig_ids, summary_labels, summaries, k_sum)
    schema = UpdateOutput if with_signature else NoSignatureUpdate
    parsed, raw = json_call(resources.chat_model(ctx, max_tokens=UPDATE_TOKENS), messages, schema)
    material = [c["text"] for c in chunks] + list(summaries.values())
    known = [decode(c.get("guard_trace", "")) for c in chunks]
    return _apply(state, ctx, parsed, raw, chunk_labels, summary_labels, k_sum, material, known)


def _update_messages(state: AgentState, ctx: AgentGraphSettings, chunks: list[dict[str, Any]], chunk_labels: dict[str, str],
                     sig_ids: list[str], summary_labels: dict[str, str], summaries: dict[str, str],
                     k_sum: int) -> list[Any]:
    label_of_chunk = {v: k for k, v in chunk_labels.items()}
    guard = ctx.injection_guard
    passages = "\n".join(prompts.fence(c["text"], guard=guard, cut=decode(c.get("guard_cut", "")), id=label_of_chunk[c["id"]],
                                       book=c["book"]) for c in chunks)
    evidence = state.get("evidence") or []
    evidence_block = (
        "Facts gathered so far:\n" + prompts.fence("\n".join(f"- {e['fact']}" for e in evidence), tag="evidence", guard=False) + "\n\n"
        if evidence else ""
    )
    if k_sum:
        label_of_summary = {v: k for k, v in summary_labels.items()}
        current = [label_of_summary[i] for i in sig_ids if i in label_of_summary]
        signature_block = (
            f"Current signature: {', '.join(current) or '(empty)'}\nSummaries you may choose from:\n"
            + "\n".join(prompts.fence(summaries.get(i, ""), tag="summary", guard=guard, id=label) for label, i in summary_labels.items())
            + "\n\n"
        )
        signature_rule = (
            f'- "signature": the labels (S1, S2, ...) of at most {k_sum} summaries, chosen from those listed, '
            "that best describe the part of the source the question is about.\n"
        )
        kinds = "the current signature (a few summaries of the relevant parts of the source), facts gathered so far"
    else:
        signature_block, signature_rule, kinds = "", "", "facts gathered so far"
    query_rule = (
        "the next search query: what is still missing to answer the question." if ctx.rewrite_query
        else "repeat the current query unchanged."
    )
    return prompts.messages(
        "update", memory_kinds=kinds, query_rule=query_rule, signature_rule=signature_rule,
        question=state["question"], query=state["query"], signature_block=signature_block,
        evidence_block=evidence_block, passages=passages,
    )


def _apply(state: AgentState, ctx: AgentGraphSettings, parsed: BaseModel | None, raw: AIMessage, chunk_labels: dict[str, str],
           summary_labels: dict[str, str], k_sum: int, material: list[str],
           known: list[list[tuple[int, int]]]) -> dict[str, Any]:
    """The state update from M_upd's reply. Labels outside those offered are dropped; with the
    injection guard, so are facts and a next query traced to an instruction in the passages
    (``injection.planted``): a document cannot choose what the agent remembers or searches next."""
    step = int(state.get("step", 0)) + 1
    usage = usage_of(raw, "update")
    if parsed is None:
        entry = {"step": step, "query": state["query"], "decision": "continue", "failure": "unparseable output"}
        _emit(entry)
        return {"step": step, "decision": "continue", "update_failures": int(state.get("update_failures", 0)) + 1,
                "usage": usage, "trajectory": [entry]}
    guarded: list[str] = []
    trusted = (state["question"], state["query"])

    def traced(text: str) -> bool:
        if ctx.injection_guard and planted(text, material, trusted, known):
            guarded.append(text)
            return True
        return False

    dropped = 0
    facts = []
    for fact in parsed.new_evidence:
        cited = [chunk_labels[c.strip()] for c in fact.chunks if c.strip() in chunk_labels]
        dropped += len(fact.chunks) - len(cited)
        if cited and fact.fact.strip() and not traced(fact.fact):
            facts.append({"fact": fact.fact.strip(), "chunks": cited, "step": step})
        else:
            dropped += 1
    update: dict[str, Any] = {"step": step, "decision": parsed.decision, "usage": usage,
                              "evidence": list(state.get("evidence") or []) + facts}
    next_query = parsed.next_query.strip()
    if ctx.rewrite_query and next_query and not traced(next_query):
        update["query"] = next_query
    if k_sum:
        chosen = list(dict.fromkeys(summary_labels[s.strip()] for s in parsed.signature if s.strip() in summary_labels))
        dropped += len(parsed.signature) - len(chosen)
        if chosen:  # an empty or fully invented signature keeps σ_t
            update["signature"] = [{"id": i} for i in chosen[:k_sum]]
    entry = {"step": step, "query": state["query"], "decision": parsed.decision,
             "next_query": update.get("query", state["query"]),
             "signature": [s["id"] for s in update.get("signature", state.get("signature") or [])],
             "new_evidence": facts, "rejected": dropped, **({"guard_rejected": guarded} if guarded else {})}
    if dropped:
        update["update_failures"] = int(state.get("update_failures", 0)) + 1
    update["trajectory"] = [entry]
    _emit(entry)
    return update


def _emit(entry: dict[str, Any]) -> None:
    """Each step's query, signature and new evidence as a custom stream event (Studio, chat UIs).

    Outside a graph run (a node called directly) there is no stream to write to."""
    try:
        writer = get_stream_writer()
    except RuntimeError:
        return
    writer({"event": "agent_step", **entry})


def update_with_signature(state: AgentState, runtime: Runtime[MiaAgentSettings]) -> dict[str, Any]:
    return update(state, runtime.context, k_sum=runtime.context.k_sum)


def update_without_signature(state: AgentState, runtime: Runtime[AgentSettings]) -> dict[str, Any]:
    return update(state, runtime.context, k_sum=0)


def next_step(state: AgentState, runtime: Runtime[AgentGraphSettings]) -> str:
    """Answer when M_upd says so or the budget N_stop is spent; otherwise retrieve again."""
    if state.get("decision") == "answer" or int(state.get("step", 0)) >= runtime.context.max_steps:
        return "generate"
    return "retrieve"


def generate(state: AgentState, runtime: Runtime[AgentGraphSettings]) -> dict[str, Any]:
    """M_gen(q, P_t, σ_{t+1}, E_{t+1}) (Eq. 6), with the memories ``answer_inputs`` names."""
    ctx = runtime.context
    store = resources.mindscape(ctx)
    chunks, cards = reader_input(store, [r["id"] for r in state.get("retrieved", [])][: ctx.top_k], ctx)
    sig_ids = [s["id"] for s in state.get("signature") or []] if "sig" in ctx.answer_inputs else []
    signature = signature_units(store, sig_ids) if sig_ids else []
    evidence = [e["fact"] for e in state.get("evidence") or []] if "evi" in ctx.answer_inputs else []
    return answer_with(resources.chat_model(ctx), state["question"], chunks, ctx.answer_format,
                       options_for(state, ctx), signature=signature, evidence=evidence, guard=ctx.injection_guard,
                       cards=cards)
