"""The question a run asks: taken from the messages or the ``question`` field, fixed in the state,
and on a thread rewritten into a standalone question. Shared by every graph's first node."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime

from mia import prompts
from mia.nodes import resources
from mia.nodes.answer import usage_of, without_sources
from mia.nodes.context import CommonSettings
from mia.nodes.state import QAState


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
    update: dict[str, Any] = {"usage": {"reset": True}, "signature": [], "step0": [], "snapshot": "", "hypothesis": "",
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
