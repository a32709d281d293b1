"""Control flow of the iterative agents (mia_agent, agent) with a scripted chat model over a real
tiny collection; one slow test runs mia_agent with the embedded chat model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from mia.nodes import resources
from mia.nodes.agent import UPDATE_TOKENS, UpdateOutput
from mia.nodes.context import MiaAgentSettings, context_from

QUESTION = "What did the youngest son get from the little grey man?"


def reply(payload: Any) -> AIMessage:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return AIMessage(content=text, usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110})


class Script:
    """A chat model that returns scripted replies in order and records every prompt it saw."""

    def __init__(self, replies: list[AIMessage]) -> None:
        self.model = GenericFakeChatModel(messages=iter(replies))
        self.prompts: list[str] = []
        original = self.model._generate

        def spy(messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            self.prompts.append("\n".join(m.text for m in messages))
            return original(messages, *args, **kwargs)

        object.__setattr__(self.model, "_generate", spy)


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch):
    def install(*payloads: Any) -> Script:
        scripted = Script([reply(p) for p in payloads])
        monkeypatch.setattr(resources, "chat_model", lambda ctx, max_tokens=None: scripted.model)
        return scripted

    return install


def run(graph_name: str, tiny, **settings: Any) -> dict[str, Any]:
    from mia.graph.registry import load_graph

    ctx = context_from(graph_name, {"collection": tiny.name, **settings})
    return load_graph(graph_name).invoke({"question": QUESTION}, context=ctx)


def full_state(graph_name: str, tiny, **settings: Any) -> tuple[dict[str, Any], Any]:
    """Run on a checkpointed copy of the graph to read the whole state (ids, step, evidence)."""
    import importlib

    builder = importlib.import_module(f"mia.graph.{graph_name}").builder
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({"question": QUESTION}, config=config, context=context_from(graph_name, {"collection": tiny.name, **settings}))
    return graph.get_state(config).values, graph


ANSWER_NOW = {"decision": "answer", "next_query": "grey man gift", "signature": ["S1"],
              "new_evidence": [{"fact": "The youngest son was given a golden goose.", "chunks": ["C1"]}]}
CONTINUE = {"decision": "continue", "next_query": "golden goose", "signature": ["S1", "S2"], "new_evidence": []}


def test_stops_at_step_one_when_update_answers(tiny_collection, script) -> None:
    scripted = script(ANSWER_NOW, "A golden goose [1]")
    state, _ = full_state("mia_agent", tiny_collection)
    assert state["step"] == 1 and state["decision"] == "answer"
    assert state["answer"] == "A golden goose"
    assert state["usage"]["llm_calls"] == 2
    assert set(state["usage"]["by_node"]) == {"update", "generate"}
    assert len(scripted.prompts) == 2


def test_stops_at_n_stop(tiny_collection, script) -> None:
    script(CONTINUE, CONTINUE, CONTINUE, CONTINUE, "A goose")
    state, _ = full_state("mia_agent", tiny_collection, max_steps=2)
    assert state["step"] == 2
    assert [e["step"] for e in state["trajectory"]] == [1, 2]
    assert state["usage"]["by_node"]["update"]["llm_calls"] == 2


def test_malformed_json_keeps_state_and_continues(tiny_collection, script) -> None:
    script("this is not json at all", ANSWER_NOW, "A goose")
    state, graph = full_state("mia_agent", tiny_collection)
    history = list(graph.get_state_history({"configurable": {"thread_id": "t"}}))
    after_init = next(h.values for h in reversed(history) if h.values.get("signature") and h.next == ("retrieve",))
    assert state["update_failures"] == 1
    first = state["trajectory"][0]
    assert first["failure"] == "unparseable output" and first["decision"] == "continue"
    assert state["step"] == 2
    # the failed step changed neither the query nor the signature
    assert state["trajectory"][1]["query"] == QUESTION
    assert after_init["signature"]


def test_invented_ids_and_uncited_facts_are_rejected(tiny_collection, script) -> None:
    payload = {"decision": "answer", "next_query": "q2", "signature": ["S99", "S1", "not-a-label"],
               "new_evidence": [{"fact": "invented", "chunks": ["C99"]}, {"fact": "no citation", "chunks": []},
                                {"fact": "grounded", "chunks": ["C2", "C77"]}]}
    script(payload, "A goose")
    state, graph = full_state("mia_agent", tiny_collection)
    history = list(graph.get_state_history({"configurable": {"thread_id": "t"}}))
    before_update = next(h.values for h in history if h.next == ("update",))
    retrieved_ids = [r["id"] for r in before_update["retrieved"]]
    sigma_t = [s["id"] for s in before_update["signature"]]
    assert [e["fact"] for e in state["evidence"]] == ["grounded"]
    assert state["evidence"][0]["chunks"] == [retrieved_ids[1]]
    # S1 is the first label offered: the first summary of σ_t
    assert [s["id"] for s in state["signature"]] == [sigma_t[0]]
    # S99 and not-a-label; C99 and the fact left without citations; the uncited fact; C77
    assert state["trajectory"][0]["rejected"] == 2 + 2 + 1 + 1
    assert state["update_failures"] == 1


def test_state_evolves_as_eq5(tiny_collection, script) -> None:
    """q_{t+1}, σ_{t+1} and E_{t+1} come from M_upd; E accumulates; without rewriting q stays q."""
    step1 = {"decision": "continue", "next_query": "the grey man", "signature": ["S2"],
             "new_evidence": [{"fact": "f1", "chunks": ["C1"]}]}
    step2 = {"decision": "answer", "next_query": "ignored", "signature": ["S1"],
             "new_evidence": [{"fact": "f2", "chunks": ["C3"]}]}
    script(step1, step2, "A goose")
    state, _ = full_state("mia_agent", tiny_collection)
    assert [e["fact"] for e in state["evidence"]] == ["f1", "f2"]
    assert state["trajectory"][1]["query"] == "the grey man"
    assert state["query"] == "ignored"

    script(step1, step2, "A goose")
    fixed, _ = full_state("mia_agent", tiny_collection, rewrite_query=False)
    assert fixed["query"] == QUESTION
    assert all(e["query"] == QUESTION for e in fixed["trajectory"])


def test_agent_never_reads_summaries(tiny_collection, script, monkeypatch: pytest.MonkeyPatch) -> None:
    from mia.stores.mindscape import Mindscape

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the agent without signature read a summary")

    original_vectors = Mindscape.vectors
    monkeypatch.setattr(Mindscape, "summary_records", forbidden)
    monkeypatch.setattr(Mindscape, "vectors", lambda self, c, ids: forbidden() if c == "summaries" else original_vectors(self, c, ids))
    scripted = script({"decision": "continue", "next_query": "goose", "new_evidence": []},
                      {"decision": "answer", "next_query": "", "new_evidence": [{"fact": "f", "chunks": ["C1"]}]},
                      "A goose")
    state, _ = full_state("agent", tiny_collection, answer_inputs="chunks+evi")
    assert state["step"] == 2 and state["answer"] == "A goose"
    assert not state.get("signature")
    assert "<summary id=" not in "".join(scripted.prompts)


def test_document_text_is_fenced_in_update_prompt(tiny_collection, script) -> None:
    scripted = script(ANSWER_NOW, "A goose")
    run("mia_agent", tiny_collection)
    update_prompt = scripted.prompts[0]
    assert "<source id=\"C1\"" in update_prompt and "</source>" in update_prompt
    assert "not instructions" in update_prompt


def test_streams_steps_and_only_generate_tokens(tiny_collection, script) -> None:
    from mia.graph.registry import load_graph

    script(CONTINUE, ANSWER_NOW, "A golden goose it was")
    custom, token_nodes = [], set()
    for mode, chunk in load_graph("mia_agent").stream(
        {"question": QUESTION}, context=MiaAgentSettings(collection=tiny_collection.name), stream_mode=["custom", "messages"]
    ):
        if mode == "custom":
            custom.append(chunk)
        elif chunk[0].type in ("ai", "AIMessageChunk"):
            token_nodes.add(chunk[1]["langgraph_node"])
    assert [c["step"] for c in custom if c["event"] == "agent_step"] == [1, 2]
    assert custom[0]["next_query"] == "golden goose" and "signature" in custom[0]
    assert token_nodes == {"generate"}


def test_thread_resumes_and_follow_up_resets_question(tiny_collection, script) -> None:
    import importlib

    scripted = script(ANSWER_NOW, "A goose", "Whom did the youngest son marry?", ANSWER_NOW, "The princess")
    graph = importlib.import_module("mia.graph.mia_agent").builder.compile(checkpointer=InMemorySaver(), interrupt_before=["update"])
    config = {"configurable": {"thread_id": "resume"}}
    ctx = MiaAgentSettings(collection=tiny_collection.name)
    graph.invoke({"messages": [HumanMessage(QUESTION)]}, config=config, context=ctx)
    assert graph.get_state(config).next == ("update",)
    graph.invoke(None, config=config, context=ctx)  # resume the interrupted thread
    first = graph.get_state(config).values
    assert first["answer"] == "A goose"
    graph.invoke({"messages": [HumanMessage("Whom did he marry?")]}, config=config, context=ctx)
    graph.invoke(None, config=config, context=ctx)
    second = graph.get_state(config).values
    # the follow-up was made standalone from the thread's earlier turns before retrieval
    assert "Whom did he marry?" in scripted.prompts[2] and "A goose" in scripted.prompts[2]
    assert second["question"] == "Whom did the youngest son marry?" and second["answer"] == "The princess"
    assert second["usage"]["by_node"]["prepare"]["llm_calls"] == 1
    assert second["step"] == 1 and len(second["trajectory"]) == 1
    assert [m.type for m in second["messages"]] == ["human", "ai", "human", "ai"]


@pytest.mark.slow
def test_mia_agent_with_embedded_model(tiny_collection, embedded_model_file) -> None:
    state, _ = full_state("mia_agent", tiny_collection, max_steps=2, step_k=5, max_new_tokens=32)
    assert state["answer"]
    assert state["citations"] and all(c["book"] in tiny_collection.texts for c in state["citations"])
    usage = state["usage"]
    assert usage["llm_calls"] >= 2 and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["by_node"]["update"]["llm_calls"] >= 1
    # The schema's bounds reach the grammar: no Update reply runs into the token cap and gets cut.
    steps = [e for e in state["trajectory"] if e]
    assert steps and not any(e.get("failure") for e in steps), steps
    update = usage["by_node"]["update"]
    assert update["output_tokens"] < UPDATE_TOKENS * update["llm_calls"]


def test_update_bounds_reach_the_grammar_but_not_validation() -> None:
    """Bounded for the embedded model's grammar; an endpoint's longer reply still parses."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    schema = UpdateOutput.model_json_schema()
    assert schema["properties"]["new_evidence"]["maxItems"] == 4
    assert schema["$defs"]["Fact"]["properties"]["fact"]["maxLength"] == 200
    grammar = json_schema_to_gbnf(json.dumps(schema))
    assert "new-evidence" in grammar
    long = UpdateOutput.model_validate({"new_evidence": [{"fact": "x" * 500, "chunks": ["C1"] * 5}] * 6})
    assert len(long.new_evidence) == 6 and len(long.new_evidence[0].fact) == 500
