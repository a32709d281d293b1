"""Each graph's settings (its ``context_schema``, Studio's form): exactly what its nodes read under its
defaults, described for a user, with the environment fallback, validation and refusal of settings the
graph, or the run's chosen strategy, does not read.

What a graph reads is found in the nodes' own code: every node function and conditional edge of its
builder, and every function of ``mia.nodes`` they call, transitively, scanned for attribute reads on
the run's settings (``ctx.X``, ``runtime.context.X``). A read is served by the graph's form or by one
of its ``ClassVar`` constants (``fixed_settings``: knobs of a strategy its defaults do not use)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import typing
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, fields
from functools import cache
from types import ModuleType
from typing import Any, ClassVar, get_args

import pytest
from langgraph.graph import StateGraph

from mia.graph import registry
from mia.nodes.context import (GRAPH_SETTINGS, AgentSettings, InfMemSettings, MiaAgentSettings, MiaRagSettings,
                               RagSettings, context_from, fixed_settings, settings_class)
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
    """(settings in the form, or constants of the class, that no node reads; settings a node reads
    that neither the form nor the class's constants hold)."""
    form = {f.name for f in fields(builder.context_schema)}
    fixed = set(fixed_settings(builder.context_schema))
    read = settings_read_by(_entry_points(builder))
    return (form | fixed) - read, read - form - fixed


@pytest.mark.parametrize("graph", registry.QUESTION_GRAPHS)
def test_each_form_holds_exactly_the_settings_its_nodes_read(graph: str) -> None:
    builder = _builder(graph)
    assert builder.context_schema is settings_class(graph)
    unread, missing = _mismatch(builder)
    assert not unread, f"{graph}'s form offers settings no node of it reads: {sorted(unread)}"
    assert not missing, f"{graph}'s nodes read settings its form lacks: {sorted(missing)}"
    assert registry.settings_read(graph) == {f.name for f in fields(builder.context_schema)}


def _node(graph: str, name: str) -> Callable[..., Any]:
    """The function of node ``name`` of ``graph``'s builder (found there, wherever the nodes live)."""
    func: Callable[..., Any] = _builder(graph).nodes[name].runnable.func
    return func


def test_the_scan_catches_an_unread_setting_and_a_missing_one() -> None:
    """The check above is not vacuous: a form with a setting no node reads fails it, and so does a
    node that reads a setting outside its graph's form."""
    prepare, hypothesize, retrieve, generate = (_node("rag", name) for name in ("prepare", "hypothesize", "retrieve", "generate"))
    init_signature = _node("mia_rag", "init_signature")
    after_retrieval = next(iter(_builder("rag").branches["retrieve"].values())).path.func

    @dataclass(kw_only=True)
    class Padded(RagSettings):
        unused_knob: int = 1

    def built(schema: type, *nodes: Callable[..., Any]) -> StateGraph:
        builder = StateGraph(QAState, context_schema=schema)
        for node in nodes:
            builder.add_node(node.__name__, node)
        return builder

    assert _mismatch(built(Padded, prepare, hypothesize, retrieve, generate)) == ({"retrieval_only", "unused_knob"}, set())
    assert _mismatch(built(RagSettings, prepare, hypothesize, retrieve, generate, init_signature))[1] >= {"k0", "k_sum", "signature_init"}
    builder = built(RagSettings, prepare, hypothesize, retrieve, generate)
    builder.add_conditional_edges("retrieve", after_retrieval)
    assert _mismatch(builder) == (set(), set())

    # A constant serves a read and is not in the form; it does not excuse a form field no node reads,
    # and a constant no node reads is as dead as such a field.
    @dataclass(kw_only=True)
    class Fixed(RagSettings):
        unused_knob: int = 1
        dead_constant: ClassVar[int] = 2

    assert fixed_settings(Fixed) == {"dead_constant": 2}
    assert _mismatch(built(Fixed, prepare, hypothesize, retrieve, generate)) == ({"retrieval_only", "unused_knob", "dead_constant"}, set())
    coverage_knobs = {"lambda_q", "lambda_c", "lambda_d", "selection_embedder"}
    agent_init = _node("mia_agent", "init_signature")
    assert settings_read_by([agent_init]) >= coverage_knobs  # read under signature_init=coverage ...
    assert not coverage_knobs & {f.name for f in fields(MiaAgentSettings)}  # ... which mia_agent's defaults do not use
    assert _mismatch(built(MiaAgentSettings, agent_init))[1] == set()


def _all_fields() -> Iterator[tuple[str, Any]]:
    for cls in GRAPH_SETTINGS.values():
        for f in fields(cls):
            yield f"{cls.__name__}.{f.name}", f


@pytest.mark.parametrize(("name", "description"), [(name, f.metadata["description"]) for name, f in _all_fields()])
def test_every_description_is_short_and_for_a_user(name: str, description: str) -> None:
    assert description.strip(), name
    sentences = re.findall(r"[.!?](?=\s+[A-Z`]|$)", description)
    assert 1 <= len(sentences) <= 2, f"{name}: {len(sentences)} sentences"
    assert not re.search(r"issue|measured|before|validation split|best on", description, flags=re.IGNORECASE), name


PAPER_NOTATION = re.compile(
    r"[\u0370-\u03ff]"  # Greek letters: λ, α, δ, σ, ...
    r"|\b(?:Eq|Alg|App|Sec|Fig|Table)\.?\s*\d|\bEq\.|\bAlg\.|\bK0\b|\bK_sum\b|\bN_stop\b|\b[A-Za-z]_\{?[A-Z]\b"
)
"""Paper notation: a user reads settings by their own names, not the paper's symbols or equations."""
EVIDENCE = re.compile(r"\bF1\b|\bEM\b|\bRecall@\d|\bR@\d|[+\u2212-]\d+(?:\.\d+)?\s*(?:F1|points|%)|\d+\s+(?:\w+\s+){0,2}"
                      r"(?:dev|val|validation|test|training)\s+questions|\bquestions\s+of\b", flags=re.IGNORECASE)
"""Quoted evidence (scores, data sets, question counts): it belongs in evals/README.md."""


@pytest.mark.parametrize(("name", "description"), [(name, f.metadata["description"]) for name, f in _all_fields()])
def test_every_description_is_under_160_characters_in_plain_words(name: str, description: str) -> None:
    """What the knob does and when to change it, in a line of a form: no paper notation, no evidence."""
    assert len(description) < 160, f"{name}: {len(description)} characters"
    assert not PAPER_NOTATION.search(description), f"{name}: paper notation {PAPER_NOTATION.search(description)[0]!r}"
    assert not EVIDENCE.search(description), f"{name}: evidence {EVIDENCE.search(description)[0]!r}"


@pytest.mark.parametrize("text", [
    "Weight of query relevance (λ_Q).", "Signature weight α in Eq. 4.", "Greedy selection, Alg. 2.", "Step-0 candidates (K0).",
    "Summaries (K_sum).", "Most steps (N_stop).", "Interpolation δ.", "The signature σ.",
])
def test_the_notation_check_catches_the_papers_symbols(text: str) -> None:
    assert PAPER_NOTATION.search(text)


@pytest.mark.parametrize("text", [
    "+2 F1 for rag and mia_rag on 40 literaryqa dev questions.", "Lifts Recall@10 on the val split.", "R@1 up by 3 points.",
])
def test_the_evidence_check_catches_quoted_results(text: str) -> None:
    assert EVIDENCE.search(text)


def _only_when(f: Field[Any]) -> tuple[str, tuple[str, ...]] | None:
    only_when: tuple[str, tuple[str, ...]] | None = f.metadata.get("only_when")
    return only_when


def _field_elsewhere(name: str) -> Field[Any]:
    """The field ``name`` is in the forms that hold it (the same field in each: one mixin's)."""
    found = {id(f): f for cls in GRAPH_SETTINGS.values() for f in fields(cls) if f.name == name}
    assert len({(f.default, f.metadata["description"]) for f in found.values()}) == 1, name
    return next(iter(found.values()))


@pytest.mark.parametrize("graph", list(GRAPH_SETTINGS))
def test_each_form_holds_only_what_the_graphs_defaults_read(graph: str) -> None:
    """A strategy's knob is in a form only when the graph's own default is that strategy; off it, the
    knob is a constant with the value of the field it is in another graph's form, and it is read
    only by a strategy the graph's defaults do not use."""
    cls = settings_class(graph)
    defaults = cls()
    for f in fields(cls):
        if (only := _only_when(f)) is not None:
            switch, readers = only
            assert getattr(defaults, switch) in readers, f"{graph}'s form offers {f.name}, which its default {switch} ignores"
    for name, value in fixed_settings(cls).items():
        elsewhere = _field_elsewhere(name)
        assert value == elsewhere.default, f"{graph}.{name} = {value!r}, but the field's default is {elsewhere.default!r}"
        only = _only_when(elsewhere)
        assert only is not None and getattr(defaults, only[0]) not in only[1], f"{graph}'s defaults read {name}: offer it"


def test_the_strategy_knobs_off_each_graphs_defaults() -> None:
    assert set(fixed_settings(MiaAgentSettings)) == {"lambda_q", "lambda_c", "lambda_d", "selection_embedder", "sig_weights",
                                                      "delta"}
    assert fixed_settings(MiaRagSettings) == {"alpha": 0.2}
    assert not any(fixed_settings(cls) for cls in (RagSettings, AgentSettings, InfMemSettings))
    ctx = MiaAgentSettings(signature_init="coverage", sig_strategy="trained")  # the constants read as the paper's defaults
    assert (ctx.lambda_q, ctx.lambda_c, ctx.lambda_d, ctx.selection_embedder, ctx.sig_weights, ctx.delta) == (
        0.3, 0.4, 0.3, "", "", 0.5)


def _changed(f: Field[Any]) -> Any:
    """A valid value of ``f`` other than its default."""
    default = f.default
    assert default is not MISSING
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1 if f.metadata["maximum"] is None else (default + f.metadata["maximum"]) / 2
    return "other"


def _strategy_knobs() -> Iterator[Any]:
    for graph, cls in GRAPH_SETTINGS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if (only := _only_when(f)) is not None:
                switch, readers = only
                for chosen in get_args(hints[switch]):
                    if chosen not in readers:
                        yield pytest.param(graph, f, switch, readers, chosen, id=f"{graph}-{f.name}-{switch}={chosen}")


@pytest.mark.parametrize(("graph", "f", "switch", "readers", "chosen"), list(_strategy_knobs()))
def test_a_knob_the_chosen_strategy_ignores_is_refused_with_the_reason(
        graph: str, f: Field[Any], switch: str, readers: tuple[str, ...], chosen: str) -> None:
    cls = settings_class(graph)
    message = (f"invalid setting: {f.name} is read only by {switch}={' or '.join(readers)}, and this run uses {chosen}: "
               f"drop {f.name} or set {switch}={readers[0]}")
    with pytest.raises(ValueError) as refused:
        cls(**{switch: chosen, f.name: _changed(f)})
    assert str(refused.value) == message
    with pytest.raises(ValueError, match=re.escape(message)):
        context_from(graph, {switch: chosen, f.name: str(_changed(f))})  # as --set sends it
    cls(**{switch: chosen, f.name: f.default})  # the default changes nothing either way
    cls(**{switch: chosen})
    assert getattr(cls(**{switch: readers[0], f.name: _changed(f)}), f.name) == _changed(f)  # a strategy that reads it


def test_the_issues_examples_are_refused() -> None:
    with pytest.raises(ValueError, match="^invalid setting: lambda_q is read only by signature_init=coverage, and this run "
                                         "uses first_k: drop lambda_q or set signature_init=coverage$"):
        context_from("mia_rag", {"signature_init": "first_k", "lambda_q": "0.5"})
    with pytest.raises(ValueError, match="sig_weights is read only by sig_strategy=trained, and this run uses mia"):
        MiaRagSettings(sig_strategy="mia", sig_weights="/x.npz")
    with pytest.raises(ValueError, match="alpha is read only by sig_strategy=centroid or mia, and this run uses trained"):
        MiaAgentSettings(sig_strategy="trained", alpha=0.5)
    with pytest.raises(ValueError, match="bm25_stemming is read only by retriever=hybrid, and this run uses dense"):
        AgentSettings(retriever="dense", bm25_stemming=False)


def test_a_deployment_default_for_another_strategy_does_not_break_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MIA_<NAME>`` is a deployment's default: it serves the strategies that read it and is left
    alone by the others (it changes nothing there); only what the run itself sets is refused."""
    monkeypatch.setenv("MIA_LAMBDA_Q", "0.6")
    monkeypatch.setenv("MIA_DELTA", "0.7")
    monkeypatch.setenv("MIA_ALPHA", "0.5")
    monkeypatch.setenv("MIA_RRF_K", "60")
    assert MiaRagSettings().lambda_q == 0.6 and MiaRagSettings().delta == 0.7
    ctx = context_from("mia_rag", {"signature_init": "first_k", "sig_strategy": "centroid", "retriever": "dense"})
    assert (ctx.lambda_q, ctx.delta, ctx.rrf_k) == (0.6, 0.7, 60)
    assert context_from("mia_agent", {"sig_strategy": "trained"}).alpha == 0.5
    assert (MiaAgentSettings().lambda_q, MiaAgentSettings().delta) == (0.3, 0.5)  # constants, not settings, there
    assert context_from("mia_rag", {"signature_init": "first_k", "lambda_q": "0.6"}).lambda_q == 0.6  # the deployment's own
    with pytest.raises(ValueError, match="lambda_q is read only by signature_init=coverage"):
        context_from("mia_rag", {"signature_init": "first_k", "lambda_q": "0.5"})  # the run's own
    # A strategy chosen by the deployment is the run's strategy: a knob the run sets against it is refused.
    monkeypatch.setenv("MIA_SIG_STRATEGY", "centroid")
    with pytest.raises(ValueError, match="delta is read only by sig_strategy=trained, and this run uses centroid"):
        MiaRagSettings(delta=0.2)


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
    (MiaAgentSettings, {"alpha": "1.5"}, r"invalid setting: alpha must be in \[0, 1\]"),
    (MiaRagSettings, {"delta": "-0.5"}, r"invalid setting: delta must be in \[0, 1\]"),
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
    with pytest.raises(ValueError, match=r"invalid setting: alpha must be in \[0, 1\]"):
        MiaAgentSettings(sig_strategy="trained")  # a bad value is bad whatever the strategy
    RagSettings()  # rag does not read alpha
    assert MiaRagSettings().alpha == 0.2  # mia_rag holds it fixed: the environment sets settings, not constants


def test_context_from_refuses_a_setting_the_graph_does_not_read() -> None:
    with pytest.raises(ValueError, match="unknown setting[(]s[)] alpha, k0 for graph rag; it reads ") as refused:
        context_from("rag", {"alpha": "0.3", "k0": "20"})
    assert all(name in str(refused.value) for name in registry.settings_read("rag"))
    with pytest.raises(ValueError, match="unknown setting[(]s[)] embedder for graph mia_rag"):
        context_from("mia_rag", {"embedder": "use"})
    with pytest.raises(ValueError, match="unknown graph 'nope'"):
        context_from("nope", {})
    ctx = context_from("mia_rag", {"delta": "0.3", "retrieval_only": "true"})
    assert isinstance(ctx, MiaRagSettings) and (ctx.delta, ctx.retrieval_only) == (0.3, True)
    with pytest.raises(ValueError, match="unknown setting[(]s[)] alpha for graph mia_rag; it reads .*; mia_rag holds alpha "
                                         "fixed at 0.2, since its defaults do not read it"):
        context_from("mia_rag", {"alpha": "0.3", "sig_strategy": "centroid"})
    with pytest.raises(ValueError, match="unknown setting[(]s[)] lambda_q, sig_weights for graph mia_agent; .*holds lambda_q "
                                         "fixed at 0.3.*holds sig_weights fixed at ''"):
        context_from("mia_agent", {"lambda_q": "0.5", "sig_weights": "/x.npz", "signature_init": "coverage"})


def test_the_command_line_refuses_a_setting_the_graph_does_not_read(cli) -> None:
    result = cli("ask", "Who?", "--collection", "anything", "--graph", "rag", "--set", "alpha=0.3")
    assert result.code == 2 and "unknown setting(s) alpha for graph rag; it reads collection," in result.err


def test_a_collection_is_queried_with_the_embedder_it_recorded(tiny_collection, minilm) -> None:
    from mia.nodes import resources
    from mia.stores.embeddings import load_embedder

    assert tiny_collection.store.embedder == "all-MiniLM-L6-v2"
    assert resources.embedder(tiny_collection.store) is load_embedder("minilm") is load_embedder("all-MiniLM-L6-v2")


@pytest.mark.parametrize(("own", "server", "redis", "expected"), [
    ("", "", "", ""),
    ("", ":memory:", "redis://r", ""),  # what `langgraph dev` sets for itself: no shared database
    ("", "postgresql://mia@db/mia", "redis://r", "postgresql://mia@db/mia"),  # the replicas' services, exported
    ("", "postgresql+psycopg://mia@db/mia", "redis://r", "postgresql://mia@db/mia"),
    ("", "postgresql://mia@db/mia", "", ""),  # a database alone is not the replicas': no lock taken there
    ("postgresql://mia@a/mia", "postgresql://mia@b/mia", "redis://r", "postgresql://mia@a/mia"),
])
def test_the_writer_lock_s_database_is_mia_s_own_else_the_replicas(
        monkeypatch: pytest.MonkeyPatch, own: str, server: str, redis: str, expected: str) -> None:
    from mia.stores.settings import Settings

    monkeypatch.setenv("MIA_DATABASE_URI", own)
    monkeypatch.setenv("DATABASE_URI", server)
    monkeypatch.setenv("REDIS_URI", redis)
    assert Settings().database_uri == expected
