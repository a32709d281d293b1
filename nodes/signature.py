"""InitSignature: choose the step-0 MiA-Signature from the session summaries the query lit up.

The step-0 query-only retriever returns K0 ranked chunks; each chunk belongs to one session summary
(or to several, for overlapping windows or multi-level memory, the paper's *overcomplete memory*).
The signature σ0 is a handful of those summaries. Appendix A of the MiA-Signature paper gives two
ways to choose them, both implemented here as pure functions over numpy arrays:

* :func:`first_k` takes the summaries of the best-ranked chunks, de-duplicated. The agent uses it
  because later Update steps repair a weak start.
* :func:`coverage_aware` is Algorithm 2: greedy maximisation of
  ``Δ(s|A) = λ_Q·Δq̃ + λ_C·ΔC + λ_D·Δ_D`` (relevance, chunk coverage, diversity). Static RAG uses it
  because there is no later step to repair the signature.

Conventions shared by every function (they are the paper's, made explicit):

* Chunk row ``i`` of ``chunk_vecs`` has rank ``r_i = i + 1``, so its weight is
  ``w_i = 1/(r_i + 1) = 1/(i + 2)``; the best chunk weighs 1/2.
* Vectors are L2-normalised by the caller, so dot products are cosines. This is checked (a tolerance
  of 1e-3 on each norm) because un-normalised embeddings silently turn "relevance" into "length".
* The relevance and coverage terms are max-normalised once, over the whole pool H0(q), so each lies
  on a [0, 1] scale comparable with diversity. A maximum that is not positive cannot serve as a
  scale (dividing by a negative maximum would reverse the ranking, dividing by zero is undefined),
  so the divisor is then 1: relevances are used as raw cosines, and all-zero coverage stays zero.
* Pool order is the tie-breaker: among gains equal up to 1e-12 (relative), the lower pool index
  wins. :func:`summary_pool` lists summaries in first-appearance order over the ranked chunks, so
  ties go to the summary the retriever ranked first. The tolerance exists because BLAS may round
  identical rows of a matrix product differently.
* Cosines are not clipped where the paper does not clip them: ``q_s`` may be negative, and the
  diversity ``1 - max cos`` may exceed 1 for a summary pointing away from the selection.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_NORM_TOL = 1e-3
_TIE_TOL = 1e-12


@dataclass(frozen=True)
class SignaturePick:
    """One chosen summary, with the marginal gain that won it its place.

    The parts are kept separately (already multiplied by their λ) so that evaluations and traces can
    say *why* a summary was chosen: because it matched the query, because it explained uncovered
    top-ranked chunks, or because it differed from what was already chosen.
    """

    summary_id: str
    gain: float
    """Total marginal gain Δ(s|A) at the moment of the pick: relevance + coverage + diversity."""
    relevance: float
    """λ_Q·Δq̃: the max-normalised query cosine."""
    coverage: float
    """λ_C·ΔC: the max-normalised marginal chunk coverage."""
    diversity: float
    """λ_D·Δ_D: ``λ_D·(1 − max cos to the selection)``, ``λ_D`` for the first pick."""


def summary_pool(
    ranked_chunk_summary_ids: Sequence[Sequence[str]] | Sequence[str],
) -> tuple[list[str], list[list[int]]]:
    """Build the candidate pool H0(q) and the coverage map Cov(s) = π⁻¹(s) from the step-0 ranking.

    ``ranked_chunk_summary_ids[i]`` names the summary (a ``str``) or summaries (a sequence of
    ``str``, possibly empty) of the chunk at rank ``i + 1``. Several ids per chunk model
    overcomplete memory, where a chunk is explained by more than one memory unit; this is where
    coverage overlaps and greedy selection has real work to do.

    Returns ``(summary_ids, coverage)``: summaries in order of first appearance (so pool order is
    step-0 rank order, which is what breaks ties downstream) and, for each, the ascending chunk
    indices it covers. An id repeated within one chunk counts once.

    Raises ``TypeError`` if the argument itself is a string (it would be read character by
    character) or if an id is not a string.
    """
    if isinstance(ranked_chunk_summary_ids, str):
        raise TypeError("ranked_chunk_summary_ids must be a sequence of ids per chunk, not a str")
    index: dict[str, int] = {}
    coverage: list[list[int]] = []
    for chunk, entry in enumerate(ranked_chunk_summary_ids):
        ids = (entry,) if isinstance(entry, str) else entry
        for summary_id in ids:
            if not isinstance(summary_id, str):
                raise TypeError(
                    f"summary ids must be str; chunk {chunk} has {type(summary_id).__name__}"
                )
            j = index.setdefault(summary_id, len(index))
            if j == len(coverage):
                coverage.append([])
            if not coverage[j] or coverage[j][-1] != chunk:
                coverage[j].append(chunk)
    return list(index), coverage


def first_k(
    ranked_summary_ids: Sequence[str] | Sequence[Sequence[str]], k: int
) -> list[SignaturePick]:
    """First-K InitSignature: the summaries of the best-ranked chunks, de-duplicated, at most ``k``.

    Accepts the same per-chunk input as :func:`summary_pool`. First-K optimises no objective, so
    there is no real marginal gain to report; ``gain`` is the rank weight ``1/(r + 1)`` of the
    summary's first chunk (rank ``r``, 1-based), the same weight :func:`coverage_aware` gives that
    chunk, so traces of both selectors read on one scale. The parts are 0 because nothing was
    traded off.

    Raises ``ValueError`` if ``k <= 0``.
    """
    k = _check_k(k)
    summary_ids, coverage = summary_pool(ranked_summary_ids)
    return [
        SignaturePick(
            summary_id, gain=1.0 / (cov[0] + 2), relevance=0.0, coverage=0.0, diversity=0.0
        )
        for summary_id, cov in zip(summary_ids[:k], coverage[:k])
    ]


def coverage_aware(
    query_vec: np.ndarray,
    summary_ids: Sequence[str],
    summary_vecs: np.ndarray,
    chunk_vecs: np.ndarray,
    coverage: Sequence[Sequence[int]],
    *,
    k: int,
    lambdas: tuple[float, float, float],
) -> list[SignaturePick]:
    """Coverage-aware InitSignature: Algorithm 2 of Appendix A, greedy over the pool.

    Shapes: ``query_vec`` (d,); ``summary_vecs`` (N, d) aligned with ``summary_ids`` and
    ``coverage``; ``chunk_vecs`` (M, d) in step-0 rank order; ``coverage[j]`` holds indices into
    ``chunk_vecs`` (they may overlap across summaries). All vectors L2-normalised. ``k`` and
    ``lambdas`` = (λ_Q, λ_C, λ_D) are the run's (``k_sum``, ``lambda_q``, ``lambda_c``,
    ``lambda_d``): the settings hold their defaults, in one place.

    The marginal gain of summary s given the selection A is the sum of three parts:

    * relevance ``λ_Q·q_s/Z_Q``, with ``q_s = e_s·e_q`` and Z_Q its maximum over the pool;
    * coverage ``λ_C·Σ w_c·m(s,c)/Z_C`` over the chunks c of Cov(s) that no summary of A covers
      (Algorithm 2, lines 11 and 20, as printed: once a selected summary lists a chunk in its
      coverage, that chunk stops counting for everyone, however weakly the selected summary matched
      it), with ``m(s,c) = max(0, e_s·e_c)``, ``w_c = 1/(r_c + 1)`` and Z_C the maximum over the
      pool of ``Σ_{c ∈ Cov(s)} w_c·m(s,c)``;
    * diversity ``λ_D·(1 − max_{a ∈ A} e_s·e_a)``, and ``λ_D`` while A is empty.

    Returns the picks in greedy order: ``min(k, N)`` of them, so a pool smaller than ``k`` is
    returned whole, and an empty pool gives ``[]`` without inspecting the arrays. All-zero lambdas
    are allowed and degenerate to pool order.

    Raises ``ValueError`` for ``k <= 0``, a negative or non-finite lambda, duplicate summary ids,
    mismatched shapes, out-of-range coverage indices, or vectors that are not finite and
    L2-normalised.
    """
    k = _check_k(k)
    lam_q, lam_c, lam_d = _check_lambdas(lambdas)
    if len(summary_ids) == 0:
        return []
    if len(set(summary_ids)) != len(summary_ids):
        raise ValueError("summary_ids must be unique: a pool lists each summary once")
    pool = _prepare(query_vec, summary_vecs, chunk_vecs, coverage, n_ids=len(summary_ids))

    n, m = pool.match.shape
    relevance_part = lam_q * pool.relevance
    available = np.ones(n, dtype=bool)
    uncovered = np.ones(m, dtype=bool)  # covered(c) = 0
    nearest = np.full(n, -np.inf)  # max cosine from each summary to the selection
    picks: list[SignaturePick] = []
    for _ in range(min(k, n)):
        delta_c = pool.match @ (pool.weights * uncovered)
        delta_d = 1.0 - nearest if picks else np.ones(n)
        coverage_part = lam_c * delta_c
        diversity_part = lam_d * delta_d
        gain = relevance_part + coverage_part + diversity_part
        gain[~available] = -np.inf
        top = gain.max()
        j = int(np.flatnonzero(gain >= top - _TIE_TOL * max(1.0, abs(top)))[0])

        picks.append(
            SignaturePick(
                summary_id=summary_ids[j],
                gain=float(gain[j]),
                relevance=float(relevance_part[j]),
                coverage=float(coverage_part[j]),
                diversity=float(diversity_part[j]),
            )
        )
        available[j] = False
        uncovered &= ~pool.member[j]
        np.maximum(nearest, pool.gram[:, j], out=nearest)
    return picks


@dataclass(frozen=True)
class _Pool:
    """Everything the greedy loop needs, computed once so each step is a few array operations."""

    relevance: np.ndarray  # (N,) q̃_s = q_s / Z_Q
    match: np.ndarray  # (N, M) m(s, c) where c ∈ Cov(s), else 0
    member: np.ndarray  # (N, M) bool, c ∈ Cov(s)
    weights: np.ndarray  # (M,) w_c / Z_C, folding the coverage normaliser into the chunk weights
    gram: np.ndarray  # (N, N) summary-summary cosines, for diversity


def _prepare(
    query_vec: np.ndarray,
    summary_vecs: np.ndarray,
    chunk_vecs: np.ndarray,
    coverage: Sequence[Sequence[int]],
    n_ids: int,
) -> _Pool:
    q = np.asarray(query_vec, dtype=np.float64)
    s = np.asarray(summary_vecs, dtype=np.float64)
    c = np.asarray(chunk_vecs, dtype=np.float64)
    if q.ndim != 1:
        raise ValueError(f"query_vec must have shape (d,), got {q.shape}")
    d = q.shape[0]
    if s.ndim != 2 or s.shape[1] != d:
        raise ValueError(f"summary_vecs must have shape (N, {d}) to match query_vec, got {s.shape}")
    if c.ndim != 2 or c.shape[1] != d:
        raise ValueError(f"chunk_vecs must have shape (M, {d}) to match query_vec, got {c.shape}")
    n, m = s.shape[0], c.shape[0]
    if n_ids != n or len(coverage) != n:
        raise ValueError(
            f"summary_vecs has shape {s.shape} but there are {n_ids} summary ids and "
            f"{len(coverage)} coverage lists; all three must describe the same N summaries"
        )
    for name, x in (("query_vec", q), ("summary_vecs", s), ("chunk_vecs", c)):
        _check_unit_rows(name, x)

    member = np.zeros((n, m), dtype=bool)
    rows = np.repeat(np.arange(n), [len(cov) for cov in coverage])
    cols = np.asarray([i for cov in coverage for i in cov])
    if cols.size:
        if cols.dtype.kind not in "iu":
            raise ValueError(f"coverage indices must be integers, got dtype {cols.dtype}")
        if cols.min() < 0 or cols.max() >= m:
            raise ValueError(
                f"coverage indices must lie in [0, {m}) for chunk_vecs of shape {c.shape}, "
                f"got range [{cols.min()}, {cols.max()}]"
            )
        member[rows, cols] = True

    q_s = s @ q
    match = np.where(member, np.maximum(s @ c.T, 0.0), 0.0)
    w = 1.0 / (np.arange(m) + 2.0)
    cov_s = match @ w
    return _Pool(
        relevance=q_s / _scale(q_s),
        match=match,
        member=member,
        weights=w / _scale(cov_s),
        gram=s @ s.T,
    )


def _scale(values: np.ndarray) -> float:
    """Max-normaliser Z = max(values), or 1 when that maximum cannot serve as a scale (≤ 0)."""
    top = float(values.max()) if values.size else 0.0
    return top if top > 0.0 else 1.0


def _check_unit_rows(name: str, x: np.ndarray) -> None:
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or inf")
    norms = np.atleast_1d(np.linalg.norm(x, axis=-1))
    off = np.abs(norms - 1.0) > _NORM_TOL
    if off.any():
        i = int(np.argmax(off))
        raise ValueError(f"{name} must be L2-normalised; row {i} has norm {norms[i]:.6g}")


def _check_k(k: int) -> int:
    k = operator.index(k)
    if k <= 0:
        raise ValueError(f"k must be a positive number of summaries, got {k}")
    return k


def _check_lambdas(lambdas: tuple[float, float, float]) -> tuple[float, float, float]:
    if len(lambdas) != 3:
        raise ValueError(f"lambdas must be (λ_Q, λ_C, λ_D), got {len(lambdas)} values")
    lam_q, lam_c, lam_d = (float(x) for x in lambdas)
    if not all(math.isfinite(x) and x >= 0.0 for x in (lam_q, lam_c, lam_d)):
        raise ValueError(f"lambdas must be finite and non-negative, got {tuple(lambdas)}")
    return lam_q, lam_c, lam_d
