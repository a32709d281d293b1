"""Graph state: ids and small values only; texts are fetched from the mindscape when needed.

Keeping chunk and summary texts out of the state keeps checkpoints small and makes the state
history in Studio readable: what a step retrieved is a list of ids with scores.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages


def merge_usage(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Add up LLM calls and tokens, in total and per node; ``{"reset": True}`` starts a new question."""
    if right and right.get("reset"):
        return {k: v for k, v in right.items() if k != "reset"}
    out: dict[str, Any] = {"llm_calls": 0, "input_tokens": 0, "output_tokens": 0, "by_node": {}}
    for part in (left or {}, right or {}):
        for key in ("llm_calls", "input_tokens", "output_tokens"):
            out[key] += int(part.get(key, 0))
        for node, counts in part.get("by_node", {}).items():
            mine = out["by_node"].setdefault(node, {"llm_calls": 0, "input_tokens": 0, "output_tokens": 0})
            for key in mine:
                mine[key] += int(counts.get(key, 0))
    return out


def replace_or_append(left: list[Any] | None, right: list[Any] | None) -> list[Any]:
    """Per-step records accumulate within a question; ``None`` entries mark a reset."""
    if right and right[0] is None:
        return list(right[1:])
    return list(left or []) + list(right or [])


class InputState(TypedDict, total=False):
    """What a caller sends: a conversation (chat frontends) or a bare question."""

    messages: Annotated[list[AnyMessage], add_messages]
    question: str
    options: list[str]


class OutputState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    question: str
    answer: str
    citations: list[dict[str, Any]]
    signature: list[dict[str, Any]]
    retrieved: list[dict[str, Any]]
    usage: Annotated[dict[str, Any], merge_usage]
    guard: dict[str, Any]
    """What the injection guard did for the answer: spans cut from the passages (book offsets),
    answers rejected as traced to an instruction."""
    hypothesis: str
    """The passage the model wrote for the question under ``hypothetical_passage`` (empty otherwise),
    which the static graphs' retrieval searched with after the question: shown so a user can see why a
    passage was found."""
    step0: list[dict[str, Any]]
    """The step-0 query-only ranking (K0 ids with scores) of the graphs that select a signature:
    what the signature changed is read against it (``--explain``, the web page). The server streams
    and returns only these output keys, so it must be one of them."""


class QAState(InputState, OutputState, total=False):
    """Static graphs (rag, mia_rag): ``asked_id`` marks the human message already answered on a thread."""

    asked_id: str
    snapshot: str
    """The token under which step 0 shared its store snapshot with E2 (``resources.share``)."""


class AgentState(QAState, total=False):
    """MiA-Agent (Alg. 1): q_t, σ_t (in ``signature``), E_t, P_t (in ``retrieved``), t and d_t."""

    query: str
    evidence: list[dict[str, Any]]
    step: int
    decision: str
    update_failures: int
    trajectory: Annotated[list[Any], replace_or_append]


class MemoryOutputState(OutputState, total=False):
    """InfMem / MemAgent results besides the answer: the final memory and what each step did."""

    memory: str
    memory_tokens: int
    step: int
    segments: int
    prethink_failures: int
    trajectory: Annotated[list[Any], replace_or_append]


class MemoryState(InputState, MemoryOutputState, total=False):
    """InfMem / MemAgent: the bounded memory and the streaming position.

    ``position`` is the character offset in the source of the next chunk to read; ``plan`` is
    the current step's PreThink record (decision, query, top_k, fallback) and ``windows`` the
    BM25 windows it retrieved (ids and offsets; Write fetches their text from the index).
    """

    position: int
    stops: int
    plan: dict[str, Any]
    windows: list[dict[str, Any]]
    retrieval_history: list[dict[str, Any]]
