"""The custom HTTP app mounted into the LangGraph server (langgraph.json ``http.app``): the
OpenAI-compatible ``/v1`` endpoints and the web page under ``/mia``, on the server's one port."""

from __future__ import annotations

from starlette.applications import Starlette

from mia.graph import openai_app, web_api

app = Starlette(routes=[*openai_app.routes, *web_api.routes])
