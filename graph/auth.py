"""Optional API keys with per-key collection allow-lists, for the LangGraph server and /v1.

``MIA_API_KEYS`` holds JSON ``{"KEY": ["holmes", "demo-*"], "ADMIN-KEY": ["*"]}`` (patterns are
shell globs). Unset or empty means no authentication: every caller may use every collection,
which is what a single user on loopback wants. With keys set:

* a request without a known key gets 401 (``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``,
  the header langgraph-sdk sends for ``api_key=``);
* a run gets 403 unless the key may use the collection it will answer from (the run's context,
  else its assistant's, else the server's ``MIA_COLLECTION``: an assistant per collection is how
  a frontend that sends no context, such as Agent Chat UI, picks one) and every other collection
  it names (an ingest run's input);
* threads are private to the key that created them (they hold questions and answers);
* a key restricted to some collections may not point a run at other models or endpoints
  (``chat_base_url``, ``chat_model``, ``selection_embedder``, ``sig_weights``): the server would
  otherwise send retrieved text, or its own requests, wherever a caller asks, and load any model
  folder on its disk;
* assistants can be changed only by keys allowed on every collection, and a key sees (and runs)
  only the default assistants and those whose collection it may use; crons and the store are
  unused by MiA and refused.

Ingest runs are also checked here for paths outside the data root, and uploads outside the
collection's upload folder (for every caller, with or without keys), so a bad path is refused with
403 before a run is queued; the ingest graph checks again when it reads. The decisions are plain functions, unit-tested without a server; the
``auth`` object at the bottom wires them into LangGraph's custom auth (langgraph.json ``auth``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Mapping, MutableMapping
from uuid import NAMESPACE_URL, UUID, uuid5

from langgraph_sdk import Auth

from mia.nodes.context import GRAPH_SETTINGS, CommonSettings
from mia.stores.paths import PathError, ingest_root, resolve_under, uploads_of

KEYS_ENV = "MIA_API_KEYS"
PERMISSION_PREFIX = "collection:"
# Run settings that choose models, weights files and endpoints: server-side for restricted keys.
SERVER_SETTINGS = ("chat_base_url", "chat_model", "selection_embedder", "sig_weights")
INGEST_GRAPH = "ingest"
GRAPH_IDS = (*GRAPH_SETTINGS, INGEST_GRAPH)
# How the servers MiA runs on name a graph's default assistant: uuid5(namespace, graph id), with
# LangGraph's own namespace (langgraph_api.graph.NAMESPACE_GRAPH) and GraphHarbor's (the URL one).
DEFAULT_ASSISTANT_NAMESPACES = (UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), NAMESPACE_URL)

Keys = Mapping[str, tuple[str, ...]]


class AuthFailure(Exception):
    """A refused request: ``status`` is 401 (who are you?) or 403 (not allowed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Caller:
    """Who is calling and which collections (glob patterns) they may use."""

    identity: str
    collections: tuple[str, ...]

    @property
    def unrestricted(self) -> bool:
        return "*" in self.collections

    def may_use(self, collection: str) -> bool:
        return any(fnmatchcase(collection, pattern) for pattern in self.collections)


ANONYMOUS = Caller("anonymous", ("*",))


def parse_keys(raw: str | None) -> Keys | None:
    """``MIA_API_KEYS`` as {key: patterns}; None when unset. Malformed values raise, so a server
    whose keys cannot be read refuses to start instead of running open."""
    if raw is None or not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{KEYS_ENV} is not valid JSON ({exc.msg}); expected {{\"KEY\": [\"collection\", ...]}}") from exc
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{KEYS_ENV} must be a non-empty JSON object {{\"KEY\": [\"collection\", ...]}}")
    keys: dict[str, tuple[str, ...]] = {}
    for key, patterns in data.items():
        if not key.strip():
            raise ValueError(f"{KEYS_ENV} has an empty key")
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
            raise ValueError(f"{KEYS_ENV}: the value for key {key_identity(key)} must be a list of collection names or patterns")
        keys[key] = tuple(patterns)
    return keys


def load_keys() -> Keys | None:
    return parse_keys(os.environ.get(KEYS_ENV))


def key_identity(key: str) -> str:
    """A stable name for a key that is safe to store in thread metadata and logs."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key from ``Authorization: Bearer KEY`` or, failing that, ``X-Api-Key: KEY``."""
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return api_key.strip() if api_key and api_key.strip() else None


def identify(keys: Keys | None, authorization: str | None, api_key: str | None) -> Caller:
    """The caller for a request's headers, or :class:`AuthFailure` (401)."""
    if keys is None:
        return ANONYMOUS
    key = presented_key(authorization, api_key)
    if key is None:
        raise AuthFailure(401, "missing API key: send `Authorization: Bearer KEY` (or `X-Api-Key: KEY`)")
    for known, patterns in keys.items():
        # Compare every key in constant time so timing does not reveal a prefix.
        if hmac.compare_digest(known.encode(), key.encode()):
            return Caller(key_identity(known), patterns)
    raise AuthFailure(401, "invalid API key")


def check_collection(caller: Caller, collection: str) -> None:
    if not caller.may_use(collection):
        raise AuthFailure(403, f"this API key may not use collection {collection!r}")


def check_settings(caller: Caller, settings: Mapping[str, Any]) -> None:
    """Refuse (403) model or endpoint overrides from a restricted caller."""
    if caller.unrestricted:
        return
    named = sorted(key for key in SERVER_SETTINGS if settings.get(key))
    if named:
        raise AuthFailure(403, f"this API key may not set {', '.join(named)}: the server chooses models and endpoints")


def check_run(caller: Caller, kwargs: Mapping[str, Any], *, graph_id: str | None, default_collection: str) -> None:
    """Refuse (403) a run that would touch a collection the caller may not use, or in which a
    restricted caller chooses models or endpoints.

    ``kwargs`` is the run's own payload (input, config, context). ``graph_id`` is the graph of a
    default assistant, or None for an assistant created through the API. A question graph answers
    from the run's context collection, else its assistant's, else the server default
    (``MIA_COLLECTION``), the order in which LangGraph and the graph's settings resolve it. A default
    assistant has no context, so the default is the one to check; a created assistant's own
    collection is guarded by its readers (:func:`visible_assistants`), which the server checks
    for such runs. The ingest graph writes to its input's collection; every collection a run
    names must be allowed.
    """
    context = kwargs.get("context") or {}
    configurable = (kwargs.get("config") or {}).get("configurable") or {}
    payload = kwargs.get("input") if isinstance(kwargs.get("input"), dict) else {}
    inherited = default_collection if graph_id not in (None, INGEST_GRAPH) else None
    for collection in (context.get("collection") or inherited, configurable.get("collection"), payload.get("collection")):
        if collection:
            check_collection(caller, str(collection))
    check_settings(caller, context)
    check_settings(caller, configurable)


RUN_FIELDS = ("input", "config", "context")


def _run_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {k: payload[k] for k in RUN_FIELDS if payload.get(k) is not None}


def run_payloads(value: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every place a run's input, config and context may sit: under ``kwargs``, as the SDK's
    ``RunsCreate`` nests them, and at the top level, where another server put them (Aegra 0.11). Each
    distinct one is checked, so a layout MiA does not expect cannot leave a collection unchecked; an
    empty one only when there is no other, since an empty payload means the server's default
    collection and would refuse a run that names its own."""
    found = [p for p in (_run_fields(value.get("kwargs") or {}), _run_fields(value)) if p]
    return [p for i, p in enumerate(found) if p not in found[:i]] or [{}]


def stamp(value: MutableMapping[str, Any], **fields: Any) -> None:
    """Add ``fields`` to the metadata the server will save with ``value``, in place (the server keeps
    a reference to that dict), also when it handed none (``None``, not ``{}``)."""
    if value.get("metadata") is None:
        value["metadata"] = {}
    value["metadata"].update(fields)


def check_ingest_paths(kwargs: Mapping[str, Any]) -> None:
    """Refuse (403) ingest paths that are absolute, contain '..' or leave their root: the data root
    for ``paths``, the collection's upload folder for ``uploads``."""
    payload = kwargs.get("input") if isinstance(kwargs.get("input"), dict) else {}
    roots = {"paths": ingest_root, "uploads": lambda: uploads_of(str(payload.get("collection") or ""))}
    try:
        for field, root in roots.items():
            paths = payload.get(field)
            if paths is None:
                continue
            if not isinstance(paths, list):
                raise AuthFailure(403, f"ingest `{field}` must be a list of relative paths")
            folder = root()
            for path in paths:
                resolve_under(folder, path)
    except PathError as exc:
        raise AuthFailure(403, str(exc)) from exc


DEFAULT_ASSISTANTS = {
    **{graph_id: graph_id for graph_id in GRAPH_IDS},
    **{str(uuid5(namespace, graph_id)): graph_id for namespace in DEFAULT_ASSISTANT_NAMESPACES for graph_id in GRAPH_IDS},
}


def default_graph(assistant_id: str) -> str | None:
    """The graph whose default assistant ``assistant_id`` names, or None for a created assistant;
    :class:`AuthFailure` (403) for an id that is neither.

    Placed from the id alone, since no server hands a run's auth handler the assistant's metadata:
    a graph name (GraphHarbor passes the one a client sent) or a name-derived (version 5) UUID is a
    default assistant, a random (version 4) UUID a created one, whose collection its readers guard.
    A version 5 UUID MiA does not know is a default assistant of a server MiA does not know how to
    read, and is refused rather than let through unchecked.
    """
    if assistant_id in DEFAULT_ASSISTANTS:
        return DEFAULT_ASSISTANTS[assistant_id]
    try:
        version = UUID(assistant_id).version
    except ValueError:
        raise AuthFailure(403, f"unknown assistant {assistant_id!r}: name a graph ({', '.join(GRAPH_IDS)}) or an assistant id") from None
    if version != 4:
        raise AuthFailure(403, f"assistant {assistant_id} is neither a default assistant MiA knows nor a created one; refused")
    return None


def check_thread_settings(caller: Caller, value: Mapping[str, Any]) -> None:
    """Refuse (403) a thread whose stored settings a restricted caller chose.

    Some servers (GraphHarbor) merge a thread's ``config`` into every run on it, after the run's
    own checks: settings stored there would name a collection or model no run check ever sees.
    """
    config = value.get("config") or {}
    if caller.unrestricted or not config:
        return
    check_run(caller, {"config": config, "context": config.get("context") or {}}, graph_id=None, default_collection="")


def readers(keys: Keys, collection: str) -> list[str]:
    """The identities of the keys that may use ``collection``: who may see an assistant naming it.

    Stamped into the assistant's metadata when it is saved, because LangGraph filters what a
    caller lists by metadata, not by a function (keys added later need the assistant re-saved).
    """
    return [key_identity(key) for key, patterns in keys.items() if Caller("", patterns).may_use(collection)]


def visible_assistants(caller: Caller) -> dict[str, Any] | None:
    """The metadata filter for the assistants ``caller`` may list, read and run (None: all)."""
    if caller.unrestricted:
        return None
    return {"$or": [{"created_by": "system"}, {"readers": {"$contains": caller.identity}}]}


def caller_of(identity: str, permissions: list[str] | tuple[str, ...]) -> Caller:
    """Rebuild the caller from what LangGraph keeps per request (identity and permissions)."""
    return Caller(identity, tuple(p.removeprefix(PERMISSION_PREFIX) for p in permissions if p.startswith(PERMISSION_PREFIX)))


# ---- LangGraph custom auth --------------------------------------------------------------------
KEYS = load_keys()
auth = Auth()


def _refuse(failure: AuthFailure) -> Auth.exceptions.HTTPException:
    return Auth.exceptions.HTTPException(status_code=failure.status, detail=failure.message)


def _caller(ctx: Auth.types.AuthContext) -> Caller:
    return caller_of(ctx.user.identity, list(ctx.permissions))


SELF_AUTHENTICATED = ("/v1/", "/mia/")
"""The custom app's routes (graph/http_app.py): /v1 and the web page check the same keys themselves,
with errors in their own shape (OpenAI's for /v1), and the page itself is public."""


def authenticates_itself(path: str) -> bool:
    return path == "/mia" or path.startswith(SELF_AUTHENTICATED)


@auth.authenticate
async def authenticate(authorization: str | None, headers: dict[bytes, bytes], path: str = "") -> Auth.types.MinimalUserDict:
    if authenticates_itself(path):
        # Servers that authenticate custom routes too (GraphHarbor) pass them on to the app's own
        # checks; this identity holds no collection, and core routes never match these paths.
        return {"identity": "mia-app-route", "is_authenticated": False, "permissions": []}
    api_key = headers.get(b"x-api-key")
    try:
        caller = identify(KEYS, authorization, api_key.decode() if api_key else None)
    except AuthFailure as failure:
        raise _refuse(failure) from None
    return {
        "identity": caller.identity,
        "is_authenticated": True,
        "permissions": [PERMISSION_PREFIX + p for p in caller.collections],
    }


@auth.on.threads.create_run
async def on_run(ctx: Auth.types.AuthContext, value: Auth.types.RunsCreate) -> Auth.types.FilterType | None:
    graph_id, default_collection = default_graph(str(value["assistant_id"])), CommonSettings().collection
    try:
        for payload in run_payloads(value):
            # Resolving paths touches the filesystem: keep it off the event loop.
            await asyncio.to_thread(check_ingest_paths, payload)
            if KEYS is not None:
                check_run(_caller(ctx), payload, graph_id=graph_id, default_collection=default_collection)
    except AuthFailure as failure:
        raise _refuse(failure) from None
    if KEYS is None:
        return None
    stamp(value, owner=ctx.user.identity)
    return {"owner": ctx.user.identity}


@auth.on.threads
async def on_threads(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> Auth.types.FilterType | None:
    """Threads (and their runs and state) are private to the key that created them."""
    if KEYS is None:
        return None
    if ctx.action in ("create", "update"):
        try:
            check_thread_settings(_caller(ctx), value)
        except AuthFailure as failure:
            raise _refuse(failure) from None
    if ctx.action == "create":
        stamp(value, owner=ctx.user.identity)
    return {"owner": ctx.user.identity}


@auth.on.assistants
async def on_assistants(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> Auth.types.FilterType | None:
    if KEYS is None:
        return None
    caller = _caller(ctx)
    if ctx.action in ("read", "search"):
        return visible_assistants(caller)
    if not caller.unrestricted:
        raise _refuse(AuthFailure(403, "changing assistants needs a key allowed on every collection (\"*\")"))
    if ctx.action == "create" or value.get("context") or (value.get("config") or {}).get("configurable"):
        settings = value.get("context") or (value.get("config") or {}).get("configurable") or {}
        stamp(value, readers=readers(KEYS, settings.get("collection") or CommonSettings().collection))
    return None


@auth.on
async def deny_rest(ctx: Auth.types.AuthContext, value: Any) -> None:
    """Default deny for everything else (crons, store): MiA uses neither."""
    if KEYS is None:
        return None
    raise _refuse(AuthFailure(403, f"{ctx.resource} are not available on this server"))
