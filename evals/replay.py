"""The fairy-tale series collection replayed in memory: every chunk vector, BM25 over the chunk
texts and each question's scores computed once, so that a grid of hundreds of first-stage settings
costs one matrix product per question and setting instead of a run of the graphs each
(``evals.tune_lexical``). Rankings are the graphs' own up to their exact search and fusion; the
tuned setting is then run once through the graphs, whose reports are the numbers of record.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from evals.runner import RECALL_KS, Part, prepare_parts
from stores.embeddings import load_embedder
from stores.mindscape import Mindscape

@dataclass
class Corpus:
    """The collection in memory: its chunks' ids (book order), vectors and character spans."""

    ids: list[str]
    vecs: np.ndarray
    spans: list[tuple[str, int, int]]


@dataclass
class Question:
    """One question with everything a setting needs, computed once."""

    id: str
    split: str
    q: np.ndarray
    dense: np.ndarray
    """The question's cosine to every chunk."""
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
    got = store.chunks.get(include=["embeddings", "metadatas"])
    order = sorted(range(len(got["ids"])), key=lambda i: (got["metadatas"][i]["book"], got["metadatas"][i]["index"]))
    metas = [got["metadatas"][i] for i in order]
    return Corpus(
        ids=[got["ids"][i] for i in order],
        vecs=np.asarray([got["embeddings"][i] for i in order], dtype=np.float32),
        spans=[(book_map.get(m["book"], m["book"]), int(m["start"]), int(m["end"])) for m in metas],
    )


def prepare_questions(corpus: Corpus, questions: Sequence[dict[str, Any]], split: str, cache: Path) -> list[Question]:
    """Embed (cached on disk by text) and score every chunk for every question once."""
    texts = [q["question"] for q in questions]
    key = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:12]
    path = cache / f"q-{split}-{key}.npy"
    if path.exists():
        qv = np.load(path)
    else:
        # MiniLM embeds queries and passages alike, so one batched call equals per-query embed_query.
        qv = load_embedder("minilm").embed_documents(texts)
        np.save(path, qv)
    out: list[Question] = []
    for question, q in zip(questions, qv):
        dense = corpus.vecs @ q
        gold = [(g["book"], g["start"], g["end"]) for g in question["gold"]]
        hits = [np.asarray([i for i, (b, s, e) in enumerate(corpus.spans) if b == gb and s < ge and gs < e]) for gb, gs, ge in gold]
        out.append(Question(question["id"], split, q, dense, hits, len(gold)))
    return out


def recalls(order: np.ndarray, question: Question) -> dict[int, float]:
    """R@k from a ranking (chunk indices, best first): the harness's overlap rule, precomputed."""
    rank = {int(c): r for r, c in enumerate(order[: max(RECALL_KS)])}
    first = [min((rank[int(c)] for c in hits if int(c) in rank), default=10**9) for hits in question.gold_hits]
    return {k: 100.0 * sum(f < k for f in first) / question.n_gold for k in RECALL_KS}


def module_command(module: str, argv: Sequence[str] | None) -> str:
    """The command line of ``python -m module`` with ``argv`` (the process's own when None): what a
    replay report names as the command that made it."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
