"""Process-wide settings read from the environment.

Graph runs carry their own typed settings (``nodes.context``, one class per graph); these are the
defaults those fall back to, and what the CLI and ingestion use. One place, so that the README's
configuration table and the code cannot drift apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def mia_home() -> Path:
    """Caches (assembled model file, summary cache, tiktoken files, BM25 indexes, embedded Chroma)."""
    return Path(_env("MIA_HOME") or Path.home() / ".cache" / "mia").expanduser()


def data_root() -> Path:
    """The shared benchmark data; ``../shared/data`` from a checkout unless MIA_DATA says otherwise."""
    return Path(_env("MIA_DATA") or "../shared/data").expanduser()


class SettingsError(ValueError):
    """A setting names a place that cannot be used; the message says which setting to change."""


def writable_dir(path: Path, setting: str) -> Path:
    """Create ``path`` if needed and prove it takes files, or say which setting to change.

    Caches live under MIA_HOME; without this check a bad MIA_HOME surfaces as a traceback from
    whichever cache happens to be opened first.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise SettingsError(f"{path} is not a writable folder ({exc.strerror}): set {setting} to a writable folder") from exc
    return path


def _replicas_database() -> str:
    """``DATABASE_URI`` when it is the replicas' Postgres: a Postgres address (``postgresql+DRIVER://``
    taken as plain) with ``REDIS_URI`` beside it, as ``mia serve`` needs them. A server's own setting
    (``langgraph dev`` sets ``:memory:``) or an unrelated database does not make ingestion lock there."""
    uri, scheme = _env("DATABASE_URI"), _env("DATABASE_URI").partition("://")[0]
    if not _env("REDIS_URI") or scheme.partition("+")[0] not in ("postgres", "postgresql"):
        return ""
    return "postgresql://" + uri.partition("://")[2]


@dataclass(frozen=True)
class Settings:
    """Model and store endpoints. Empty strings mean "use the embedded default"."""

    home: Path = field(default_factory=mia_home)
    chroma_path: str = field(default_factory=lambda: _env("MIA_CHROMA_PATH"))
    chroma_url: str = field(default_factory=lambda: _env("MIA_CHROMA_URL"))
    embeddings: str = field(default_factory=lambda: _env("MIA_EMBEDDINGS", "minilm"))
    embeddings_base_url: str = field(default_factory=lambda: _env("MIA_EMBEDDINGS_BASE_URL"))
    chat_base_url: str = field(default_factory=lambda: _env("MIA_CHAT_BASE_URL"))
    chat_model: str = field(default_factory=lambda: _env("MIA_CHAT_MODEL"))
    api_key: str = field(default_factory=lambda: _env("MIA_API_KEY") or _env("OPENAI_API_KEY"))
    database_uri: str = field(default_factory=lambda: _env("MIA_DATABASE_URI") or _replicas_database())
    """Postgres shared by the replicas of a production server (``mia serve --database-uri`` sets it for its
    replica): writers of one collection exclude each other there."""

    @property
    def resolved_chroma_path(self) -> Path:
        return Path(self.chroma_path).expanduser() if self.chroma_path else self.home / "chroma"


def offline_environment() -> None:
    """Make every library we use behave offline: no hub downloads, no telemetry, no version checks.

    Called before any model or Chroma import, so that a missing file fails at once with a clear
    message instead of hanging on a network that does not exist here.
    """
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "ANONYMIZED_TELEMETRY": "False",
        "TOKENIZERS_PARALLELISM": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGGRAPH_NO_VERSION_CHECK": "true",
        "LANGSMITH_TRACING": "false",
        "TIKTOKEN_CACHE_DIR": str(mia_home() / "tiktoken"),
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
