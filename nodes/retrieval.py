"""E1 (query-only) and E2 (query + signature, Eq. 4) retrieval over a whole mindscape.

E2's score s(c) = (1 − α)·e_q·e_c + α·s_sig(c) is linear in the chunk vector for the
``centroid``, ``concat`` and ``mia`` strategies (each gives s_sig(c) = e_σ·e_c for some vector
e_σ), so the top of the ranking over the WHOLE collection is one nearest-neighbour search with
v = (1 − α)·e_q + α·e_σ. The candidates it returns are then rescored exactly, which also undoes
any approximation of the vector index within the candidate set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nodes.context import SigStrategy
from stores.embeddings import Embedder
from stores.mindscape import Mindscape, MindscapeError


@dataclass(frozen=True)
class Scored:
    id: str
    score: float
    s_qry: float
    s_sig: float

    def as_dict(self) -> dict[str, float | str]:
        return {"id": self.id, "score": round(self.score, 6), "s_qry": round(self.s_qry, 6), "s_sig": round(self.s_sig, 6)}


def query_only(store: Mindscape, query_vec: np.ndarray, k: int) -> list[Scored]:
    return [Scored(h.id, h.score, h.score, 0.0) for h in store.search_chunks(query_vec, k)]


def signature_text(store: Mindscape, summary_ids: Sequence[str]) -> str:
    return "\n".join(r["text"] for r in store.summary_records(summary_ids))


def signature_vector(
    strategy: SigStrategy, store: Mindscape, embedder: Embedder, query: str, summary_ids: Sequence[str]
) -> tuple[np.ndarray, dict[str, object]]:
    """e_σ for the chosen strategy, plus notes for --explain (e.g. whether concat was truncated)."""
    if not summary_ids:
        raise MindscapeError(
            f"collection {store.name!r} has no session summaries to build a signature from: "
            "re-ingest it with --summarizer llm or extractive"
        )
    if strategy == "centroid":
        centroid = store.vectors("summaries", summary_ids).mean(axis=0)
        return centroid / max(float(np.linalg.norm(centroid)), 1e-12), {}
    text = signature_text(store, summary_ids)
    if strategy == "concat":
        joined = f"{query}\n{text}"  # the query first, so any truncation cuts summaries, not the question
        notes: dict[str, object] = {}
        if embedder.count_tokens and embedder.max_tokens:
            used = embedder.count_tokens(joined)
            notes = {"concat_tokens": used, "truncated": used > embedder.max_tokens}
        return embedder.embed_query(joined), notes
    if strategy == "mia":
        model = embedder.model
        if not hasattr(model, "embed_query_with_signature"):
            raise MindscapeError(
                "sig_strategy 'mia' needs a decoder embedder in the MiA-Emb format (embedder decoder:PATH); "
                f"the collection uses {embedder.name!r}"
            )
        vec = np.asarray(model.embed_query_with_signature(query, text), dtype=np.float32)
        return vec / max(float(np.linalg.norm(vec)), 1e-12), {}
    raise ValueError(f"unknown sig_strategy {strategy!r}")


def dual_signal(
    store: Mindscape, query_vec: np.ndarray, sig_vec: np.ndarray, alpha: float, k: int, candidates: int
) -> list[Scored]:
    """Top-k chunks of the whole collection under Eq. 4 (one interpolated search + exact rescoring)."""
    mixed = (1.0 - alpha) * query_vec + alpha * sig_vec
    hits = store.search_chunks(mixed, max(k, candidates))
    if not hits:
        return []
    ids = [h.id for h in hits]
    vectors = store.vectors("chunks", ids)
    s_qry = vectors @ query_vec
    s_sig = vectors @ sig_vec
    score = (1.0 - alpha) * s_qry + alpha * s_sig
    order = np.argsort(-score, kind="stable")[:k]
    return [Scored(ids[i], float(score[i]), float(s_qry[i]), float(s_sig[i])) for i in order]
