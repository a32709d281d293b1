"""The question graphs by name, with what each reads, imported on first use (each import loads
LangGraph and the nodes)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from nodes.context import settings_in


@dataclass(frozen=True)
class GraphInfo:
    setting_groups: frozenset[str]
    """The ``Context`` setting groups the graph reads (see ``nodes.context.SettingGroup``)."""
    retrieval_only: bool
    """Whether the graph honours ``retrieval_only``: the agents decide *what* to retrieve with the
    chat model, so stopping them before it would measure nothing."""


_MINDSCAPE = frozenset({"common", "retrieval"})
GRAPHS: dict[str, GraphInfo] = {
    "rag": GraphInfo(_MINDSCAPE, retrieval_only=True),
    "mia_rag": GraphInfo(_MINDSCAPE | {"signature"}, retrieval_only=True),
    "mia_agent": GraphInfo(_MINDSCAPE | {"signature"}, retrieval_only=False),
    "agent": GraphInfo(_MINDSCAPE, retrieval_only=False),
    "infmem": GraphInfo(frozenset({"common", "streaming"}), retrieval_only=False),
    "memagent": GraphInfo(frozenset({"common", "streaming"}), retrieval_only=False),
}
QUESTION_GRAPHS = tuple(GRAPHS)
RETRIEVAL_ONLY_GRAPHS = tuple(name for name, info in GRAPHS.items() if info.retrieval_only)


def settings_read(name: str) -> frozenset[str]:
    """The ``Context`` settings graph ``name`` reads: a run's result depends on these alone."""
    return settings_in(_info(name).setting_groups)


def load_graph(name: str) -> Any:
    _info(name)
    return importlib.import_module(f"graph.{name}").graph


def _info(name: str) -> GraphInfo:
    if name not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; choose one of {', '.join(QUESTION_GRAPHS)}")
    return GRAPHS[name]
