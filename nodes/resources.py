"""The heavy objects a run needs (mindscape, embedder, chat model): the mindscape and chat model
named by its settings, the embedder the collection records.

Loaded once per process and shared by every run: model weights and Chroma clients are expensive
to open, and the settings only name them.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

from langchain_core.language_models import BaseChatModel

from mia.nodes.context import CommonSettings, SignatureGraphSettings
from mia.stores.chat import load_chat_model
from mia.stores.embeddings import Embedder, load_embedder
from mia.stores.chroma import MindscapeError
from mia.stores.mindscape import Mindscape


SHARED_SNAPSHOTS = 64
"""How many runs' snapshots a process keeps for their later nodes (the oldest go first)."""
_SHARED: OrderedDict[str, Mindscape] = OrderedDict()
_SHARED_LOCK = threading.Lock()


def mindscape(ctx: CommonSettings, snapshot: str = "") -> Mindscape:
    """The run's collection, read afresh; or, given the ``snapshot`` token an earlier node of the
    same run got from ``share``, that node's instance while this process still holds it.

    A shared instance keeps the collection handles and the books' rows its first node read, so
    mia_rag's E2 reads nothing from Chroma (its search runs over the vectors in memory, its
    sessions' chunks come from the books' rows): against a Chroma server every read is a
    round trip, and E2 paid all of step 0's again. The run also sees one version of the books from
    step 0 to E2. Without the instance (another worker process, a run resumed from its checkpoint)
    the node reads afresh, which answers the same.
    """
    if not ctx.collection:
        raise MindscapeError("no collection given: set `collection` in the run's context (CLI: --collection NAME)")
    if snapshot:
        with _SHARED_LOCK:
            store = _SHARED.get(snapshot)
        if store is not None and store.name == ctx.collection:
            return store
    return Mindscape(ctx.collection)


def share(store: Mindscape) -> str:
    """A token for the run's state under which later nodes of the run get ``store`` back (``mindscape``)."""
    token = uuid.uuid4().hex
    with _SHARED_LOCK:
        _SHARED[token] = store
        while len(_SHARED) > SHARED_SNAPSHOTS:
            _SHARED.popitem(last=False)
    return token


def embedder(store: Mindscape) -> Embedder:
    """The embedder the collection recorded at ingestion, not a run setting: querying with another
    model would compare unrelated spaces. A collection that recorded none is read with the
    ingestion default (``MIA_EMBEDDINGS``)."""
    return load_embedder(store.embedder)


def selection_embedder(ctx: SignatureGraphSettings) -> Embedder:
    """The embedder that scores the signature selection when ``selection_embedder`` names one
    (loaded once per process); it reads texts, so it need not match the collection's."""
    return load_embedder(ctx.selection_embedder)


def chat_model(ctx: CommonSettings, max_tokens: int | None = None) -> BaseChatModel:
    return load_chat_model(ctx.chat_base_url, ctx.chat_model, max_tokens or ctx.max_new_tokens)
