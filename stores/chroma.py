"""The Chroma client and the collection names of mindscapes: which store a process opens, and how
a mindscape NAME maps onto Chroma collections (``NAME__chunks``, ``NAME__summaries``, ``NAME__books``,
``NAME__texts``)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mia.stores.settings import Settings, offline_environment, writable_dir
from mia.stores.writer_lock import collection_writer, store_path

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,48}[a-z0-9]$")
SUFFIXES = ("__chunks", "__summaries", "__books", "__texts")
COSINE = {"hnsw:space": "cosine"}


class MindscapeError(ValueError):
    """A user-facing problem with a collection: the message says what is wrong and what to do."""


def validate_name(name: str) -> str:
    if not NAME_PATTERN.match(name or "") or "__" in name:
        raise MindscapeError(
            f"invalid collection name {name!r}: use 2-50 characters, lowercase letters, digits, '-' or '_', "
            "starting and ending with a letter or digit, and no '__'"
        )
    return name


@lru_cache(maxsize=4)
def _client(path: str, url: str) -> Any:
    offline_environment()
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
    if url:
        parsed = urlparse(url)
        if not parsed.hostname:
            raise MindscapeError(f"MIA_CHROMA_URL={url!r} is not a URL like http://127.0.0.1:8000")
        return chromadb.HttpClient(
            host=parsed.hostname,
            port=parsed.port or (443 if parsed.scheme == "https" else 8000),
            ssl=parsed.scheme == "https",
            settings=chroma_settings,
        )
    store = writable_dir(Path(path), "MIA_CHROMA_PATH or MIA_HOME")
    return chromadb.PersistentClient(path=str(store), settings=chroma_settings)


def chroma_client(settings: Settings | None = None) -> Any:
    settings = settings or Settings()
    return _client(str(settings.resolved_chroma_path), settings.chroma_url)


def list_mindscapes(client: Any) -> list[str]:
    names = {c if isinstance(c, str) else c.name for c in client.list_collections()}
    return sorted(n.removesuffix("__books") for n in names if n.endswith("__books"))


def delete_mindscape(name: str, client: Any | None = None) -> None:
    client = client if client is not None else chroma_client()
    validate_name(name)
    with collection_writer(store_path(client), name):
        _delete(name, client)


def _delete(name: str, client: Any) -> None:
    if name not in list_mindscapes(client):
        raise MindscapeError(f"unknown collection {name!r}: `mia ls` lists the collections")
    for suffix in SUFFIXES:
        try:
            client.delete_collection(f"{name}{suffix}")
        except Exception:  # noqa: BLE001 - a partly created mindscape may lack some collections
            pass
