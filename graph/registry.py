"""The question graphs by name, imported on first use (each import loads LangGraph and the nodes)."""

from __future__ import annotations

import importlib
from typing import Any

QUESTION_GRAPHS = ("rag", "mia_rag", "mia_agent", "agent", "infmem", "memagent")


def load_graph(name: str) -> Any:
    if name not in QUESTION_GRAPHS:
        raise ValueError(f"unknown graph {name!r}; choose one of {', '.join(QUESTION_GRAPHS)}")
    return importlib.import_module(f"graph.{name}").graph
