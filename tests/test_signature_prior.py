"""The soft membership prior (sig_strategy="prior"): hand-computed weights, scores and gate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nodes.context import Context
from nodes.retrieval import membership_prior, prior_scores, prior_weights, vote_relevance


def test_prior_weights_softmax_by_hand() -> None:
    w = prior_weights([0.5, 0.4], temperature=0.1)
    e = math.exp(-1.0)
    assert w == pytest.approx([1 / (1 + e), e / (1 + e)])
    assert w.sum() == pytest.approx(1.0)


def test_prior_weights_nothing_relevant_means_no_prior() -> None:
    assert prior_weights([float("-inf"), float("-inf")], 0.1).tolist() == [0.0, 0.0]
    assert prior_weights([], 0.1).size == 0
    with pytest.raises(ValueError):
        prior_weights([0.1], 0.0)


def test_votes_sum_the_chunks_of_each_summary() -> None:
    # a has two chunks (0.5, 0.4), b one (0.5), c none; the unowned chunk only sets the scale.
    rel = vote_relevance([("a", 0.5), ("a", 0.4), ("b", 0.5), (None, 0.9)], ["a", "b", "c"], 0.1)
    w = prior_weights(rel, 0.1)
    e = math.exp(-1.0)
    assert w == pytest.approx([(1 + e) / (2 + e), 1 / (2 + e), 0.0])


def test_prior_scores_by_hand() -> None:
    score, s_sig, applied = prior_scores(np.array([0.6, 0.5, 0.4]), ["a", "b", None], {"a": 0.2, "b": 0.8}, alpha=0.5, gate=0.5)
    assert applied
    assert s_sig.tolist() == pytest.approx([0.2, 0.8, 0.0])
    assert score.tolist() == pytest.approx([0.4, 0.65, 0.2])


def test_gate_falls_back_to_query_only() -> None:
    s_qry = np.array([0.6, 0.5, 0.4])
    score, s_sig, applied = prior_scores(s_qry, ["a", "b", None], {"a": 0.2, "b": 0.8}, alpha=0.5, gate=0.81)
    assert not applied
    assert s_sig.tolist() == [0.0, 0.0, 0.0]
    assert score.tolist() == pytest.approx(s_qry.tolist())
    # At exactly the gate the prior applies; an empty signature never does.
    assert prior_scores(s_qry, ["a", "b", None], {"a": 0.2, "b": 0.8}, 0.5, 0.8)[2]
    assert not prior_scores(s_qry, ["a", "b", None], {}, 0.5, 0.0)[2]


class _Hit:
    def __init__(self, id_: str, score: float) -> None:
        self.id, self.score = id_, score


class FakeStore:
    """Four unit chunk vectors in 2-d; E1 returns only the top ``k`` by the query."""

    def __init__(self) -> None:
        angles = {"c1": 0.0, "c2": 0.3, "c3": 0.6, "c4": 1.2}
        self.vecs = {i: np.array([math.cos(a), math.sin(a)], dtype=np.float32) for i, a in angles.items()}
        self.owners = {"c1": "s1", "c2": "s1", "c3": "s2", "c4": "s2"}

    def search_chunks(self, vector: np.ndarray, k: int) -> list[_Hit]:
        scored = sorted(((float(v @ vector), i) for i, v in self.vecs.items()), reverse=True)[:k]
        return [_Hit(i, s) for s, i in scored]

    def summary_of(self, ids: list[str]) -> list[str]:
        return [self.owners[i] for i in ids]

    def session_members(self, summary_ids: list[str]) -> list[tuple[str, str]]:
        return [(i, s) for i, s in self.owners.items() if s in summary_ids]

    def vectors(self, collection: str, ids: list[str]) -> np.ndarray:
        return np.stack([self.vecs[i] for i in ids])


def test_membership_prior_scores_signature_chunks_outside_e1() -> None:
    store = FakeStore()
    q = np.array([1.0, 0.0], dtype=np.float32)
    # E1 keeps only c1, c2 (s1); the signature says s2, so c3 and c4 must still be scored.
    hits = membership_prior(store, q, {"s2": 1.0}, alpha=0.5, gate=0.0, k=4, candidates=2)
    got = {h.id: h.score for h in hits}
    assert set(got) == {"c1", "c2", "c3", "c4"}
    assert got["c3"] == pytest.approx(0.5 * math.cos(0.6) + 0.5)
    assert got["c1"] == pytest.approx(0.5 * 1.0)
    assert [h.id for h in hits][:2] == ["c3", "c4"]


def test_membership_prior_gate_closed_is_query_only() -> None:
    store = FakeStore()
    q = np.array([1.0, 0.0], dtype=np.float32)
    hits = membership_prior(store, q, {"s1": 0.5, "s2": 0.5}, alpha=0.5, gate=0.6, k=2, candidates=2)
    assert [h.id for h in hits] == ["c1", "c2"]
    assert all(h.s_sig == 0.0 for h in hits)


def test_context_fields_validate() -> None:
    ctx = Context(sig_strategy="prior", prior_gate=0.5, prior_weights="relevance")
    assert ctx.prior_temperature > 0
    with pytest.raises(ValueError):
        Context(prior_gate=1.5)
    with pytest.raises(ValueError):
        Context(prior_weights="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Context(prior_temperature=0.0)
