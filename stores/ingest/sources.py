"""What ingestion reads: text files, one a book, checked before anything is written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

SUPPORTED_SUFFIXES = (".txt", ".md")


class InputError(ValueError):
    """Bad input to ingestion; the message names the problem and the fix."""


@dataclass(frozen=True)
class Source:
    path: Path
    book: str
    text: str


def book_id(path: Path) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-")
    return slug or "book"


def decode_text(name: str, data: bytes) -> str:
    """A source file's text, or :class:`InputError` saying why it is not one: the one rule for files
    named on the command line and files uploaded to the server."""
    if b"\x00" in data:
        raise InputError(f"{name}: looks binary (contains NUL bytes); only plain-text files can be ingested")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not valid UTF-8 (byte {exc.start}); re-encode it, e.g. `iconv -f latin1 -t utf-8`") from exc
    if not text.strip():
        raise InputError(f"{name}: file is empty; remove it from the inputs")
    return text


def collect_sources(paths: Sequence[str | Path]) -> list[Source]:
    """Read and check every input before anything is written (one file is one book)."""
    if not paths:
        raise InputError("no input paths given: pass one or more .txt/.md files or folders")
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise InputError(f"{path}: no such file or folder; check the path")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_SUFFIXES)
            if not found:
                raise InputError(f"{path}: folder holds no .txt or .md files; point at a folder of text files")
            files.extend(found)
        elif path.suffix.lower() not in SUPPORTED_SUFFIXES:
            raise InputError(f"{path}: not a .txt or .md file; convert it to plain text first")
        else:
            files.append(path)
    sources: list[Source] = []
    seen: dict[str, Path] = {}
    for path in files:
        text = decode_text(str(path), path.read_bytes())
        book = book_id(path)
        if book in seen and seen[book] != path:
            raise InputError(f"{path} and {seen[book]} would both be book {book!r}; rename one of them")
        seen[book] = path
        sources.append(Source(path=path, book=book, text=text))
    return sources
