"""Each graph's settings (its ``context_schema``, Studio's form): exactly what its nodes read, described
for a user, with the environment fallback, validation and refusal of settings the graph does not read.

What a graph reads is found in the nodes' own code: every node function and conditional edge of its
builder, and every function of ``mia.nodes`` they call, transitively, scanned for attribute reads on
the run's settings (``ctx.X``, ``runtime.context.X``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from functools import cache
from types import ModuleType
from typing import Any

import pytest
from langgraph.graph import StateGraph

from mia.graph import registry
from mia.nodes.context import (GRAPH_SETTINGS, AgentSettings, InfMemSettings, MiaAgentSettings, MiaRagSettings, RagSettings,
                               context_from, settings_class)
from mia.nodes.state import QAState

SETTINGS_NAMES = frozenset({"ctx", "context"})
"""What the nodes call the run's settings: ``ctx`` (a local or parameter) or ``runtime.context``."""
NODES_PACKAGE = "mia.nodes"


def _builder(graph: str) -> StateGraph:
    return importlib.import_module(f"mia.graph.{graph}").builder


def _entry_points(builder: StateGraph) -> list[Callable[..., Any]]:
    """The functions LangGraph calls: every node's, and every conditional edge's."""
    nodes = [spec.runnable.func for spec in builder.nodes.values()]
    edges = [branch.path.func for branches in builder.branches.values() for branch in branches.values()]
    return nodes + edges


@cache
def _tree(function: Callable[..., Any]) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(function)))


def _is_settings(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SETTINGS_NAMES
    return isinstance(node, ast.Attribute) and node.attr == "context" and isinstance(node.value, ast.Name) and node.value.id == "runtime"


def _callee(call: ast.Call, module: ModuleType) -> Callable[..., Any] | None:
    """The function of ``mia.nodes`` a call names (``f(...)``, ``module.f(...)``, ``Class.method(...)``), if any."""
    target: Any
    if isinstance(call.func, ast.Name):
        target = vars(module).get(call.func.id)
    elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        target = getattr(vars(module).get(call.func.value.id), call.func.attr, None)
    else:
        return None
    target = getattr(target, "__func__", target)  # a classmethod, bound to its class
    if inspect.isfunction(target) and target.__module__.startswith(NODES_PACKAGE):
        return target
    return None


def settings_read_by(entry_points: list[Callable[..., Any]]) -> set[str]:
    """Every settings attribute read by the functions and the ``mia.nodes`` functions they call."""
    read: set[str] = set()
    seen: set[Callable[..., Any]] = set()
    todo = list(entry_points)
    while todo:
        function = todo.pop()
        if function in seen:
            continue
        seen.add(function)
        module = inspect.getmodule(function)
        assert module is not None, function
        for node in ast.walk(_tree(function)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _is_settings(node.value):
                read.add(node.attr)
            elif isinstance(node, ast.Call) and (callee := _callee(node, module)) is not None:
                todo.append(callee)
    return read - {"context"}  # ``runtime.context`` itself


def _mismatch(builder: StateGraph) -> tuple[set[str], set[str]]:
    """(settings in the form that no node reads, settings a node reads that the form lacks)."""
    form = {f.name for f in fields(builder.context_schema)}
    read = settings_read_by(_entry_points(builder))
    return form - read, read - form


@pytest.mark.parametrize("graph", registry.QUESTION_GRAPHS)
def test_each_form_holds_exactly_the_settings_its_nodes_read(graph: str) -> None:
    builder = _builder(graph)
    assert builder.context_schema is settings_class(graph)
    unread, missing = _mismatch(builder)
    assert not unread, f"{graph}'s form offers settings no node of it reads: {sorted(unread)}"
    assert not missing, f"{graph}'s nodes read settings its form lacks: {sorted(missing)}"
    assert registry.settings_read(graph) == {f.name for f in fields(builder.context_schema)}


def test_the_scan_catches_an_unread_setting_and_a_missing_one() -> None:
    """The check above is not vacuous: a form with a setting no node reads fails it, and so does a
    node that reads a setting outside its graph's form."""
    from mia.nodes.qa import after_retrieval, generate, init_signature, prepare, retrieve

    @dataclass(kw_only=True)
    class Padded(RagSettings):
        unused_knob: int = 1

    def built(schema: type, *nodes: Callable[..., Any]) -> StateGraph:
        builder = StateGraph(QAState, context_schema=schema)
        for node in nodes:
            builder.add_node(node.__name__, node)
        return builder

    assert _mismatch(built(Padded, prepare, retrieve, generate)) == ({"retrieval_only", "unused_knob"}, set())
    assert _mismatch(built(RagSettings, prepare, retrieve, generate, init_signature))[1] >= {"k0", "k_sum", "signature_init"}
    builder = built(RagSettings, prepare, retrieve, generate)
    builder.add_conditional_edges("retrieve", after_retrieval)
    assert _mismatch(builder) == (set(), set())


def _all_fields() -> Iterator[tuple[str, Any]]:
    for cls in GRAPH_SETTINGS.values():
        for f in fields(cls):
            yield f"{cls.__name__}.{f.name}", f


@pytest.mark.parametrize(("name", "description"), [(name, f.metadata["description"]) for name, f in _all_fields()])
def test_every_description_is_short_and_for_a_user(name: str, description: str) -> None:
    assert description.strip(), name
    assert len(description) <= 250, f"{name}: {len(description)} characters"
    sentences = re.findall(r"[.!?](?=\s+[A-Z`]|$)", description.replace("Eq. ", "Eq ").replace("Alg. ", "Alg "))
    assert 1 <= len(sentences) <= 2, f"{name}: {len(sentences)} sentences"
    assert not re.search(r"issue|measured|before|validation split|best on", description, flags=re.IGNORECASE), name


def test_the_graphs_own_defaults() -> None:
    assert (MiaRagSettings().signature_init, MiaRagSettings().sig_strategy) == ("coverage", "trained")
    assert (MiaAgentSettings().signature_init, MiaAgentSettings().sig_strategy) == ("first_k", "centroid")
    assert registry.RETRIEVAL_ONLY_GRAPHS == ("rag", "mia_rag")
    assert registry.settings_read("rag") < registry.settings_read("mia_rag")
    assert registry.settings_read("agent") < registry.settings_read("mia_agent")
    assert registry.settings_read("memagent") < registry.settings_read("infmem")
    assert not registry.settings_read("infmem") & {"retriever", "alpha", "top_k", "embedder"}


def test_environment_fills_settings_left_at_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIA_TOP_K", "7")
    monkeypatch.setenv("MIA_SIG_STRATEGY", "centroid")
    monkeypatch.setenv("MIA_BM25_STEMMING", "off")
    assert (RagSettings().top_k, RagSettings().bm25_stemming) == (7, False)
    assert RagSettings(top_k=3).top_k == 3  # a run's own value wins
    assert MiaRagSettings().sig_strategy == "centroid"
    assert context_from("rag", {"top_k": "4"}).top_k == 4


@pytest.mark.parametrize(("cls", "values", "message"), [
    (RagSettings, {"top_k": 0}, "invalid setting: top_k must be at least 1"),
    (RagSettings, {"bm25_weight": -1.0}, "invalid setting: bm25_weight must be non-negative"),
    (RagSettings, {"bm25_weight": float("nan")}, "invalid setting: bm25_weight must be non-negative"),
    (MiaRagSettings, {"alpha": "1.5"}, r"invalid setting: alpha must be in \[0, 1\]"),
    (MiaRagSettings, {"sig_strategy": "auto"}, "invalid setting: sig_strategy must be one of trained, centroid, mia, got 'auto'"),
    (MiaRagSettings, {"sig_strategy": "concat"}, "sig_strategy must be one of trained, centroid, mia"),
    (MiaRagSettings, {"signature_init": "auto"}, "signature_init must be one of coverage, first_k"),
    (MiaRagSettings, {"answer_inputs": "chunks+evi"}, "answer_inputs must be one of chunks, chunks[+]sig, got"),
    (AgentSettings, {"answer_inputs": "chunks+sig"}, "answer_inputs must be one of chunks, chunks[+]evi, got"),
    (MiaAgentSettings, {"answer_inputs": "auto"}, "answer_inputs must be one of chunks, chunks[+]sig, chunks[+]evi, chunks[+]sig[+]evi"),
    (InfMemSettings, {"bm25_overlap": 500}, r"invalid setting: bm25_overlap must be in \[0, bm25_window\)"),
    (InfMemSettings, {"stream_chunk_tokens": 99}, "stream_chunk_tokens must be at least 100"),
    (RagSettings, {"retrieval_only": "maybe"}, "setting retrieval_only='maybe' is not one of 1/true/yes/on/0/false/no/off"),
    (RagSettings, {"top_k": "ten"}, "setting top_k='ten' is not a valid int"),
])
def test_bad_values_are_refused_by_name(cls: type, values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(**values)


def test_a_bad_environment_value_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIA_ALPHA", "2")
    with pytest.raises(ValueError, match=r"invalid setting: alpha must be in \[0, 1\]"):
        MiaAgentSettings()
    RagSettings()  # rag does not read alpha


def test_context_from_refuses_a_setting_the_graph_does_not_read() -> None:
    with pytest.raises(ValueError, match="unknown setting[(]s[)] alpha, k0 for graph rag; it reads ") as refused:
        context_from("rag", {"alpha": "0.3", "k0": "20"})
    assert all(name in str(refused.value) for name in registry.settings_read("rag"))
    with pytest.raises(ValueError, match="unknown setting[(]s[)] embedder for graph mia_rag"):
        context_from("mia_rag", {"embedder": "use"})
    with pytest.raises(ValueError, match="unknown graph 'nope'"):
        context_from("nope", {})
    ctx = context_from("mia_rag", {"alpha": "0.3", "retrieval_only": "true"})
    assert isinstance(ctx, MiaRagSettings) and (ctx.alpha, ctx.retrieval_only) == (0.3, True)


def test_the_command_line_refuses_a_setting_the_graph_does_not_read(cli) -> None:
    result = cli("ask", "Who?", "--collection", "anything", "--graph", "rag", "--set", "alpha=0.3")
    assert result.code == 2 and "unknown setting(s) alpha for graph rag; it reads collection," in result.err


def test_a_collection_is_queried_with_the_embedder_it_recorded(tiny_collection, minilm) -> None:
    from mia.nodes import resources
    from mia.stores.embeddings import load_embedder

    assert tiny_collection.store.embedder == "all-MiniLM-L6-v2"
    assert resources.embedder(tiny_collection.store) is load_embedder("minilm") is load_embedder("all-MiniLM-L6-v2")
