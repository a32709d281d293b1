"""E1 (query-only) and E2 (query + signature: the trained head, or Eq. 4) retrieval over a whole mindscape.

E2's score s(c) = (1 − α)·e_q·e_c + α·s_sig(c) is linear in the chunk vector for the
``centroid`` and ``mia`` strategies (each gives s_sig(c) = e_σ·e_c for some vector
e_σ), so the top of the ranking over the WHOLE collection is one nearest-neighbour search with
v = (1 − α)·e_q + α·e_σ. The candidates it returns are then rescored exactly, which also undoes
any approximation of the vector index within the candidate set.

With ``retriever=hybrid`` every ranking is fused with BM25 over the chunk texts (weighted reciprocal
rank fusion, ``Fusion``): the lexical hits join the candidate set, are scored exactly like the dense
candidates, and the final order is the fusion of the exact dense ranking and the BM25 ranking.
On the fairy-tale series set the dense step 0 misses stories that a name or a rare word would
find (evals/results/signature-payoff); BM25 is what finds them, and plain RRF (k = 60, equal
weights) let the weaker dense ranking pull the fused one below BM25 alone, hence the weights.

``sig_strategy=trained`` is not linear in the chunk vector: the trained head (stores.signature_head)
adds to rag's own fused first stage a signature-aware cosine and session and region membership terms, scored
exactly over a candidate set that provably holds the top k (``trained_signature``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mia.nodes.context import RetrievalSettings, SigStrategy, SignatureGraphSettings
from mia.stores.bm25 import ChunkIndex
from mia.stores.chroma import MindscapeError
from mia.stores.embeddings import Embedder
from mia.stores.mindscape import Mindscape
from mia.stores.signature_head import EVIDENCE, SignatureHead, load_head
from mia.stores.units import Level
from mia.stores.vector_index import ChunkHit


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
    def of(cls, ctx: RetrievalSettings) -> Fusion | None:
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


def scored(hit: ChunkHit) -> Scored:
    """A query-only hit as a ranking entry (s_qry = cosine to the query, s_sig = 0)."""
    return Scored(hit.id, hit.score, hit.score if hit.cosine is None else hit.cosine, 0.0)


def as_scored(hits: Sequence[ChunkHit]) -> list[dict[str, float | str]]:
    """Query-only hits in the state's ranking shape."""
    return [scored(h).as_dict() for h in hits]


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
) -> np.ndarray:
    """e_σ for a strategy linear in the chunk vector (centroid or mia)."""
    if not summary_ids:
        raise MindscapeError(
            f"collection {store.name!r} has no session summaries to build a signature from: "
            "re-ingest it with --summarizer llm or extractive"
        )
    if strategy == "centroid":
        centroid = store.vectors("summaries", summary_ids).mean(axis=0)
        return centroid / max(float(np.linalg.norm(centroid)), 1e-12)
    if strategy == "mia":
        model = embedder.model
        if not hasattr(model, "embed_query_with_signature"):
            raise MindscapeError(
                "sig_strategy 'mia' needs a collection built with a decoder embedder in the MiA-Emb format "
                f"(MIA_EMBEDDINGS=decoder:PATH at ingestion); the collection uses {embedder.name!r}"
            )
        vec = np.asarray(model.embed_query_with_signature(query, signature_text(store, summary_ids)), dtype=np.float32)
        return vec / max(float(np.linalg.norm(vec)), 1e-12)
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


def first_stage(store: Mindscape, query_vec: np.ndarray, depth: int, *, text: str = "",
                fusion: Fusion | None = None) -> list[tuple[str, float]]:
    """rag's E1 ranking as (id, fused score), best first: the nearest ``depth`` chunks fused with
    BM25's ``depth`` best under a ``fusion``, or the dense ranking's reciprocal ranks without one."""
    dense = [h.id for h in store.search_chunks(query_vec, depth)]
    return fusion.fuse(dense, lexical(store, text, depth, fusion)) if fusion else reciprocal_rank_fusion(dense)


def signature_evidence(query_vec: np.ndarray, summary_vecs: np.ndarray, summary_ids: Sequence[str],
                       fused: Sequence[tuple[str, float]], session_of: dict[str, str],
                       cosine: dict[str, float]) -> np.ndarray:
    """``EVIDENCE`` (stores.signature_head) for each signature summary, one row each: what the
    question and the first stage's ``fused`` ranking say of its session. ``session_of`` maps every
    chunk of the signature's sessions to its session, ``cosine`` gives their cosines to the query."""
    rank = {c: r for r, (c, _) in enumerate(fused, start=1)}
    score = dict(fused)
    chunks: dict[str, list[str]] = {}
    for cid, sid in session_of.items():
        chunks.setdefault(sid, []).append(cid)
    rows = []
    for j, sid in enumerate(summary_ids):
        members = chunks.get(sid, [])
        fused_scores = [score[c] for c in members if c in score]
        ranks = [rank[c] for c in members if c in rank]
        cosines = sorted((cosine[c] for c in members), reverse=True)
        rows.append([float(summary_vecs[j] @ query_vec), max(fused_scores, default=0.0), sum(fused_scores),
                     cosines[0] if cosines else 0.0, float(np.mean(cosines[:3])) if cosines else 0.0,
                     1.0 / min(ranks) if ranks else 0.0, float(sum(r <= 10 for r in ranks)), 1.0 / (j + 1)])
    return np.asarray(rows, dtype=np.float64).reshape(len(summary_ids), len(EVIDENCE))


def head_inputs(store: Mindscape, query_vec: np.ndarray, summary_ids: Sequence[str], depth: int, *, text: str = "",
                fusion: Fusion | None = None) -> tuple[list[tuple[str, float]], dict[str, str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """What the trained head reads, as E2 and its training both compute it: (the first stage's
    fused ranking, each chunk of the signature's sessions → its session, the ids of both (fused
    first), their vectors, the summaries' vectors, the summaries' evidence)."""
    d = query_vec.shape[0]
    fused = first_stage(store, query_vec, depth, text=text, fusion=fusion)
    session_of = dict(store.session_members(summary_ids)) if summary_ids else {}
    ids = list(dict.fromkeys([c for c, _ in fused] + list(session_of)))
    vectors = store.vectors("chunks", ids).astype(np.float64) if ids else np.zeros((0, d))
    summary_vecs = store.vectors("summaries", summary_ids).astype(np.float64) if summary_ids else np.zeros((0, d))
    evidence = signature_evidence(query_vec, summary_vecs, summary_ids, fused, session_of, dict(zip(ids, vectors @ query_vec)))
    return fused, session_of, ids, vectors, summary_vecs, evidence


def trained_signature(
    store: Mindscape, head: SignatureHead, query_vec: np.ndarray, summary_ids: Sequence[str], delta: float,
    k: int, candidates: int, *, text: str = "", fusion: Fusion | None = None,
) -> list[Scored]:
    """Top-k chunks under the trained head (``sig_strategy=trained``): κ·rrf(c) + λ·e·e_c + the
    membership terms (``SignatureHead.session_lift``: β·a_{π(c)} and β_near on the sessions around
    each signature summary) over rag's own first stage (``first_stage`` at depth ``candidates``),
    with e the head's signature-aware query interpolated by ``delta`` and a its attention over the
    signature. With an empty signature, the head's query is the query's own and nothing is lifted.

    The first stage's best chunk stays first, so the signature reorders what follows it: on the
    fairy-tale val split the head otherwise lifted Recall@10 while it lowered Recall@1. Scored
    exactly over the first stage's chunks ∪ every chunk of the lifted sessions ∪ the nearest
    ``candidates`` to e: a chunk outside all three has no fused score and no membership term, so it
    scores λ·e·e_c, no more than each of those nearest (which score at least as much, κ, λ, β,
    β_near ≥ 0 as ``load_head`` checks), and it cannot reach the top k. ``s_sig`` of a hit is what the
    signature terms gave it."""
    query = np.asarray(query_vec, dtype=np.float64).ravel()
    query = query / max(float(np.linalg.norm(query)), 1e-12)
    if query.shape[0] != head.dim or (store.embedder and store.embedder != head.embedder):
        raise MindscapeError(
            f"the signature head was trained on {head.dim}-dimensional vectors of {head.embedder!r} but collection "
            f"{store.name!r} holds {store.embedder or 'other'!r} vectors ({query.shape[0]}-dimensional queries): train a "
            "head on its embedder (`mia train retriever`) or use sig_strategy=centroid"
        )
    depth = max(k, candidates)
    fused, session_of, ids, vectors, summary_vecs, evidence = head_inputs(store, query, summary_ids, depth, text=text, fusion=fusion)
    e, attention = head.query(query, summary_vecs, evidence, delta)
    rows, summaries = store.vector_rows(Level.SESSION)
    lift = head.session_lift(summary_ids, attention, lambda a, b: float(summaries[rows[a]] @ summaries[rows[b]])
                             if a in rows and b in rows else None)
    own = set(summary_ids)
    around = [s for s in lift if s not in own]
    if around:  # the region term's sessions: their chunks are candidates too
        session_of = {**session_of, **dict(store.session_members(around))}
    seen = set(ids)
    more = [c for c in session_of if c not in seen]
    seen.update(more)
    more += [h.id for h in store.search_chunks(e, depth) if h.id not in seen]
    if more:  # the region's chunks, then the nearest to e: their vectors in one read
        ids += more
        vectors = np.vstack([vectors, store.vectors("chunks", more).astype(np.float64)])
    if not ids:
        return []
    rrf = dict(fused)
    base = head.kappa * np.asarray([rrf.get(c, 0.0) for c in ids])
    score = base + head.lam * (vectors @ e) + np.asarray([lift.get(session_of.get(c, ""), 0.0) for c in ids])
    order = list(np.argsort(-score, kind="stable"))
    if fused:  # the first stage's best chunk (row 0 of ids) leads
        order.remove(0)
        order.insert(0, 0)
    s_qry = vectors @ query
    return [Scored(ids[i], float(score[i]), float(s_qry[i]), float(score[i] - base[i])) for i in order[:k]]


def signature_ranking(ctx: SignatureGraphSettings, store: Mindscape, embedder: Embedder, question: str,
                      query_vec: np.ndarray, summary_ids: Sequence[str], k: int) -> list[Scored]:
    """E2 under the run's ``sig_strategy``: the top k chunks for the question and its signature
    (mia_rag's E2, mia_agent's Retrieve, the retrieval bench).

    E2 reads the signature's units at the session level (those the session index holds); units
    above it (``signature_levels``) are left to the reader: a book unit spans every chunk of its book,
    so it would pull the ranking towards the book as a whole, not towards a part of it, and the head
    was trained on sessions only. A signature without sessions conditions nothing, and E2 is then
    the query-only ranking."""
    fusion = Fusion.of(ctx)
    sessions, _ = store.vector_rows(Level.SESSION)
    summary_ids = [i for i in summary_ids if i in sessions]
    if not summary_ids:
        hits = query_only(store, query_vec, k, text=question, fusion=fusion, depth=ctx.candidates, for_signature=False)
        return [scored(h) for h in hits]
    if ctx.sig_strategy == "trained":
        return trained_signature(store, load_head(ctx.sig_weights), query_vec, summary_ids, ctx.delta, k, ctx.candidates,
                                 text=question, fusion=fusion)
    sig_vec = signature_vector(ctx.sig_strategy, store, embedder, question, summary_ids)
    return dual_signal(store, query_vec, sig_vec, ctx.alpha, k, ctx.candidates, text=question, fusion=fusion)
