"""retriever=hybrid: reciprocal rank fusion of the exact dense ranking with BM25 over the chunks.

(a) The fusion itself against hand-computed values.
(b) Over a real collection, every hybrid ranking (rag's E1, mia_rag's step 0 and E2) equals the
    brute-force fusion of the exact dense ranking of the candidate set with bm25s's own ranking.
(c) The chunk index follows the collection: a re-ingested book rebuilds it.
"""

from __future__ import annotations

import json
from typing import Any

import bm25s
import numpy as np
import pytest

from mia.nodes.context import MiaRagSettings, RagSettings
from mia.nodes.retrieval import RRF_K, Fusion, dual_signal, lexical, query_only, reciprocal_rank_fusion
from mia.stores.bm25 import ChunkIndex, tokenize
from tests.conftest import requires_data

QUESTION = "Who stole the lovely Rose-Red?"


def test_fusion_by_hand() -> None:
    fused = dict(reciprocal_rank_fusion(["a", "b", "c"], ["c", "a"], k=1))
    assert fused == pytest.approx({"a": 1 / 2 + 1 / 3, "b": 1 / 3, "c": 1 / 4 + 1 / 2})
    assert [i for i, _ in reciprocal_rank_fusion(["a", "b", "c"], ["c", "a"], k=1)] == ["a", "c", "b"]
    # A tie keeps the first-seen order; an empty ranking changes nothing.
    assert [i for i, _ in reciprocal_rank_fusion(["x", "y"], ["y", "x"])] == ["x", "y"]
    assert reciprocal_rank_fusion(["a", "b"], []) == reciprocal_rank_fusion(["a", "b"])
    assert reciprocal_rank_fusion() == []


def test_weighted_fusion_by_hand() -> None:
    """Fusion(w, k): 1/(k + r_dense) + w/(k + r_bm25); a heavy BM25 weight lets its top hit win."""
    fused = dict(Fusion(bm25_weight=3.0, k=2).fuse(["a", "b", "c"], ["c", "a"]))
    assert fused == pytest.approx({"a": 1 / 3 + 3 / 4, "b": 1 / 4, "c": 1 / 5 + 3 / 3})
    assert [i for i, _ in Fusion(3.0, 2).fuse(["a", "b", "c"], ["c", "a"])] == ["c", "a", "b"]
    assert Fusion().fuse(["a", "b"], ["b"]) == reciprocal_rank_fusion(["a", "b"], ["b"])  # plain RRF
    assert [i for i, _ in Fusion(0.0, 60).fuse(["a", "b"], ["b", "z"])][:2] == ["a", "b"]  # weight 0: dense order
    assert Fusion.of(RagSettings(retriever="dense")) is None
    assert Fusion.of(RagSettings(retriever="hybrid", bm25_weight=2.5, rrf_k=7, bm25_stemming=False)) == Fusion(2.5, 7, False)


def _brute_bm25(store: Any, text: str, stem: bool = False) -> list[str]:
    """bm25s over every chunk, built here from scratch: the ranking ChunkIndex must reproduce."""
    got = store.chunks.get(include=["documents"])
    ids, docs = list(got["ids"]), list(got["documents"])
    index = bm25s.BM25()
    index.index([tokenize(d, stem=stem) for d in docs], show_progress=False)
    scores = index.get_scores(tokenize(text, stem=stem))
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return [ids[i] for i in order if scores[i] > 0]


def _exact_dense(store: Any, ids: list[str], vector: np.ndarray) -> list[str]:
    vectors = store.vectors("chunks", ids)
    return [ids[i] for i in np.argsort(-(vectors @ vector), kind="stable")]


@requires_data
@pytest.mark.parametrize("stem", [False, True])
def test_chunk_index_ranks_like_bm25s(tiny_collection, stem: bool) -> None:
    store = tiny_collection.store
    expected = _brute_bm25(store, QUESTION, stem)
    assert expected, "the question shares words with the stories"
    got = ChunkIndex.for_collection(store, stem=stem).search(QUESTION, len(expected) + 5)
    assert set(got) == set(expected) and got[:3] == expected[:3]
    assert ChunkIndex.for_collection(store, stem=stem).search("the of and", 5) == []  # stopwords only: no hits


@requires_data
def test_stemmed_index_matches_other_forms_of_a_word(tiny_collection) -> None:
    """The stories say "swallowed" and never "swallowing": only the stemmed index finds the one from the other."""
    store = tiny_collection.store
    text = " ".join(tiny_collection.texts.values()).lower()
    assert "swallowed" in text and "swallowing" not in text
    assert ChunkIndex.for_collection(store).search("swallowing", 5) == []
    hits = ChunkIndex.for_collection(store, stem=True).search("swallowing", 5)
    assert hits and all("swallow" in r["text"].lower() for r in store.chunk_records(hits))


@requires_data
def test_hybrid_query_only_is_the_fusion_of_exact_rankings(tiny_collection, minilm) -> None:
    store = tiny_collection.store
    query_vec = minilm.embed_query(QUESTION)
    depth = 12
    bm25 = lexical(store, QUESTION, depth, Fusion())
    dense = [h.id for h in store.search_chunks(query_vec, depth)]
    expected = reciprocal_rank_fusion(_exact_dense(store, dense, query_vec), bm25)
    hits = query_only(store, query_vec, 8, text=QUESTION, fusion=Fusion(), depth=depth)
    assert [h.id for h in hits] == [i for i, _ in expected[:8]]
    assert [h.score for h in hits] == pytest.approx([s for _, s in expected[:8]])
    # BM25-only hits carry what InitSignature needs: their session and their vector.
    for hit in hits:
        record = store.chunk_records([hit.id], documents=False)[0]
        assert hit.summary_id == record["summary_id"]
        np.testing.assert_allclose(hit.vector, store.vectors("chunks", [hit.id])[0], atol=1e-6)
    top_bm25 = bm25[0]
    assert top_bm25 in [h.id for h in hits], "the best lexical hit ranks at worst second among two rankings"


@requires_data
def test_hybrid_eq4_fuses_exact_scores_over_dense_and_lexical_candidates(tiny_collection, minilm) -> None:
    store = tiny_collection.store
    query_vec = minilm.embed_query(QUESTION)
    sig_vec = store.vectors("summaries", [store.summaries.get()["ids"][0]])[0]
    bm25 = lexical(store, QUESTION, 10, Fusion())  # BM25 to the same depth as the dense side, max(k, candidates)
    hits = dual_signal(store, query_vec, sig_vec, 0.5, k=10, candidates=6, text=QUESTION, fusion=Fusion())
    mixed = 0.5 * query_vec + 0.5 * sig_vec
    pool = list(dict.fromkeys([h.id for h in store.search_chunks(mixed, 10)] + bm25))  # max(k, candidates) dense
    expected = reciprocal_rank_fusion(_exact_dense(store, pool, mixed), bm25)[:10]
    assert [h.id for h in hits] == [i for i, _ in expected]
    vectors = store.vectors("chunks", [h.id for h in hits])
    np.testing.assert_allclose([h.s_qry for h in hits], vectors @ query_vec, atol=1e-5)
    np.testing.assert_allclose([h.s_sig for h in hits], vectors @ sig_vec, atol=1e-5)
    assert max(h.score for h in hits) <= 2.0 / (RRF_K + 1) + 1e-12


@requires_data
@pytest.mark.parametrize("graph", ["rag", "mia_rag"])
def test_graphs_use_the_hybrid_ranking(graph: str, tiny_collection, minilm, cli) -> None:
    result = cli("ask", QUESTION, "--collection", tiny_collection.name, "--graph", graph, "--json",
                 "--set", "retrieval_only=true", "--set", "retriever=hybrid", "--set", "top_k=5")
    assert result.code == 0, result.err
    state = json.loads(result.out)
    store = tiny_collection.store
    query_vec = minilm.embed_query(QUESTION)
    depth, fusion = MiaRagSettings().candidates, Fusion.of(MiaRagSettings())
    if graph == "rag":
        expected = [h.id for h in query_only(store, query_vec, 5, text=QUESTION, fusion=fusion, depth=depth)]
    else:
        step0 = query_only(store, query_vec, MiaRagSettings().k0, text=QUESTION, fusion=fusion, depth=depth)
        assert [r["id"] for r in state["step0"]] == [h.id for h in step0]
        from mia.nodes.retrieval import trained_signature
        from mia.stores.signature_head import load_head

        signature = [s["id"] for s in state["signature"]]  # the default strategy: the shipped trained head
        expected = [h.id for h in trained_signature(store, load_head(""), query_vec, signature, MiaRagSettings().delta, 5, depth,
                                                    text=QUESTION, fusion=fusion)]
    assert [r["id"] for r in state["retrieved"]] == expected


def test_unknown_retriever_is_refused(cli) -> None:
    result = cli("ask", QUESTION, "--collection", "anything", "--set", "retriever=sparse")
    assert result.code == 2 and "retriever must be one of dense, hybrid" in result.err


@requires_data
def test_explain_says_how_the_rankings_were_scored(tiny_collection, cli) -> None:
    base = ("ask", QUESTION, "--collection", tiny_collection.name, "--graph", "mia_rag", "--explain",
            "--set", "retrieval_only=true")
    hybrid = cli(*base)
    assert hybrid.code == 0, hybrid.err
    assert "Signature (selection order" in hybrid.out
    assert "Step-0 ranking (query only) (score: reciprocal rank fusion with BM25):" in hybrid.out
    assert "Final ranking (score: the trained signature head" in hybrid.out  # the default sig_strategy
    dense = cli(*base, "--set", "retriever=dense", "--set", "sig_strategy=centroid")
    assert dense.code == 0 and "Final ranking:" in dense.out and "fusion" not in dense.out
