"""Situated chunks in rag's first stage, replayed in memory on the fairy-tale series (issue 22).

Contextual retrieval embeds and BM25-indexes each chunk together with a line that places it in its
source. Here that line is the opening sentence of the chunk's session summary (the book title adds
nothing on the series: one title covers a dozen stories, and title prefixes measured no gain in issue
27). The chunks are re-embedded with the prefix and BM25 rebuilt over the same texts, in memory;
``rag``'s fused first stage (``evals.tune_lexical.fused_order``, the shipped weight, k and depth) then
ranks train and val questions with the plain and the situated texts, on either side of the fusion or
both. Nothing is written to the collection. The plain row replays the graphs' own ``rag``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

import bm25s
import numpy as np

from evals.replay import load_corpus, module_command, prepare_questions, recalls, series_parts
from evals.runner import RECALL_KS, _book_ids
from evals.train_retriever import ensure_collection
from evals.tune_lexical import fused_order, table
from nodes.context import Context
from stores import summaries
from stores.bm25 import tokenize
from stores.embeddings import load_embedder
from stores.ingest import IngestOptions
from stores.mindscape import Mindscape

OPENING_CHARS = 200
"""The prefix's budget: about 40 word pieces, so a 200-token chunk stays within MiniLM's 256."""


def situated_texts(store: Mindscape, chunk_ids: Sequence[str], texts: Sequence[str]) -> list[str]:
    """Each chunk's text after the opening sentence of its session's summary."""
    owners = store.summary_of(chunk_ids)
    got = store.summaries.get(ids=sorted(set(owners)), include=["documents"])
    opening = {i: " ".join(summaries.sentences(d)[:1])[:OPENING_CHARS] for i, d in zip(got["ids"], got["documents"])}
    return [f"{opening.get(o, '')}\n{t}" for o, t in zip(owners, texts)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("evals/results/situated-fairytale-series"))
    p.add_argument("--train-limit", type=int, default=1500, help="at most this many train questions (val is used whole)")
    args = p.parse_args(argv)
    started = time.time()
    cache, parts = series_parts(args.out)
    embedder = load_embedder("minilm")
    part, name = ensure_collection("fairytale-series", "val", IngestOptions(), embedder, progress=True)
    corpus = load_corpus(name, _book_ids(part.dataset))
    store = Mindscape(name)
    got = store.chunks.get(ids=corpus.ids, include=["documents"])
    by_id = dict(zip(got["ids"], got["documents"]))
    plain = [by_id[i] for i in corpus.ids]
    situated = situated_texts(store, corpus.ids, plain)
    print(f"re-embedding {len(situated)} situated chunks", flush=True)
    situated_vecs = np.asarray(embedder.embed_documents(situated), dtype=np.float32)
    ctx = Context()
    stem = ctx.bm25_stemming
    indexes = {}
    for label, texts in (("plain", plain), ("situated", situated)):
        indexes[label] = bm25s.BM25()
        indexes[label].index([tokenize(t, stem=stem) for t in texts], show_progress=False)
    variants = (("plain (rag)", "plain", False), ("situated BM25", "situated", False),
                ("situated dense", "plain", True), ("situated both", "situated", True))
    sections = []
    for split, limit in (("train", args.train_limit), ("val", None)):
        pool = [q for q in parts[split].dataset.questions if q.get("gold")][:limit]
        questions = prepare_questions(corpus, pool, split, cache)
        rows = []
        for label, lexical, situated_dense in variants:
            per = [recalls(fused_order(situated_vecs @ q.q if situated_dense else q.dense,
                                       indexes[lexical].get_scores(tokenize(item["question"], stem=stem)),
                                       ctx.bm25_weight, ctx.rrf_k, ctx.candidates), q)
                   for q, item in zip(questions, pool)]
            rows.append((label, {k: [r[k] for r in per] for k in RECALL_KS}))
        sections += [f"## {split} ({len(questions)} questions; paired against plain)", "", *table(rows, rows[0][1]), ""]
    command = module_command("evals.situated", argv)
    lines = [
        "# Situated chunks in rag's first stage (fairytale-series, train and val)",
        "",
        f"Command: `{command}` ({(time.time() - started) / 60:.1f} min on this machine). Retrieval only, in memory; MiniLM;",
        f"window chunks of 200 tokens, extractive summaries; collection `{name}` ({len(corpus.ids)} chunks). Each chunk is",
        "prefixed with the opening sentence of its session summary, re-embedded and BM25-indexed (stemmed); fusion weight",
        f"{ctx.bm25_weight:g}, k {ctx.rrf_k}, depth {ctx.candidates}, as `rag` runs them. Test is not read.",
        "",
        *sections,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
