"""The production server (graph/production.py) for real: two replicas of `mia serve` on one Postgres,
one Redis and one Chroma server, all on loopback (tests/services.py).

The embedded server's auth cases (tests/test_server.py) run again against each replica; then what
only a shared database can do: a thread continued on the other replica, a book ingested through one
and answered from the other, ten messages acknowledged by replicas killed with SIGKILL all finished
by surviving workers, both replicas serving on after Postgres restarts, one writer per collection across
processes, and a bad database address refused in one line. Runs here stop after retrieval (no chat
model), so the module costs the servers' start-ups (twelve replicas) and MiniLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from mia.evals.bench_scale import chroma_server
from mia.graph.server import Server, ingest_elsewhere, start_server
from tests.conftest import TEST_READER, requires_data
from tests.services import Postgres, postgres, redis, services_available
from tests.test_server import (  # the embedded server's auth cases, collected here once per replica
    COLLECTION,
    KEYS,
    OTHER,
    QUESTION,
    STORIES,
    Served,
    _status,
    served_data,
    test_an_assistant_can_choose_the_collection,  # noqa: F401
    test_every_question_graph_is_served,  # noqa: F401
    test_forbidden_collection_gets_403,  # noqa: F401
    test_ingest_outside_the_data_root_gets_403,  # noqa: F401
    test_missing_or_wrong_key_gets_401,  # noqa: F401
    test_models_list_only_allowed_collections,  # noqa: F401
    test_threads_are_private_to_their_key,  # noqa: F401
)

pytestmark = [requires_data, pytest.mark.skipif(not services_available(), reason="needs Debian's postgresql and redis-server (.ci/run installs them)")]

LEASE_SECONDS = 5
"""How long a killed worker's run stays claimed before another worker takes it (GraphHarbor's lease)."""
RETRIEVE = {"collection": COLLECTION, "retrieval_only": True, "top_k": 3}


@dataclass
class Topology:
    postgres: Postgres
    redis: str
    chroma: str
    data: Path
    base: Path
    replicas: dict[str, Server]

    @property
    def database(self) -> str:
        return self.postgres.uri

    def env(self) -> dict[str, str]:
        return {"MIA_CHROMA_URL": self.chroma, "MIA_INGEST_ROOT": str(self.data), "MIA_API_KEYS": json.dumps(KEYS),
                "MIA_COLLECTION": OTHER, "MIA_HOME": str(self.base / "home"), "GRAPHHARBOR_LEASE_SECONDS": str(LEASE_SECONDS),
                "GRAPHHARBOR_REAPER_INTERVAL_SECONDS": "1"}

    def replica(self, name: str) -> Any:
        """A started replica (a context manager), with its own state folder."""
        return start_server(env=self.env(), state_dir=self.base / f"replica-{name}", database_uri=self.database,
                            redis_uri=self.redis, timeout=180, jobs=2)


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """The served collections of tests/test_server.py in a Chroma server, and replicas ``a`` and ``b``."""
    base = tmp_path_factory.mktemp("production")
    data, paths = served_data(base)
    with postgres() as cluster, redis(base / "redis") as queue, chroma_server(base / "chroma") as (chroma, _):
        ingest_elsewhere({COLLECTION: paths, OTHER: paths[:1]}, None, chroma_url=chroma, chunk_size=100, window=2)
        topology = Topology(cluster, queue, chroma, data, base, {})
        with topology.replica("a") as a, topology.replica("b") as b:
            topology.replicas.update(a=a, b=b)
            yield topology


@pytest.fixture(params=["a", "b"])
def served(request: pytest.FixtureRequest, topology: Topology) -> Served:
    return Served(topology.replicas[request.param])


def _ask(client: Any, thread_id: str, question: str = QUESTION) -> dict[str, Any]:
    return client.runs.wait(thread_id, "rag", input={"messages": [{"role": "user", "content": question}]}, context=RETRIEVE)


def test_a_thread_continues_on_the_other_replica(topology: Topology) -> None:
    a, b = (Served(topology.replicas[n]).sdk("key-fairy") for n in "ab")
    thread = a.threads.create()
    first = _ask(a, thread["thread_id"])
    second = _ask(b, thread["thread_id"], "Why was it impossible to grind flour in the mill?")
    assert first["retrieved"] and second["retrieved"]
    asked = [m["content"] for m in a.threads.get_state(thread["thread_id"])["values"]["messages"] if m["type"] == "human"]
    assert asked == [QUESTION, "Why was it impossible to grind flour in the mill?"]
    with pytest.raises(httpx.HTTPStatusError) as error:  # still private to its key on either replica
        Served(topology.replicas["b"]).sdk("key-admin").threads.get(thread["thread_id"])
    assert _status(error)[0] == 404


@pytest.mark.parametrize("name", ["a", "b"])
def test_the_app_s_own_routes_serve_on_each_replica(topology: Topology, name: str) -> None:
    """The web page and its API check the keys themselves; /v1 runs its graph in the replica's
    process, without a thread: the server's checkpointer, attached to the shared graph object, must
    not demand one (streamed or not)."""
    with Served(topology.replicas[name]).http(None) as anonymous:
        page = anonymous.get("/mia/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert anonymous.get("/mia/api/collections").status_code == 401
    with Served(topology.replicas[name]).http("key-fairy") as http:
        listed = [c["collection"] for c in http.get("/mia/api/collections").json()["collections"]]
        assert COLLECTION in listed and OTHER not in listed
    request = {"model": f"rag:{COLLECTION}", "messages": [{"role": "user", "content": QUESTION}], "context": RETRIEVE}
    with Served(topology.replicas[name]).http("key-fairy") as http:
        reply = http.post("/v1/chat/completions", json=request)
        assert reply.status_code == 200, reply.text  # retrieval only: the reply's text needs the chat model (below)
        assert reply.json()["object"] == "chat.completion" and reply.json()["choices"][0]["finish_reason"] == "stop"
        with http.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as stream:
            assert stream.status_code == 200
            events = [line.removeprefix("data: ") for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])


def test_a_book_ingested_through_one_replica_is_answered_from_the_other(topology: Topology) -> None:
    a, b = (Served(topology.replicas[n]).sdk("key-admin") for n in "ab")
    output = a.runs.wait(None, "ingest", input={"paths": [f"stories/{STORIES[1]}.txt"], "collection": "shared",
                                                "summarizer": "extractive"})
    assert output["books_written"] == [STORIES[1]]
    answer = b.runs.wait(None, "rag", input={"messages": [{"role": "user", "content": QUESTION}]},
                         context={**RETRIEVE, "collection": "shared"})
    assert answer["retrieved"] and all(r["id"].startswith(f"{STORIES[1]}:") for r in answer["retrieved"])


KILLS = 10


def test_messages_acknowledged_by_killed_replicas_are_all_kept(topology: Topology) -> None:
    """One conversation, ten messages, each sent to a fresh replica that is killed with SIGKILL
    (server and worker) right after it acknowledges the run: a surviving worker finishes every
    run (whether the dead one had claimed it or not), and the thread ends holding all ten
    messages in order."""
    survivor = Served(topology.replicas["b"]).sdk("key-fairy")
    thread_id = survivor.threads.create()["thread_id"]
    asked: list[str] = []
    pending: str | None = None
    for round_ in range(KILLS):
        with topology.replica(f"killed-{round_}") as doomed:
            if pending is not None:  # the previous message's run, finished by the survivor
                survivor.runs.join(thread_id, pending)
                assert survivor.runs.get(thread_id, pending)["status"] == "success"
            question = f"{QUESTION} (message {round_ + 1})"
            pending = Served(doomed).sdk("key-fairy").runs.create(
                thread_id, "rag", input={"messages": [{"role": "user", "content": question}]}, context=RETRIEVE)["run_id"]
            asked.append(question)
            for group in doomed.groups:
                os.killpg(group, signal.SIGKILL)
    assert pending is not None
    survivor.runs.join(thread_id, pending)
    assert survivor.runs.get(thread_id, pending)["status"] == "success"
    assert [run["status"] for run in survivor.runs.list(thread_id, limit=KILLS + 1)] == ["success"] * KILLS
    values = survivor.threads.get_state(thread_id)["values"]
    assert [m["content"] for m in values["messages"] if m["type"] == "human"] == asked and values["retrieved"]


def test_replicas_reconnect_after_postgres_restarts(topology: Topology) -> None:
    """Postgres restarted while the replicas are idle (every connection they held is closed): both
    serve the next requests, reads and runs, without a restart of their own."""
    import psycopg

    with psycopg.connect(topology.database) as conn:
        held = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                            "AND datname = current_database() AND pid <> pg_backend_pid()").fetchone()
    assert held and held[0] > 0, "the replicas hold no connection to lose"
    topology.postgres.restart()
    for name in "ab":
        client = Served(topology.replicas[name]).sdk("key-fairy")
        thread_id = client.threads.create()["thread_id"]
        assert _ask(client, thread_id)["retrieved"]
        assert client.threads.get(thread_id)["thread_id"] == thread_id


_HOLD = """
import sys, time
from mia.stores.writer_lock import collection_lock
with collection_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_one_writer_per_collection_across_processes(topology: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock lives in the shared Postgres: a second writer is refused at once, whichever process
    holds it, and a holder killed with SIGKILL frees it."""
    from mia.stores.writer_lock import StoreBusy, collection_lock

    monkeypatch.setenv("MIA_DATABASE_URI", topology.database)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, "books"], env={**os.environ}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusy, match="collection 'books' is being written by another process or replica"):
            with collection_lock("books"):
                pass
        with collection_lock("other-books"), collection_lock("other-books"):  # others are free; re-entrant
            pass
        events = list(Served(topology.replicas["a"]).sdk("key-admin").runs.stream(
            None, "ingest", input={"paths": [f"stories/{STORIES[0]}.txt"], "collection": "books", "summarizer": "extractive"}))
        errors = [part.data for part in events if part.event == "error"]  # what a client streaming the run sees
        assert errors and "being written by another process or replica" in json.dumps(errors)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    deadline = time.monotonic() + 30
    while True:  # Postgres ends the dead holder's session, and with it the lock
        try:
            with collection_lock("books"):
                break
        except StoreBusy:
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.5)


def test_a_bad_database_address_is_one_clear_line(tmp_path: Path, topology: Topology) -> None:
    closed = f"postgresql://mia:s3cret@127.0.0.1:{_closed_port()}/postgres"
    done = subprocess.run([sys.executable, "-m", "mia.graph.cli", "serve", "--port", str(_closed_port()),
                           "--database-uri", closed, "--redis-uri", topology.redis],
                          env={**os.environ, "MIA_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mia: error: cannot use the database at postgresql://mia:***@127.0.0.1")
    assert "s3cret" not in done.stderr and "Traceback" not in done.stderr
    only_one = subprocess.run([sys.executable, "-m", "mia.graph.cli", "serve", "--port", str(_closed_port()),
                               "--database-uri", topology.database],
                              env={k: v for k, v in os.environ.items() if k != "REDIS_URI"}, capture_output=True, text=True,
                              timeout=120)
    assert only_one.returncode == 2 and "needs both --database-uri (Postgres) and --redis-uri (Redis)" in only_one.stderr


def _closed_port() -> int:
    from mia.graph.server import free_port

    return free_port()


@pytest.mark.slow
def test_replicas_read_one_model_server(topology: Topology, embedded_model_file: Path) -> None:
    """`mia serve-model` holds the one copy of the chat model; a replica pointed at it answers
    through it and never maps the model file itself."""
    import psutil

    from mia.graph.server import free_port

    port = free_port()
    log = topology.base / "model-server.log"
    with log.open("wb") as sink:
        model_server = subprocess.Popen([sys.executable, "-m", "mia.graph.cli", "serve-model", "--port", str(port),
                                         "--model", TEST_READER],
                                        stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert model_server.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the model server did not answer within 180 s"
            time.sleep(1)
        env = {**topology.env(), "MIA_CHAT_BASE_URL": f"http://127.0.0.1:{port}/v1"}
        with start_server(env=env, state_dir=topology.base / "replica-model", database_uri=topology.database,
                          redis_uri=topology.redis, timeout=180, jobs=1) as replica:
            output = Served(replica).sdk("key-fairy").runs.wait(
                None, "rag", input={"messages": [{"role": "user", "content": QUESTION}]},
                context={"collection": COLLECTION, "top_k": 3, "max_new_tokens": 12})
            assert output["answer"].strip()
            with Served(replica).http("key-fairy") as http:  # /v1 too, run in the replica's own process
                reply = http.post("/v1/chat/completions", json={"model": f"rag:{COLLECTION}", "max_tokens": 12,
                                                                "messages": [{"role": "user", "content": QUESTION}]})
            assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"].strip(), reply.text
            mapped = {m.path for group in replica.groups for p in [psutil.Process(group), *psutil.Process(group).children(recursive=True)]
                      for m in p.memory_maps()}
            assert str(embedded_model_file) not in mapped
        assert str(embedded_model_file) in {m.path for m in psutil.Process(model_server.pid).memory_maps()}
    finally:
        os.killpg(model_server.pid, signal.SIGTERM)
        model_server.wait(timeout=30)
