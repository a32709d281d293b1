"""Files written whole or not at all: readers (another process, a replica sharing the folder) see
the old content or the new one, never a part, and two writers of one name never share a partial file."""

from __future__ import annotations

import uuid
from pathlib import Path


def write_atomically(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    partial.write_text(text, encoding="utf-8")
    partial.replace(target)
