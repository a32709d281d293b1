"""``mia serve --database-uri URI --redis-uri URI``: the same graphs, keys, /v1 and web page, served
by GraphHarbor (an open LangGraph agent server) on Postgres and Redis, so several replicas share
threads and runs.

Why GraphHarbor: LangChain's own server needs an Enterprise licence for the custom auth MiA relies
on, and of the open servers tried GraphHarbor enforced every auth case (the closing note of issue 60
says what each did). It splits into ``serve`` (the HTTP API, which queues runs) and ``worker`` (which
runs them); a MiA replica is one of each, started and stopped together by ``mia serve``. Any number
of replicas on one database and one Redis serve the same threads, and a run queued through one is
finished by whichever worker is alive.

What is adapted, and nothing more: GraphHarbor executes graph files without registering them as
modules, which breaks code that looks its own module up (dataclasses, postponed annotations), so
each graph, the auth and the app are reached through a one-line shim that imports MiA's module
normally; it ignores langgraph.json's ``env``, so those values are set here; and it signs run
context with a secret every server and worker must share, derived here from the database address
(which every replica already shares) unless ``GRAPHHARBOR_RUNTIME_CONTEXT_SECRET`` is set.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

from mia.stores.files import write_atomically

SECRET_ENV = "GRAPHHARBOR_RUNTIME_CONTEXT_SECRET"
CONNECT_TIMEOUT = 5
MIGRATION_LOCK = 0x4D6941  # "MiA": replicas starting together migrate one at a time
MIGRATION_TIMEOUT = 120.0


class ServiceError(RuntimeError):
    """Postgres or Redis cannot be used; the message is one line that says which and why."""


def redacted(uri: str) -> str:
    """``uri`` without its password, for messages and logs."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def check_services(database_uri: str, redis_uri: str) -> None:
    """Reach both services (bounded), or raise :class:`ServiceError` naming the one that failed."""
    import psycopg
    import redis

    try:
        with psycopg.connect(database_uri, connect_timeout=CONNECT_TIMEOUT):
            pass
    except (psycopg.Error, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceError(f"cannot use the database at {redacted(database_uri)}: {reason}") from None
    try:
        client = redis.Redis.from_url(redis_uri, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT)
        client.ping()
        client.close()
    except (redis.RedisError, ValueError) as exc:
        raise ServiceError(f"cannot use Redis at {redacted(redis_uri)}: {exc}") from None


def runtime_secret(database_uri: str, env: Mapping[str, str]) -> str:
    """The run-context signing secret: the one set, else one derived from the database address."""
    given = env.get(SECRET_ENV, "").strip()
    return given or hashlib.sha256(b"mia-graphharbor\0" + database_uri.encode()).hexdigest()


def production_environment(env: Mapping[str, str], config: Path, database_uri: str, redis_uri: str) -> dict[str, str]:
    """``env`` plus langgraph.json's ``env`` values (unless set), the services (the database also as
    MiA's own ``MIA_DATABASE_URI``, for the collection writer lock) and the shared secret."""
    data: dict[str, Any] = json.loads(config.read_text())
    declared = data.get("env") if isinstance(data.get("env"), dict) else {}
    return {**{k: str(v) for k, v in declared.items()}, **env, "DATABASE_URI": database_uri, "REDIS_URI": redis_uri,
            "MIA_DATABASE_URI": database_uri, SECRET_ENV: runtime_secret(database_uri, env)}


def _shim(state_dir: Path, name: str, module: str, variable: str) -> str:
    """A file that imports ``module``'s ``variable``: what GraphHarbor executes instead of MiA's file."""
    path = state_dir / f"shim_{name}.py"
    text = f'"""Written by `mia serve`: GraphHarbor runs this file; MiA\'s module is imported normally."""\n' \
           f"from {module} import {variable}  # noqa: F401\n"
    if not path.exists() or path.read_text() != text:
        write_atomically(path, text)  # replicas sharing a state folder never read a half-written shim
    return f"./{path.name}:{variable}"


def _module_of(spec: str) -> tuple[str, str]:
    """``./graph/rag.py:graph`` → (``mia.graph.rag``, ``graph``): MiA's files are its package's modules."""
    target, _, variable = spec.rpartition(":")
    return "mia." + target.removeprefix("./").removesuffix(".py").replace("/", "."), variable


def production_config(config: Path, state_dir: Path) -> Path:
    """Write ``state_dir/langgraph.json``: ``config`` with every graph, the auth and the app behind a shim."""
    data: dict[str, Any] = json.loads(config.read_text())
    state_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"dependencies": ["."], "graphs": {}}
    for name, spec in data.get("graphs", {}).items():
        out["graphs"][name] = _shim(state_dir, name, *_module_of(spec if isinstance(spec, str) else spec["path"]))
    if "app" in data.get("http", {}):
        out["http"] = {**data["http"], "app": _shim(state_dir, "http_app", *_module_of(data["http"]["app"]))}
    if "path" in data.get("auth", {}):
        out["auth"] = {**data["auth"], "path": _shim(state_dir, "auth", *_module_of(data["auth"]["path"]))}
    target = state_dir / "langgraph.json"
    write_atomically(target, json.dumps(out, indent=2))
    return target


def migrate(env: Mapping[str, str], state_dir: Path) -> None:
    """Bring the database's schema up to the server's, one replica at a time (a Postgres advisory
    lock), or raise :class:`ServiceError` with the migration's last lines."""
    import subprocess

    import psycopg

    with psycopg.connect(env["DATABASE_URI"], connect_timeout=CONNECT_TIMEOUT, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            done = subprocess.run([sys.executable, "-m", "langhost", "migrate", "upgrade"], cwd=state_dir, env=dict(env),
                                  capture_output=True, text=True, timeout=MIGRATION_TIMEOUT)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise ServiceError(f"the database schema could not be migrated (exit {done.returncode}):\n{tail}")


def production_commands(host: str, port: int, config: Path, jobs: int) -> list[list[str]]:
    """A replica: GraphHarbor's HTTP server and its worker, which runs ``jobs`` runs at once."""
    base = [sys.executable, "-m", "langhost"]
    return [[*base, "serve", "--config", str(config), "--host", host, "--port", str(port)],
            [*base, "worker", "--config", str(config), "--n-jobs-per-worker", str(jobs)]]
