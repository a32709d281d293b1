"""Unit tests for nodes/signature.py: Appendix A (Algorithm 2) of the MiA-Signature paper.

Fast and offline: tiny hand-computed instances, seeded random instances against the objective
written here from its definition (``paper_gains``, plain loops) and against brute force, and one
realistic-size instance (K0=50 chunks, 50 summaries, d=384).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mia.nodes.signature import SignaturePick, coverage_aware, first_k, summary_pool

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
#   Δ_C(s0) = (1/2·1)/Z_C (c3 now covered)                   Δ_D(s0) = 1 − 0.6 = 0.4
#   Δ(s0) = 0.25 + 0.4·0.5/Z_C + 0.3·0.4 = 0.25 + 0.282220 + 0.12 = 0.652220   ← pick s0
#   Δ_C(s2) = 0 (c1 covered)                                  Δ_D(s2) = 1 − 0.8 = 0.2
#   Δ(s2) = 0.1875 + 0 + 0.06 = 0.2475
# Step 3: only s2 is left; s0 does not cover c1 and s0·s2 = 0, so nothing changes for s2:
#   Δ(s2) = 0.2475.
# --------------------------------------------------------------------------------------------------

Q = np.array([0.8, 0.6])
S = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
C = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]])
COV = [[0, 3], [1, 2, 3], [1]]
IDS = ["s0", "s1", "s2"]
Z_C = 0.8 / 3 + 1 / 4 + 0.96 / 5
LAMBDAS = (0.3, 0.4, 0.3)
"""The λ of the hand computations above (the product's own defaults are the settings')."""


def paper_gains(
    q: np.ndarray,
    s: np.ndarray,
    c: np.ndarray,
    cov: list[list[int]],
    order: list[int] | tuple[int, ...],
    lambdas: tuple[float, float, float],
) -> list[tuple[float, float, float]]:
    """(relevance, coverage, diversity) of each summary of ``order`` (pool indices), picked in that
    order, from the definition (``coverage_aware``'s docstring), one number at a time:

    * relevance ``λ_Q·q_s/Z_Q``, q_s the query cosine, Z_Q its pool maximum (1 if that is not positive);
    * coverage ``λ_C·Σ w_c·m(s,c)/Z_C`` over the chunks of Cov(s) no earlier pick covers, with
      m = max(0, cos), w_c = 1/(r_c + 1) for rank r_c = c + 1, Z_C the pool maximum of the full sum;
    * diversity ``λ_D·(1 − max cos to the earlier picks)``, ``λ_D`` for the first.
    """
    lam_q, lam_c, lam_d = lambdas

    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(sum(x * y for x, y in zip(a, b)))

    def covered_by(j: int, chunks: set[int]) -> float:
        return sum(max(0.0, cos(s[j], c[i])) / (i + 2) for i in chunks)

    def scale(values: list[float]) -> float:
        return max(values) if values and max(values) > 0 else 1.0

    z_q = scale([cos(x, q) for x in s])
    z_c = scale([covered_by(j, set(cov[j])) for j in range(len(s))])
    gains, covered, chosen = [], set(), []
    for j in order:
        relevance = lam_q * cos(s[j], q) / z_q
        coverage = lam_c * covered_by(j, set(cov[j]) - covered) / z_c
        diversity = lam_d * (1.0 - max(cos(s[j], s[a]) for a in chosen)) if chosen else lam_d
        gains.append((relevance, coverage, diversity))
        covered |= set(cov[j])
        chosen.append(j)
    return gains


def objective(q: np.ndarray, s: np.ndarray, c: np.ndarray, cov: list[list[int]], order: list[int] | tuple[int, ...],
              lambdas: tuple[float, float, float]) -> float:
    """The objective of picking ``order`` in that order: its marginal gains, summed."""
    return sum(sum(parts) for parts in paper_gains(q, s, c, cov, order, lambdas))


def _parts(p: SignaturePick) -> tuple[float, float, float, float]:
    return (p.gain, p.relevance, p.coverage, p.diversity)


def test_hand_computed() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=3, lambdas=LAMBDAS)
    assert [p.summary_id for p in picks] == ["s1", "s0", "s2"]
    assert _parts(picks[0]) == pytest.approx((1.0, 0.3, 0.4, 0.3))
    assert _parts(picks[1]) == pytest.approx(
        (0.25 + 0.4 * 0.5 / Z_C + 0.12, 0.25, 0.4 * 0.5 / Z_C, 0.12)
    )
    assert picks[1].gain == pytest.approx(0.652220, abs=1e-6)
    assert _parts(picks[2]) == pytest.approx((0.2475, 0.1875, 0.0, 0.06))
    # The definition written out here agrees with the hand computation.
    assert [(p.relevance, p.coverage, p.diversity) for p in picks] == [
        pytest.approx(g) for g in paper_gains(Q, S, C, COV, [1, 0, 2], LAMBDAS)
    ]


def test_hand_computed_first_pick_only() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=1, lambdas=LAMBDAS)
    assert [p.summary_id for p in picks] == ["s1"]


def test_a_covered_chunk_does_not_count_again_even_when_explained_better() -> None:
    # Pure coverage, λ = (0, 1, 0). Chunks c0 = (1,0) w=1/2, c1 = (0,1) w=1/3.
    #   a = (0.6, 0.8) covers {c0, c1}: cov = 0.6/2 + 0.8/3 = 17/30 = Z_C     ← step 1 picks a
    #   c = (0, 1)     covers {c1}:     cov = 1/3
    #   b = (1, 0)     covers {c0}:     cov = 1/2
    # Step 2: c0 and c1 are both covered, though c and b match them better than a does:
    # Δ(c) = Δ(b) = 0, a tie, which goes to the lower index, c.
    q = np.array([0.6, 0.8])
    s = np.array([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]])
    c = np.array([[1.0, 0.0], [0.0, 1.0]])
    cov = [[0, 1], [1], [0]]
    lam = (0.0, 1.0, 0.0)
    picks = coverage_aware(q, ["a", "c", "b"], s, c, cov, k=2, lambdas=lam)
    assert [p.summary_id for p in picks] == ["a", "c"]
    assert [p.gain for p in picks] == pytest.approx([1.0, 0.0])
    assert objective(q, s, c, cov, [0, 1], lam) == objective(q, s, c, cov, [0, 2], lam) == pytest.approx(1.0)


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
    assert objective(q, s, c, [[0], [0]], [0, 1], (1.0, 1.0, 0.0)) == pytest.approx(-1.4)


def test_diversity_can_exceed_one_for_an_opposite_summary() -> None:
    q = np.array([1.0, 0.0])
    s = np.array([[1.0, 0.0], [-1.0, 0.0]])
    c = np.empty((0, 2))
    picks = coverage_aware(q, ["a", "b"], s, c, [[], []], k=2, lambdas=(0.0, 0.0, 1.0))
    assert [p.diversity for p in picks] == pytest.approx([1.0, 2.0])


# --------------------------------------------------------------------------------------------------
# Seeded random instances against the definition and against brute force
# --------------------------------------------------------------------------------------------------


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    # Non-negative entries keep every cosine ≥ 0, so every gain is ≥ 0 as Proposition 1 assumes.
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


def _check_greedy_against_the_definition(
    q: np.ndarray, ids: list[str], s: np.ndarray, c: np.ndarray, cov: list[list[int]], k: int,
    lambdas: tuple[float, float, float],
) -> list[SignaturePick]:
    """Each pick has the largest marginal gain by the definition, given the picks before it, and
    reports that gain's parts; the gains sum to the objective of the picks."""
    picks = coverage_aware(q, ids, s, c, cov, k=k, lambdas=lambdas)
    assert len(picks) == min(k, len(ids))
    chosen = [ids.index(p.summary_id) for p in picks]
    for step, (pick, j) in enumerate(zip(picks, chosen)):
        gains = {x: sum(paper_gains(q, s, c, cov, [*chosen[:step], x], lambdas)[-1])
                 for x in range(len(ids)) if x not in chosen[:step]}
        assert pick.gain == pytest.approx(max(gains.values()), abs=1e-9)
        assert (pick.relevance, pick.coverage, pick.diversity) == pytest.approx(
            paper_gains(q, s, c, cov, chosen[: step + 1], lambdas)[-1], abs=1e-9)
    assert sum(p.gain for p in picks) == pytest.approx(objective(q, s, c, cov, chosen, lambdas))
    return picks


def test_each_pick_has_the_largest_marginal_gain_by_the_definition() -> None:
    rng = np.random.default_rng(20260506)
    for _ in range(150):
        q, s, c, cov = _random_instance(rng)
        n = len(s)
        lambdas = tuple(float(x) for x in rng.uniform(0.0, 1.0, size=3))
        _check_greedy_against_the_definition(q, [f"s{j}" for j in range(n)], s, c, cov, int(rng.integers(1, n + 2)),
                                             lambdas)  # type: ignore[arg-type]


def test_greedy_is_optimal_when_the_objective_adds_up() -> None:
    # Disjoint coverage and no diversity: a summary's gain does not depend on the others, so the
    # objective of a set is the sum of its members' values and greedy must find the best set.
    rng = np.random.default_rng(11)
    lam = (0.3, 0.4, 0.0)
    for _ in range(50):
        q, s, c, _ = _random_instance(rng)
        n, m = len(s), len(c)
        owner = rng.integers(0, n, size=m)
        cov = [[i for i in range(m) if owner[i] == j] for j in range(n)]
        ids = [f"s{j}" for j in range(n)]
        k = int(rng.integers(1, min(4, n) + 1))
        picks = coverage_aware(q, ids, s, c, cov, k=k, lambdas=lam)
        best = max(objective(q, s, c, cov, a, lam) for a in itertools.combinations(range(n), k))
        assert sum(p.gain for p in picks) == pytest.approx(best)


def test_greedy_gains_do_not_increase_without_diversity() -> None:
    # Diminishing returns seen from the inside: with λ_D = 0, a summary's coverage gain only shrinks
    # as chunks get covered, so each pick's gain is at most the previous one's.
    rng = np.random.default_rng(3)
    for _ in range(50):
        q, s, c, cov = _random_instance(rng)
        ids = [f"s{j}" for j in range(len(s))]
        picks = coverage_aware(q, ids, s, c, cov, k=len(s), lambdas=(0.3, 0.4, 0.0))
        gains = [p.gain for p in picks]
        assert all(g1 <= g0 + 1e-12 for g0, g1 in zip(gains, gains[1:]))


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
    # and S1's together: the best two, in any order, are {S0, S1}, and greedy finds them.
    q = np.array([1.0, 0.0])
    ids, cov = summary_pool([["b:s00000", "b#book"], ["b:s00000", "b#book"], ["b:s00001", "b#book"]])
    s = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # S0, B, S1 in pool order
    c = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    lam = (0.3, 0.4, 0.0)
    values = {a: objective(q, s, c, cov, a, lam) for a in itertools.permutations(range(3), 2)}
    best = max(values, key=values.__getitem__)
    picks = coverage_aware(q, ids, s, c, cov, k=2, lambdas=lam)
    assert {ids[i] for i in best} == {p.summary_id for p in picks} == {"b:s00000", "b:s00001"}
    assert sum(p.gain for p in picks) == pytest.approx(values[best])
    # With k = 3 the book unit comes last, with no coverage gain: the sessions cover every chunk it spans.
    third = coverage_aware(q, ids, s, c, cov, k=3, lambdas=lam)[2]
    assert third.summary_id == "b#book"
    assert third.coverage == 0


def test_two_level_picks_have_the_largest_marginal_gain_by_the_definition() -> None:
    rng = np.random.default_rng(20261204)
    for _ in range(150):
        q, ids, s, c, cov = _two_level_instance(rng)
        _check_greedy_against_the_definition(q, ids, s, c, cov, int(rng.integers(1, min(4, len(ids)) + 1)), LAMBDAS)


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
    assert coverage_aware(Q, [], np.empty((0, 2)), C, [], k=5, lambdas=LAMBDAS) == []


def test_fewer_summaries_than_k_returns_all_in_greedy_order() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=10, lambdas=LAMBDAS)
    assert picks == coverage_aware(Q, IDS, S, C, COV, k=3, lambdas=LAMBDAS)
    assert len(picks) == 3


def test_identical_summaries_tie_to_lower_index() -> None:
    q = np.array([0.6, 0.8])
    s = np.array([[0.6, 0.8], [0.6, 0.8], [1.0, 0.0]])
    c = np.array([[0.6, 0.8], [1.0, 0.0]])
    cov = [[0], [0], [1]]
    picks = coverage_aware(q, ["x", "y", "z"], s, c, cov, k=3, lambdas=LAMBDAS)
    assert picks[0].summary_id == "x"
    assert coverage_aware(q, ["y", "x", "z"], s, c, cov, k=1, lambdas=LAMBDAS)[0].summary_id == "y"
    # y duplicates x: no coverage left and no diversity, so z overtakes it.
    assert [p.summary_id for p in picks] == ["x", "z", "y"]
    assert picks[2].diversity == pytest.approx(0.0, abs=1e-12)


def test_zero_lambdas_fall_back_to_pool_order() -> None:
    picks = coverage_aware(Q, IDS, S, C, COV, k=3, lambdas=(0.0, 0.0, 0.0))
    assert [p.summary_id for p in picks] == IDS


@pytest.mark.parametrize("k", [0, -1])
def test_invalid_k(k: int) -> None:
    with pytest.raises(ValueError, match="k must be a positive"):
        coverage_aware(Q, IDS, S, C, COV, k=k, lambdas=LAMBDAS)
    with pytest.raises(ValueError, match="k must be a positive"):
        first_k(IDS, k)


@pytest.mark.parametrize(
    "lambdas", [(-0.1, 0.4, 0.3), (0.3, 0.4, -1e-9), (0.3, float("nan"), 0.3), (0.5, 0.5)]
)
def test_invalid_lambdas(lambdas: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="lambdas"):
        coverage_aware(Q, IDS, S, C, COV, k=3, lambdas=lambdas)


def test_k_and_lambdas_are_the_callers() -> None:
    """No defaults here: the run's settings hold them, in one place."""
    with pytest.raises(TypeError, match="lambdas"):
        coverage_aware(Q, IDS, S, C, COV, k=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'k'"):
        coverage_aware(Q, IDS, S, C, COV, lambdas=LAMBDAS)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        coverage_aware(Q, IDS, S, C, COV, 3, LAMBDAS)  # type: ignore[misc]


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
        coverage_aware(*args, k=3, lambdas=LAMBDAS)


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
    picks = coverage_aware(q, ids, summaries, chunks, cov, k=5, lambdas=LAMBDAS)
    assert len(picks) == 5
    assert len({p.summary_id for p in picks}) == 5
    assert all(math.isfinite(p.gain) for p in picks)
    for p in picks:
        assert p.gain == pytest.approx(p.relevance + p.coverage + p.diversity)


# --------------------------------------------------------------------------------------------------
# Three levels (signature_levels=sessions+parts+story): a chunk is covered by its session, its part
# and its book's story
# --------------------------------------------------------------------------------------------------


def _angle(a: float) -> np.ndarray:
    return np.array([np.cos(a), np.sin(a)])


def test_three_level_pool_and_selection_match_brute_force_on_a_small_case() -> None:
    # Four chunks of one book: S0 holds the first two, S1 the third, S2 the fourth; part P0 spans S0 and S1,
    # P1 spans S2; the story spans all. The part nearest the query covers three of the four chunks, so it
    # leads; the story, which alone also covers the fourth, follows it.
    owners = [["b:s00000", "b:p0000", "b#story"]] * 2 + [["b:s00001", "b:p0000", "b#story"],
                                                         ["b:s00002", "b:p0001", "b#story"]]
    ids, cov = summary_pool(owners)
    assert ids == ["b:s00000", "b:p0000", "b#story", "b:s00001", "b:s00002", "b:p0001"]
    assert cov == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [2], [3], [3]]
    q = _angle(0.0)
    s = np.array([_angle(a) for a in (1.3, 0.0, 1.4, 0.1, 1.2, 0.3)])  # in pool order
    c = np.array([_angle(a) for a in (0.5, 0.7, 0.9, 1.4)])
    lam = (0.3, 0.4, 0.3)
    expected = [{"b:p0000"}, {"b:p0000", "b#story"}, {"b:p0000", "b#story", "b:s00001"}]
    for k, chosen in zip((1, 2, 3), expected):
        values = {a: objective(q, s, c, cov, a, lam) for a in itertools.permutations(range(len(ids)), k)}
        best = max(values, key=values.__getitem__)
        picks = coverage_aware(q, ids, s, c, cov, k=k, lambdas=lam)
        assert {ids[i] for i in best} == {p.summary_id for p in picks} == chosen
        assert sum(p.gain for p in picks) == pytest.approx(values[best])


def test_three_level_picks_have_the_largest_marginal_gain_by_the_definition() -> None:
    rng = np.random.default_rng(20261207)
    for _ in range(150):
        owners = []
        for b in range(int(rng.integers(1, 3))):
            for j in range(int(rng.integers(2, 7))):
                owners += [[f"book{b}:s{j:05d}", f"book{b}:p{j // 3:04d}", f"book{b}#story"]] * int(rng.integers(1, 3))
        ranked = [owners[i] for i in rng.permutation(len(owners))]
        ids, cov = summary_pool(ranked)
        d = int(rng.integers(2, 6))
        q, s, c = _unit_rows(rng, 1, d)[0], _unit_rows(rng, len(ids), d), _unit_rows(rng, len(ranked), d)
        _check_greedy_against_the_definition(q, ids, s, c, cov, int(rng.integers(1, min(5, len(ids)) + 1)), LAMBDAS)
