"""Real processes, real SIGKILLs, real Chroma: replacement, readers and the one-writer lock.

What must hold (issue 23): a book being replaced is invisible until its new rows are committed,
so no query, BM25 index or ``mia ls`` between a kill and the rerun shows an uncommitted chunk; the
rerun ends equal, row for row and vector for vector, to a clean ingestion, book order included;
a second writer is refused at once with the holder's PID while the first finishes unharmed.

Children come from a fork server that imported ``tests.crash_child`` once (see there), so ten
kills cost seconds, not minutes.
"""

from __future__ import annotations

import multiprocessing
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests import crash_child
from tests.conftest import requires_data, story_text

pytestmark = requires_data

BOOKS = ("golden-goose", "how-molo-stole-the-lovely-rose-red")
KILLS = 10
QUERIES = ["the golden goose and the princess", "Molo stole the lovely rose-red", "the king promised his daughter"]


class Children:
    """Calls into ``tests.crash_child`` in fresh processes forked from one pre-imported server."""

    def __init__(self) -> None:
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["tests.crash_child"])

    def call(self, name: str, *args: Any, timeout: float = 180.0) -> tuple[int, Any]:
        """(exit code, return value or None): -9 when the child killed itself."""
        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_serve, args=(send, name, args))
        process.start()
        send.close()
        result = None
        if receive.poll(timeout):
            try:
                result = receive.recv()
            except EOFError:  # killed before it could answer
                pass
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            pytest.fail(f"crash_child.{name} did not finish in {timeout:.0f}s")
        return process.exitcode, result


def _serve(send: Any, name: str, args: tuple[Any, ...]) -> None:
    send.send(getattr(crash_child, name)(*args))


@pytest.fixture(scope="module")
def children() -> Children:
    return Children()


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory, children: Children) -> dict[str, Any]:
    """The books (the first in two versions), a store holding the old versions, and the snapshot
    of a clean ingestion of the new ones: what every interrupted replacement must end equal to."""
    base = tmp_path_factory.mktemp("crash")
    old, new = base / "old", base / "new"
    old.mkdir(), new.mkdir()
    for book in BOOKS:
        (old / f"{book}.txt").write_text(story_text(book, 4), encoding="utf-8")
        (new / f"{book}.txt").write_text(story_text(book, 4), encoding="utf-8")
    (new / f"{BOOKS[0]}.txt").write_text(story_text(BOOKS[0], 6), encoding="utf-8")  # the replacement grows
    paths = {name: [folder / f"{b}.txt" for b in BOOKS] for name, folder in (("old", old), ("new", new))}

    code, _ = children.call("ingest_books", base / "clean", base / "clean.sqlite", paths["new"], "shelf")
    assert code == 0
    _, clean = children.call("snapshot", base / "clean", "shelf")
    code, _ = children.call("ingest_books", base / "template", base / "template.sqlite", paths["old"], "shelf")
    assert code == 0
    # How many Chroma writes the replacement makes: the kills are placed among them.
    shutil.copytree(base / "template", base / "count")
    code, writes = children.call("ingest_books", base / "count", base / "template.sqlite", paths["new"], "shelf")
    assert code == 0 and writes >= KILLS
    return {"base": base, "paths": paths, "clean": clean, "writes": writes}


def test_killed_replacements_are_invisible_and_end_as_a_clean_run(library: dict[str, Any], children: Children) -> None:
    base, paths = library["base"], library["paths"]
    points = sorted(random.Random(0).sample(range(1, library["writes"] + 1), KILLS))
    saw_uncommitted = 0
    for n, point in enumerate(points):
        store = base / f"kill{n}"
        shutil.copytree(base / "template", store)
        code, _ = children.call("ingest_books", store, base / "template.sqlite", paths["new"], "shelf", point)
        assert code == -9, f"the child was to kill itself before write {point} of {library['writes']}"

        seen = children.call("read_everything", store, "shelf", QUERIES)[1]
        assert seen["foreign"] == [], f"kill before write {point}: queries returned chunks of no committed book"
        assert seen["returned"] > 0 and seen["stats_chunks"] == seen["committed_chunks"]
        assert seen["orders"].get(BOOKS[1]) == 1 and seen["orders"].get(BOOKS[0], 0) == 0
        saw_uncommitted += seen["unfinished"]["chunks"] > 0

        code, _ = children.call("ingest_books", store, base / "template.sqlite", paths["new"], "shelf")
        assert code == 0
        assert crash_child.same_rows(children.call("snapshot", store, "shelf")[1], library["clean"]), f"kill before write {point}"
    # The kills did land where uncommitted rows existed, so the reader checks above were not vacuous.
    assert saw_uncommitted >= 3


@pytest.fixture
def paused_writer(library: dict[str, Any], children: Children, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A child ingesting the new books into a copy of the store, holding the writer lock and
    paused half way through replacing the changed book (before its fifth Chroma write: the book
    is pending, its old rows are gone, some new chunks are in) until the test creates ``release``."""
    store, release = tmp_path / "store", tmp_path / "release"
    shutil.copytree(library["base"] / "template", store)
    result: dict[str, Any] = {"store": store, "release": release}
    worker = threading.Thread(target=lambda: result.update(
        outcome=children.call("ingest_books", store, tmp_path / "cache.sqlite", library["paths"]["new"], "shelf", None, 5, release)))
    worker.start()
    holder = next(iter(crash_child.lock_holders(store)), None)
    deadline = time.monotonic() + 120
    while holder is None and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.1)
        holder = next(iter(crash_child.lock_holders(store)), None)
    assert holder is not None, "the first writer never took the lock"
    result["holder"] = holder
    try:
        yield result
    finally:
        release.touch()
        worker.join(180)


def test_a_second_writer_is_refused_at_once_and_the_first_finishes(paused_writer: dict[str, Any], library: dict[str, Any],
                                                                     children: Children, isolated_environment: Path) -> None:
    store = paused_writer["store"]
    second = subprocess.run([sys.executable, "-m", "mia.graph.cli", "ingest", *map(str, library["paths"]["new"]), "--collection", "shelf",
                             "--summarizer", "extractive"], env=_env(store), capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    message = second.stderr.strip().splitlines()[-1]
    assert message.startswith("mia: error:") and f"PID {paused_writer['holder']['pid']}" in message
    assert "wait" in message and "MIA_CHROMA_URL" in message
    # How fast: evals/bench_lock.py (speed goals are benchmarks, not timed assertions).

    # Readers still work while the writer holds the lock, and see none of its half-written rows.
    listing = subprocess.run([sys.executable, "-m", "mia.graph.cli", "ls"], env=_env(store), capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "shelf:" in listing.stdout and "unfinished ingestion (golden-goose)" in listing.stdout
    seen = children.call("read_everything", store, "shelf", QUERIES)[1]
    assert seen["foreign"] == [] and seen["unfinished"]["chunks"] > 0 and seen["returned"] > 0

    paused_writer["release"].touch()
    deadline = time.monotonic() + 180
    while "outcome" not in paused_writer and time.monotonic() < deadline:
        time.sleep(0.1)
    assert paused_writer.get("outcome", (None,))[0] == 0
    assert crash_child.same_rows(children.call("snapshot", store, "shelf")[1], library["clean"])
    assert crash_child.lock_holders(store) == []


def _env(store: Path) -> dict[str, str]:
    import os

    return {**os.environ, "MIA_CHROMA_PATH": str(store)}


def test_the_lock_is_reentrant_in_a_thread_and_refused_to_another(tmp_path: Path) -> None:
    from mia.stores.writer_lock import StoreBusy, writer_lock

    outcome: list[str] = []

    def other() -> None:
        try:
            with writer_lock(tmp_path):
                outcome.append("acquired")
        except StoreBusy as exc:
            outcome.append(str(exc))

    with writer_lock(tmp_path), writer_lock(tmp_path):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    assert len(outcome) == 1 and outcome[0].startswith(f"the store {tmp_path} is being written by PID ")
    with writer_lock(tmp_path):  # released on exit
        pass
    assert crash_child.lock_holders(tmp_path) == []
