"""The product runs without the evaluation harness: ``mia`` with ``mia.evals`` unimportable.

The harness joins the command line through entry points, and only when it imports. Each test runs
the real CLI in a child process that cannot import ``mia.evals`` (conftest's ``without_harness``),
inherited by the server the CLI starts, so an import of the harness anywhere on the product's path
fails the command instead of passing unnoticed. ``mia demo`` runs the same way in test_demo.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mia.graph.server import free_port
from tests.conftest import blocking, mia, mia_serve, requires_data, write_stories

pytestmark = requires_data

PRODUCT_COMMANDS = ("ingest", "ls", "rm", "ask", "demo", "serve")
HARNESS_COMMANDS = ("eval", "bench", "train")


@pytest.fixture
def env(without_harness: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**without_harness, "MIA_CHROMA_PATH": str(tmp_path / "chroma")}


def test_the_blocker_blocks(env: dict[str, str]) -> None:
    """Without this the other tests could pass with the harness importable."""
    child = subprocess.run([sys.executable, "-c", "import mia.evals.cli"], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode != 0 and "No module named 'mia.evals" in child.stderr


def test_help_lists_the_product_commands_only(env: dict[str, str]) -> None:
    shown = mia(env, "--help", timeout=60)
    assert shown.returncode == 0, shown.stderr
    listed = shown.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert set(PRODUCT_COMMANDS) <= set(listed)
    assert not set(HARNESS_COMMANDS) & set(listed)


def test_without_the_eval_extra_the_harness_commands_are_absent(tmp_path: Path) -> None:
    """The harness installed but not its extra: its commands must not be offered only to fail halfway."""
    env = blocking(tmp_path / "no-extra", "matplotlib")
    shown = mia(env, "--help", timeout=60)
    assert shown.returncode == 0, shown.stderr
    listed = shown.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert set(PRODUCT_COMMANDS) <= set(listed) and not set(HARNESS_COMMANDS) & set(listed)
    child = subprocess.run([sys.executable, "-c", "import mia.evals"], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode != 0 and "pip install 'mia[eval]'" in child.stderr


def test_ingest_ls_ask_rm_without_the_harness(env: dict[str, str], tmp_path: Path) -> None:
    paths = write_stories(tmp_path / "stories", ("golden-goose",), sections=3)
    ingested = mia(env, "ingest", *map(str, paths), "--collection", "plain", "--summarizer", "extractive", "--quiet")
    assert ingested.returncode == 0, ingested.stderr
    assert "plain: 1 book(s) written" in ingested.stdout

    listed = mia(env, "ls")
    assert listed.returncode == 0 and "plain: 1 book(s)" in listed.stdout, listed.stderr

    asked = mia(env, "ask", "Who had the golden goose?", "--collection", "plain", "--graph", "mia_rag",
                "--set", "retrieval_only=true", "--json")
    assert asked.returncode == 0, asked.stderr
    assert '"retrieved": [{' in asked.stdout and '"signature": [{' in asked.stdout

    removed = mia(env, "rm", "plain")
    assert removed.returncode == 0 and "removed plain" in removed.stdout, removed.stderr


@pytest.mark.slow
def test_serve_answers_without_the_harness(env: dict[str, str], tmp_path: Path) -> None:
    """The server's processes inherit the blocker: a graph that imported the harness would fail here."""
    paths = write_stories(tmp_path / "stories", ("golden-goose",), sections=3)
    assert mia(env, "ingest", *map(str, paths), "--collection", "served", "--summarizer", "none", "--quiet").returncode == 0
    port = free_port()
    serve_env = {**env, "MIA_HOME": str(tmp_path / "home")}
    server = mia_serve(serve_env, port, tmp_path / "serve.log")
    try:
        run = httpx.post(f"http://127.0.0.1:{port}/runs/wait", timeout=120, json={
            "assistant_id": "rag", "input": {"question": "Who had the golden goose?"},
            "context": {"collection": "served", "retrieval_only": True}})
        assert run.status_code == 200, run.text
        assert run.json()["retrieved"], run.text
    finally:
        server.terminate()
        server.wait(30)
