"""Step 0 and InitSignature, shared by ``mia_rag`` and ``mia_agent``: the query lights up K0 chunks,
and the units that cover them (at the levels ``signature_levels`` names) are compressed into the
signature."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mia.nodes import resources
from mia.nodes.context import SignatureGraphSettings
from mia.nodes.retrieval import Fusion, as_scored, query_only
from mia.nodes.signature import coverage_aware, first_k, summary_pool
from mia.stores.units import BUILT_BY, SIGNATURE_LEVELS, Level
from mia.stores.vector_index import ChunkHit


def initial_signature(question: str, ctx: SignatureGraphSettings) -> dict[str, Any]:
    """σ_0 and the step-0 ranking."""
    store = resources.mindscape(ctx)
    query_vec = resources.embedder(store).embed_query(question)
    step0 = query_only(store, query_vec, ctx.k0, text=question, fusion=Fusion.of(ctx), depth=ctx.candidates)
    return {"step0": as_scored(step0), "signature": select_signature(store, question, query_vec, step0, ctx),
            "snapshot": resources.share(store)}


def select_signature(store: Any, question: str, query_vec: Any, step0: Sequence[ChunkHit],
                     ctx: SignatureGraphSettings) -> list[dict[str, Any]]:
    """InitSignature (``signature_init``) over the ranked step-0 hits. Under ``signature_levels``
    sessions+parts+story a chunk is covered by its session, its part and its book's story, the paper's
    overcomplete memory: coverage then overlaps, and a unit competes with the units below it that it spans."""
    covered = [h for h in step0 if h.summary_id]
    if step0 and not covered:
        raise resources.MindscapeError(
            f"collection {store.name!r} has no session summaries: re-ingest it with --summarizer llm or extractive"
        )
    levels = SIGNATURE_LEVELS[ctx.signature_levels]
    owners = store.units_over([h.id for h in covered], levels)
    lacking = [level for level in levels if level != Level.SESSION and not any(level in units for units in owners)]
    if covered and lacking:
        raise resources.MindscapeError(
            f"signature_levels {ctx.signature_levels} needs {lacking[0]} units, and the books of collection {store.name!r} "
            f"that the question reached have none: rerun `mia ingest` on them with {BUILT_BY[lacking[0]]} to write them"
        )
    level_of = {unit: level for units in owners for level, unit in units.items()}
    ranked_summaries = [list(units.values()) for units in owners]
    if ctx.signature_init == "first_k":
        picks = first_k(ranked_summaries, ctx.k_sum)
    else:
        pool, coverage = summary_pool(ranked_summaries)
        e_q, summary_vecs, chunk_vecs = selection_vectors(store, ctx, question, query_vec, pool, covered)
        picks = coverage_aware(e_q, pool, summary_vecs, chunk_vecs, coverage, k=ctx.k_sum,
                               lambdas=(ctx.lambda_q, ctx.lambda_c, ctx.lambda_d))
    return [{"id": p.summary_id, "level": str(level_of[p.summary_id]), "gain": round(p.gain, 6),
             "relevance": round(p.relevance, 6), "coverage": round(p.coverage, 6), "diversity": round(p.diversity, 6)}
            for p in picks]


def selection_vectors(store: Any, ctx: SignatureGraphSettings, question: str, query_vec: np.ndarray, pool: Sequence[str],
                      covered: Sequence[ChunkHit]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e_q, summary vectors, chunk vectors) for the selection objective: the collection's own
    vectors, or those of ``selection_embedder`` (the paper's BGE-M3), which embeds the question,
    the pool's summaries and the step-0 chunks afresh: one encoder pass of about K0 + |pool| texts
    per question, worth a GPU."""
    if not ctx.selection_embedder:
        return query_vec, store.vectors("summaries", pool), np.stack([h.vector for h in covered])
    encoder = resources.selection_embedder(ctx)
    summaries = [r["text"] for r in store.summary_records(pool)]
    chunks = [r["text"] for r in store.chunk_records([h.id for h in covered])]
    return encoder.embed_query(question), encoder.embed_documents(summaries), encoder.embed_documents(chunks)
