"""Nodes of the bounded-memory graphs over one mindscape's source (InfMem paper, Sec. 3).

``memagent``: stream the source in ``stream_chunk_tokens`` chunks; each step overwrites the
memory from (question, memory, chunk); answer from the final memory.
``infmem``: at each chunk, PreThink decides from (question, memory, retrieval history) whether
to STOP or SEARCH (query, top_k); SEARCH runs Retrieve (in-document BM25, the current chunk
excluded) and Write (retrieved passages + chunk + memory compressed together); STOP skips the
chunk's Write and counts toward early stop after ``stop_after`` consecutive STOPs.

The memory never exceeds ``memory_tokens`` tiktoken tokens: the model's generation is capped at
that many tokens and its text is then cut by counting (the model's tokenizer is not ours). The
source text stays out of the state: each step fetches it from the store and slices the chunk
at ``position``. Step-internal LLM calls are tagged "nostream" so chat frontends stream only the
answer; each finished step is emitted as a custom stream event.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.config import get_stream_writer
from langgraph.runtime import Runtime
from pydantic import BaseModel, Field, field_validator

from mia import prompts
from mia.nodes import resources
from mia.nodes.answer import NOTHING_FOUND, generate, options_for, usage_of, without_material
from mia.nodes.context import InfMemSettings, MemAgentSettings, StreamingGraphSettings
from mia.nodes.state import MemoryState
from mia.stores.bm25 import BM25Index, Window, source_text
from mia.stores.chat import json_call
from mia.stores.tokens import count_tokens, token_spans, truncate

TOP_K_RANGE = (3, 20)
FALLBACK_TOP_K = 5
PRETHINK_TOKENS = 160
# The paper caps retrieval at 4,000 tokens per 5,000-token chunk; scaling with the chunk keeps
# the Write prompt (chunk + passages + memory) a fixed multiple of the chunk.
RETRIEVED_SHARE = 0.8
# PreThink sees only the latest searches, so its prompt stays bounded on long sources.
HISTORY_SHOWN = 8


class PreThinkDecision(BaseModel):
    """PreThink's control record (a_t, u_t, k_t); out-of-range top_k is clamped, not rejected."""

    decision: Literal["STOP", "SEARCH"] = Field(description="STOP if the memory suffices, else SEARCH")
    # maxLength reaches the embedded model's grammar only (see nodes.agent): a query cut by the
    # token cap would make the whole reply unparseable.
    query: str = Field("", description="keyword query for the missing evidence (SEARCH only)", json_schema_extra={"maxLength": 160})
    top_k: int = Field(FALLBACK_TOP_K, description="passages to fetch, from 3 to 20 (SEARCH only)")

    @field_validator("decision", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("top_k")
    @classmethod
    def _clamp(cls, value: int) -> int:
        return min(max(value, TOP_K_RANGE[0]), TOP_K_RANGE[1])


# ---- helpers -------------------------------------------------------------------------------------

def next_span(source: str, start: int, tokens: int) -> tuple[int, int]:
    """Character range of the ``tokens``-token chunk that starts at ``start``.

    Tokenises only a window ahead of ``start`` (widened until it holds more than ``tokens``
    tokens or reaches the end), so a step costs the same at the start and the end of a long source.
    """
    width = tokens * 6
    while True:
        spans = token_spans(source[start : start + width])
        if len(spans) > tokens or start + width >= len(source):
            return start, start + (spans[min(tokens, len(spans)) - 1][1] if spans else 0)
        width *= 2


def count_segments(source: str, tokens: int) -> int:
    """How many chunks the stream has; walked with ``next_span`` so the count matches the steps."""
    position, segments = 0, 0
    while position < len(source):
        position = next_span(source, position, tokens)[1]
        segments += 1
    return segments


def bound(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` tokens, verified by counting.

    ``truncate`` decodes a token prefix; a cut inside a multi-byte character decodes to U+FFFD,
    which can re-encode to more tokens than it replaced, so the cut moves back until it fits.
    """
    text = text.strip()
    cut, kept = limit, truncate(text, limit)
    while count_tokens(kept) > limit:
        cut -= 1
        kept = truncate(text, cut)
    return kept.rstrip("\ufffd").strip()


def _memory_fence(memory: str) -> str:
    """A sentence, not a bare "(empty)", for a fresh memory: the small model echoed that token back.
    The memory is the model's own notes, written from guarded text: nothing in it is cut."""
    return prompts.fence(memory or "No notes yet.", tag="memory", guard=False)


def _progress(state: MemoryState) -> str:
    return (f"Next: section {state['step'] + 1} of {state['segments']}. "
            f"Consecutive STOP decisions so far: {state.get('stops', 0)}.")


def _history(records: list[dict[str, Any]]) -> str:
    shown = records[-HISTORY_SHOWN:]
    lines = [f"- section {r['step']}: \"{r['query']}\" (top {r['top_k']}) -> {len(r['windows'])} passages" for r in shown]
    return "\n".join(lines) or "(none yet)"


def _within_budget(hits: list[Window], budget: int) -> list[Window]:
    """The best hit always, then hits in rank order until the next would pass the token budget
    (the Write prompt must fit the model's context whatever top_k PreThink asked for)."""
    kept: list[Window] = []
    used = 0
    for hit in hits:
        used += count_tokens(hit.text)
        if kept and used > budget:
            break
        kept.append(hit)
    return kept


def _plan(parsed: PreThinkDecision | None, question: str, memory: str) -> dict[str, Any]:
    """The step's plan; output that does not parse into the schema becomes SEARCH(question, 5),
    and so does a STOP over an empty memory (``stop_refused``).

    SEARCH, not STOP: a controller whose output cannot be read must never end the stream early,
    and searching with the question itself keeps the step as useful as a MemAgent step. A STOP
    says the memory suffices, which an empty one never does: the 1.5B reader said STOP at each of
    its first three steps with nothing in memory, then answered with an invented name.
    """
    if parsed is None:
        return {"decision": "SEARCH", "query": question, "top_k": FALLBACK_TOP_K, "fallback": True}
    if parsed.decision == "STOP" and not memory.strip():
        return {"decision": "SEARCH", "query": question, "top_k": FALLBACK_TOP_K, "fallback": False, "stop_refused": True}
    if parsed.decision == "STOP":
        return {"decision": "STOP", "query": "", "top_k": 0, "fallback": False}
    return {"decision": "SEARCH", "query": parsed.query.strip() or question, "top_k": parsed.top_k, "fallback": False}


def _finish_step(event: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Emit the finished step to custom-stream listeners; the entry is also kept in ``trajectory``."""
    get_stream_writer()({"event": event, **entry})
    return [entry]


def _rewrite(ctx: StreamingGraphSettings, template: str, node: str, **values: str) -> tuple[str, dict[str, Any]]:
    """One memory-writing call: the new memory (bounded) and the call's usage."""
    llm = resources.chat_model(ctx, ctx.memory_tokens).with_config(tags=["nostream"])
    reply = llm.invoke(prompts.messages(template, limit=str(ctx.memory_tokens), words=str(ctx.memory_tokens * 3 // 4), **values))
    return bound(reply.text, ctx.memory_tokens), usage_of(reply, node)


# ---- nodes shared by both graphs -----------------------------------------------------------------

def start_stream(state: MemoryState, runtime: Runtime[StreamingGraphSettings]) -> dict[str, Any]:
    """Empty memory at the start of the source; counts the chunks so progress reads "t of T"."""
    source = source_text(resources.mindscape(runtime.context))
    return {
        "memory": "", "memory_tokens": 0, "position": 0, "step": 0, "stops": 0, "prethink_failures": 0,
        "segments": count_segments(source, runtime.context.stream_chunk_tokens),
        "plan": {}, "windows": [], "retrieval_history": [], "trajectory": [None],
    }


def answer(state: MemoryState, runtime: Runtime[StreamingGraphSettings]) -> dict[str, Any]:
    """Answer from the final memory alone, in the shared answer format (this call streams). An open
    question over an empty memory is answered that nothing was found, without a call."""
    ctx = runtime.context
    memory = state.get("memory", "")
    if not memory.strip() and ctx.answer_format == "open":
        return without_material(NOTHING_FOUND)
    return generate(resources.chat_model(ctx), state["question"], [], ctx.answer_format,
                    options_for(state, ctx), evidence=[memory] if memory else [], node="answer", guard=ctx.injection_guard)


# ---- memagent ----------------------------------------------------------------------------------

def update_memory(state: MemoryState, runtime: Runtime[MemAgentSettings]) -> dict[str, Any]:
    """MemAgent step: overwrite the memory from (question, memory, next chunk)."""
    ctx = runtime.context
    source = source_text(resources.mindscape(ctx))
    start, end = next_span(source, state["position"], ctx.stream_chunk_tokens)
    step = state["step"] + 1
    memory, usage = _rewrite(
        ctx, "memagent", "update_memory", question=state["question"], memory=_memory_fence(state.get("memory", "")),
        chunk=prompts.fence(source[start:end], guard=ctx.injection_guard, part=f"{step} of {state['segments']}"),
    )
    entry = {"step": step, "start": start, "end": end, "memory_tokens": count_tokens(memory)}
    return {"memory": memory, "memory_tokens": entry["memory_tokens"], "position": end, "step": step,
            "usage": usage, "trajectory": _finish_step("memagent_step", entry)}


def after_update(state: MemoryState) -> Literal["update_memory", "answer"]:
    return "update_memory" if state["step"] < state["segments"] else "answer"


# ---- infmem ------------------------------------------------------------------------------------

def prethink(state: MemoryState, runtime: Runtime[InfMemSettings]) -> dict[str, Any]:
    """PreThink on (q, m_{t-1}, retrieval history), before this step's Write.

    STOP ends the step here: the chunk is skipped (the memory already suffices) and the
    consecutive-STOP count grows; SEARCH resets it and hands the plan to Retrieve.
    """
    ctx = runtime.context
    messages = prompts.messages(
        "prethink", question=state["question"], memory=_memory_fence(state.get("memory", "")),
        history=_history(state.get("retrieval_history", [])), progress=_progress(state),
    )
    parsed, raw = json_call(resources.chat_model(ctx, PRETHINK_TOKENS), messages, PreThinkDecision)  # tagged "nostream"
    plan = _plan(parsed, state["question"], state.get("memory", ""))
    update: dict[str, Any] = {"plan": plan, "windows": [], "usage": usage_of(raw, "prethink"),
                              "prethink_failures": state.get("prethink_failures", 0) + int(plan["fallback"])}
    if plan["decision"] == "SEARCH":
        return {**update, "stops": 0}
    start, end = next_span(source_text(resources.mindscape(ctx)), state["position"], ctx.stream_chunk_tokens)
    step = state["step"] + 1
    entry = {"step": step, "start": start, "end": end, **plan, "retrieved": [], "memory_tokens": state.get("memory_tokens", 0)}
    return {**update, "stops": state.get("stops", 0) + 1, "position": end, "step": step,
            "trajectory": _finish_step("infmem_step", entry)}


def after_prethink(state: MemoryState, runtime: Runtime[InfMemSettings]) -> Literal["retrieve", "prethink", "answer"]:
    if state["plan"]["decision"] == "SEARCH":
        return "retrieve"
    if state["stops"] >= runtime.context.stop_after or state["step"] >= state["segments"]:
        return "answer"
    return "prethink"


def retrieve(state: MemoryState, runtime: Runtime[InfMemSettings]) -> dict[str, Any]:
    """BM25 over the whole source with PreThink's query and top_k, the current chunk excluded."""
    ctx = runtime.context
    index = BM25Index.for_collection(resources.mindscape(ctx), ctx.bm25_window, ctx.bm25_overlap)
    chunk = next_span(index.source, state["position"], ctx.stream_chunk_tokens)
    plan = state["plan"]
    hits = index.search(plan["query"], plan["top_k"], exclude=chunk)
    hits = _within_budget(hits, int(RETRIEVED_SHARE * ctx.stream_chunk_tokens))
    windows = [{"id": h.id, "start": h.start, "end": h.end, "score": round(h.score, 4)} for h in hits]
    record = {"step": state["step"] + 1, "query": plan["query"], "top_k": plan["top_k"], "windows": [w["id"] for w in windows]}
    return {"windows": windows, "retrieval_history": [*state.get("retrieval_history", []), record]}


def write(state: MemoryState, runtime: Runtime[InfMemSettings]) -> dict[str, Any]:
    """Write: jointly compress retrieved passages + current chunk + memory under the bound."""
    ctx = runtime.context
    index = BM25Index.for_collection(resources.mindscape(ctx), ctx.bm25_window, ctx.bm25_overlap)
    start, end = next_span(index.source, state["position"], ctx.stream_chunk_tokens)
    step = state["step"] + 1
    windows = state.get("windows", [])
    passages = "\n".join(prompts.fence(index.window(w["id"]).text, guard=ctx.injection_guard, n=i + 1, kind="retrieved") for i, w in enumerate(windows))
    memory, usage = _rewrite(
        ctx, "write", "write", question=state["question"], memory=_memory_fence(state.get("memory", "")),
        passages=passages or "(none found)",
        chunk=prompts.fence(index.source[start:end], guard=ctx.injection_guard, kind="current", part=f"{step} of {state['segments']}"),
    )
    entry = {"step": step, "start": start, "end": end, **state["plan"], "retrieved": [w["id"] for w in windows],
             "memory_tokens": count_tokens(memory)}
    return {"memory": memory, "memory_tokens": entry["memory_tokens"], "position": end, "step": step,
            "usage": usage, "trajectory": _finish_step("infmem_step", entry)}


def after_write(state: MemoryState) -> Literal["prethink", "answer"]:
    return "prethink" if state["step"] < state["segments"] else "answer"
