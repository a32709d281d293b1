"""Prompt templates, versioned with the code, and the fencing that keeps documents as data.

Every template is a Markdown file beside this module with a ``# system`` and a ``# user``
section. Text that comes from a source (chunks, summaries, memories built from them) is only ever
inserted through :func:`fence`, which wraps it in tags that the system prompts declare to be
data, neutralises any closing tag the text itself contains, so a document cannot end its fence
early and speak as the user, and takes out text that gives orders to the model
(``prompts.injection``).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from mia.prompts import injection

_HERE = Path(__file__).parent
_SECTION = re.compile(r"^# (system|user)\s*$", flags=re.MULTILINE)


@lru_cache(maxsize=None)
def template(name: str) -> tuple[str, str]:
    """(system, user) templates of ``prompts/NAME.md``."""
    text = (_HERE / f"{name}.md").read_text(encoding="utf-8")
    parts = _SECTION.split(text)
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    return sections["system"], sections["user"]


def version(name: str) -> str:
    """A short hash of a template: part of cache keys, so editing a prompt invalidates its cache."""
    system, user = template(name)
    return hashlib.sha256(f"{system}\n{user}".encode()).hexdigest()[:12]


def fence(text: str, tag: str = "source", *, guard: bool = True, cut: Sequence[tuple[int, int]] = (),
          **attributes: str | int) -> str:
    """Wrap document text in ``<tag ...>`` … ``</tag>`` so prompts can declare it to be data.

    Chat-template control tokens are always made inert; with ``guard`` (the ``injection_guard``
    setting, on unless a user asks about instruction-like text itself), instruction spans, and the
    ``cut`` ranges found in the text's book at ingestion, are replaced by a marker too
    (``prompts.injection``).
    """
    text = injection.break_control_tokens(injection.neutralise(text, cut) if guard else text)
    safe = re.sub(rf"<(/?)\s*{tag}\b", lambda m: f"<{m.group(1)}{tag}\u200b", text, flags=re.IGNORECASE)
    attrs = "".join(f' {k}="{v}"' for k, v in attributes.items())
    return f"<{tag}{attrs}>\n{safe}\n</{tag}>"


def messages(name: str, **values: str) -> list[BaseMessage]:
    """The chat messages of a template with ``{placeholders}`` filled in (values are not re-parsed)."""
    system, user = template(name)
    return [SystemMessage(system.format_map(values)), HumanMessage(user.format_map(values))]
