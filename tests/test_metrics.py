"""Metrics against values worked out by hand, so a refactor cannot silently shift reported numbers."""

from __future__ import annotations

import random

import pytest

from mia.evals.metrics import (
    answer_in_passages,
    bootstrap_ci,
    choice_accuracy,
    exact_match,
    f1,
    normalize_answer,
    pair_accuracy,
    paired_bootstrap_ci,
    recall_at_k,
    recall_at_tokens,
    strict_recall_at_k,
    strict_recall_at_tokens,
    sub_em,
    within_budget,
)


def test_normalize_answer() -> None:
    assert normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words


def test_f1_hand_computed() -> None:
    # pred -> [cat, sat, on, mat], gold -> [cat, on, mat]: common 3, P = 3/4, R = 1, F1 = 1.5/1.75 = 6/7
    assert f1("The cat sat on the mat", ["a cat on a mat"]) == pytest.approx(6 / 7)
    # gold 1 -> [she, had, golden, hair]: common 2, P = 1, R = 1/2, F1 = 2/3
    # gold 2 -> [red, hair]: common 1, P = R = 1/2, F1 = 1/2; the max over golds is 2/3
    assert f1("golden hair", ["She had golden hair.", "red hair"]) == pytest.approx(2 / 3)
    # pred -> [cat, cat, cat], gold -> [cat, dog]: common min(3, 1) = 1, P = 1/3, R = 1/2, F1 = 2/5
    assert f1("the cat cat cat", ["cat dog"]) == pytest.approx(0.4)
    assert f1("dog", ["cat"]) == 0.0
    assert f1("", ["the"]) == 1.0  # both normalise to nothing
    assert f1("cat", ["a"]) == 0.0


def test_exact_match_and_sub_em() -> None:
    assert exact_match("Rush.", ["rush"]) == 1.0
    assert exact_match("The band Rush", ["Rush"]) == 0.0
    assert exact_match("Toto", ["Rush", "toto!"]) == 1.0
    assert sub_em("The band was Rush.", ["rush"]) == 1.0
    assert sub_em("Rush", ["Rush band"]) == 0.0  # gold inside prediction only, not the reverse
    assert sub_em("anything", ["the"]) == 0.0  # an empty normalised gold matches only an empty prediction
    assert sub_em("", ["an"]) == 1.0


def test_golds_must_be_a_list() -> None:
    with pytest.raises(ValueError):
        f1("rush", "rush")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        exact_match("rush", [])


def test_recall_at_k() -> None:
    gold = [("b1", 100, 200), ("b1", 300, 400), ("b2", 0, 50)]
    retrieved = [
        ("b1", 150, 160),  # inside gold 1
        ("b2", 50, 100),  # touches gold 3 at 50 only: half-open intervals do not overlap
        ("b1", 390, 500),  # overlaps the end of gold 2
        ("b3", 0, 50),  # same offsets as gold 3, other book
        ("b2", 40, 60),  # overlaps gold 3
    ]
    assert recall_at_k(retrieved, gold, 1) == pytest.approx(1 / 3)
    assert recall_at_k(retrieved, gold, 2) == pytest.approx(1 / 3)
    assert recall_at_k(retrieved, gold, 3) == pytest.approx(2 / 3)
    assert recall_at_k(retrieved, gold, 4) == pytest.approx(2 / 3)
    assert recall_at_k(retrieved, gold, 5) == 1.0
    assert recall_at_k(retrieved, gold, 50) == 1.0
    assert recall_at_k([("b2", 100, 200)], [("b1", 100, 200)], 1) == 0.0  # same offsets, other book
    # one chunk covering two gold spans hits both
    assert recall_at_k([("b1", 0, 1000)], gold[:2], 1) == 1.0
    with pytest.raises(ValueError):
        recall_at_k(retrieved, [], 3)
    with pytest.raises(ValueError):
        recall_at_k(retrieved, gold, 0)


def test_strict_recall_at_k() -> None:
    gold = [("b1", 100, 200), ("b1", 200, 400)]  # two adjacent sections of 100 and 200 characters
    # a window straddling the boundary: 30 characters in the first, 170 in the second
    straddling = ("b1", 170, 370)
    assert recall_at_k([straddling], gold, 1) == 1.0  # plain overlap credits both sections
    assert strict_recall_at_k([straddling], gold, 1) == pytest.approx(1 / 2)  # it is mostly the second
    wide = [("b1", 100, 300)]
    # the chunk's rule alone: half of the chunk inside a span counts (a quarter of the span), under half does not
    assert strict_recall_at_k([("b1", 50, 150)], wide, 1) == 1.0
    assert strict_recall_at_k([("b1", 51, 151)], wide, 1) == 1.0  # 49 of 100 outside: 51% inside
    assert strict_recall_at_k([("b1", 49, 149)], wide, 1) == 0.0  # 49% of the chunk, 24.5% of the span
    # the span's rule alone: a chunk holding half of a span counts, however large the chunk
    assert strict_recall_at_k([("b1", 0, 400)], [("b1", 300, 500)], 1) == 1.0  # half of the span, a quarter of the chunk
    assert strict_recall_at_k([("b1", 0, 399)], [("b1", 300, 500)], 1) == 0.0  # 49.5% of the span, 25% of the chunk
    assert strict_recall_at_k([("b1", 0, 600)], wide, 1) == 1.0  # all of the span, a third of the chunk
    assert strict_recall_at_k([("b1", 150, 200)], gold[:1], 1) == 1.0  # wholly inside, however small
    assert strict_recall_at_k([("b1", 150, 150)], gold[:1], 1) == 0.0  # an empty chunk holds nothing
    assert strict_recall_at_k([("b2", 100, 200)], gold[:1], 1) == 0.0  # other book
    assert strict_recall_at_k([("b1", 0, 99), ("b1", 100, 200)], gold, 1) == 0.0
    assert strict_recall_at_k([("b1", 0, 99), ("b1", 100, 200)], gold, 2) == pytest.approx(1 / 2)
    with pytest.raises(ValueError):
        strict_recall_at_k([straddling], [], 1)
    with pytest.raises(ValueError):
        strict_recall_at_k([straddling], gold, 0)
    for share in (0.0, 1.01):
        with pytest.raises(ValueError):
            strict_recall_at_k([straddling], gold, 1, share=share)


def test_recall_at_tokens_by_hand() -> None:
    """Three chunks of 300 tokens (4 characters a token) in rank order; budgets counted by hand."""
    chunks = [("b", 0, 1200), ("b", 1200, 2400), ("b", 2400, 3600)]
    tokens = [300, 300, 300]
    gold = [
        ("b", 100, 200),  # inside chunk 1
        ("b", 1950, 2300),  # the second chunk's later part: 50 characters before a 500-token cut, 350 after
        ("b", 2500, 2600),  # inside chunk 3, which no budget below 600 reaches
    ]
    # 500 tokens: chunk 1 whole (300), then chunk 2 cut to its first 200 of 300 tokens (2/3 of its 1,200
    # characters: 1200..2000), chunk 3 not at all.
    assert within_budget(chunks, tokens, 500) == [("b", 0, 1200), ("b", 1200, 2000)]
    assert recall_at_tokens(chunks, tokens, gold, 500) == pytest.approx(2 / 3)  # gold 2 overlaps the cut part (1950..2000)
    # strict: 50 characters are neither half of the 800-character cut chunk nor half of the 350-character span
    assert strict_recall_at_tokens(chunks, tokens, gold, 500) == pytest.approx(1 / 3)
    # 600 tokens: chunks 1 and 2 whole, and chunk 2 now holds all of gold 2
    assert within_budget(chunks, tokens, 600) == chunks[:2]
    assert recall_at_tokens(chunks, tokens, gold, 600) == strict_recall_at_tokens(chunks, tokens, gold, 600) == pytest.approx(2 / 3)
    # 300 tokens: chunk 1 exactly fills the budget, nothing of chunk 2 is in
    assert within_budget(chunks, tokens, 300) == chunks[:1]
    assert recall_at_tokens(chunks, tokens, gold, 300) == pytest.approx(1 / 3)
    # 100 tokens: a third of chunk 1 (0..400) still holds gold 1 whole
    assert within_budget(chunks, tokens, 100) == [("b", 0, 400)]
    assert strict_recall_at_tokens(chunks, tokens, gold, 100) == pytest.approx(1 / 3)
    assert recall_at_tokens(chunks, tokens, gold, 1000) == strict_recall_at_tokens(chunks, tokens, gold, 1000) == 1.0
    # a cut chunk that mostly is its section still counts for it under the strict rule
    assert strict_recall_at_tokens(chunks, tokens, [("b", 1200, 2400)], 500) == 1.0
    # the cut rounds up to a whole character: 1 token of a 3-token, 10-character chunk keeps 4 characters
    assert within_budget([("b", 0, 10)], [3], 1) == [("b", 0, 4)]
    with pytest.raises(ValueError):
        within_budget(chunks, tokens[:2], 500)
    with pytest.raises(ValueError):
        recall_at_tokens(chunks, tokens, gold, 0)


def test_strict_recall_matches_brute_force_over_characters() -> None:
    """Random small layouts scored by counting characters as sets, against the interval arithmetic."""
    rng = random.Random(0)

    def reference(retrieved: list[tuple[str, int, int]], gold: list[tuple[str, int, int]], k: int, share: float) -> float:
        hits = 0
        for g_book, g_start, g_end in gold:
            span = set(range(g_start, g_end))
            hits += any(
                book == g_book and (inside := len(span & set(range(start, end)))) > 0
                and (inside >= share * (end - start) or inside >= share * len(span))
                for book, start, end in retrieved[:k]
            )
        return hits / len(gold)

    for _ in range(500):
        gold = [(rng.choice("ab"), s, s + rng.randint(1, 30)) for s in rng.sample(range(100), 3)]
        retrieved = [(rng.choice("ab"), s, s + rng.randint(0, 40)) for s in (rng.randint(0, 110) for _ in range(5))]
        share = rng.choice((0.5, 0.25, 1.0))
        for k in (1, 3, 5):
            assert strict_recall_at_k(retrieved, gold, k, share) == pytest.approx(reference(retrieved, gold, k, share))
            assert strict_recall_at_k(retrieved, gold, k, share) <= recall_at_k(retrieved, gold, k)


def test_choice_and_pair_accuracy() -> None:
    assert choice_accuracy("(b)", "B") == 1.0
    assert choice_accuracy("B.", "b") == 1.0
    assert choice_accuracy("C", "B") == 0.0
    assert choice_accuracy("", "A") == 0.0
    pairs = [
        (True, True, False, False),  # both right
        (True, True, True, False),  # second wrong: the pair fails
        ("yes", "Yes", "no", "NO "),  # both right, case and spacing ignored
    ]
    assert pair_accuracy(pairs) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        pair_accuracy([])


def test_bootstrap_ci() -> None:
    values = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    mean, lo, hi = bootstrap_ci(values)
    assert mean == pytest.approx(0.7)
    assert lo <= mean <= hi
    assert 0.0 <= lo < hi <= 1.0
    assert bootstrap_ci(values) == (mean, lo, hi)  # same seed, same interval
    assert bootstrap_ci([0.5] * 7) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_paired_bootstrap_ci() -> None:
    a = [0.9, 0.4, 0.7, 1.0, 0.2, 0.6]
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0, 0.0)
    mean, lo, hi = paired_bootstrap_ci(a, [x - 0.1 for x in a])  # constant difference: no spread
    assert (mean, lo, hi) == pytest.approx((0.1, 0.1, 0.1))
    b = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    mean, lo, hi = paired_bootstrap_ci(a, b, seed=3)
    assert mean == pytest.approx(sum(a) / 6 - 0.5)
    assert lo <= mean <= hi
    assert paired_bootstrap_ci(a, b, seed=3) == (mean, lo, hi)
    with pytest.raises(ValueError):
        paired_bootstrap_ci(a, b[:-1])


def test_answer_in_passages_needs_every_word_of_one_reference() -> None:
    passages = ["Siddhartha went back to the river.", "He thought of killing himself, the ferryman said."]
    assert answer_in_passages(passages, ["By the river."]) == 0.0  # "by" is not one of the passages' words
    assert answer_in_passages(passages, ["The river"]) == 1.0  # articles and punctuation are normalised away
    assert answer_in_passages(passages, ["He thinks of killing himself."]) == 0.0  # "thinks" is not "thought"
    assert answer_in_passages(passages, ["He thinks of killing himself.", "killing himself"]) == 1.0  # any reference
    assert answer_in_passages(passages, ["riv"]) == 0.0  # whole words, not substrings
    assert answer_in_passages([], ["river"]) == 0.0
    with pytest.raises(ValueError, match="non-empty list"):
        answer_in_passages(passages, "river")
