"""Question handling on threads: which question a run answers when the state keeps earlier turns."""

from __future__ import annotations

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from mia.nodes.context import MiaAgentSettings, RagSettings


def test_new_question_input_wins_over_an_unanswered_earlier_message(tiny_collection) -> None:
    from mia.graph.rag import builder

    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "q"}}
    ctx = RagSettings(collection=tiny_collection.name, retrieval_only=True)
    graph.invoke({"messages": [HumanMessage("Who found the golden goose?")]}, config=config, context=ctx)
    first = graph.get_state(config).values
    assert first["question"] == "Who found the golden goose?" and first["retrieved"]
    graph.invoke({"question": "What did the fox promise the wolf?"}, config=config, context=ctx)
    second = graph.get_state(config).values
    assert second["question"] == "What did the fox promise the wolf?"
    assert [m.text for m in second["messages"] if m.type == "human"][-1] == "What did the fox promise the wolf?"
    assert second["retrieved"] != first["retrieved"]


def test_options_from_an_earlier_turn_are_ignored_unless_multiple_choice() -> None:
    from mia.nodes.answer import options_for

    state = {"options": ["a goose", "a pig"]}
    assert options_for(state, RagSettings(answer_format="open")) == []
    assert options_for(state, RagSettings(answer_format="choice")) == ["a goose", "a pig"]


def test_context_converts_strings_from_api_payloads() -> None:
    ctx = MiaAgentSettings(top_k="3", alpha="0.25", rewrite_query="false")
    assert (ctx.top_k, ctx.alpha, ctx.rewrite_query) == (3, 0.25, False)
