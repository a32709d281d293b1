"""One writer at a time per embedded Chroma store.

Embedded Chroma is not process-safe: two processes writing one store can corrupt its vector
index, and each keeps its own in-memory copy. So ingestion and removal hold an OS file lock
(``flock``, released by the kernel when the holder dies, even by SIGKILL) kept in the store
folder itself (by default under ``MIA_HOME``), so that two processes with different ``MIA_HOME``
but the same ``MIA_CHROMA_PATH`` exclude each other too. A second writer is refused at once with
the holder's PID and what to do; readers take no lock and keep working. A Chroma server
(``MIA_CHROMA_URL``) orders writes itself, so no file lock is taken for one.

Replicas of a production server (several machines, one Chroma server, one Postgres) would still
interleave two ingestions of one collection; there each collection's writer holds a Postgres
advisory lock (:func:`collection_lock`), which Postgres releases when the holder's connection
ends, so a killed writer never leaves a collection locked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from mia.stores.settings import Settings, writable_dir

LOCK_NAME = "mia-writer.lock"
CONNECT_TIMEOUT = 5
_held = threading.local()


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


def _advisory_key(collection: str) -> int:
    """A signed 64-bit key for ``collection`` in Postgres's advisory lock space, MiA's own."""
    return int.from_bytes(hashlib.sha256(f"mia-writer\0{collection}".encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def collection_lock(collection: str, settings: Settings | None = None) -> Iterator[None]:
    """Hold ``collection``'s writer lock in the shared Postgres for the block, or raise
    :class:`StoreBusy` without waiting; nothing without the replicas' database (``Settings.database_uri``).
    Re-entrant within one thread."""
    database_uri = (settings or Settings()).database_uri
    held: set[str] = _held.__dict__.setdefault("collections", set())
    if not database_uri or collection in held:
        yield
        return
    import psycopg

    try:
        conn = psycopg.connect(database_uri, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                               application_name=f"mia writer {collection}"[:63])
    except psycopg.Error as exc:
        raise StoreBusy(f"cannot take the writer lock of collection {collection!r}: the database is unreachable "
                        f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None
    with conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (_advisory_key(collection),)).fetchone()
        if not row or not row[0]:
            raise StoreBusy(f"collection {collection!r} is being written by another process or replica: wait for it "
                            "to finish (queries still work), or write to another collection")
        held.add(collection)
        try:
            yield
        finally:
            held.discard(collection)
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (_advisory_key(collection),))


@contextlib.contextmanager
def collection_writer(store: Path | None, collection: str, settings: Settings | None = None) -> Iterator[None]:
    """Every lock a writer of ``collection`` holds: its embedded store's file lock (``store``, None for a
    Chroma server) and the collection's lock across replicas."""
    with writer_lock(store), collection_lock(collection, settings):
        yield
