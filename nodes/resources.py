"""The heavy objects a run needs (mindscape, embedder, chat model), resolved from its context.

Loaded once per process and shared by every run: model weights and Chroma clients are expensive
to open, and the context only names them.
"""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel

from nodes.context import Context
from stores.chat import load_chat_model
from stores.embeddings import Embedder, load_embedder
from stores.mindscape import Mindscape, MindscapeError


def mindscape(ctx: Context) -> Mindscape:
    if not ctx.collection:
        raise MindscapeError("no collection given: set `collection` in the run's context (CLI: --collection NAME)")
    return Mindscape(ctx.collection)


def embedder(ctx: Context, store: Mindscape | None = None) -> Embedder:
    """The collection's own embedder: querying with another model would compare unrelated spaces."""
    model = load_embedder(ctx.embedder)
    if store is not None and store.embedder and store.embedder != model.name:
        if store.embedder == "all-MiniLM-L6-v2":
            return load_embedder("minilm")
        if store.embedder == "use-multilingual-v3":
            return load_embedder("use")
        raise MindscapeError(
            f"collection {store.name!r} was built with embedder {store.embedder!r} but the run uses {model.name!r}: "
            "set `embedder` to the collection's"
        )
    return model


def selection_embedder(ctx: Context) -> Embedder:
    """The embedder that scores the signature selection when ``selection_embedder`` names one
    (loaded once per process); it reads texts, so it need not match the collection's."""
    return load_embedder(ctx.selection_embedder)


def chat_model(ctx: Context, max_tokens: int | None = None) -> BaseChatModel:
    return load_chat_model(ctx.chat_base_url, ctx.chat_model, max_tokens or ctx.max_new_tokens)
