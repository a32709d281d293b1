"""One writer at a time per embedded Chroma store.

Embedded Chroma is not process-safe: two processes writing one store can corrupt its vector
index, and each keeps its own in-memory copy. So ingestion and removal hold an OS file lock
(``flock``, released by the kernel when the holder dies, even by SIGKILL) kept in the store
folder itself (by default under ``MIA_HOME``), so that two processes with different ``MIA_HOME``
but the same ``MIA_CHROMA_PATH`` exclude each other too. A second writer is refused at once with
the holder's PID and what to do; readers take no lock and keep working. A Chroma server
(``MIA_CHROMA_URL``) orders writes itself, so no lock is taken for one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from mia.stores.settings import Settings, writable_dir

LOCK_NAME = "mia-writer.lock"


class StoreBusy(ValueError):
    """Another process (or thread) is writing the same embedded store (a user-facing error)."""


def store_path(client: Any) -> Path | None:
    """The folder of an embedded Chroma client; ``None`` for a Chroma server."""
    settings = client.get_settings()
    return Path(settings.persist_directory).resolve() if settings.is_persistent else None


def settings_store_path(settings: Settings | None = None) -> Path | None:
    """The store the settings name, known without opening Chroma (so the CLI can refuse at once)."""
    settings = settings or Settings()
    return None if settings.chroma_url else settings.resolved_chroma_path.expanduser().resolve()


def _lock_files(store: Path) -> tuple[Path, Path]:
    folder = writable_dir(store, "MIA_CHROMA_PATH or MIA_HOME")
    return folder / LOCK_NAME, folder / "mia-writer.holder.json"


def _holder(info: Path) -> str:
    try:
        data = json.loads(info.read_text())
    except (OSError, ValueError):
        return "another process (its PID is being recorded)"
    since = time.strftime("%H:%M:%S", time.localtime(data.get("since", 0)))
    return f"PID {data.get('pid')} (`{data.get('command', '?')}`, since {since})"


def _command() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] not in ("", "-c") else "python"
    return " ".join([name, *sys.argv[1:]])[:200]


@contextlib.contextmanager
def writer_lock(store: Path | None) -> Iterator[None]:
    """Hold the store's writer lock for the block, or raise :class:`StoreBusy` without waiting.

    Re-entrant within one thread (the CLI takes it before loading models, ingestion again inside),
    refused to any other thread or process.
    """
    if store is None:
        yield
        return
    lock_file, info = _lock_files(store)
    lock = FileLock(str(lock_file), timeout=0, is_singleton=True)
    try:
        lock.acquire()
    except Timeout:
        raise StoreBusy(
            f"the store {store} is being written by {_holder(info)}: wait for it to finish (queries still work), "
            "or run a Chroma server (`chroma run`) and set MIA_CHROMA_URL for several writers at once"
        ) from None
    outermost = lock.lock_counter == 1
    try:
        if outermost:
            tmp = info.with_name(f"{info.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"pid": os.getpid(), "command": _command(),
                                       "since": time.time(), "store": str(store)}))
            tmp.replace(info)
        yield
    finally:
        if outermost:
            info.unlink(missing_ok=True)
        lock.release()
