"""``mia serve``: every graph of langgraph.json (plus /v1, auth) behind one LangGraph server.

The server is ``langgraph dev`` (the in-memory LangGraph API server) run as a child process with
an environment that keeps it offline: no analytics, no version check, no LangSmith tracing, no
browser, no reloader (the reloader would watch the Chroma folder and restart mid-run). It runs in
a state folder (default ``$MIA_HOME/server``) rather than the checkout, because the in-memory
runtime persists threads to ``./.langgraph_api``; a copy of langgraph.json with absolute paths
is written there, so the graph, auth and app paths still point into the checkout.

``start_server`` starts one on a free loopback port for tests and benchmarks, waits (bounded)
for ``/ok`` and stops it. The in-memory server is for one machine; to scale out, see the README
(Chroma server, LangGraph server with Postgres, an OpenAI-compatible model server).
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
    pid: int


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
          state_dir: Path | None = None, config: Path = CONFIG) -> int:
    """Run the server in the foreground until it exits or is interrupted; returns its exit code."""
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
    command = server_command(host, port, server_config(config, state), jobs)
    print(f"MiA server on http://{host}:{port} (LangGraph API; OpenAI-compatible /v1); state in {state}", file=sys.stderr)
    # The server leads its own process group, which this process stops as a whole on SIGTERM,
    # SIGINT or SIGHUP (a supervisor's stop, Ctrl-C, a closed terminal): nothing is left on the port.
    # The handlers go in before the child starts, so no signal can slip between the two.
    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    process: subprocess.Popen[bytes] | None = None
    try:
        process = subprocess.Popen(command, cwd=state, env=env, start_new_session=True, preexec_fn=_die_with_parent())
        return process.wait()
    except _Stopped as stopped:
        for sig in STOP_SIGNALS:  # a second Ctrl-C during the shutdown must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        if process is not None:
            _stop(process, grace=STOP_GRACE, group=True)
        return 128 + stopped.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stopped(Exception):
    """Raised by the signal handler in the main thread, so ``process.wait()`` returns to the
    shutdown path instead of the default handler killing ``mia serve`` alone."""

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


def _log_tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def start_server(*, env: Mapping[str, str] | None = None, state_dir: Path | None = None, jobs: int = DEFAULT_JOBS,
                 timeout: float = 180.0, config: Path = CONFIG, host: str = "127.0.0.1") -> Iterator[Server]:
    """A server on a free loopback port, ready (``/ok`` answered) within ``timeout`` seconds.

    ``env`` overrides the environment (e.g. MIA_HOME, MIA_CHROMA_PATH, MIA_API_KEYS). The server
    logs to ``<state_dir>/server.log``; a start that fails or times out raises ServerError with
    the log's tail. The server is stopped when the block exits, whatever happens in it.
    """
    full_env = server_environment(env)
    _check_keys(full_env)
    state = (state_dir or Path(full_env["MIA_HOME"]) / "server").resolve()
    port = free_port(host)
    command = server_command(host, port, server_config(config, state), jobs)
    log = state / "server.log"
    url = f"http://{host}:{port}"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=state, env=full_env, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if process.poll() is not None:
                    raise ServerError(f"the server exited with code {process.returncode} before it was ready; "
                                      f"log {log}:\n{_log_tail(log)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}/ok").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise ServerError(f"the server was not ready after {timeout:.0f}s; log {log}:\n{_log_tail(log)}")
                time.sleep(0.5)
        yield Server(url=url, log=log, pid=process.pid)
    finally:
        _stop(process, group=True)


_INGEST_SCRIPT = """
import json, sys
from mia.stores.ingest import IngestOptions, ingest_sources
spec = json.loads(sys.argv[1])
options = IngestOptions(**spec["options"])
for collection, paths in spec["collections"].items():
    ingest_sources(paths, collection, options, embedder_spec="minilm", progress=False)
"""


def ingest_elsewhere(collections: dict[str, Sequence[Path]], chroma_path: Path, **options: Any) -> None:
    """Fill the embedded store a server (from ``start_server``) will open, for tests and benchmarks.

    In a child process, so the calling process holds no handle on that store (embedded Chroma is
    not process-safe). ``options`` are ``IngestOptions`` fields (extractive summaries unless given)."""
    spec = json.dumps({"collections": {name: [str(p) for p in paths] for name, paths in collections.items()},
                       "options": {"summarizer": "extractive", **options}})
    done = subprocess.run([sys.executable, "-c", _INGEST_SCRIPT, spec], env={**os.environ, "MIA_CHROMA_PATH": str(chroma_path)},
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
    p.add_argument("--state-dir", type=Path, default=None, help="where threads persist (default $MIA_HOME/server)")
    p.set_defaults(func=lambda args: serve(args.host, args.port, jobs=args.jobs, state_dir=args.state_dir))
