"""Shared fixtures: an isolated environment per test session and one tiny real collection.

Every test session gets its own MIA_HOME (Chroma store, summary cache, tiktoken table, assembled
model), so tests never read or write a developer's caches, and no ``MIA_*`` setting from the shell
(a chat endpoint, another embedder, a context override such as ``MIA_TOP_K``) changes what a test
measures. The tiny collection is built once with the real MiniLM embedder from three FairytaleQA
test stories: building it is the slowest part of the fast tests, and most tests only read it.
"""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from mia.stores.settings import data_root

STORIES = ("golden-goose", "fox-and-wolf", "how-molo-stole-the-lovely-rose-red")
"""Three short test-split stories (~5k words together): small enough to embed in seconds on two
cores, distinct enough that a question about one of them has its answer in that one only."""

TINY = "tiny"
TINY_CHUNK_SIZE = 100
TINY_WINDOW = 4
"""Small chunks and windows, so the tiny collection still has dozens of chunks and several
summaries per book: enough for rankings, signatures and window→summary maps to mean something."""

_KEEP = {"MIA_DATA"}
TEST_READER = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def shared_data() -> Path:
    """The shared data folder (``MIA_DATA`` or ``../shared/data``); tests needing it skip without it."""
    return data_root()


def fairytale_section_dir() -> Path:
    return shared_data() / "fairytaleqa" / "data-by-train-split" / "section-stories" / "test"


def story_text(story: str, sections: int | None = None) -> str:
    """A FairytaleQA story as one plain text: its (first ``sections``) sections in order, separated
    by blank lines. Fewer sections keep write-heavy tests fast while the text stays real."""
    path = fairytale_section_dir() / f"{story}-story.csv"
    with path.open(encoding="utf-8", newline="") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["section"]))
    return "\n\n".join(row["text"].strip() for row in rows[:sections]) + "\n"


def write_stories(folder: Path, stories: tuple[str, ...] = STORIES, sections: int | None = None) -> list[Path]:
    """The stories as ``.txt`` files (one book each), in the given order."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for story in stories:
        path = folder / f"{story}.txt"
        path.write_text(story_text(story, sections), encoding="utf-8")
        paths.append(path)
    return paths


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run ``mia ARGS...`` in-process and return its exit code and captured output."""
    from mia.graph import cli as mia_cli

    def run(*argv: str) -> CliResult:
        capsys.readouterr()
        code = mia_cli.main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


BLOCKER = '''
import os
import sys

# None in sys.modules is how Python marks a module absent: importing it fails and
# importlib.util.find_spec answers None, as on an install without it.
for name in filter(None, os.environ.get("BLOCKED_MODULES", "").split(",")):
    sys.modules[name] = None
'''


def blocking(folder: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python processes cannot import ``modules``: a ``sitecustomize`` on
    PYTHONPATH, inherited by every child process."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    return {**os.environ, "PYTHONPATH": str(folder), "BLOCKED_MODULES": ",".join(modules)}


@pytest.fixture
def without_harness(tmp_path: Path) -> dict[str, str]:
    """An environment without the evaluation harness, as on an install without it."""
    return blocking(tmp_path / "no-harness", "mia.evals")


def mia(env: dict[str, str], *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the ``mia`` command line in a child process with ``env``."""
    return subprocess.run([sys.executable, "-m", "mia.graph.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout)


def mia_serve(env: dict[str, str], port: int, log: Path, timeout: float = 180) -> subprocess.Popen[bytes]:
    """Start ``mia serve`` on ``port`` in a child process and return it once ``/ok`` answers; the
    test stops it. Fails with the end of the server's log if it is not ready within ``timeout``."""
    with log.open("wb") as handle:
        server = subprocess.Popen([sys.executable, "-m", "mia.graph.cli", "serve", "--port", str(port)], env=env,
                                  stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/ok", timeout=2).status_code == 200:
                return server
        time.sleep(0.5)
    server.kill()
    pytest.fail(f"mia serve was not ready: {log.read_text()[-2000:]}")


requires_data = pytest.mark.skipif(
    not fairytale_section_dir().is_dir(), reason=f"shared data not found at {shared_data()}; set MIA_DATA"
)


@pytest.fixture(scope="session", autouse=True)
def isolated_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh MIA_HOME for the session and no inherited MIA_* settings (MIA_DATA excepted)."""
    home = tmp_path_factory.mktemp("mia-home")
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("MIA_") and k not in _KEEP]:
        del os.environ[key]
    for key in ("OPENAI_API_KEY", "TIKTOKEN_CACHE_DIR"):
        os.environ.pop(key, None)
    os.environ["MIA_HOME"] = str(home)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(home / "tiktoken")
    # The 0.5B reader, not the default 1.5B: the graphs' tests read what it writes, and it answers in
    # well under the 1.5B's time; tests/test_embedded_models.py answers with the default itself.
    os.environ["MIA_CHAT_MODEL"] = TEST_READER
    from mia.stores.settings import offline_environment

    offline_environment()
    yield home
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def minilm():  # -> stores.embeddings.Embedder
    """The real MiniLM embedder, loaded once per session (a few seconds)."""
    from mia.stores.embeddings import load_embedder

    return load_embedder("minilm")


@dataclass(frozen=True)
class TinyCollection:
    """The session's tiny collection: its name, an open mindscape and the exact source texts."""

    name: str
    store: object  # stores.mindscape.Mindscape
    texts: dict[str, str]  # book id -> source text
    paths: list[Path]
    report: object  # stores.ingest.IngestReport


@pytest.fixture(scope="session")
def tiny_collection(tmp_path_factory: pytest.TempPathFactory, minilm, isolated_environment: Path) -> TinyCollection:
    """Three stories ingested with extractive summaries into the session's default store.

    It lives in the default store (MIA_HOME/chroma) so that graphs and the CLI, which open the
    store from the environment, see it. Tests must not modify it.
    """
    if not fairytale_section_dir().is_dir():
        pytest.skip(f"shared data not found at {shared_data()}; set MIA_DATA")
    from mia.stores.ingest import IngestOptions, book_id, ingest
    from mia.stores.mindscape import Mindscape

    paths = write_stories(tmp_path_factory.mktemp("stories"))
    options = IngestOptions(chunk_size=TINY_CHUNK_SIZE, window=TINY_WINDOW, summarizer="extractive")
    report = ingest(paths, TINY, minilm, options=options, progress=False)
    texts = {book_id(p): p.read_text(encoding="utf-8") for p in paths}
    return TinyCollection(name=TINY, store=Mindscape(TINY), texts=texts, paths=paths, report=report)


@pytest.fixture(scope="session")
def embedded_model_file(isolated_environment: Path) -> Iterator[Path]:
    """The tests' reader's GGUF, assembled once into the session's MIA_HOME and deleted afterwards (491 MB)."""
    from mia.stores.chat import EMBEDDED_MODELS, embedded_model_path

    path = embedded_model_path(model=EMBEDDED_MODELS[TEST_READER])
    yield path
    path.unlink(missing_ok=True)
