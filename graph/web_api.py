"""The web page's own endpoints under ``/mia``: the page, collections, uploads, passages.

The page (``graph/web/``: one HTML file, one script, one stylesheet, nothing fetched from
outside the machine) chats through the LangGraph API itself (threads, ``runs/stream``), so a
question asked on the page is an ordinary run that Studio and the SDK can inspect. What the API
does not offer lives here: collection statistics, deleting a collection, receiving an uploaded
file (which the page then ingests with a run of the ``ingest`` graph, as it does a path under
``MIA_INGEST_ROOT``), and the texts and positions that turn a run's ids into pictures (chunk and
summary records, book lengths, a cited passage in its book context).

Custom routes are not covered by LangGraph's custom auth, so every endpoint here authenticates
itself with the same keys and decisions as ``graph/auth.py``: a key sees, reads, fills and
deletes only the collections it may use. Store reads run in worker threads
(``asyncio.to_thread``) to keep the server's event loop free.
"""

from __future__ import annotations

import asyncio
import re
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Awaitable, Callable, get_args
from urllib.parse import urlparse

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mia.graph.auth import KEYS, AuthFailure, Caller, check_collection, identify
from mia.nodes.context import settings_class
from mia.stores.chroma import MindscapeError, chroma_client, delete_mindscape, list_mindscapes, validate_name
from mia.stores.files import write_atomically
from mia.stores.mindscape import Mindscape
from mia.stores.paths import upload_root
from mia.stores.writer_lock import StoreBusy

ASSETS = Path(__file__).resolve().parent / "web"
PREFIX = "/mia"
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
"""A book is a few MB of text; a larger body is refused before it is written."""
PREVIEW_CHARS = 240
CONTEXT_CHARS = 1500
"""Characters of book text shown on each side of a cited passage (at most ``MAX_CONTEXT_CHARS``)."""
MAX_CONTEXT_CHARS = 20_000
_UPLOAD_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class WebError(Exception):
    """A refused request: its status and a message that says what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


Handler = Callable[[Request, Caller], Awaitable[Response]]


def authenticated(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint with its caller resolved from the request's key, and refusals as JSON
    ``{"detail": ...}`` (the LangGraph API's error shape, so the page reads both alike)."""
    async def endpoint(request: Request) -> Response:
        try:
            _same_origin(request)
            caller = identify(KEYS, request.headers.get("authorization"), request.headers.get("x-api-key"))
            return await handler(request, caller)
        except AuthFailure as failure:
            return JSONResponse({"detail": failure.message}, status_code=failure.status)
        except WebError as error:
            return JSONResponse({"detail": error.message}, status_code=error.status)
        except StoreBusy as error:
            return JSONResponse({"detail": str(error)}, status_code=409)
        except MindscapeError as error:
            return JSONResponse({"detail": str(error)}, status_code=404 if "unknown collection" in str(error) else 400)
    return endpoint


def _same_origin(request: Request) -> None:
    """Refuse a request sent by another site's page (403). The server allows every origin (CORS) for
    its API, and without keys a page elsewhere could otherwise read, fill or delete collections on
    the loopback server through the user's browser. Browsers send ``Origin`` on cross-site requests
    and on the page's own writes; tools that send none (curl, the SDK) are not browsers."""
    origin = request.headers.get("origin")
    if origin and urlparse(origin).netloc != request.headers.get("host"):
        raise WebError(403, f"cross-site request from {origin} refused: use the page served by this server")


def _allowed_collection(request: Request, caller: Caller) -> str:
    """The collection named in the path, if its name is valid and the caller may use it (403 first:
    a key must not learn which collections it may not use exist)."""
    name = request.path_params["name"]
    try:
        validate_name(name)
    except MindscapeError as exc:
        raise WebError(400, str(exc)) from None
    check_collection(caller, name)
    return name


def _open(name: str) -> Mindscape:
    return Mindscape(name, chroma_client())


# ---- collections ------------------------------------------------------------------------------
async def collections(request: Request, caller: Caller) -> Response:
    """Every collection the caller may use, with its books, chunks, summaries and tokens."""
    def read() -> list[dict[str, Any]]:
        client = chroma_client()
        return [Mindscape(n, client).stats() for n in list_mindscapes(client) if caller.may_use(n)]

    return JSONResponse({"collections": await asyncio.to_thread(read), "auth": KEYS is not None})


async def collection(request: Request, caller: Caller) -> Response:
    name = _allowed_collection(request, caller)
    return JSONResponse(await asyncio.to_thread(lambda: _open(name).stats()))


async def remove_collection(request: Request, caller: Caller) -> Response:
    name = _allowed_collection(request, caller)
    await asyncio.to_thread(delete_mindscape, name)
    return JSONResponse({"removed": name})


# ---- uploads ------------------------------------------------------------------------------------
async def upload(request: Request, caller: Caller) -> Response:
    """The request body is one ``.txt`` or ``.md`` file named by ``?filename=``; it is kept in the
    collection's upload folder (``$MIA_HOME/uploads/COLLECTION/``; the book's id is its file name).

    Nothing is ingested here: the page then starts a run of the ``ingest`` graph with
    ``{"uploads": [FILE]}``, so an upload is ingested as a path is, on a thread whose run Studio,
    the SDK and the page follow alike.
    """
    from mia.stores.ingest import SUPPORTED_SUFFIXES, InputError, decode_text

    name = _allowed_collection(request, caller)
    raw_name = Path(request.query_params.get("filename", "")).name
    filename = _UPLOAD_NAME.sub("_", raw_name).strip("._")
    if not filename or Path(filename).suffix.lower() not in SUPPORTED_SUFFIXES:
        raise WebError(400, f"upload {raw_name!r}: name a {' or '.join(SUPPORTED_SUFFIXES)} file with ?filename=")
    data = bytearray()
    async for part in request.stream():
        data.extend(part)
        if len(data) > MAX_UPLOAD_BYTES:
            raise WebError(413, f"upload larger than {MAX_UPLOAD_BYTES // 2**20} MB: ingest it with `mia ingest` instead")
    try:
        text = decode_text(f"upload {filename!r}", bytes(data))
    except InputError as exc:
        raise WebError(400, str(exc)) from None
    await asyncio.to_thread(write_atomically, upload_root(name) / filename, text)
    return JSONResponse({"collection": name, "upload": filename}, status_code=201)


# ---- what a run's ids point to ----------------------------------------------------------------
async def lookup(request: Request, caller: Caller) -> Response:
    """``{"chunks": [ids], "summaries": [ids]}`` → their books, positions, a preview of each chunk
    and each summary's text, plus every book's body span: what the page draws rankings and the book
    strip from (a run's state holds ids only)."""
    name = _allowed_collection(request, caller)
    body = await _json_body(request)
    chunk_ids = [str(i) for i in body.get("chunks") or []][:1000]
    summary_ids = [str(i) for i in body.get("summaries") or []][:200]

    def read() -> dict[str, Any]:
        store = _open(name)
        chunks = {c["id"]: {"book": c["book"], "index": c["index"], "start": c["start"], "end": c["end"],
                            "summary_id": c.get("summary_id", ""), "preview": c["text"][:PREVIEW_CHARS]}
                  for c in store.chunk_records(chunk_ids)}
        summaries = {s["id"]: {"book": s["book"], "window": s.get("window"), "first_chunk": s.get("first_chunk"),
                               "last_chunk": s.get("last_chunk"), "start": s.get("start"), "end": s.get("end"),
                               "text": s["text"]}
                     for s in store.summary_records(summary_ids)}
        records = store.commits.committed()  # the snapshot the record reads above already took
        # Books ingested before front matter was recognised have no body span: all of the text is body.
        books = {b: {"order": r["order"], "chunks": r["chunks"], "summaries": r["summaries"], "tokens": r["tokens"],
                     "body_start": int(r.get("body_start", 0)),
                     "body_end": int(r["body_end"]) if "body_end" in r else len(store.book_text(b))}
                 for b, r in records.items()}
        return {"chunks": chunks, "summaries": summaries, "books": books}

    return JSONResponse(await asyncio.to_thread(read))


async def passage(request: Request, caller: Caller) -> Response:
    """A chunk in its book: the text before it, the chunk itself (the cited span) and after it,
    with its offsets and its position in the book."""
    name = _allowed_collection(request, caller)
    chunk_id = request.query_params.get("chunk", "")
    try:
        around = min(max(int(request.query_params.get("context", CONTEXT_CHARS)), 0), MAX_CONTEXT_CHARS)
    except ValueError:
        raise WebError(400, "context must be a number of characters") from None

    def read() -> dict[str, Any]:
        store = _open(name)
        found = store.chunk_records([chunk_id])
        if not found:
            raise WebError(404, f"collection {name!r} has no committed chunk {chunk_id!r}")
        chunk = found[0]
        record = store.commits.committed().get(chunk["book"])  # chunk_records' snapshot: no second read
        if record is None:
            raise WebError(409, f"book {chunk['book']!r} is being rewritten: try again when its ingestion ends")
        text = store.book_text(chunk["book"])
        body_start, body_end = int(record.get("body_start", 0)), int(record.get("body_end", len(text)))
        start, end = int(chunk["start"]), int(chunk["end"])
        lo, hi = max(body_start, start - around), min(body_end, end + around)
        return {
            "collection": name, "id": chunk["id"], "book": chunk["book"], "index": chunk["index"],
            "chunks": int(record["chunks"]), "start": start, "end": end, "body_start": body_start, "body_end": body_end,
            "position": round((start - body_start) / max(body_end - body_start, 1), 4),
            "before": text[lo:start], "text": text[start:end], "after": text[end:hi],
        }

    return JSONResponse(await asyncio.to_thread(read))


# ---- settings form ----------------------------------------------------------------------------
def settings_schema(graph: str) -> list[dict[str, Any]]:
    """Every setting ``graph`` reads with its type, choices, effective default (``MIA_*`` applied) and
    description: the page's side panel is built from the same fields as Studio's form for that graph."""
    try:
        cls = settings_class(graph)
    except ValueError as exc:
        raise WebError(400, str(exc)) from None
    hints = typing.get_type_hints(cls)
    defaults = cls()
    out = []
    for f in fields(cls):
        kind = hints[f.name]
        choices = list(get_args(kind)) if typing.get_origin(kind) is typing.Literal else []
        out.append({"name": f.name, "type": "choice" if choices else kind.__name__, "choices": choices,
                    "default": getattr(defaults, f.name), "description": f.metadata["description"]})
    return out


async def settings(request: Request, caller: Caller) -> Response:
    """``?graph=NAME``: the settings form of that graph."""
    graph = request.query_params.get("graph", "")
    return JSONResponse({"graph": graph, "settings": settings_schema(graph)})


async def _json_body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise WebError(415, "send the request body as JSON (Content-Type: application/json)")
    try:
        body = await request.json()
    except ValueError:
        raise WebError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise WebError(400, "the request body must be a JSON object")
    return body


# ---- the page -----------------------------------------------------------------------------------
async def page(request: Request) -> Response:
    """The page itself holds no data, so it is served without a key; everything it shows comes
    from authenticated calls."""
    return FileResponse(ASSETS / "index.html", headers={"Cache-Control": "no-cache"})


async def to_page(request: Request) -> Response:
    return RedirectResponse(f"{PREFIX}/")


routes = [
    Route(PREFIX, to_page),
    Route(f"{PREFIX}/", page),
    Mount(f"{PREFIX}/static", app=StaticFiles(directory=ASSETS), name="mia-static"),
    Route(f"{PREFIX}/api/settings", authenticated(settings)),
    Route(f"{PREFIX}/api/collections", authenticated(collections)),
    Route(f"{PREFIX}/api/collections/{{name}}", authenticated(collection), methods=["GET"]),
    Route(f"{PREFIX}/api/collections/{{name}}", authenticated(remove_collection), methods=["DELETE"]),
    Route(f"{PREFIX}/api/collections/{{name}}/upload", authenticated(upload), methods=["PUT"]),
    Route(f"{PREFIX}/api/collections/{{name}}/lookup", authenticated(lookup), methods=["POST"]),
    Route(f"{PREFIX}/api/collections/{{name}}/passage", authenticated(passage)),
]
