"""E1 (query-only) and E2 (query + signature, Eq. 4) retrieval over a whole mindscape.

E2's score s(c) = (1 − α)·e_q·e_c + α·s_sig(c) is linear in the chunk vector for the
``centroid``, ``concat`` and ``mia`` strategies (each gives s_sig(c) = e_σ·e_c for some vector
e_σ), so the top of the ranking over the WHOLE collection is one nearest-neighbour search with
v = (1 − α)·e_q + α·e_σ. The candidates it returns are then rescored exactly, which also undoes
any approximation of the vector index within the candidate set.

With ``retriever=hybrid`` every ranking is fused with BM25 over the chunk texts (weighted reciprocal
rank fusion, ``Fusion``): the lexical hits join the candidate set, are scored exactly like the dense
candidates, and the final order is the fusion of the exact dense ranking and the BM25 ranking.
On the fairy-tale series set the dense step 0 misses stories that a name or a rare word would
find (evals/results/signature-payoff); BM25 is what finds them, and plain RRF (k = 60, equal
weights) let the weaker dense ranking pull the fused one below BM25 alone, hence the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nodes.context import Context, PriorWeights, SigStrategy
from stores.bm25 import ChunkIndex
from stores.embeddings import Embedder
from stores.mindscape import ChunkHit, Mindscape, MindscapeError


@dataclass(frozen=True)
class Scored:
    id: str
    score: float
    s_qry: float
    s_sig: float

    def as_dict(self) -> dict[str, float | str]:
        return {"id": self.id, "score": round(self.score, 6), "s_qry": round(self.s_qry, 6), "s_sig": round(self.s_sig, 6)}


RRF_K = 60


@dataclass(frozen=True)
class Fusion:
    """How a dense ranking and BM25's are fused: a chunk scores 1/(k + r_dense) + w/(k + r_bm25)."""

    bm25_weight: float = 1.0
    k: int = RRF_K
    stem: bool = False
    """Whether BM25 matches words by their Snowball English stems (``bm25_stemming``)."""

    @classmethod
    def of(cls, ctx: Context) -> Fusion | None:
        """The context's fusion, or None for dense retrieval."""
        return cls(ctx.bm25_weight, ctx.rrf_k, ctx.bm25_stemming) if ctx.retriever == "hybrid" else None

    def fuse(self, dense: Sequence[str], bm25: Sequence[str]) -> list[tuple[str, float]]:
        return reciprocal_rank_fusion(dense, bm25, k=self.k, weights=(1.0, self.bm25_weight))


def reciprocal_rank_fusion(*rankings: Sequence[str], k: int = RRF_K,
                           weights: Sequence[float] | None = None) -> list[tuple[str, float]]:
    """(id, Σ w/(k + rank)) over the rankings (ranks from 1; every w 1 unless given), best first;
    ties keep first-seen order."""
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings)):
        for rank, id_ in enumerate(ranking, start=1):
            fused[id_] = fused.get(id_, 0.0) + weight / (k + rank)
    return sorted(fused.items(), key=lambda item: -item[1])


def lexical(store: Mindscape, text: str, depth: int, fusion: Fusion) -> list[str]:
    """The BM25 ranking of ``text`` over the collection's chunks (hybrid retrieval)."""
    return ChunkIndex.for_collection(store, stem=fusion.stem).search(text, depth)


def query_only(store: Mindscape, query_vec: np.ndarray, k: int, *, text: str = "", fusion: Fusion | None = None,
               depth: int = 100, for_signature: bool = True) -> list[ChunkHit]:
    """E1. ``for_signature``: hits carry their session and vector, which InitSignature needs next;
    without it only BM25-only hits are given a vector, for their cosine to the query.

    With a ``fusion``, the dense ranking of ``max(k, depth)`` candidates is fused with BM25's ranking
    of ``text``; a hit's score is then its fused score and its ``cosine`` the cosine to the query.
    """
    if fusion is None:
        return store.search_chunks(query_vec, k, vectors=for_signature, owners=for_signature)
    depth = max(k, depth)
    dense = store.search_chunks(query_vec, depth)
    cosine = {h.id: h.score for h in dense}
    fused = fusion.fuse([h.id for h in dense], lexical(store, text, depth, fusion))[:k]
    ids = [i for i, _ in fused]
    needed = ids if for_signature else [i for i in ids if i not in cosine]
    vectors = dict(zip(needed, store.vectors("chunks", needed))) if needed else {}
    sessions = store.summary_of(ids) if for_signature else [""] * len(ids)
    return [ChunkHit(i, score, owner, vectors.get(i), cosine[i] if i in cosine else float(vectors[i] @ query_vec))
            for (i, score), owner in zip(fused, sessions)]


def as_scored(hits: Sequence[ChunkHit]) -> list[dict[str, float | str]]:
    """Query-only hits in the state's ranking shape (s_qry = cosine to the query, s_sig = 0)."""
    return [Scored(h.id, h.score, h.score if h.cosine is None else h.cosine, 0.0).as_dict() for h in hits]


def _ranked(ids: Sequence[str], score: np.ndarray, s_qry: np.ndarray, s_sig: np.ndarray, k: int,
            bm25: Sequence[str], fusion: Fusion | None) -> list[Scored]:
    """The top k by exact score, or by its fusion with the BM25 ranking ``bm25`` under ``fusion``."""
    order = np.argsort(-score, kind="stable")
    if fusion is None:
        return [Scored(ids[i], float(score[i]), float(s_qry[i]), float(s_sig[i])) for i in order[:k]]
    row = {id_: n for n, id_ in enumerate(ids)}
    fused = fusion.fuse([ids[i] for i in order], bm25)[:k]
    return [Scored(i, f, float(s_qry[row[i]]), float(s_sig[row[i]])) for i, f in fused]


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
    store: Mindscape, query_vec: np.ndarray, sig_vec: np.ndarray, alpha: float, k: int, candidates: int,
    *, text: str = "", fusion: Fusion | None = None,
) -> list[Scored]:
    """Top-k chunks of the whole collection under Eq. 4 (one interpolated search + exact rescoring);
    a ``fusion`` fuses it with BM25's ranking of ``text`` (whose hits are scored exactly too)."""
    bm25 = lexical(store, text, max(k, candidates), fusion) if fusion else []
    mixed = (1.0 - alpha) * query_vec + alpha * sig_vec
    # The search returns ids; every candidate's vector comes from the store's in-memory rows.
    ids = [h.id for h in store.search_chunks(mixed, max(k, candidates))]
    seen = set(ids)
    ids += [i for i in dict.fromkeys(bm25) if i not in seen]
    if not ids:
        return []
    vectors = store.vectors("chunks", ids)
    s_qry = vectors @ query_vec
    s_sig = vectors @ sig_vec
    score = (1.0 - alpha) * s_qry + alpha * s_sig
    return _ranked(ids, score, s_qry, s_sig, k, bm25, fusion)


def prior_weights(relevance: Sequence[float], temperature: float) -> np.ndarray:
    """w_s: a softmax of the signature summaries' relevance, summing to 1.

    A sharp softmax concentrates the prior on the region the evidence favours; when several regions
    are about equally relevant the weights stay flat and small, so the prior fades by itself
    instead of pulling the ranking towards five stories at once (what the centroid does).
    """
    rel = np.asarray(relevance, dtype=np.float64)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if rel.size == 0 or not np.isfinite(rel.max()):
        return np.zeros_like(rel)  # nothing relevant: no prior
    z = np.exp((rel - rel.max()) / temperature)
    return z / z.sum()


def vote_relevance(step0: Sequence[tuple[str | None, float]], summary_ids: Sequence[str], temperature: float) -> list[float]:
    """Relevance of each signature summary as the soft vote of its step-0 chunks.

    ``step0`` holds (π(c), s_qry(c)) of the K0 candidates. The log of Σ_c exp(s_qry(c)/τ) over a
    summary's chunks rewards a region that several good chunks light up, which an extractive
    summary's own vector (a few sentences) often fails to show. The value is τ·log Σ_c exp(s_qry(c)/τ),
    so ``prior_weights`` with the same τ gives w_s ∝ Σ_c exp(s_qry(c)/τ); a summary no step-0 chunk
    lit up gets −inf, i.e. weight 0.
    """
    mass: dict[str, float] = {}
    top = max((score for _, score in step0), default=0.0)
    for owner, score in step0:
        if owner is not None:
            mass[owner] = mass.get(owner, 0.0) + float(np.exp((score - top) / temperature))
    return [temperature * float(np.log(mass[s])) + top if s in mass else float("-inf") for s in summary_ids]


def prior_scores(
    s_qry: np.ndarray, owners: Sequence[str | None], weights: dict[str, float], alpha: float, gate: float
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Eq. 4 with the soft membership prior s_sig(c) = Σ_s w_s·[π(c) = s] = w_{π(c)}.

    The prior is applied only when the signature is confident, i.e. its top weight (weights sum
    to 1) reaches ``gate``; otherwise every s_sig is 0 and the ranking is query-only, because a
    prior spread over several regions was measured to cost recall. Returns (score, s_sig, applied).
    """
    applied = bool(weights) and max(weights.values()) >= gate
    s_sig = np.asarray([weights.get(o, 0.0) if (applied and o is not None) else 0.0 for o in owners], dtype=np.float64)
    s_qry = np.asarray(s_qry, dtype=np.float64)
    score = (1.0 - alpha) * s_qry + alpha * s_sig if applied else s_qry
    return score, s_sig, applied


def membership_prior(
    store: Mindscape,
    query_vec: np.ndarray,
    weights: dict[str, float],
    alpha: float,
    gate: float,
    k: int,
    candidates: int,
    *,
    text: str = "",
    fusion: Fusion | None = None,
) -> list[Scored]:
    """Top-k chunks under ``prior_scores``, scored exactly over E1 top-``candidates`` ∪ every chunk
    of the signature's sessions.

    s_sig is a step function of the chunk's session, not a linear function of its vector, so one
    interpolated vector search cannot find the top of the ranking; but a chunk outside both sets
    has s_sig = 0 and a query score below the E1 cut, so it cannot outrank the candidates' top k
    (when k ≤ candidates). With a ``fusion``, BM25's hits for ``text`` join the set and the exact
    order is fused with BM25's ranking.
    """
    bm25 = lexical(store, text, max(k, candidates), fusion) if fusion else []
    hits = store.search_chunks(query_vec, max(k, candidates))
    ids = list(dict.fromkeys([h.id for h in hits] + list(bm25)))
    owners: list[str | None] = [o or None for o in store.summary_of(ids)]
    members = [s for s, w in weights.items() if w > 0.0]
    if members and max(weights.values()) >= gate:
        seen = set(ids)
        for cid, owner in store.session_members(members):
            if cid not in seen:
                ids.append(cid)
                owners.append(owner)
                seen.add(cid)
    if not ids:
        return []
    s_qry = store.vectors("chunks", ids) @ np.asarray(query_vec, dtype=np.float32)
    score, s_sig, _ = prior_scores(s_qry, owners, weights, alpha, gate)
    return _ranked(ids, score, s_qry, s_sig, k, bm25, fusion)


def signature_weights(
    store: Mindscape,
    query_vec: np.ndarray,
    summary_ids: Sequence[str],
    mode: PriorWeights,
    temperature: float,
    step0: Sequence[dict[str, object]] = (),
) -> dict[str, float]:
    """w_s for each signature summary: ``votes`` from the step-0 chunks (``step0`` rows carry
    ``id`` and ``s_qry``), ``relevance`` from e_q·e_s. Votes need a step 0; without one (the
    agent's later steps) relevance is the only evidence there is, so it is used."""
    if not summary_ids:
        return {}
    if mode == "votes" and step0:
        step0_ids = [str(h["id"]) for h in step0]
        owners = {i: o or None for i, o in zip(step0_ids, store.summary_of(step0_ids))}
        rel = vote_relevance([(owners.get(str(h["id"])), float(h["s_qry"])) for h in step0], summary_ids, temperature)
    else:
        rel = list(store.vectors("summaries", summary_ids) @ np.asarray(query_vec, dtype=np.float32))
    return dict(zip(summary_ids, (float(w) for w in prior_weights(rel, temperature))))
