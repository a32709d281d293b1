"""The question graphs by name, with what each reads, imported on first use (each import loads
LangGraph and the nodes). What a graph reads is its settings class (``nodes.context``), the same
class its builder takes as ``context_schema``, so the two cannot disagree."""

from __future__ import annotations

import importlib
from dataclasses import fields
from typing import Any

from mia.nodes.context import GRAPH_SETTINGS, GraphSettings, StaticSettings, context_from, settings_class

QUESTION_GRAPHS = tuple(GRAPH_SETTINGS)
RETRIEVAL_ONLY_GRAPHS = tuple(name for name, cls in GRAPH_SETTINGS.items() if issubclass(cls, StaticSettings))
"""The graphs that honour ``retrieval_only``: the agents decide *what* to retrieve with the chat
model, so stopping them before it would measure nothing."""


def settings_read(name: str) -> frozenset[str]:
    """The settings graph ``name`` reads: a run's result depends on these alone."""
    return frozenset(f.name for f in fields(settings_class(name)))


def settings_for(name: str, shared: dict[str, Any]) -> GraphSettings:
    """Graph ``name``'s settings from values shared by several graphs, each taking those it reads:
    ``context_from`` refuses the rest, as it should for one graph's own settings."""
    read = settings_read(name)
    return context_from(name, {k: v for k, v in shared.items() if k in read})


def load_graph(name: str) -> Any:
    settings_class(name)  # an unknown name is refused before anything is imported
    return importlib.import_module(f"mia.graph.{name}").graph
