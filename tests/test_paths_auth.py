"""Fast unit tests: which ingest paths the server may read, and which requests a key may make."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from mia.graph.auth import (
    ANONYMOUS,
    AuthFailure,
    Caller,
    caller_of,
    check_ingest_paths,
    check_run,
    check_thread_settings,
    default_graph,
    identify,
    key_identity,
    parse_keys,
    readers,
    run_payloads,
    visible_assistants,
)
from mia.graph.openai_app import parse_model, remainder
from mia.stores.paths import PathError, files_under, resolve_under

KEYS = parse_keys(json.dumps({"k-all": ["*"], "k-fairy": ["fairy", "demo-*"]}))
FAIRY = Caller(key_identity("k-fairy"), ("fairy", "demo-*"))


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """data/ with a book, a folder, and symlinks inside and out; outside/ holds a secret."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "books").mkdir(parents=True)
    outside.mkdir()
    (data / "books" / "a.txt").write_text("a")
    (data / "books" / "b.md").write_text("b")
    (data / "books" / "skip.csv").write_text("c")
    (outside / "secret.txt").write_text("secret")
    (data / "escape.txt").symlink_to(outside / "secret.txt")
    (data / "inner.txt").symlink_to(data / "books" / "a.txt")
    (data / "sneaky").mkdir()
    (data / "sneaky" / "leak.txt").symlink_to(outside / "secret.txt")
    (data / "empty").mkdir()
    return data


# ---- paths ----------------------------------------------------------------------------------
def test_relative_paths_resolve_inside_the_root(root: Path) -> None:
    assert resolve_under(root, "books/a.txt") == (root / "books" / "a.txt").resolve()
    assert resolve_under(root, "./books/./b.md") == (root / "books" / "b.md").resolve()
    # A symlink that stays inside the root is fine: what matters is where the file really is.
    assert resolve_under(root, "inner.txt") == (root / "books" / "a.txt").resolve()


@pytest.mark.parametrize("path, reason", [
    ("/etc/passwd", "absolute"),
    ("~/notes.txt", "absolute"),
    ("C:\\secret.txt", "absolute"),
    ("\\\\server\\share\\x.txt", "absolute"),
    ("../outside/secret.txt", "'..'"),
    ("books/../../outside/secret.txt", "'..'"),
    ("books\\..\\..\\outside\\secret.txt", "'..'"),
    ("escape.txt", "symlink"),
    ("missing.txt", "no such file"),
    ("", "empty"),
    ("a\x00b", "NUL"),
])
def test_paths_that_leave_the_root_are_refused(root: Path, path: str, reason: str) -> None:
    with pytest.raises(PathError, match=reason):
        resolve_under(root, path)


def test_a_missing_root_is_reported(tmp_path: Path) -> None:
    with pytest.raises(PathError, match="does not exist"):
        resolve_under(tmp_path / "nope", "a.txt")


def test_folders_expand_to_checked_files_in_order(root: Path) -> None:
    books = (root / "books").resolve()
    assert files_under(root, ["books/b.md", "books"], (".txt", ".md")) == [books / "b.md", books / "a.txt"]


def test_a_symlink_inside_an_allowed_folder_is_refused(root: Path) -> None:
    with pytest.raises(PathError, match="symlink"):
        files_under(root, ["sneaky"], (".txt",))


def test_empty_inputs_are_refused(root: Path) -> None:
    with pytest.raises(PathError, match="no ingest paths"):
        files_under(root, [], (".txt",))
    with pytest.raises(PathError, match="holds no"):
        files_under(root, ["empty"], (".txt",))


# ---- keys and callers -----------------------------------------------------------------------
def test_no_keys_means_no_auth() -> None:
    assert parse_keys(None) is None and parse_keys("  ") is None
    assert identify(None, None, None) == ANONYMOUS
    assert ANONYMOUS.may_use("anything")


@pytest.mark.parametrize("raw, match", [
    ("{not json", "not valid JSON"),
    ("[]", "non-empty JSON object"),
    ('{"k": "fairy"}', "must be a list"),
    ('{"k": [""]}', "must be a list"),
    ('{" ": ["x"]}', "empty key"),
])
def test_malformed_keys_are_rejected(raw: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_keys(raw)


def test_keys_identify_callers_by_bearer_or_x_api_key() -> None:
    assert identify(KEYS, "Bearer k-fairy", None) == FAIRY
    assert identify(KEYS, "bearer  k-all ", None).unrestricted
    assert identify(KEYS, None, "k-fairy") == FAIRY
    assert FAIRY.identity != "k-fairy" and "k-fairy" not in FAIRY.identity  # the key is never stored


@pytest.mark.parametrize("authorization, api_key, message", [
    (None, None, "missing API key"),
    ("Basic abc", None, "missing API key"),
    ("Bearer nope", None, "invalid API key"),
    (None, "k-fairy-but-longer", "invalid API key"),
])
def test_missing_or_wrong_keys_get_401(authorization: str | None, api_key: str | None, message: str) -> None:
    with pytest.raises(AuthFailure, match=message) as failure:
        identify(KEYS, authorization, api_key)
    assert failure.value.status == 401


def test_collection_patterns() -> None:
    assert FAIRY.may_use("fairy") and FAIRY.may_use("demo-holmes")
    assert not FAIRY.may_use("holmes") and not FAIRY.may_use("fairy2") and not FAIRY.unrestricted
    assert caller_of(FAIRY.identity, ["collection:fairy", "collection:demo-*", "other"]) == FAIRY


# ---- runs ----------------------------------------------------------------------------------
def _check(caller: Caller, kwargs: dict, graph: str | None = "rag", default: str = "") -> None:
    check_run(caller, kwargs, graph_id=graph, default_collection=default)


def _refused(caller: Caller, kwargs: dict, graph: str | None = "rag", default: str = "") -> str:
    with pytest.raises(AuthFailure) as failure:
        _check(caller, kwargs, graph, default)
    assert failure.value.status == 403
    return failure.value.message


def test_runs_on_allowed_collections_pass() -> None:
    _check(FAIRY, {"context": {"collection": "fairy", "top_k": 3}, "input": {"messages": []}})
    _check(FAIRY, {"input": {"paths": ["a.txt"], "collection": "demo-new"}}, graph="ingest")
    _check(identify(KEYS, "Bearer k-all", None), {"context": {"collection": "holmes"}})


def test_forbidden_collections_are_refused_wherever_named() -> None:
    assert "'holmes'" in _refused(FAIRY, {"context": {"collection": "holmes"}})
    assert "'holmes'" in _refused(FAIRY, {"config": {"configurable": {"collection": "holmes"}}})
    assert "'holmes'" in _refused(FAIRY, {"input": {"paths": ["a"], "collection": "holmes"}}, graph="ingest")
    # An allowed context does not launder a forbidden input collection.
    assert "'holmes'" in _refused(FAIRY, {"context": {"collection": "fairy"}, "input": {"collection": "holmes"}})


def test_the_collection_checked_is_the_one_the_run_will_use() -> None:
    """The run's context, else (default assistants) the server default, which such runs inherit."""
    assert "'holmes'" in _refused(FAIRY, {}, default="holmes")
    assert "'holmes'" in _refused(FAIRY, {"context": {"top_k": 3}}, default="holmes")
    _check(FAIRY, {"context": {"collection": "fairy"}}, default="holmes")  # the run's own context wins
    _check(FAIRY, {}, default="")  # nothing to check: the run fails for want of a collection
    # A created assistant's collection is guarded by its readers, not here (a frontend sends no context).
    _check(FAIRY, {}, graph=None, default="holmes")
    # Ingest writes to its input's collection; the default is not involved.
    _check(FAIRY, {"input": {"paths": ["a"], "collection": "fairy"}}, graph="ingest", default="holmes")


def _run_handler(monkeypatch: pytest.MonkeyPatch, value: dict[str, Any]) -> dict[str, Any] | None:
    """MiA's create-run handler as a server calls it, for the key ``k-fairy``."""
    import asyncio

    from langgraph_sdk import Auth
    from langgraph_sdk.auth.types import StudioUser

    from mia.graph import auth as auth_module

    monkeypatch.setattr(auth_module, "KEYS", KEYS)
    user = StudioUser(FAIRY.identity)
    ctx = Auth.types.AuthContext(permissions=[f"collection:{c}" for c in FAIRY.collections], user=user,
                                 resource="threads", action="create_run")
    return asyncio.run(auth_module.on_run(ctx, value))


def test_a_run_s_settings_are_checked_wherever_the_server_puts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``kwargs`` (the SDK's RunsCreate) or flat at the top (Aegra 0.11): a forbidden collection
    in either is refused, and metadata the server handed as None is created for the owner."""
    from langgraph_sdk import Auth

    rag = default_graph("rag")
    assert rag == "rag"
    for value in ({"assistant_id": "rag", "kwargs": {"context": {"collection": "holmes"}}},
                  {"assistant_id": "rag", "context": {"collection": "holmes"}, "input": {"messages": []}},
                  {"assistant_id": "rag", "kwargs": {"context": {"collection": "fairy"}}, "config": {"configurable": {"collection": "holmes"}}}):
        with pytest.raises(Auth.exceptions.HTTPException) as refused:
            _run_handler(monkeypatch, value)
        assert refused.value.status_code == 403 and "'holmes'" in str(refused.value.detail)
    # The server's default collection (MIA_COLLECTION) is one this key may not use: a run that names
    # its own is allowed whichever layout it comes in, and one that names none is refused.
    monkeypatch.setenv("MIA_COLLECTION", "holmes")
    allowed = {"assistant_id": "rag", "context": {"collection": "fairy"}, "metadata": None}
    assert _run_handler(monkeypatch, allowed) == {"owner": FAIRY.identity}
    assert allowed["metadata"] == {"owner": FAIRY.identity}
    both = {"assistant_id": "rag", "context": {"collection": "fairy"}, "kwargs": {"context": {"collection": "fairy"}}}
    assert _run_handler(monkeypatch, both) == {"owner": FAIRY.identity}
    with pytest.raises(Auth.exceptions.HTTPException, match="holmes"):
        _run_handler(monkeypatch, {"assistant_id": "rag", "input": {"messages": []}})
    assert run_payloads({"context": {"a": 1}, "stream_mode": "values", "kwargs": {"context": {"a": 1}, "webhook": None}}) \
        == [{"context": {"a": 1}}]
    assert run_payloads({"assistant_id": "rag"}) == [{}]


def test_restricted_keys_may_not_choose_models_or_endpoints() -> None:
    message = _refused(FAIRY, {"context": {"collection": "fairy", "chat_base_url": "http://elsewhere"}})
    assert "chat_base_url" in message
    assert "sig_weights" in _refused(FAIRY, {"config": {"configurable": {"collection": "fairy", "sig_weights": "/x.npz"}}})
    assert "selection_embedder" in _refused(FAIRY, {"context": {"collection": "fairy", "selection_embedder": "bge-m3:/x"}})
    _check(identify(KEYS, "Bearer k-all", None), {"context": {"collection": "x", "selection_embedder": "use"}})


def test_assistants_are_visible_to_the_keys_that_may_use_their_collection() -> None:
    assert readers(KEYS, "fairy") == [key_identity("k-all"), key_identity("k-fairy")]
    assert readers(KEYS, "holmes") == [key_identity("k-all")]
    assert visible_assistants(identify(KEYS, "Bearer k-all", None)) is None
    assert visible_assistants(FAIRY) == {"$or": [{"created_by": "system"}, {"readers": {"$contains": FAIRY.identity}}]}


def test_default_assistants_are_placed_from_their_id_alone() -> None:
    """Each server's default assistant is recognised without its internals; a created (random) id
    is left to its readers; an id MiA cannot place is refused."""
    from uuid import NAMESPACE_URL, UUID, uuid1, uuid4, uuid5

    langgraph = UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")  # the embedded server's (tests/test_server.py runs it)
    for graph in ("rag", "mia_rag", "infmem", "ingest"):
        assert default_graph(str(uuid5(langgraph, graph))) == graph
        assert default_graph(str(uuid5(NAMESPACE_URL, graph))) == graph  # GraphHarbor
        assert default_graph(graph) == graph  # a graph name, as a client may send it
    assert default_graph(str(uuid4())) is None
    for unknown, message in ((str(uuid5(NAMESPACE_URL, "other")), "neither"), (str(uuid1()), "neither"),
                             ("rag; drop", "unknown assistant")):
        with pytest.raises(AuthFailure, match=message) as failure:
            default_graph(unknown)
        assert failure.value.status == 403


def test_only_the_app_s_own_routes_are_left_to_the_app() -> None:
    """/v1 and the web page check keys themselves; every other path is the server's to check."""
    from mia.graph.auth import authenticates_itself
    from mia.graph.http_app import app

    paths = [route.path.replace("{name}", "x") for route in app.routes]
    assert paths and all(authenticates_itself(path) for path in paths)
    for path in ("/threads", "/runs/wait", "/assistants/search", "/v1", "/miax/api", "/store/items", "/ok"):
        assert not authenticates_itself(path), path


def test_settings_stored_on_a_thread_are_checked_like_a_run_s() -> None:
    """A server that merges a thread's config into its runs must not launder a collection."""
    check_thread_settings(FAIRY, {"metadata": {"x": 1}})
    check_thread_settings(FAIRY, {"config": {"context": {"collection": "fairy"}}})
    check_thread_settings(identify(KEYS, "Bearer k-all", None), {"config": {"context": {"collection": "holmes"}}})
    for config in ({"context": {"collection": "holmes"}}, {"configurable": {"collection": "holmes"}},
                   {"context": {"chat_base_url": "http://elsewhere"}}):
        with pytest.raises(AuthFailure) as failure:
            check_thread_settings(FAIRY, {"config": config})
        assert failure.value.status == 403


def test_ingest_paths_are_checked_against_the_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIA_INGEST_ROOT", str(root))
    check_ingest_paths({"input": {"paths": ["books/a.txt", "books"], "collection": "x"}})
    check_ingest_paths({"input": {"messages": []}})
    for bad in (["/etc/passwd"], ["../outside/secret.txt"], ["escape.txt"], "books/a.txt"):
        with pytest.raises(AuthFailure) as failure:
            check_ingest_paths({"input": {"paths": bad}})
        assert failure.value.status == 403


# ---- the OpenAI app, without a server --------------------------------------------------------
def test_model_names_and_stream_remainders() -> None:
    assert parse_model("rag:fairy") == ("rag", "fairy")
    for bad in ("rag", "nope:fairy", "rag:", None):
        with pytest.raises(Exception, match="unknown model"):
            parse_model(bad)
    reply = "Paris [1].\n\nSources: [1] book, chunk 3"
    assert remainder(" Paris [1]. ", reply) == "\n\nSources: [1] book, chunk 3"
    assert remainder("B) the second", "B\n\nSources: x") == "\n\nSources: x"
    assert remainder("", reply) == reply


def test_openai_endpoint_refuses_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    from mia.graph import openai_app as openai_app

    monkeypatch.setattr(openai_app, "KEYS", KEYS)
    client = TestClient(openai_app.app)
    assert client.get("/v1/models").status_code == 401
    refused = client.post("/v1/chat/completions", headers={"Authorization": "Bearer k-fairy"},
                          json={"model": "rag:holmes", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 403 and "'holmes'" in refused.json()["error"]["message"]
    bad = client.post("/v1/chat/completions", headers={"Authorization": "Bearer k-fairy"},
                      json={"model": "rag:fairy", "messages": [{"role": "assistant", "content": "hi"}]})
    assert bad.status_code == 400 and "last message" in bad.json()["error"]["message"]
