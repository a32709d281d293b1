"""``mia serve``: every graph of langgraph.json (plus /v1, auth) behind one LangGraph server.

The server is ``langgraph dev`` (the in-memory LangGraph API server) run as a child process with
an environment that keeps it offline: no analytics, no version check, no LangSmith tracing, no
browser, no reloader (the reloader would watch the Chroma folder and restart mid-run). It runs in
a state folder (default ``$MIA_HOME/server``) rather than the checkout, because the in-memory
runtime persists threads to ``./.langgraph_api``; a copy of langgraph.json with absolute paths
is written there, so the graph, auth and app paths still point into the checkout.

``start_server`` starts one on a free loopback port for tests and benchmarks, waits (bounded)
for ``/ok`` and stops it. The in-memory server is for one machine; given Postgres and Redis, the same
command runs a production replica instead (graph/production.py), and several of them, with a Chroma
server and one model server, scale out.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import httpx

from mia.graph.production import (
    ServiceError,
    check_services,
    migrate,
    production_commands,
    production_config,
    production_environment,
    redacted,
)
from mia.stores.settings import data_root, mia_home

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "langgraph.json"
DEFAULT_PORT = 2024
DEFAULT_JOBS = 4
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Environment variables holding paths: made absolute because the server runs in its state folder.
PATH_VARIABLES = ("MIA_HOME", "MIA_DATA", "MIA_CHROMA_PATH", "MIA_INGEST_ROOT", "TIKTOKEN_CACHE_DIR")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE = 5.0
"""Seconds the server has to shut down cleanly before its group is killed."""
PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a child receives when its parent dies."""
OFFLINE = {"LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGGRAPH_NO_VERSION_CHECK": "true", "LANGSMITH_TRACING": "false"}


class ServerError(RuntimeError):
    """The server could not start; the message says why and where its log is."""


@dataclass(frozen=True)
class Server:
    url: str
    log: Path
    groups: tuple[int, ...]
    """The process groups that make up the server, each led by its process (a production replica has two)."""


def _absolute_spec(spec: str, base: Path) -> str:
    """``./graph/rag.py:graph`` → ``/abs/graph/rag.py:graph``; module specs stay as they are."""
    target, _, variable = spec.rpartition(":")
    if "/" in target or target.endswith(".py"):
        return f"{(base / target).resolve()}:{variable}"
    return spec


def server_config(config: Path, state_dir: Path) -> Path:
    """Write ``state_dir/langgraph.json``: ``config`` with every path made absolute."""
    data: dict[str, Any] = json.loads(config.read_text())
    base = config.resolve().parent
    data["dependencies"] = [str((base / d).resolve()) if d.startswith(".") else d for d in data.get("dependencies", [])]
    data["graphs"] = {
        name: _absolute_spec(spec, base) if isinstance(spec, str) else {**spec, "path": _absolute_spec(spec["path"], base)}
        for name, spec in data.get("graphs", {}).items()
    }
    if "app" in data.get("http", {}):
        data["http"] = {**data["http"], "app": _absolute_spec(data["http"]["app"], base)}
    if "path" in data.get("auth", {}):
        data["auth"] = {**data["auth"], "path": _absolute_spec(data["auth"]["path"], base)}
    state_dir.mkdir(parents=True, exist_ok=True)
    target = state_dir / "langgraph.json"
    target.write_text(json.dumps(data, indent=2))
    return target


def server_environment(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours plus ``overrides``, offline, with MiA's paths made absolute.

    The three LangGraph variables are forced (as in langgraph.json's ``env``) because the CLI
    sends analytics before it reads that file.
    """
    env = {**os.environ, **(overrides or {}), **OFFLINE}
    env["MIA_HOME"] = env.get("MIA_HOME") or str(mia_home())
    env["MIA_DATA"] = env.get("MIA_DATA") or str(data_root())
    for name in PATH_VARIABLES:
        if env.get(name):
            env[name] = str(Path(env[name]).expanduser().resolve())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def server_command(host: str, port: int, config: Path, jobs: int) -> list[str]:
    return [sys.executable, "-m", "langgraph_cli", "dev", "--no-browser", "--no-reload", "--host", host,
            "--port", str(port), "--config", str(config), "--n-jobs-per-worker", str(jobs)]


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _check_keys(env: Mapping[str, str]) -> None:
    from mia.graph.auth import KEYS_ENV, parse_keys

    parse_keys(env.get(KEYS_ENV))  # raises ValueError with the reason


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, jobs: int = DEFAULT_JOBS,
          state_dir: Path | None = None, config: Path = CONFIG, database_uri: str | None = None,
          redis_uri: str | None = None) -> int:
    """Run the server in the foreground until it exits or is interrupted; returns its exit code.

    With ``database_uri`` and ``redis_uri`` the server is a production replica (graph/production.py).
    """
    env = server_environment()
    _check_keys(env)
    if not port_is_free(host, port):
        # langgraph dev would silently move to another port; clients would not find it.
        print(f"mia: error: port {port} on {host} is in use: pass --port with a free port", file=sys.stderr)
        return 2
    if host not in LOOPBACK and not env.get("MIA_API_KEYS"):
        print(f"mia: warning: serving on {host} without MIA_API_KEYS: anyone who can reach it may query every "
              "collection and ingest from the data root", file=sys.stderr)
    state = (state_dir or Path(env["MIA_HOME"]) / "server").resolve()
    try:
        commands, env, kind = _launch(host, port, jobs, state, env, config, database_uri, redis_uri)
    except ServiceError as exc:
        print(f"mia: error: {exc}", file=sys.stderr)
        return 2
    print(f"MiA server on http://{host}:{port} ({kind}; OpenAI-compatible /v1); state in {state}", file=sys.stderr)
    # Each server process leads its own process group, which this process stops as a whole on SIGTERM,
    # SIGINT or SIGHUP (a supervisor's stop, Ctrl-C, a closed terminal): nothing is left on the port.
    # The handlers go in before the child starts, so no signal can slip between the two.
    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        _spawn(commands, state, env, processes)
        while True:
            for process in processes:
                if process.poll() is not None:
                    # One half of a replica gone leaves the other useless: stop both.
                    _stop_all(processes, grace=STOP_GRACE)
                    return process.returncode
            time.sleep(0.5)
    except _Stopped as stopped:
        for sig in STOP_SIGNALS:  # a second Ctrl-C during the shutdown must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        _stop_all(processes, grace=STOP_GRACE)
        return 128 + stopped.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _launch(host: str, port: int, jobs: int, state: Path, env: dict[str, str], config: Path,
            database_uri: str | None, redis_uri: str | None) -> tuple[list[list[str]], dict[str, str], str]:
    """The commands of one server (the embedded one, or a production replica when the services are
    given), its environment and what it is called; :class:`ServiceError` when a service is unusable."""
    if not database_uri and not redis_uri:
        return [server_command(host, port, server_config(config, state), jobs)], env, "LangGraph API"
    if not (database_uri and redis_uri):
        raise ServiceError("a production server needs both --database-uri (Postgres) and --redis-uri (Redis)")
    env = production_environment(env, config, database_uri, redis_uri)
    check_services(database_uri, redis_uri)
    commands = production_commands(host, port, production_config(config, state), jobs)
    migrate(env, state)
    return commands, env, f"LangGraph API on {redacted(database_uri)} and {redacted(redis_uri)}"


def _spawn(commands: list[list[str]], cwd: Path, env: Mapping[str, str], started: list[subprocess.Popen[bytes]],
           **streams: Any) -> None:
    """Start ``commands``, each leading a process group of its own (stopped as a whole) and told to
    die with this process. Each is appended to ``started`` as it starts, so a caller interrupted
    half-way can stop them."""
    for command in commands:
        started.append(subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, preexec_fn=_die_with_parent(),
                                        **streams))


class _Stopped(Exception):
    """Raised by the signal handler in the main thread, so the wait for the server's processes returns
    to the shutdown path instead of the default handler killing ``mia serve`` alone."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, the child's pre-exec hook: be sent SIGTERM when ``mia serve`` dies, even by SIGKILL,
    which no handler sees (``PR_SET_PDEATHSIG``), and exit at once if it already has. ``prctl`` is
    looked up here, in the parent: the forked child may only make the call. Elsewhere ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return hook


def _stop(process: subprocess.Popen[bytes], grace: float = 15.0, *, group: bool = False) -> None:
    """SIGTERM the server (its whole process group when it leads one), SIGKILL after ``grace`` s."""
    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait(timeout=grace)
    if group:  # members that outlived their leader, or ignored SIGTERM
        send(signal.SIGKILL)


def _stop_all(processes: Sequence[subprocess.Popen[bytes]], grace: float = 15.0) -> None:
    """Stop every process group of a server: all are asked at once, so their grace periods overlap."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        _stop(process, grace, group=True)


def _log_tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def start_server(*, env: Mapping[str, str] | None = None, state_dir: Path | None = None, jobs: int = DEFAULT_JOBS,
                 timeout: float = 180.0, config: Path = CONFIG, host: str = "127.0.0.1",
                 database_uri: str | None = None, redis_uri: str | None = None) -> Iterator[Server]:
    """A server on a free loopback port, ready (``/ok`` answered) within ``timeout`` seconds.

    ``env`` overrides the environment (e.g. MIA_HOME, MIA_CHROMA_PATH, MIA_API_KEYS); the two
    services make it a production replica. The server logs to ``<state_dir>/server.log``; a start
    that fails or times out raises ServerError with the log's tail. The server is stopped when the
    block exits, whatever happens in it.
    """
    full_env = server_environment(env)
    _check_keys(full_env)
    state = (state_dir or Path(full_env["MIA_HOME"]) / "server").resolve()
    port = free_port(host)
    commands, full_env, _ = _launch(host, port, jobs, state, full_env, config, database_uri, redis_uri)
    log = state / "server.log"
    url = f"http://{host}:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with log.open("ab") as sink:
            _spawn(commands, state, full_env, processes, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if exited := [p for p in processes if p.poll() is not None]:
                    raise ServerError(f"the server exited with code {exited[0].returncode} before it was ready; "
                                      f"log {log}:\n{_log_tail(log)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}/ok").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise ServerError(f"the server was not ready after {timeout:.0f}s; log {log}:\n{_log_tail(log)}")
                time.sleep(0.5)
        yield Server(url=url, log=log, groups=tuple(p.pid for p in processes))
    finally:
        _stop_all(processes)


_INGEST_SCRIPT = """
import json, sys
from mia.stores.ingest import IngestOptions, ingest_sources
spec = json.loads(sys.argv[1])
options = IngestOptions(**spec["options"])
for collection, paths in spec["collections"].items():
    ingest_sources(paths, collection, options, embedder_spec="minilm", progress=False)
"""


def ingest_elsewhere(collections: dict[str, Sequence[Path]], chroma_path: Path | None, *, chroma_url: str = "",
                     **options: Any) -> None:
    """Fill the store a server (from ``start_server``) will open, for tests and benchmarks: the
    embedded one at ``chroma_path``, or the Chroma server at ``chroma_url``.

    In a child process, so the calling process holds no handle on that store (embedded Chroma is
    not process-safe). ``options`` are ``IngestOptions`` fields (extractive summaries unless given)."""
    spec = json.dumps({"collections": {name: [str(p) for p in paths] for name, paths in collections.items()},
                       "options": {"summarizer": "extractive", **options}})
    store = {"MIA_CHROMA_URL": chroma_url} if chroma_url else {"MIA_CHROMA_PATH": str(chroma_path)}
    done = subprocess.run([sys.executable, "-c", _INGEST_SCRIPT, spec], env={**os.environ, **store},
                          timeout=600, capture_output=True, text=True)
    if done.returncode != 0:
        raise ServerError(f"ingestion for the served collection failed:\n{done.stderr[-3000:]}")


def register(subparsers: Any) -> None:
    """Add ``serve`` to the ``mia`` command line."""
    p = subparsers.add_parser("serve", help="serve every graph (LangGraph API + OpenAI-compatible /v1) on one port")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; others need MIA_API_KEYS)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                   help=f"runs executed at once (default {DEFAULT_JOBS}); the embedded chat model still answers one at a time")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where threads persist (default $MIA_HOME/server; with a database, only the server's files)")
    p.add_argument("--database-uri", default=os.environ.get("DATABASE_URI") or None,
                   help="Postgres address (default $DATABASE_URI): serve as one replica of a production server "
                        "whose threads and runs live in Postgres; needs --redis-uri")
    p.add_argument("--redis-uri", default=os.environ.get("REDIS_URI") or None,
                   help="Redis address (default $REDIS_URI), shared by the replicas")
    p.set_defaults(func=lambda args: serve(args.host, args.port, jobs=args.jobs, state_dir=args.state_dir,
                                           database_uri=args.database_uri, redis_uri=args.redis_uri))
