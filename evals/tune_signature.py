"""Tune and measure the signature strategies on fairytale-series (issue 8), retrieval only.

Why a script of its own and not ``mia eval --sweep``: the grid has hundreds of settings over a
few thousand train+val questions, and the graphs pay a whole run per question per setting.
Here every question is embedded once, the whole collection's vectors are held in memory, and each
setting is scored with the same functions the graphs run (``nodes.signature`` selection,
``nodes.retrieval.prior_weights`` / ``vote_relevance`` / ``prior_scores``). Scoring every chunk
exactly equals the graphs' E2 ranking (``dual_signal`` rescoring exactly; ``membership_prior``
scoring E1 top-N ∪ the signature's sessions, which contains the exact top k); the graphs searched
Chroma's approximate index when this was run, which the check run below bounds (they search exactly
since de40d50).

Protocol: the grid is scored on train + val only; the best setting by mean R@10 there is then
run ONCE on test, beside the colleague's table reproduced on the same questions, and — as the
number of record — through the real graphs with ``evals.runner.run_eval`` (rag vs mia_rag with
the chosen settings), whose per-question scores give the paired bootstrap interval.

The books of every split are the same four merged origin books (only the questions differ), so
one collection serves all three splits; the script checks that the sources are identical.

    MIA_HOME=/tmp/miahome-sig python -m evals.tune_signature --out evals/results/signature-payoff
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import bm25s
import numpy as np

from evals import metrics
from evals.runner import RECALL_KS, Part, _book_ids, collection_name, prepare_parts, run_eval
from nodes.retrieval import prior_scores, prior_weights, vote_relevance
from nodes.signature import coverage_aware, first_k, summary_pool
from stores.bm25 import tokenize
from stores.embeddings import load_embedder
from stores.ingest import IngestOptions
from stores.mindscape import Mindscape

K0 = 50
RRF_K = 60


@dataclass
class Corpus:
    """The collection in memory: chunk vectors and owners, summary vectors, BM25 over chunk texts."""

    ids: list[str]
    vecs: np.ndarray
    owner: np.ndarray
    """Index of each chunk's summary in ``sum_ids``."""
    spans: list[tuple[str, int, int]]
    sum_ids: list[str]
    sum_vecs: np.ndarray
    bm25: Any


@dataclass
class Question:
    """One question with everything a setting needs, computed once."""

    id: str
    split: str
    q: np.ndarray
    dense: np.ndarray
    hybrid: np.ndarray
    """RRF of the BM25 and dense ranks, scaled so that rank 1 in both gives 1."""
    gold_hits: list[np.ndarray]
    """For each gold span, the chunk indices that overlap it."""
    n_gold: int


def series_parts(out: Path) -> tuple[Path, dict[str, Part]]:
    """``out`` and its ``.cache`` folder created, and the fairytale-series train/val/test parts
    built there; refused unless the three splits share their books, so one collection serves all."""
    out.mkdir(parents=True, exist_ok=True)
    cache = out / ".cache"
    cache.mkdir(exist_ok=True)
    parts = {split: prepare_parts("fairytale-series", split, [], 0, out)[0] for split in ("train", "val", "test")}
    digests = {s: [hashlib.sha256(Path(part.dataset.dir, src["file"]).read_bytes()).hexdigest() for src in part.dataset.manifest["sources"]]
               for s, part in parts.items()}
    if len({json.dumps(d) for d in digests.values()}) != 1:
        raise SystemExit("the splits' source books differ: one collection cannot serve them all")
    return cache, parts


def load_corpus(name: str, book_map: dict[str, str]) -> Corpus:
    store = Mindscape(name)
    got = store.chunks.get(include=["embeddings", "metadatas", "documents"])
    order = sorted(range(len(got["ids"])), key=lambda i: (got["metadatas"][i]["book"], got["metadatas"][i]["index"]))
    ids = [got["ids"][i] for i in order]
    metas = [got["metadatas"][i] for i in order]
    texts = [got["documents"][i] for i in order]
    sums = store.summaries.get(include=["embeddings"])
    sum_index = {s: j for j, s in enumerate(sums["ids"])}
    retriever = bm25s.BM25()
    retriever.index([tokenize(t) for t in texts], show_progress=False)
    return Corpus(
        ids=ids,
        vecs=np.asarray([got["embeddings"][i] for i in order], dtype=np.float32),
        owner=np.asarray([sum_index[m["summary_id"]] for m in metas]),
        spans=[(book_map.get(m["book"], m["book"]), int(m["start"]), int(m["end"])) for m in metas],
        sum_ids=list(sums["ids"]),
        sum_vecs=np.asarray(sums["embeddings"], dtype=np.float32),
        bm25=retriever,
    )


def prepare_questions(corpus: Corpus, questions: Sequence[dict[str, Any]], split: str, cache: Path) -> list[Question]:
    """Embed (cached on disk by text) and pre-score every question once."""
    texts = [q["question"] for q in questions]
    key = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:12]
    path = cache / f"q-{split}-{key}.npy"
    if path.exists():
        qv = np.load(path)
    else:
        # MiniLM embeds queries and passages alike, so one batched call equals per-query embed_query.
        qv = load_embedder("minilm").embed_documents(texts)
        np.save(path, qv)
    n = len(corpus.ids)
    out: list[Question] = []
    for question, q in zip(questions, qv):
        dense = corpus.vecs @ q
        raw = corpus.bm25.get_scores(tokenize(question["question"]))
        rank_d = np.empty(n)
        rank_d[np.argsort(-dense, kind="stable")] = np.arange(1, n + 1)
        rank_b = np.empty(n)
        rank_b[np.argsort(-raw, kind="stable")] = np.arange(1, n + 1)
        hybrid = (1.0 / (RRF_K + rank_d) + 1.0 / (RRF_K + rank_b)) * (RRF_K + 1) / 2.0
        gold = [(g["book"], g["start"], g["end"]) for g in question["gold"]]
        hits = [np.asarray([i for i, (b, s, e) in enumerate(corpus.spans) if b == gb and s < ge and gs < e]) for gb, gs, ge in gold]
        out.append(Question(question["id"], split, q, dense, hybrid, hits, len(gold)))
    return out


def recalls(order: np.ndarray, question: Question) -> dict[int, float]:
    """R@k from a ranking (chunk indices, best first): the harness's overlap rule, precomputed."""
    rank = {int(c): r for r, c in enumerate(order[: max(RECALL_KS)])}
    first = [min((rank[int(c)] for c in hits if int(c) in rank), default=10**9) for hits in question.gold_hits]
    return {k: 100.0 * sum(f < k for f in first) / question.n_gold for k in RECALL_KS}


def top(score: np.ndarray) -> np.ndarray:
    return np.argsort(-score, kind="stable")[: max(RECALL_KS)]


# --------------------------------------------------------------------------- signatures


def signature(corpus: Corpus, question: Question, step0: np.ndarray, init: str, k: int) -> list[int]:
    """InitSignature (summary indices) over the step-0 chunk ranking, as ``nodes.qa.select_signature``."""
    ranked = [corpus.sum_ids[corpus.owner[c]] for c in step0]
    if init == "first_k":
        picks = first_k(ranked, k)
    else:
        pool, coverage = summary_pool(ranked)
        index = {s: j for j, s in enumerate(corpus.sum_ids)}
        picks = coverage_aware(question.q, pool, corpus.sum_vecs[[index[s] for s in pool]], corpus.vecs[step0], coverage, k=k)
    index = {s: j for j, s in enumerate(corpus.sum_ids)}
    return [index[p.summary_id] for p in picks]


def weights_of(corpus: Corpus, question: Question, step0: np.ndarray, sig: list[int], mode: str, tau: float) -> dict[str, float]:
    ids = [corpus.sum_ids[s] for s in sig]
    if mode == "votes":
        rel = vote_relevance([(corpus.sum_ids[corpus.owner[c]], float(question.dense[c])) for c in step0], ids, tau)
    else:
        rel = list(corpus.sum_vecs[sig] @ question.q)
    return dict(zip(ids, (float(w) for w in prior_weights(rel, tau))))


# --------------------------------------------------------------------------- systems


System = Callable[[Question], np.ndarray]


def make_query_only(_: Corpus) -> System:
    return lambda q: top(q.dense)


def make_hybrid(_: Corpus) -> System:
    return lambda q: top(q.hybrid)


def make_centroid(corpus: Corpus, init: str, alpha: float, k_sum: int) -> System:
    def run(q: Question) -> np.ndarray:
        step0 = top_k0(q.dense)
        sig = signature(corpus, q, step0, init, k_sum)
        c = corpus.sum_vecs[sig].mean(axis=0)
        c = c / max(float(np.linalg.norm(c)), 1e-12)
        return top((1 - alpha) * q.dense + alpha * (corpus.vecs @ c))
    return run


def top_k0(score: np.ndarray) -> np.ndarray:
    return np.argsort(-score, kind="stable")[:K0]


@dataclass(frozen=True)
class PriorSetting:
    init: str
    k_sum: int
    weights: str
    tau: float
    alpha: float
    gate: float
    step0: str = "dense"
    """Which ranking feeds the signature: ``dense`` (E1 as in the paper) or ``hybrid`` (BM25+dense RRF)."""
    base: str = "dense"
    """The first term of Eq. 4: dense s_qry (as the graphs) or the hybrid score."""

    def label(self) -> str:
        extra = "".join(f",{k}={v}" for k, v in (("step0", self.step0), ("base", self.base)) if v != "dense")
        return (f"prior[{self.init},k_sum={self.k_sum},w={self.weights},tau={self.tau},"
                f"alpha={self.alpha},gate={self.gate}{extra}]")


def prior_rankings(corpus: Corpus, questions: Sequence[Question], settings: Sequence[PriorSetting]) -> dict[PriorSetting, list[np.ndarray]]:
    """Rankings of many prior settings, sharing signature and weight computations between them."""
    out: dict[PriorSetting, list[np.ndarray]] = {s: [] for s in settings}
    groups: dict[tuple[str, str, int], list[PriorSetting]] = {}
    for s in settings:
        groups.setdefault((s.step0, s.init, s.k_sum), []).append(s)
    kmax = max(s.k_sum for s in settings)
    owner_ids = [corpus.sum_ids[o] for o in corpus.owner]
    for q in questions:
        cache: dict[tuple[str, str], list[int]] = {}
        for (step0_kind, init, k_sum), members in groups.items():
            step0 = top_k0(q.dense if step0_kind == "dense" else q.hybrid)
            if (step0_kind, init) not in cache:
                cache[(step0_kind, init)] = signature(corpus, q, step0, init, kmax)  # greedy: prefixes are the smaller K_sum
            sig = cache[(step0_kind, init)][:k_sum]
            wcache: dict[tuple[str, float], dict[str, float]] = {}
            for s in members:
                if (s.weights, s.tau) not in wcache:
                    wcache[(s.weights, s.tau)] = weights_of(corpus, q, step0, sig, s.weights, s.tau)
                base = q.dense if s.base == "dense" else q.hybrid
                score, _, _ = prior_scores(base, owner_ids, wcache[(s.weights, s.tau)], s.alpha, s.gate)
                out[s].append(top(score))
    return out


# --------------------------------------------------------------------------- reporting


def evaluate(orders: Sequence[np.ndarray], questions: Sequence[Question]) -> dict[int, list[float]]:
    per = [recalls(o, q) for o, q in zip(orders, questions)]
    return {k: [p[k] for p in per] for k in RECALL_KS}


def row(name: str, scores: dict[int, list[float]], baseline: dict[int, list[float]] | None, extra: str = "") -> str:
    cells = []
    for k in RECALL_KS:
        mean, lo, hi = metrics.bootstrap_ci(scores[k])
        cells.append(f"{mean:.1f} [{lo:.1f}, {hi:.1f}]")
    diff = ""
    if baseline is not None:
        d, lo, hi = metrics.paired_bootstrap_ci(scores[10], baseline[10])
        diff = f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    return f"| {name} | " + " | ".join(cells) + f" | {diff} | {extra} |"


HEADER = "| system | R@1 | R@5 | R@10 | R@20 | ΔR@10 vs query-only (paired 95%) | notes |\n|---|---|---|---|---|---|---|"


def grid() -> list[PriorSetting]:
    settings = [
        PriorSetting(init, k_sum, w, tau, alpha, gate)
        for init, k_sum, w, tau, alpha, gate in itertools.product(
            ("coverage", "first_k"), (1, 3, 5, 10), ("votes", "relevance"), (0.02, 0.05),
            (0.1, 0.2, 0.3, 0.5), (0.0, 0.4, 0.6),
        )
    ]
    # Direction 2: a hybrid step 0 (and base), on the paper's First-K/coverage defaults only.
    settings += [
        PriorSetting("first_k", k_sum, "votes", tau, alpha, gate, step0="hybrid", base=base)
        for k_sum, tau, alpha, gate, base in itertools.product(
            (3, 10), (0.02,), (0.1, 0.2, 0.3, 0.5), (0.0, 0.4, 0.6), ("dense", "hybrid"),
        )
    ]
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("evals/results/signature-payoff"))
    p.add_argument("--window", type=int, default=5, help="ingestion window W (summaries per W chunks)")
    p.add_argument("--tune-limit", type=int, default=1200, help="at most this many train questions, to fit 2 shared cores (val is used whole)")
    p.add_argument("--skip-harness", action="store_true", help="do not run the chosen setting through the graphs")
    args = p.parse_args(argv)
    started = time.time()
    out: Path = args.out
    cache, parts = series_parts(out)
    options = IngestOptions(window=args.window, summarizer="extractive")
    test_part = parts["test"]
    # Ingest (or reuse) the collection and get the query-only baseline through the harness itself.
    harness_out = out / f"harness-w{args.window}"
    run_eval("fairytale-series", "test", ["rag"], retrieval_only=True, out=harness_out, progress=False,
             settings={"window": str(args.window)}, summarizer="extractive")
    name = collection_name(test_part, options, "minilm", None)
    corpus = load_corpus(name, _book_ids(test_part.dataset))
    tune_q = [q for q in parts["train"].dataset.questions][: args.tune_limit] + list(parts["val"].dataset.questions)
    tune = prepare_questions(corpus, [q for q in tune_q if q.get("gold")], "trainval", cache)
    test = prepare_questions(corpus, [q for q in test_part.dataset.questions if q.get("gold")], "test", cache)
    print(f"corpus {name}: {len(corpus.ids)} chunks, {len(corpus.sum_ids)} summaries; tune {len(tune)} q, test {len(test)} q", flush=True)

    # ---- grid on train+val
    settings = grid()
    t0 = time.time()
    ranked = prior_rankings(corpus, tune, settings)
    base_tune = evaluate([make_query_only(corpus)(q) for q in tune], tune)
    tuned = sorted(((float(np.mean(evaluate(o, tune)[10])), s) for s, o in ranked.items()), key=lambda x: -x[0])
    grid_seconds = time.time() - t0
    best = tuned[0][1]
    best_dense = next(s for _, s in tuned if s.step0 == "dense" and s.base == "dense")
    (out / f"grid-w{args.window}.jsonl").write_text("".join(json.dumps({"setting": s.label(), "trainval_r10": round(r, 3)}) + "\n" for r, s in tuned))

    # ---- test, once
    systems: list[tuple[str, System]] = [("rag (query-only, in-memory)", make_query_only(corpus))]
    for init, alpha in itertools.product(("coverage", "first_k"), (0.2, 0.5)):
        systems.append((f"mia_rag centroid {init} α={alpha} (paper)", make_centroid(corpus, init, alpha, 5)))
    systems.append(("hybrid E1 (BM25+dense RRF), no signature", make_hybrid(corpus)))
    test_rows: list[str] = []
    base_test = evaluate([systems[0][1](q) for q in test], test)
    timing: dict[str, float] = {}
    for label, make in systems:
        t = time.perf_counter()
        orders = [make(q) for q in test]
        timing[label] = 1000 * (time.perf_counter() - t) / len(test)
        test_rows.append(row(label, evaluate(orders, test), base_test if label != systems[0][0] else None, f"{timing[label]:.1f} ms/q"))
    chosen = [best] if best == best_dense else [best, best_dense]
    for s in chosen:
        t = time.perf_counter()
        orders = prior_rankings(corpus, test, [s])[s]
        ms = 1000 * (time.perf_counter() - t) / len(test)
        tv = next(r for r, x in tuned if x == s)
        test_rows.append(row(f"**{s.label()}** (tuned, train+val R@10 {tv:.1f})", evaluate(orders, test), base_test, f"{ms:.1f} ms/q"))

    # ---- the number of record: the graphs, through the harness, with the best dense setting
    harness_rows: list[str] = []
    harness_cmd = ""
    if not args.skip_harness:
        s = best_dense
        settings_map = {"window": str(args.window), "mia_rag:sig_strategy": "prior", "mia_rag:signature_init": s.init,
                        "mia_rag:k_sum": str(s.k_sum), "mia_rag:prior_weights": s.weights,
                        "mia_rag:prior_temperature": str(s.tau), "mia_rag:alpha": str(s.alpha), "mia_rag:prior_gate": str(s.gate)}
        harness_cmd = ("mia eval --dataset fairytale-series --split test --systems rag,mia_rag --retrieval-only "
                       + " ".join(f"--set {k}={v}" for k, v in settings_map.items()) + f" --out {harness_out}")
        res = run_eval("fairytale-series", "test", ["rag", "mia_rag"], retrieval_only=True, out=harness_out, progress=False,
                       settings=settings_map, summarizer="extractive", command=harness_cmd)
        by: dict[str, dict[str, dict[str, float]]] = {}
        secs: dict[str, list[float]] = {}
        for r in res.records:
            by.setdefault(r["system"], {})[r["id"]] = r["scores"]
            secs.setdefault(r["system"], []).append(r["seconds"])
        ids = sorted(by["rag"])
        scores = {sys_: {k: [by[sys_][i][f"recall@{k}"] for i in ids] for k in RECALL_KS} for sys_ in by}
        for sys_ in ("rag", "mia_rag"):
            harness_rows.append(row(f"{sys_} (graphs, harness)", scores[sys_], scores["rag"] if sys_ != "rag" else None,
                                    f"{1000 * float(np.median(secs[sys_])):.0f} ms/q median wall"))
        ratio = float(np.mean(scores["mia_rag"][10])) / float(np.mean(scores["rag"][10]))
        harness_rows.append(f"\nmia_rag / rag R@10 = {ratio:.3f} (goal ≥ 1.15)")

    cmd = shlex.join(["python", "-m", "evals.tune_signature", *(argv if argv is not None else sys.argv[1:])])
    top10 = "\n".join(f"| {s.label()} | {r:.2f} |" for r, s in tuned[:15])
    by_dir: dict[str, tuple[float, PriorSetting]] = {}
    for r, s in tuned:
        key = f"step0={s.step0}, base={s.base}, init={s.init}, weights={s.weights}, gate={'on' if s.gate > 0 else 'off'}"
        by_dir.setdefault(key, (r, s))
    dirs = "\n".join(f"| {k} | {r:.2f} | {s.label()} |" for k, (r, s) in sorted(by_dir.items(), key=lambda x: -x[1][0]))
    report = f"""# Signature payoff (issue 8) — fairytale-series, retrieval only

Data: fairytale-series (FairytaleQA norwegian+scottish+swedish+lilac merged books), collection `{name}`
({len(corpus.ids)} chunks of 200 tokens, {len(corpus.sum_ids)} extractive summaries, W={args.window}),
embedder all-MiniLM-L6-v2, K0={K0}, no chat model (0 LLM calls in every system below). Gold: cor_section spans,
overlap rule of `evals.metrics.recall_at_k`. Intervals: percentile bootstrap over questions (1000 resamples,
seed 0); Δ is paired. Tuned on train+val ({len(tune)} questions), reported on test ({len(test)} questions) once.

Command: `MIA_HOME=/tmp/miahome-sig {cmd}` ({time.time() - started:.0f} s wall on 2 shared cores; grid of
{len(settings)} settings scored in {grid_seconds:.0f} s). Train+val query-only R@10: {np.mean(base_tune[10]):.2f}.

## Test (in-memory scoring with the graphs' functions; exact over the whole collection)
{HEADER}
{chr(10).join(test_rows)}

## Test through the graphs (`run_eval`, the number of record)
{'Command: `MIA_HOME=/tmp/miahome-sig ' + harness_cmd + '`' if harness_cmd else 'not run (--skip-harness)'}

{HEADER if harness_rows else ''}
{chr(10).join(harness_rows)}

## Best train+val R@10 per direction
| direction | train+val R@10 | best setting |
|---|---|---|
{dirs}

## Top 15 settings on train+val
| setting | train+val R@10 |
|---|---|
{top10}
"""
    (out / f"report-w{args.window}.md").write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
