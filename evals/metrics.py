"""Scoring functions for the evaluation protocol (docs/design.md §5), pure and dependency-light.

Answer metrics follow the SQuAD conventions so numbers are comparable with the papers we reproduce;
each takes one prediction and a list of acceptable golds and scores the best gold. Recall@k works on
character spans, so it is defined whatever the chunk size; strict recall@k also asks how much of a
chunk or of the gold span they share, so it can tell chunkers apart. Recall at N tokens scores the
same rules on the first N retrieved tokens rather than the first k chunks, so systems whose chunks
differ in size are compared on the same amount of text. Confidence intervals are percentile
bootstraps with a fixed seed, so a rerun reports the same interval.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np

Span = tuple[str, int, int]
"""(book, start, end): character offsets into the book's text, end exclusive."""

TOKEN_BUDGETS = (500, 1000, 2000, 4000)
"""Retrieved-token budgets of recall at N tokens (``recall_at_tokens``): about 2, 5, 10 and 20
chunks of MiA's 200 tokens."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _require_golds(golds: Sequence[str]) -> None:
    if isinstance(golds, str) or not golds:
        raise ValueError("golds must be a non-empty list of strings (a bare string would be scored per character)")


def _f1_one(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # SQuAD v2 convention: two empty answers agree, an empty one against a real one scores 0.
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-overlap F1 against the best-matching gold."""
    _require_golds(golds)
    return max(_f1_one(prediction, gold) for gold in golds)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold."""
    _require_golds(golds)
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in golds))


def sub_em(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when some normalised gold is a substring of the normalised prediction.

    One direction only (gold inside prediction), as in MemAgent / InfMem: it forgives a verbose but
    correct answer, while a prediction that is merely a fragment of the gold gets no credit. Plain
    substring on normalised text, as those papers do, so "1987" contains the gold "198"; an empty
    normalised gold only matches an empty prediction.
    """
    _require_golds(golds)
    pred = normalize_answer(prediction)
    normalized = (normalize_answer(gold) for gold in golds)
    return float(any(gold in pred if gold else not pred for gold in normalized))


def answer_in_passages(passages: Sequence[str], golds: Sequence[str]) -> float:
    """1.0 when every word of some reference answer (SQuAD-normalised) occurs in the passages.

    It splits a wrong answer into a retrieval miss (the reader never saw the answer's words) and a
    reading miss (it saw them and answered otherwise). Words, not the phrase: a free-text reference
    ("He must become wealthy") is rarely quoted verbatim by the book, while its words are there.
    """
    _require_golds(golds)
    seen = set(normalize_answer(" ".join(passages)).split())
    return float(any(words and set(words) <= seen for words in (normalize_answer(g).split() for g in golds)))


def recall_at_k(retrieved: Sequence[Span], gold: Sequence[Span], k: int) -> float:
    """Share of gold spans overlapped by at least one of the top-k retrieved chunks.

    Overlap, not containment, so the score is defined whatever the chunk size: a chunk hits a gold
    span when both are in the same book and their half-open intervals intersect.
    """
    return _recall(retrieved, gold, k, share=0.0)


def strict_recall_at_k(retrieved: Sequence[Span], gold: Sequence[Span], k: int, share: float = 0.5) -> float:
    """Share of gold spans that one of the top-k chunks mostly is or mostly holds: at least
    ``share`` of the chunk lies inside the span, or the chunk holds at least ``share`` of the span.

    Plain overlap (``recall_at_k``) lets a chunk that straddles a boundary hit the spans on both
    sides, so it rewards chunkers for where they cut: a fixed window that crosses a section
    boundary is credited with both sections, a chunk that ends at the paragraph with one. This rule
    credits a chunk with a span only when it mostly is that span or holds most of it.
    """
    _check_share(share)
    return _recall(retrieved, gold, k, share)


def within_budget(retrieved: Sequence[Span], tokens: Sequence[int], budget: int) -> list[Span]:
    """What a reader given the first ``budget`` retrieved tokens holds: the chunks in rank order
    while their ``tokens`` add up to at most ``budget``, then the chunk that crosses the budget cut
    to its first (budget − used) tokens; the chunks after it not at all.

    Cut rather than dropped, so every system is scored on exactly ``budget`` tokens whatever its
    chunk size: dropping the crossing chunk would leave a system of 1,000-token chunks up to 999
    tokens short of the budget and one of 100-token chunks at most 99, which is the bias towards
    small chunks that a token budget is there to remove. Spans carry no text, so the cut is placed
    in proportion by characters (rounded up, so the partly counted token is in): exact at a chunk's
    ends, and within it off by how unevenly its tokens spread over its characters.
    """
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")
    if len(tokens) != len(retrieved):
        raise ValueError(f"one token count per retrieved chunk: got {len(tokens)} for {len(retrieved)} chunks")
    taken: list[Span] = []
    used = 0
    for (book, start, end), count in zip(retrieved, tokens):
        if used + count <= budget:
            taken.append((book, start, end))
            used += count
            continue
        left = budget - used
        if left > 0:
            taken.append((book, start, start + math.ceil((end - start) * left / count)))
        break
    return taken


def recall_at_tokens(retrieved: Sequence[Span], tokens: Sequence[int], gold: Sequence[Span], budget: int) -> float:
    """``recall_at_k``'s rule on the first ``budget`` retrieved tokens (``within_budget``)."""
    return _covered(within_budget(retrieved, tokens, budget), gold, share=0.0)


def strict_recall_at_tokens(retrieved: Sequence[Span], tokens: Sequence[int], gold: Sequence[Span], budget: int,
                            share: float = 0.5) -> float:
    """``strict_recall_at_k``'s rule on the first ``budget`` retrieved tokens (``within_budget``):
    a chunk cut at the budget counts by the part of it that is in."""
    _check_share(share)
    return _covered(within_budget(retrieved, tokens, budget), gold, share)


def _check_share(share: float) -> None:
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")


def _recall(retrieved: Sequence[Span], gold: Sequence[Span], k: int, share: float) -> float:
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    return _covered(retrieved[:k], gold, share)


def _covered(chunks: Sequence[Span], gold: Sequence[Span], share: float) -> float:
    """Every recall: the share of gold spans hit by one of ``chunks``, where a chunk hits a span of
    its book that it overlaps by at least ``share`` of its own length or of the span's (``share``
    0: any overlap at all)."""
    if not gold:
        raise ValueError("recall is undefined without gold spans; skip such questions")

    def hits(chunk: Span, span: Span) -> bool:
        (book, start, end), (g_book, g_start, g_end) = chunk, span
        inside = min(end, g_end) - max(start, g_start)
        return book == g_book and inside > 0 and (inside >= share * (end - start) or inside >= share * (g_end - g_start))

    return sum(any(hits(chunk, span) for chunk in chunks) for span in gold) / len(gold)


def _letter(choice: str) -> str:
    return choice.strip().strip("().:").strip().upper()


def choice_accuracy(pred_letter: str, label: str) -> float:
    """Multiple choice: 1.0 when the letters agree, tolerating case and "(B)" / "B." wrapping."""
    return float(bool(_letter(pred_letter)) and _letter(pred_letter) == _letter(label))


def _same_claim(pred: str | bool, gold: str | bool) -> bool:
    if isinstance(pred, str) and isinstance(gold, str):
        return pred.strip().casefold() == gold.strip().casefold()
    return pred == gold


def pair_accuracy(pairs: Sequence[tuple[str | bool, str | bool, str | bool, str | bool]]) -> float:
    """NoCha pair accuracy: a (true claim, false claim) pair counts only when both are judged right.

    Each pair is ``(pred1, gold1, pred2, gold2)``; this removes the credit a model earns by always
    answering the same way.
    """
    if not pairs:
        raise ValueError("pair_accuracy needs at least one pair")
    return sum(_same_claim(p1, g1) and _same_claim(p2, g2) for p1, g1, p2, g2 in pairs) / len(pairs)


def _percentile_ci(
    values: np.ndarray, n: int, seed: int, alpha: float
) -> tuple[float, float, float]:
    if values.size == 0:
        raise ValueError("bootstrap needs at least one value")
    if n <= 0:
        raise ValueError(f"n (bootstrap resamples) must be positive, got {n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n, values.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(values.mean()), float(lo), float(hi)


def bootstrap_ci(
    values: Sequence[float], n: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap interval of the mean over questions."""
    return _percentile_ci(np.asarray(values, dtype=float), n, seed, alpha)


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], n: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """(mean, lo, hi) of mean(a - b), resampling questions jointly.

    Two systems scored on the same questions are correlated; resampling the per-question
    differences gives a much tighter, honest interval than comparing two separate intervals.
    """
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"paired scores must have the same length, got {a_arr.size} and {b_arr.size}")
    return _percentile_ci(a_arr - b_arr, n, seed, alpha)
