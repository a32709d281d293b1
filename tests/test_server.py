"""The real server on loopback: LangGraph API (SDK and plain HTTP), /v1, ingest, keys; Chroma server.

One server per module, over a small real collection: two short FairytaleQA stories ingested with
extractive summaries (in a child process, before the server starts: the embedded Chroma is not
process-safe, so this process never opens the server's store). Tests that make the chat model
answer are marked slow; the rest only need the server and MiniLM. Every request is bounded by a
timeout, and everything listens on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from langgraph_sdk import get_sync_client

from mia.evals.bench_scale import chroma_server
from mia.graph.registry import QUESTION_GRAPHS
from mia.graph.server import Server, free_port, ingest_elsewhere, port_is_free, start_server
from tests.conftest import mia_serve, requires_data, write_stories

pytestmark = requires_data

STORIES = ("self-did-it", "the-miserly-farmer")
COLLECTION, OTHER, UPLOADS = "fairy", "other", "uploads"
KEYS = {"key-admin": ["*"], "key-fairy": [COLLECTION, UPLOADS]}
QUESTION = "Who had carted pears to market?"
FOLLOW_UP = "Why was it impossible to grind flour in the mill?"
# Keep every run short: few chunks, one agent step, a few answer tokens.
SMALL = {"collection": COLLECTION, "max_new_tokens": 12, "top_k": 3, "k0": 10, "k_sum": 2, "max_steps": 1, "step_k": 3}
GENERATING_NODES = {"generate", "answer"}
MEMORY_GRAPHS = {"infmem", "memagent"}
TIMEOUT = httpx.Timeout(300.0, connect=10.0)


@dataclass(frozen=True)
class Served:
    server: Server

    def sdk(self, key: str | None = "key-admin") -> Any:
        return get_sync_client(url=self.server.url, api_key=key, timeout=TIMEOUT)

    def http(self, key: str | None = "key-admin") -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=TIMEOUT)


def served_data(base: Path) -> tuple[Path, list[Path]]:
    """``base/data`` (the data root) with the stories, and a symlink in it that leaves it for a secret."""
    data, outside = base / "data", base / "outside"
    paths = write_stories(data / "stories", STORIES)
    outside.mkdir()
    (outside / "secret.txt").write_text("not for callers")
    (data / "escape.txt").symlink_to(outside / "secret.txt")
    return data, paths


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The server over collections ``fairy`` (both stories) and ``other`` (one, also the server default), with API keys.

    The data root holds the stories and a symlink that leaves it, for the ingest path checks.
    """
    base = tmp_path_factory.mktemp("served")
    data, paths = served_data(base)
    ingest_elsewhere({COLLECTION: paths, OTHER: paths[:1]}, base / "chroma", chunk_size=100, window=2)
    server_env = {"MIA_CHROMA_PATH": str(base / "chroma"), "MIA_INGEST_ROOT": str(data), "MIA_API_KEYS": json.dumps(KEYS),
                  "MIA_COLLECTION": OTHER}
    with start_server(env=server_env, state_dir=base / "server", timeout=180) as server:
        yield Served(server)


def _status(error: pytest.ExceptionInfo[BaseException]) -> tuple[int, str]:
    response = error.value.response  # type: ignore[attr-defined]
    return response.status_code, response.text


# ---- refusals (no chat model needed) ----------------------------------------------------------
def test_missing_or_wrong_key_gets_401(served: Served) -> None:
    for key, message in ((None, "missing API key"), ("key-wrong", "invalid API key")):
        with pytest.raises(httpx.HTTPStatusError) as error:
            served.sdk(key).threads.create()
        status, text = _status(error)
        assert status == 401 and message in text
        with served.http(key) as http:
            response = http.get("/v1/models")
            assert response.status_code == 401 and message in response.json()["error"]["message"]
            assert http.post("/threads/search", json={}).status_code == 401
    # Studio's header must not open a side door around the keys.
    with served.http(None) as http:
        assert http.post("/threads/search", json={}, headers={"x-auth-scheme": "langsmith"}).status_code == 401


def test_forbidden_collection_gets_403(served: Served) -> None:
    client = served.sdk("key-fairy")
    thread = client.threads.create()
    with pytest.raises(httpx.HTTPStatusError) as error:
        client.runs.wait(thread["thread_id"], "rag", input={"messages": [{"role": "user", "content": QUESTION}]},
                         context={**SMALL, "collection": OTHER})
    status, text = _status(error)
    assert status == 403 and f"may not use collection '{OTHER}'" in text
    # The same refusal on every other way to start a run: streamed, stateless, in the background.
    forbidden = {"input": {"messages": [{"role": "user", "content": QUESTION}]}, "context": {**SMALL, "collection": OTHER}}
    for start in (lambda: list(client.runs.stream(thread["thread_id"], "rag", **forbidden)),
                  lambda: list(client.runs.stream(None, "rag", **forbidden)),
                  lambda: client.runs.wait(None, "rag", **forbidden),
                  lambda: client.runs.create(thread["thread_id"], "rag", **forbidden)):
        with pytest.raises(httpx.HTTPStatusError) as error:
            start()
        assert _status(error)[0] == 403
    # A default assistant answers from the server's collection (MIA_COLLECTION), which this key may not use.
    with pytest.raises(httpx.HTTPStatusError) as error:
        client.runs.wait(thread["thread_id"], "rag", input={"messages": [{"role": "user", "content": QUESTION}]},
                         context={"top_k": 3})
    status, text = _status(error)
    assert status == 403 and f"may not use collection '{OTHER}'" in text
    # An assistant naming a forbidden collection is invisible to the key, so it cannot be run.
    other_assistant = served.sdk("key-admin").assistants.create("rag", context={"collection": OTHER})
    with pytest.raises(httpx.HTTPStatusError) as error:
        client.runs.wait(thread["thread_id"], other_assistant["assistant_id"],
                         input={"messages": [{"role": "user", "content": QUESTION}]})
    assert _status(error)[0] == 404
    with pytest.raises(httpx.HTTPStatusError) as error:
        client.assistants.create("rag", context={"collection": COLLECTION})
    assert _status(error)[0] == 403  # only keys allowed on every collection change assistants
    with served.http("key-fairy") as http:
        response = http.post("/v1/chat/completions",
                             json={"model": f"rag:{OTHER}", "messages": [{"role": "user", "content": QUESTION}]})
        assert response.status_code == 403 and OTHER in response.json()["error"]["message"]


def test_an_assistant_can_choose_the_collection(served: Served) -> None:
    """How a frontend that sends no run context (Agent Chat UI) picks a collection."""
    admin, fairy = served.sdk("key-admin"), served.sdk("key-fairy")
    mine = admin.assistants.create("rag", context={"collection": COLLECTION})
    hidden = admin.assistants.create("rag", context={"collection": OTHER})
    visible = {a["assistant_id"] for a in fairy.assistants.search(limit=100)}
    assert mine["assistant_id"] in visible and hidden["assistant_id"] not in visible
    output = fairy.runs.wait(None, mine["assistant_id"], context={"retrieval_only": True},
                             input={"messages": [{"role": "user", "content": QUESTION}]})
    assert output["question"] == QUESTION and output["retrieved"]


def test_threads_are_private_to_their_key(served: Served) -> None:
    mine = served.sdk("key-fairy").threads.create()
    with pytest.raises(httpx.HTTPStatusError) as error:
        served.sdk("key-admin").threads.get(mine["thread_id"])
    assert _status(error)[0] == 404
    assert all(t["thread_id"] != mine["thread_id"] for t in served.sdk("key-admin").threads.search(limit=100))


def test_every_question_graph_is_served(served: Served) -> None:
    served_graphs = {a["graph_id"] for a in served.sdk().assistants.search(limit=100)}
    missing = sorted(set(QUESTION_GRAPHS) - served_graphs)
    assert not missing, f"add {missing} to langgraph.json's graphs: they are in graph.registry.QUESTION_GRAPHS"


def test_models_list_only_allowed_collections(served: Served) -> None:
    def models(key: str) -> set[str]:
        with served.http(key) as http:
            response = http.get("/v1/models")
        assert response.status_code == 200
        return {m["id"] for m in response.json()["data"]}

    admin, fairy = models("key-admin"), models("key-fairy")
    assert {f"{g}:{c}" for g in QUESTION_GRAPHS for c in (COLLECTION, OTHER)} <= admin
    assert {f"{g}:{COLLECTION}" for g in QUESTION_GRAPHS} <= fairy
    assert not any(m.endswith(f":{OTHER}") for m in fairy)


@pytest.mark.parametrize("path, reason", [
    ("/etc/passwd", "absolute"),
    ("../outside/secret.txt", "'..'"),
    ("escape.txt", "symlink"),
])
def test_ingest_outside_the_data_root_gets_403(served: Served, path: str, reason: str) -> None:
    with pytest.raises(httpx.HTTPStatusError) as error:
        served.sdk("key-admin").runs.wait(None, "ingest", input={"paths": [path], "collection": UPLOADS,
                                                                  "summarizer": "extractive"})
    status, text = _status(error)
    assert status == 403 and reason in text


def test_ingest_through_the_server(served: Served) -> None:
    output = served.sdk("key-fairy").runs.wait(
        None, "ingest", input={"paths": [f"stories/{STORIES[0]}.txt"], "collection": UPLOADS, "summarizer": "extractive"})
    assert output["collection"] == UPLOADS and output["books_written"] == [STORIES[0]] and output["chunks"] > 0
    with served.http("key-fairy") as http:
        assert f"rag:{UPLOADS}" in {m["id"] for m in http.get("/v1/models").json()["data"]}


# ---- answering (the chat model) ---------------------------------------------------------------
def _stream_turn(client: Any, thread_id: str, graph: str, question: str) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """One streamed turn: the (node, text) of every AI token event, and the final state values."""
    tokens: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    for part in client.runs.stream(thread_id, graph, input={"messages": [{"role": "user", "content": question}]},
                                   context=SMALL, stream_mode=["messages-tuple", "values"]):
        if part.event == "messages":
            message, metadata = part.data
            if message.get("type") in ("ai", "AIMessageChunk"):
                tokens.append((metadata.get("langgraph_node", ""), message.get("content") or ""))
        elif part.event == "values":
            values = part.data
        assert part.event != "error", part.data
    return tokens, values


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("graph", QUESTION_GRAPHS)
def test_chat_turns_on_a_thread(served: Served, graph: str, embedded_model_file: Path) -> None:
    """A streamed first turn through the SDK (answer tokens from the generating node only), then a
    follow-up on the same thread over plain HTTP: the thread keeps both turns, and the second run
    answers the second question with fresh per-question results."""
    client = served.sdk("key-fairy")
    thread_id = client.threads.create()["thread_id"]
    tokens, values = _stream_turn(client, thread_id, graph, QUESTION)
    assert tokens, "no answer tokens were streamed"
    assert {node for node, _ in tokens} <= GENERATING_NODES
    reply = values["messages"][-1]
    assert reply["type"] == "ai"
    if graph not in MEMORY_GRAPHS:  # the streaming agents answer from their memory, not from passages
        assert "Sources:" in reply["content"]
    assert reply["content"].startswith("".join(text for _, text in tokens).strip())
    assert values["question"] == QUESTION

    with served.http("key-fairy") as http:
        response = http.post(f"/threads/{thread_id}/runs/wait", json={
            "assistant_id": graph, "context": SMALL, "input": {"messages": [{"role": "user", "content": FOLLOW_UP}]}})
        assert response.status_code == 200, response.text
        output = response.json()
        state = http.get(f"/threads/{thread_id}/state").json()["values"]
    # The new question (prepare may rewrite a follow-up into a standalone one), not the old one.
    assert output["question"] == state["question"] and output["question"] not in ("", QUESTION)
    kinds = [(m["type"], m["content"]) for m in output["messages"]]
    assert [k for k, _ in kinds] == ["human", "ai", "human", "ai"]
    assert kinds[0][1] == QUESTION and kinds[2][1] == FOLLOW_UP
    assert graph in MEMORY_GRAPHS or "Sources:" in kinds[3][1]
    # per-question fields were reset (the memory agents keep no passage ranking)
    assert (graph in MEMORY_GRAPHS or output["retrieved"]) and output["usage"]["llm_calls"] >= 1
    history = client.threads.get_history(thread_id, limit=100)
    assert {output["question"], QUESTION} <= {h["values"].get("question") for h in history}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openai_chat_completions(served: Served, embedded_model_file: Path) -> None:
    request = {"model": f"rag:{COLLECTION}", "max_tokens": 12, "context": {"top_k": 3},
               "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]}
    with served.http("key-fairy") as http:
        response = http.post("/v1/chat/completions", json=request)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "chat.completion" and body["model"] == f"rag:{COLLECTION}"
        content = body["choices"][0]["message"]["content"]
        assert "Sources:" in content and body["usage"]["completion_tokens"] > 0

        chunks: list[dict[str, Any]] = []
        with http.stream("POST", "/v1/chat/completions",
                         json={**request, "stream": True, "stream_options": {"include_usage": True}}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in stream.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert "\n\nSources: " in text and text.split("\n\nSources: ")[0].strip()  # answer tokens, then the sources
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 2
    assert chunks[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_serve_finds_no_lost_or_mixed_answers(served: Served, embedded_model_file: Path) -> None:
    import asyncio

    from mia.evals.bench_serve import bench

    result = asyncio.run(bench(served.server.url, graph="rag", collection=COLLECTION, requests=2, concurrency=2,
                               max_new_tokens=8, settings={"top_k": 3}, api_key="key-fairy", deadline=400))
    assert result["failed"] == 0, result["outcomes"]
    assert result["latency_p95_seconds"] >= result["latency_p50_seconds"] > 0


# ---- Chroma server mode -------------------------------------------------------------------------
def test_chroma_server_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minilm: Any) -> None:
    """MIA_CHROMA_URL sends ingestion and retrieval to a `chroma run` server instead of a folder."""
    from mia.graph.registry import load_graph
    from mia.nodes.context import context_from
    from mia.stores.ingest import IngestOptions, ingest
    from mia.stores.chroma import chroma_client, list_mindscapes
    from mia.stores.mindscape import Mindscape

    paths = write_stories(tmp_path / "stories", STORIES)
    with chroma_server(tmp_path / "chroma-server") as (url, _):
        monkeypatch.setenv("MIA_CHROMA_URL", url)
        client = chroma_client()
        report = ingest(paths, "remote", minilm, options=IngestOptions(chunk_size=100, window=2, summarizer="extractive"),
                        progress=False)
        assert report.chunks > 0 and "remote" in list_mindscapes(client)
        assert Mindscape("remote").stats()["chunks"] == report.chunks
        state = load_graph("rag").invoke({"question": QUESTION},
                                         context=context_from("rag", {"collection": "remote", "retrieval_only": True, "top_k": 3}))
        top = Mindscape("remote").chunk_records([state["retrieved"][0]["id"]])[0]
        assert top["book"] == "the-miserly-farmer" and "pears" in top["text"]
    # The rows went to the server's folder (readable once it has stopped), not to an embedded store.
    import chromadb

    stored = chromadb.PersistentClient(path=str(tmp_path / "chroma-server"))
    assert "remote" in list_mindscapes(stored)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_mia_serve_stops_its_whole_tree_and_frees_the_port(sig: signal.Signals, tmp_path: Path) -> None:
    """What a supervisor (SIGTERM) or Ctrl-C (SIGINT) does: no process of the server may outlive it."""
    import psutil

    port = free_port()
    env = {**os.environ, "MIA_HOME": str(tmp_path / "home"), "MIA_CHROMA_PATH": str(tmp_path / "chroma")}
    mia = mia_serve(env, port, tmp_path / "serve.log")
    try:
        server = psutil.Process(mia.pid).children(recursive=True)
        assert server, "mia serve should run the server as its child"

        stopped = time.monotonic()
        mia.send_signal(sig)
        assert mia.wait(10) == 128 + sig
        _, alive = psutil.wait_procs(server, timeout=max(0.0, 10 - (time.monotonic() - stopped)))
        assert not alive, f"still running {time.monotonic() - stopped:.1f}s after {sig.name}: {[p.pid for p in alive]}"
        assert port_is_free("127.0.0.1", port)
    finally:  # whatever failed, leave nothing running (an orphan is no longer our child)
        for process in [*psutil.Process().children(recursive=True), *locals().get("server", [])]:
            with contextlib.suppress(psutil.Error):
                process.kill()
