"""``quote_first``: the reader copies the sentence that answers before it answers. The reply is cut
to its answer (``unquoted``, hand-written replies of the shapes small models give), the prompt asks
for the format only when the setting is on (a recording chat model on the real tiny collection), and
the embedded reader answers in it (slow test)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage

from mia.graph.registry import load_graph
from mia.nodes import resources
from mia.nodes.answer import FORMAT_RULES, QUOTE_RULE, unquoted
from mia.nodes.context import context_from


@pytest.mark.parametrize("reply, answer", [
    ('Quote: "Emma Jane Perkins was her dearest friend." [3]\nAnswer: Emma Jane Perkins', "Emma Jane Perkins [3]"),
    ('Quote: "She sold soap." [2]\nAnswer: Soap [4]', "Soap [4]"),  # the answer's own marker wins
    ('**Quote:** "a b" [1]\n**Answer:** Miranda.', "Miranda. [1]"),  # markdown around the labels
    ('Quote: "The railway company bought the farm." [4]', "The railway company bought the farm. [4]"),  # no answer line
    ('Quote: "It is said." [2]\nAnswer:', "It is said. [2]"),  # an empty answer: the sentence it found
    ("Emma Jane Perkins [1]", "Emma Jane Perkins [1]"),  # the format ignored: the reply as it is
    ('Quote: "none"\nAnswer: The material does not say.', "The material does not say."),
    ('Quote: "x" [1]\nAnswer: Rebecca\nQuote: "y" [2]\nAnswer: Jane', "Rebecca [1]"),  # a looping reply: its first answer
])
def test_a_quote_first_reply_is_cut_to_its_answer(reply: str, answer: str) -> None:
    assert unquoted(reply) == answer


QUOTED = 'Quote: "the wolf had eaten so much that he could not get out" [{n}]\nAnswer: The wolf [{n}]'


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> list[list[BaseMessage]]:
    """The messages of every call; the model quotes passage 1 and answers "The wolf"."""
    sent: list[list[BaseMessage]] = []

    class Recording(GenericFakeChatModel):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            sent.append(messages)
            return super()._generate(messages, *args, **kwargs)

    replies = iter([AIMessage(QUOTED.format(n=1))] * 8)
    monkeypatch.setattr(resources, "chat_model", lambda ctx, max_tokens=None: Recording(messages=replies))
    return sent


@pytest.mark.parametrize("graph", ["rag", "mia_rag", "mia_agent"])
def test_the_reader_is_asked_to_quote_only_when_the_setting_is_on(graph: str, tiny_collection, reader) -> None:
    settings = {"collection": tiny_collection.name, **({"max_steps": 1} if graph == "mia_agent" else {})}
    plain = load_graph(graph).invoke({"question": "Who was stuck?"}, context=context_from(graph, settings))
    quoting = load_graph(graph).invoke({"question": "Who was stuck?"},
                                       context=context_from(graph, {**settings, "quote_first": True}))
    answering = [m[0].text for m in reader if m[0].text.startswith("You answer questions")]  # not the agent's other calls
    plain_system, quoting_system = answering
    assert FORMAT_RULES["open"] in plain_system and QUOTE_RULE not in plain_system
    assert QUOTE_RULE in quoting_system and FORMAT_RULES["open"] not in quoting_system
    assert quoting["answer"] == "The wolf"  # the answer line, without the quote or its marker
    assert plain["answer"].startswith("Quote:")  # the same reply, not asked for, is not cut
    assert quoting["citations"][0]["n"] == 1 and quoting["citations"][0]["cited_by_model"]


def test_quote_first_is_refused_where_the_answer_is_a_letter(tiny_collection) -> None:
    with pytest.raises(ValueError, match="quote_first is read only by answer_format=open"):
        context_from("rag", {"collection": tiny_collection.name, "answer_format": "choice", "quote_first": True})


@pytest.mark.slow
def test_the_embedded_reader_quotes_then_answers(tiny_collection, embedded_model_file, cli) -> None:
    result = cli("ask", "Who could not get out of the cellar?", "--collection", tiny_collection.name, "--graph", "rag",
                 "--json", "--set", "quote_first=true", "--set", "max_new_tokens=96")
    assert result.code == 0, result.err
    state = json.loads(result.out)
    answer = state["answer"]
    assert answer.strip() and not answer.lower().startswith(("quote", "answer")) and "\n" not in answer
    assert state["citations"] and state["usage"]["llm_calls"] == 1
