"""OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models`` over the question graphs.

Mounted into the LangGraph server through ``graph/http_app.py`` (langgraph.json ``http.app``), so one server and
one port serve LangGraph clients (SDK, Studio, Agent Chat UI) and OpenAI clients (Open WebUI,
the ``openai`` SDK, LibreChat). A model is ``GRAPH:COLLECTION``, e.g. ``mia_rag:holmes``.

Graphs run in-process (``graph.astream`` with the run's settings) rather than through the
server's run API, because an OpenAI client is stateless: it resends the whole conversation on
every request, so there is no thread or checkpoint to keep, and a direct run has no queue hop.
The server's in-process SDK transport would also skip custom auth, so this app authenticates
itself with the same keys and decisions as ``graph/auth.py`` (``Authorization: Bearer KEY``) and
lists and runs only the collections the key may use. Sync nodes run in worker threads, which
keeps the event loop free; blocking calls made here (Chroma, imports) go through
``asyncio.to_thread`` for the same reason.

Extensions: ``max_tokens`` / ``max_completion_tokens`` set ``max_new_tokens``; an optional
``context`` object overrides other run settings (top_k, k0, ...); sampling parameters are
ignored (answers are greedy). Streaming sends the answer tokens as they are generated, then the
rest of the reply (the "Sources: ..." line) in one last chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, convert_to_messages
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mia.graph.auth import KEYS, AuthFailure, Caller, check_collection, check_settings, identify
from mia.graph.registry import QUESTION_GRAPHS, load_graph
from mia.nodes.answer import SOURCES_MARKER
from mia.nodes.context import GraphSettings, context_from
from mia.stores.chroma import chroma_client, list_mindscapes

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A request refused before any graph runs, with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}},
                            status_code=self.status)


def _caller(request: Request) -> Caller:
    try:
        return identify(KEYS, request.headers.get("authorization"), request.headers.get("x-api-key"))
    except AuthFailure as failure:
        raise RequestError(failure.status, failure.message, "authentication_error", "invalid_api_key") from None


def _collections() -> list[str]:
    return list_mindscapes(chroma_client())


async def list_models(request: Request) -> Response:
    """One model per question graph × collection the caller may use."""
    try:
        caller = _caller(request)
    except RequestError as error:
        return error.response()
    names = [c for c in await asyncio.to_thread(_collections) if caller.may_use(c)]
    data = [{"id": f"{graph}:{name}", "object": "model", "created": 0, "owned_by": "mia"}
            for graph in QUESTION_GRAPHS for name in names]
    return JSONResponse({"object": "list", "data": data})


def parse_model(model: Any) -> tuple[str, str]:
    """``GRAPH:COLLECTION`` → (graph, collection), or a 404 naming the expected form."""
    graph, _, collection = str(model or "").partition(":")
    if graph not in QUESTION_GRAPHS or not collection:
        raise RequestError(404, f"unknown model {model!r}: use GRAPH:COLLECTION with GRAPH one of "
                                f"{', '.join(QUESTION_GRAPHS)} (GET /v1/models lists them)", code="model_not_found")
    return graph, collection


def parse_messages(raw: Any) -> list[BaseMessage]:
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "`messages` must be a non-empty list of {role, content}")
    try:
        messages = convert_to_messages(raw)
    except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
        raise RequestError(400, f"invalid `messages`: {exc}") from None
    if not isinstance(messages[-1], HumanMessage) or not messages[-1].text.strip():
        raise RequestError(400, "the last message must be the user's question")
    return messages


async def _prepare(request: Request) -> tuple[str, Any, dict[str, Any], GraphSettings, dict[str, Any]]:
    """Everything a completion needs, with every refusal decided before a graph starts."""
    caller = _caller(request)
    try:
        body = await request.json()
    except json.JSONDecodeError:
        raise RequestError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    graph_name, collection = parse_model(body.get("model"))
    try:
        check_collection(caller, collection)
    except AuthFailure as failure:
        raise RequestError(failure.status, failure.message, "permission_error") from None
    messages = parse_messages(body.get("messages"))
    settings = body.get("context") or {}
    if not isinstance(settings, dict):
        raise RequestError(400, "`context` must be an object of run settings")
    try:
        check_settings(caller, settings)
    except AuthFailure as failure:
        raise RequestError(failure.status, failure.message, "permission_error") from None
    settings = {**settings, "collection": collection}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        settings["max_new_tokens"] = max_tokens
    try:
        ctx = context_from(graph_name, settings)
    except (ValueError, TypeError) as exc:
        raise RequestError(400, str(exc)) from None
    if collection not in await asyncio.to_thread(_collections):
        raise RequestError(404, f"unknown collection {collection!r}: GET /v1/models lists the ones you may use",
                           code="model_not_found")
    graph = await asyncio.to_thread(stateless_graph, graph_name)
    return str(body["model"]), graph, {"messages": messages}, ctx, body


def stateless_graph(name: str) -> Any:
    """The graph without a checkpointer: a production server (GraphHarbor) attaches its Postgres one to
    the shared graph object, which would then demand a thread for a run that has none."""
    return load_graph(name).copy(update={"checkpointer": None})


def reply_of(state: dict[str, Any]) -> str:
    """The chat reply: the final AI message (answer + sources), else the bare answer."""
    messages = state.get("messages") or []
    if messages and isinstance(messages[-1], AIMessage):
        return messages[-1].text
    return str(state.get("answer") or "")


def remainder(streamed: str, reply: str) -> str:
    """The part of the reply a streaming client has not seen: usually the sources line.

    The reply is normally the streamed answer, stripped, plus sources. When a graph rewrote the
    answer (e.g. normalised a multiple-choice letter), only the sources are still worth sending.
    """
    head = streamed.strip()
    if reply.startswith(head):
        return reply[len(head):]
    cut = reply.find(SOURCES_MARKER)
    return reply[cut:] if cut >= 0 else ""


def _usage(state: dict[str, Any]) -> dict[str, int]:
    usage = state.get("usage") or {}
    prompt, completion = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def chat_completions(request: Request) -> Response:
    try:
        model, graph, payload, ctx, body = await _prepare(request)
    except RequestError as error:
        return error.response()
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(_stream(graph, payload, ctx, model, completion_id, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        state = await graph.ainvoke(payload, context=ctx)
    except ValueError as exc:  # user-facing errors (MindscapeError, QuestionError, settings) are ValueErrors
        return RequestError(400, str(exc)).response()
    return JSONResponse({
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply_of(state)},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": _usage(state),
    })


async def _stream(graph: Any, payload: dict[str, Any], ctx: GraphSettings, model: str, completion_id: str,
                  include_usage: bool) -> AsyncIterator[str]:
    """OpenAI ``chat.completion.chunk`` events: role, answer tokens, the rest, stop, ``[DONE]``."""
    created = int(time.time())

    def event(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": choices, **extra}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    yield event({"role": "assistant", "content": ""})
    streamed: list[str] = []
    state: dict[str, Any] = {}
    try:
        # LLM calls outside the answering node are tagged "nostream", so every AI chunk here is
        # answer text; complete messages (node outputs) are covered by the final remainder.
        async for mode, data in graph.astream(payload, context=ctx, stream_mode=["messages", "values"]):
            if mode == "values":
                state = data
                continue
            message, _ = data
            if isinstance(message, AIMessageChunk) and message.text:
                streamed.append(message.text)
                yield event({"content": message.text})
    except Exception as exc:  # noqa: BLE001 - the 200 header is sent: report in-band, as OpenAI does
        if not isinstance(exc, ValueError):
            logger.exception("chat completion %s failed", completion_id)
        error = {"message": str(exc), "type": "invalid_request_error" if isinstance(exc, ValueError) else "server_error"}
        yield f"data: {json.dumps({'error': error}, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"
        return
    tail = remainder("".join(streamed), reply_of(state))
    if tail:
        yield event({"content": tail})
    yield event({}, "stop")
    if include_usage:
        yield event(None, usage=_usage(state))
    yield "data: [DONE]\n\n"


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
app = Starlette(routes=routes)
"""These routes alone (tests); the server mounts ``graph.http_app.app``, which adds the web page."""
