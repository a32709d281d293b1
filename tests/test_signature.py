"""Unit tests for nodes/signature.py: Appendix A (Algorithm 2) of the MiA-Signature paper.

Fast and offline: tiny hand-computed instances, seeded random instances against brute force, and
one realistic-size instance (K0=50 chunks, 50 summaries, d=384).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mia.nodes.signature import (
    SignaturePick,
    coverage_aware,
    first_k,
    objective,
    summary_pool,
)

# --------------------------------------------------------------------------------------------------
# Hand-computed instance (2-d, 3 summaries, 4 chunks, overlapping coverage)
#
#   e_q = (0.8, 0.6)
#   summaries: s0 = (1, 0)      s1 = (0.6, 0.8)      s2 = (0, 1)
#   chunks (rank order, w = 1/(r+1)):
#     c0 = (1, 0)      r=1  w=1/2
#     c1 = (0, 1)      r=2  w=1/3
#     c2 = (0.6, 0.8)  r=3  w=1/4
#     c3 = (0.8, 0.6)  r=4  w=1/5
#   Cov(s0) = {c0, c3}   Cov(s1) = {c1, c2, c3}   Cov(s2) = {c1}      (c1 and c3 are shared)
#
#   q_s:  q0 = 0.8, q1 = 0.48 + 0.48 = 0.96, q2 = 0.6           Z_Q = 0.96
#   m(s,c): m(s0,c0) = 1, m(s0,c3) = 0.8
#           m(s1,c1) = 0.8, m(s1,c2) = 1, m(s1,c3) = 0.96
#           m(s2,c1) = 1
#   cov_s: cov0 = 1/2 + 0.8/5 = 0.66
#          cov1 = 0.8/3 + 1/4 + 0.96/5 = 0.708667                  Z_C = cov1
#          cov2 = 1/3
#   summary cosines: s0·s1 = 0.6, s0·s2 = 0, s1·s2 = 0.8
#
# Step 1 (A = ∅, Δ_D = 1 for everyone), λ = (0.3, 0.4, 0.3):
#   Δ(s0) = 0.3·0.8/0.96 + 0.4·0.66/Z_C   + 0.3 = 0.25   + 0.372530 + 0.3 = 0.922530
#   Δ(s1) = 0.3·1        + 0.4·1          + 0.3 = 1.0                           ← pick s1
#   Δ(s2) = 0.3·0.6/0.96 + 0.4·(1/3)/Z_C  + 0.3 = 0.1875 + 0.188147 + 0.3 = 0.675647
# Step 2: s1 covered c1, c2, c3.
#   binary: Δ_C(s0) = (1/2·1)/Z_C (c3 now covered)           Δ_D(s0) = 1 − 0.6 = 0.4
#           Δ(s0) = 0.25 + 0.4·0.5/Z_C + 0.3·0.4 = 0.25 + 0.282220 + 0.12 = 0.652220   ← pick s0
#           Δ_C(s2) = 0 (c1 covered)                          Δ_D(s2) = 1 − 0.8 = 0.2
#           Δ(s2) = 0.1875 + 0 + 0.06 = 0.2475
#   max:    Δ_C(s0) = [1/2·(1 − 0) + 1/5·max(0, 0.8 − 0.96)]/Z_C = 0.5/Z_C    (same as binary)
#           Δ_C(s2) = 1/3·(1 − 0.8)/Z_C = (0.2/3)/Z_C          (s2 explains c1 better than s1)
#           Δ(s2) = 0.1875 + 0.4·(0.2/3)/Z_C + 0.06 = 0.285129 < Δ(s0)           ← pick s0
# Step 3: only s2 is left; s0 does not cover c1 and s0·s2 = 0, so nothing changes for s2:
#   binary Δ(s2) = 0.2475;  max Δ(s2) = 0.285129.
# --------------------------------------------------------------------------------------------------

Q = np.array([0.8, 0.6])
S = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
C = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]])
COV = [[0, 3], [1, 2, 3], [1]]
IDS = ["s0", "s1", "s2"]
Z_C = 0.8 / 3 + 1 / 4 + 0.96 / 5


def _parts(p: SignaturePick) -> tuple[float, float, float, float]:
    return (p.gain, p.relevance, p.coverage, p.diversity)


def test_hand_computed_binary() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=3)
    assert [p.summary_id for p in picks] == ["s1", "s0", "s2"]
    assert _parts(picks[0]) == pytest.approx((1.0, 0.3, 0.4, 0.3))
    assert _parts(picks[1]) == pytest.approx(
        (0.25 + 0.4 * 0.5 / Z_C + 0.12, 0.25, 0.4 * 0.5 / Z_C, 0.12)
    )
    assert picks[1].gain == pytest.approx(0.652220, abs=1e-6)
    assert _parts(picks[2]) == pytest.approx((0.2475, 0.1875, 0.0, 0.06))


def test_hand_computed_max_mode() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=3, coverage_mode="max")
    assert [p.summary_id for p in picks] == ["s1", "s0", "s2"]
    assert picks[1].gain == pytest.approx(0.652220, abs=1e-6)
    s2_cov = 0.4 * (0.2 / 3) / Z_C
    assert _parts(picks[2]) == pytest.approx((0.1875 + s2_cov + 0.06, 0.1875, s2_cov, 0.06))
    assert picks[2].gain == pytest.approx(0.285129, abs=1e-6)


def test_hand_computed_first_pick_only() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=1)
    assert [p.summary_id for p in picks] == ["s1"]


def test_modes_pick_differently_when_a_covered_chunk_is_explained_better() -> None:
    # Pure coverage, λ = (0, 1, 0). Chunks c0 = (1,0) w=1/2, c1 = (0,1) w=1/3.
    #   a = (0.6, 0.8) covers {c0, c1}: cov = 0.6/2 + 0.8/3 = 17/30 = Z_C     ← step 1 picks a
    #   c = (0, 1)     covers {c1}:     cov = 1/3
    #   b = (1, 0)     covers {c0}:     cov = 1/2
    # Step 2, binary: c0 and c1 are both covered → Δ(c) = Δ(b) = 0, tie → lower index c.
    # Step 2, max:    Δ(c) = (1 − 0.8)/3 / Z_C = 2/17,  Δ(b) = (1 − 0.6)/2 / Z_C = 6/17 → b.
    q = np.array([0.6, 0.8])
    s = np.array([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]])
    c = np.array([[1.0, 0.0], [0.0, 1.0]])
    cov = [[0, 1], [1], [0]]
    ids = ["a", "c", "b"]
    lam = (0.0, 1.0, 0.0)
    binary = coverage_aware(q, ids, s, c, cov, k=2, lambdas=lam, coverage_mode="binary")
    exact = coverage_aware(q, ids, s, c, cov, k=2, lambdas=lam, coverage_mode="max")
    assert [p.summary_id for p in binary] == ["a", "c"]
    assert [p.gain for p in binary] == pytest.approx([1.0, 0.0])
    assert [p.summary_id for p in exact] == ["a", "b"]
    assert [p.gain for p in exact] == pytest.approx([1.0, 6 / 17])
    assert objective(q, s, c, cov, [0, 2], lambdas=lam) == pytest.approx(1.0 + 6 / 17)


def test_non_positive_maxima_are_not_used_as_divisors() -> None:
    # Every q_s < 0: dividing by max q_s = −0.6 would reverse the order, so q̃ = q (Z_Q = 1).
    # The only chunk points away from every summary: all m = 0, cov = 0, Z_C = 1, Δ_C = 0 (no NaN).
    q = np.array([-0.6, -0.8])
    s = np.array([[1.0, 0.0], [0.0, 1.0]])
    c = np.array([[-1.0, 0.0]])
    picks = coverage_aware(q, ["x", "y"], s, c, [[0], [0]], k=2, lambdas=(1.0, 1.0, 0.0))
    assert [p.summary_id for p in picks] == ["x", "y"]
    assert [p.relevance for p in picks] == pytest.approx([-0.6, -0.8])
    assert [p.coverage for p in picks] == [0.0, 0.0]
    assert objective(q, s, c, [[0], [0]], [0, 1], lambdas=(1.0, 1.0, 0.0)) == pytest.approx(-1.4)


def test_diversity_can_exceed_one_for_an_opposite_summary() -> None:
    q = np.array([1.0, 0.0])
    s = np.array([[1.0, 0.0], [-1.0, 0.0]])
    c = np.empty((0, 2))
    picks = coverage_aware(q, ["a", "b"], s, c, [[], []], k=2, lambdas=(0.0, 0.0, 1.0))
    assert [p.diversity for p in picks] == pytest.approx([1.0, 2.0])


# --------------------------------------------------------------------------------------------------
# Brute force: the monotone part (λ_D = 0) with overlapping coverage
# --------------------------------------------------------------------------------------------------


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    # Non-negative entries keep every cosine ≥ 0, so f_Q is monotone as Proposition 1 assumes.
    x = np.abs(rng.standard_normal((n, d))) + 1e-3
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _random_instance(
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]]]:
    n = int(rng.integers(3, 9))
    m = int(rng.integers(4, 13))
    d = int(rng.integers(2, 7))
    q = _unit_rows(rng, 1, d)[0]
    s = _unit_rows(rng, n, d)
    c = _unit_rows(rng, m, d)
    # Each chunk is explained by 1-3 summaries: overlapping (overcomplete) coverage.
    per_chunk = [
        rng.choice(n, size=int(rng.integers(1, min(3, n) + 1)), replace=False) for _ in range(m)
    ]
    cov = [[i for i in range(m) if j in per_chunk[i]] for j in range(n)]
    return q, s, c, cov


def test_greedy_reaches_one_minus_one_over_e_of_brute_force() -> None:
    rng = np.random.default_rng(20260506)
    lam = (0.3, 0.4, 0.0)
    ratios = []
    for _ in range(150):
        q, s, c, cov = _random_instance(rng)
        n = len(s)
        k = int(rng.integers(1, min(4, n) + 1))
        ids = [f"s{j}" for j in range(n)]
        picks = coverage_aware(q, ids, s, c, cov, k=k, lambdas=lam, coverage_mode="max")
        chosen = [ids.index(p.summary_id) for p in picks]
        greedy = objective(q, s, c, cov, chosen, lambdas=lam)
        # The greedy gains telescope to the objective of the chosen set.
        assert sum(p.gain for p in picks) == pytest.approx(greedy)
        best = max(
            objective(q, s, c, cov, a, lambdas=lam) for a in itertools.combinations(range(n), k)
        )
        assert greedy >= (1 - 1 / math.e) * best - 1e-12
        ratios.append(greedy / best)
    assert min(ratios) >= 1 - 1 / math.e


def test_monotone_part_is_monotone_and_submodular() -> None:
    rng = np.random.default_rng(7)
    lam = (0.3, 0.4, 0.3)  # λ_D is ignored by objective()
    for _ in range(200):
        q, s, c, cov = _random_instance(rng)
        n = len(s)
        order = rng.permutation(n)
        b_size = int(rng.integers(0, n))
        a_size = int(rng.integers(0, b_size + 1))
        a, b, x = list(order[:a_size]), list(order[:b_size]), int(order[b_size])

        def f(sel: list[int]) -> float:
            return objective(q, s, c, cov, sel, lambdas=lam)

        assert f(a) <= f(b) + 1e-12
        assert f(a + [x]) - f(a) >= f(b + [x]) - f(b) - 1e-12


def test_greedy_gains_do_not_increase_without_diversity() -> None:
    # Diminishing returns seen from the inside: with λ_D = 0 and exact max coverage, each pick's
    # gain is at most the previous one's.
    rng = np.random.default_rng(3)
    for _ in range(50):
        q, s, c, cov = _random_instance(rng)
        ids = [f"s{j}" for j in range(len(s))]
        picks = coverage_aware(
            q, ids, s, c, cov, k=len(s), lambdas=(0.3, 0.4, 0.0), coverage_mode="max"
        )
        gains = [p.gain for p in picks]
        assert all(g1 <= g0 + 1e-12 for g0, g1 in zip(gains, gains[1:]))


def test_binary_and_max_agree_on_disjoint_coverage() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        q, s, c, _ = _random_instance(rng)
        n, m = len(s), len(c)
        owner = rng.integers(0, n, size=m)
        cov = [[i for i in range(m) if owner[i] == j] for j in range(n)]
        ids = [f"s{j}" for j in range(n)]
        binary = coverage_aware(q, ids, s, c, cov, k=3, coverage_mode="binary")
        exact = coverage_aware(q, ids, s, c, cov, k=3, coverage_mode="max")
        assert binary == exact


# --------------------------------------------------------------------------------------------------
# Two levels (signature_levels=sessions+books): every chunk is covered by its session and its book
# --------------------------------------------------------------------------------------------------


def _two_level_instance(
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, list[list[int]]]:
    """Books of sessions of chunks, the step-0 ranking a shuffle of the chunks, and the per-chunk
    [session, book unit] lists ``select_signature`` gives ``summary_pool``."""
    owners = []
    for b in range(int(rng.integers(1, 3))):
        for j in range(int(rng.integers(2, 4))):
            owners += [[f"book{b}:s{j:05d}", f"book{b}#book"]] * int(rng.integers(1, 4))
    ranked = [owners[i] for i in rng.permutation(len(owners))]
    ids, cov = summary_pool(ranked)
    d = int(rng.integers(2, 6))
    return _unit_rows(rng, 1, d)[0], ids, _unit_rows(rng, len(ids), d), _unit_rows(rng, len(ranked), d), cov


def test_two_level_pool_covers_each_chunk_by_its_session_and_its_book() -> None:
    ids, cov = summary_pool([["b:s00000", "b#book"], ["b:s00001", "b#book"], ["b:s00000", "b#book"]])
    assert ids == ["b:s00000", "b#book", "b:s00001"]
    assert cov == [[0, 2], [0, 1, 2], [1]]


def test_two_level_selection_matches_brute_force_on_a_small_case() -> None:
    # One book, two sessions: the unit B covers all three chunks, S0 the two best-ranked, S1 the third.
    # B is orthogonal to the query and to the best chunk, so its wide coverage is worth less than S0's
    # and S1's together: the optimum of two is {S0, S1}, and greedy finds it.
    q = np.array([1.0, 0.0])
    ids, cov = summary_pool([["b:s00000", "b#book"], ["b:s00000", "b#book"], ["b:s00001", "b#book"]])
    s = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # S0, B, S1 in pool order
    c = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    lam = (0.3, 0.4, 0.0)
    values = {a: objective(q, s, c, cov, a, lambdas=lam) for a in itertools.combinations(range(3), 2)}
    best = max(values, key=values.__getitem__)
    picks = coverage_aware(q, ids, s, c, cov, k=2, lambdas=lam, coverage_mode="max")
    assert {ids[i] for i in best} == {p.summary_id for p in picks} == {"b:s00000", "b:s00001"}
    assert sum(p.gain for p in picks) == pytest.approx(values[best])
    # With k = 3 the book unit still earns what it explains better than the sessions: the third chunk.
    third = coverage_aware(q, ids, s, c, cov, k=3, lambdas=lam, coverage_mode="max")[2]
    assert third.summary_id == "b#book"
    assert third.coverage > 0


def test_two_level_greedy_reaches_one_minus_one_over_e_of_brute_force() -> None:
    rng = np.random.default_rng(20261204)
    lam = (0.3, 0.4, 0.0)
    optimal = 0
    for _ in range(150):
        q, ids, s, c, cov = _two_level_instance(rng)
        n = len(ids)
        k = int(rng.integers(1, min(4, n) + 1))
        picks = coverage_aware(q, ids, s, c, cov, k=k, lambdas=lam, coverage_mode="max")
        greedy = objective(q, s, c, cov, [ids.index(p.summary_id) for p in picks], lambdas=lam)
        assert sum(p.gain for p in picks) == pytest.approx(greedy)
        best = max(objective(q, s, c, cov, a, lambdas=lam) for a in itertools.combinations(range(n), k))
        assert greedy >= (1 - 1 / math.e) * best - 1e-12
        optimal += greedy >= best - 1e-9
    assert optimal >= 100  # on these small pools greedy is mostly exactly optimal, not just within the bound


# --------------------------------------------------------------------------------------------------
# First-K and the pool
# --------------------------------------------------------------------------------------------------


def test_summary_pool_flat_and_overlapping() -> None:
    assert summary_pool(["b", "a", "b", "c", "a"]) == (["b", "a", "c"], [[0, 2], [1, 4], [3]])
    assert summary_pool([["b", "x"], ["x"], [], "b", ["c", "c"]]) == (
        ["b", "x", "c"],
        [[0, 3], [0, 1], [4]],
    )
    assert summary_pool([]) == ([], [])


def test_summary_pool_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="not a str"):
        summary_pool("abc")
    with pytest.raises(TypeError, match="chunk 1"):
        summary_pool(["a", [3]])


def test_first_k_is_the_deduplicated_prefix() -> None:
    ranked = ["b", "a", "b", "c", "a", "d", "e"]
    picks = first_k(ranked, 3)
    assert [p.summary_id for p in picks] == ["b", "a", "c"]
    # gain = 1/(r+1) for the rank r (1-based) of each summary's first chunk: r = 1, 2, 4.
    assert [p.gain for p in picks] == pytest.approx([1 / 2, 1 / 3, 1 / 5])
    assert all((p.relevance, p.coverage, p.diversity) == (0.0, 0.0, 0.0) for p in picks)
    assert [p.summary_id for p in first_k(ranked, 100)] == ["b", "a", "c", "d", "e"]
    assert [p.summary_id for p in first_k([["x", "b"], "a"], 2)] == ["x", "b"]
    assert first_k([], 5) == []


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------


def test_empty_pool() -> None:
    assert coverage_aware(Q, [], np.empty((0, 2)), C, [], k=5) == []


def test_fewer_summaries_than_k_returns_all_in_greedy_order() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=10)
    assert picks == coverage_aware(Q, IDS, S, C, COV, k=3)
    assert len(picks) == 3


def test_identical_summaries_tie_to_lower_index() -> None:
    q = np.array([0.6, 0.8])
    s = np.array([[0.6, 0.8], [0.6, 0.8], [1.0, 0.0]])
    c = np.array([[0.6, 0.8], [1.0, 0.0]])
    cov = [[0], [0], [1]]
    picks = coverage_aware(q, ["x", "y", "z"], s, c, cov, k=3)
    assert picks[0].summary_id == "x"
    assert coverage_aware(q, ["y", "x", "z"], s, c, cov, k=1)[0].summary_id == "y"
    # y duplicates x: no coverage left and no diversity, so z overtakes it.
    assert [p.summary_id for p in picks] == ["x", "z", "y"]
    assert picks[2].diversity == pytest.approx(0.0, abs=1e-12)


def test_zero_lambdas_fall_back_to_pool_order() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=3, lambdas=(0.0, 0.0, 0.0))
    assert [p.summary_id for p in picks] == IDS


@pytest.mark.parametrize("k", [0, -1])
def test_invalid_k(k: int) -> None:
    with pytest.raises(ValueError, match="k must be a positive"):
        coverage_aware(Q, IDS, S, C, COV, k=k)
    with pytest.raises(ValueError, match="k must be a positive"):
        first_k(IDS, k)


@pytest.mark.parametrize(
    "lambdas", [(-0.1, 0.4, 0.3), (0.3, 0.4, -1e-9), (0.3, float("nan"), 0.3), (0.5, 0.5)]
)
def test_invalid_lambdas(lambdas: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="lambdas"):
        coverage_aware(Q, IDS, S, C, COV, lambdas=lambdas)


def test_invalid_coverage_mode() -> None:
    with pytest.raises(ValueError, match="coverage_mode"):
        coverage_aware(Q, IDS, S, C, COV, coverage_mode="soft")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((Q[None, :], IDS, S, C, COV), r"query_vec must have shape \(d,\), got \(1, 2\)"),
        ((Q, IDS, np.hstack([S, np.zeros((3, 1))]), C, COV), r"summary_vecs .* got \(3, 3\)"),
        ((Q, IDS, S, np.ones((4, 1)), COV), r"chunk_vecs .* got \(4, 1\)"),
        ((Q, IDS[:2], S, C, COV), r"shape \(3, 2\) but there are 2 summary ids"),
        ((Q, IDS, S, C, COV[:2]), r"3 summary ids and 2 coverage lists"),
        ((Q, IDS, S, C, [[0], [4], [1]]), r"\[0, 4\) for chunk_vecs of shape \(4, 2\)"),
        ((Q, IDS, S, C, [[0], [-1], [1]]), r"\[0, 4\)"),
        ((Q, IDS, S, C, [[0], [1.0], [1]]), r"must be integers"),
        ((Q, ["a", "a", "b"], S, C, COV), r"unique"),
        ((Q * 2, IDS, S, C, COV), r"query_vec must be L2-normalised"),
        ((Q, IDS, S, C * np.nan, COV), r"chunk_vecs contains NaN"),
    ],
)
def test_invalid_inputs(args: tuple, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        coverage_aware(*args)


# --------------------------------------------------------------------------------------------------
# Realistic size: K0 = 50 chunks, 50 summaries, d = 384 (timing lives in the benchmarks)
# --------------------------------------------------------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_realistic_size_selection() -> None:
    rng = np.random.default_rng(0)
    d, m, n = 384, 50, 50
    q = _unit(rng.standard_normal(d))
    chunks = _unit(q + 0.3 * rng.standard_normal((m, d)))
    # Chunk i is in summary i, and in a random second summary for overcomplete memory.
    ranked = [[f"s{i}", f"s{int(j)}"] for i, j in enumerate(rng.integers(0, n, size=m))]
    ids, cov = summary_pool(ranked)
    assert len(ids) == n
    by_id = {f"s{j}": j for j in range(n)}
    summaries = _unit(
        np.stack([chunks[by_id[sid]] + 0.3 * _unit(rng.standard_normal(d)) for sid in ids])
    )
    for mode in ("binary", "max"):
        picks = coverage_aware(q, ids, summaries, chunks, cov, k=5, coverage_mode=mode)
        assert len(picks) == 5
        assert len({p.summary_id for p in picks}) == 5
        assert all(math.isfinite(p.gain) for p in picks)
        for p in picks:
            assert p.gain == pytest.approx(p.relevance + p.coverage + p.diversity)
