"""`mia train retriever`: train the signature head (``stores.signature_head``) on train questions only.

The paper's gain comes from MiA-Emb, a retriever trained to read query + signature; a fixed mix of
generic vectors does not reproduce it (issue 22). This trains that reading at our scale, on both
kinds of collection the head ranks in (issue 44):

* Series: ``fairytale-train``, one book per FairytaleQA origin holding only its *train* stories, and
  their questions. No val or test story is in the collection, not even as a negative.
* Multi-document: ``--multihop N`` documents of ``multihop-synth``'s train split (2Wiki *train*
  questions, one ``--multihop-length``-token document per question: its gold paragraphs among seeded
  distractors), each document its own collection, named and ingested exactly as ``mia eval --dataset
  multihop-synth --split train`` makes them. So the head learns the very ranking it faces in the
  multi-hop reports (a question against its own document's chunks, never another document's, which
  would add easy negatives, and false ones where a document holds another question's gold paragraph
  as a distractor), and either command's collections serve the other. A fixed fifth of the 2Wiki
  train questions is held out as their val split (``multihop_split``); the multihop-synth ``dev``
  questions, the report set, are never read.

Every collection is ingested with the product's defaults, so the head learns on the chunks and
summaries it will be used with.

* Inputs: each question's signature comes from the project's own step 0 and InitSignature
  (``nodes.signature_init.select_signature``: hybrid E1, coverage-aware), and what the head reads of it from
  ``nodes.retrieval.head_inputs``, the function E2 itself calls.
* Objective: InfoNCE over every chunk of the question's collection (a softmax over all of them, so
  the hard negatives the first stage confuses, other stories' chunks, are all in it), with several
  positives when a question's gold sections span several chunks. Scores are over one collection's
  chunks, so a batch holds one collection's questions (``epoch_batches``); the batches of every
  collection are shuffled together each epoch. A 2Wiki document holds one question, so each is an
  optimiser step of its own: ``N`` sets the multi-document part's weight (N steps an epoch beside the
  fairy tales' ~270 batches of 32).
* Selection: after each epoch the head ranks the fairy-tale *val* questions and the held-out 2Wiki
  questions through E2 itself (``nodes.retrieval.trained_signature``); the epoch with the best mean
  of the two Recall@10 is kept (epoch 0, the untrained head, is rag's ranking). Test is never read.

Writes ``signature-head.npz`` with its card (sha256, command, every collection with its question and
chunk counts, the curve) and ``curve.png`` under ``--out``; ``--out stores/weights`` replaces the
shipped head.

Time on two cores: once the collections exist, a few minutes (the fairy tales' ~1.5 min with their
step-0 inputs cached; a 2Wiki document adds ~0.2 s to open and ~7 ms a training step per epoch, so
the multi-document part is bounded by building its collections, not by training). Building them:
about 3 min for the fairy tales; the 2Wiki data set ~10 s, then ~10 s to ingest each 32k-token
document, 35 min for 200 training and 100 held-out documents (~1 GB of Chroma; measured 2026-12-04).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from mia.evals import metrics
from mia.evals.plots import save_png
from mia.evals.runner import collection_name, prepare_parts
from mia.nodes.context import MiaRagSettings
from mia.nodes.signature_init import select_signature
from mia.nodes.retrieval import Fusion, head_inputs, query_only, trained_signature
from mia.stores.embeddings import Embedder, load_embedder
from mia.stores.ingest import IngestOptions, ingest
from mia.stores.mindscape import Mindscape
from mia.stores.units import Level, neighbour_sessions
from mia.stores.settings import mia_home
from mia.stores.signature_head import DEFAULT_WEIGHTS, EVIDENCE, MAX_RADIUS, SignatureHead

RECALL_K = 10
KAPPA_START = 20.0
"""κ at the start. The fused scores are at most ~0.45 (1/11 + 4/11 at the default fusion), and the
loss reads scores as logits, so κ = 20 makes the untrained head's softmax about as sharp as a
temperature of 0.05 on cosines; with λ = β = 0 it ranks exactly as rag does."""
HYPERPARAMETERS = ("epochs", "lr", "weight_decay", "rank", "fusion_rank", "radius", "continuity", "batch_size", "delta",
                   "seed")
MULTIHOP_SEED = 0
"""The 2Wiki documents' seed: `mia eval`'s default, so its train collections are these, and the same
whatever ``--seed`` trains with, so seeds compare training, not data."""
MULTIHOP_VAL_SHARE = 0.2
"""The share of the 2Wiki train questions held out as their val split (``multihop_split``)."""
MULTIHOP_HELD_OUT = (f"{MULTIHOP_VAL_SHARE:.0%} of the 2Wiki train questions, by document and by gold article: questions "
                     "whose gold paragraphs share a title are one group, groups taken in the sha256 order of their first "
                     "document's name; none is a training document or has a gold article that is a training question's "
                     "gold (as distractors, paragraphs of the one pool recur across documents)")
"""The held-out rule as the card states it."""


@dataclass
class Collection:
    """A collection's vectors in memory, as the loss needs them."""

    store: Mindscape | None
    chunk_ids: list[str]
    chunks: np.ndarray
    owner: np.ndarray
    """Each chunk's session as a row of ``summaries`` (``len(summary_ids)`` when it has none)."""
    summary_ids: list[str]
    summaries: np.ndarray
    spans: list[tuple[str, int, int]]


@dataclass
class Examples:
    """One collection's questions with what the head reads and the chunk rows it should rank first."""

    questions: list[dict[str, Any]]
    queries: np.ndarray
    signatures: list[list[str]]
    """Summary ids of each question's step-0 signature, in selection order."""
    evidence: list[np.ndarray]
    """``EVIDENCE`` of each signature summary (rows in signature order)."""
    fused: list[tuple[np.ndarray, np.ndarray]]
    """The first stage's ranking: chunk rows and their fused scores."""
    gold_rows: list[np.ndarray]
    """Rows of ``Collection.chunk_ids`` that overlap a gold span of the question."""


@dataclass
class QuestionSet:
    """A collection with its questions' examples, and what the card says it holds."""

    data: str
    """The data set, split and (for a multi-hop document) the document it was built from."""
    name: str
    collection: Collection
    examples: Examples

    @property
    def pair(self) -> tuple[Collection, Examples]:
        return self.collection, self.examples

    def entry(self) -> dict[str, Any]:
        """Its line in the card's recipe."""
        return {"data": self.data, "collection": self.name, "questions": len(self.examples.questions),
                "chunks": len(self.collection.chunk_ids)}


def without_signatures(ex: Examples) -> Examples:
    """The examples with every signature emptied: the ablation that tells the signature's gain from
    what the same head gains by re-weighting the first stage alone (``--without-signature``)."""
    return dataclasses.replace(ex, signatures=[[] for _ in ex.signatures],
                               evidence=[np.zeros((0, len(EVIDENCE))) for _ in ex.evidence])


def open_collection(name: str, book_map: dict[str, str]) -> Collection:
    store = Mindscape(name)
    rows, chunks = store.vector_rows(Level.CHUNK)
    chunk_ids = sorted(rows, key=rows.get)
    summary_rows, summaries = store.vector_rows(Level.SESSION)
    summary_ids = sorted(summary_rows, key=summary_rows.get)
    owner = np.asarray([summary_rows.get(s, len(summary_ids)) for s in store.summary_of(chunk_ids)])
    records = store.chunk_records(chunk_ids, documents=False)
    spans = [(book_map.get(r["book"], r["book"]), int(r["start"]), int(r["end"])) for r in records]
    return Collection(store, chunk_ids, np.asarray(chunks, dtype=np.float32), owner, summary_ids,
                      np.asarray(summaries, dtype=np.float32), spans)


def build_examples(collection: Collection, questions: Sequence[dict[str, Any]], embedder: Embedder, ctx: MiaRagSettings,
                   cache: Path, label: str, progress: bool) -> Examples:
    """Step 0, InitSignature and the head's inputs for every question, as mia_rag computes them;
    cached on disk by the collection's version, the questions and every setting that shapes them."""
    assert collection.store is not None
    store = collection.store
    questions = [q for q in questions if q.get("gold")]
    texts = [q["question"] for q in questions]
    key = hashlib.sha256(json.dumps([store.commits.version(), texts, ctx.k0, ctx.k_sum, ctx.candidates, ctx.lambda_q,
                                     ctx.lambda_c, ctx.lambda_d, ctx.retriever, ctx.bm25_weight, ctx.rrf_k,
                                     ctx.bm25_stemming, EVIDENCE], default=str).encode()).hexdigest()[:16]
    path = cache / f"examples-{label}-{key}.npz"
    if not path.exists():
        queries = np.asarray(embedder.embed_documents(texts), dtype=np.float32)  # MiniLM embeds queries as documents
        fusion = Fusion.of(ctx)
        signatures, evidence, fused_ids, fused_scores = [], [], [], []
        for text, q in tqdm(list(zip(texts, queries)), desc=f"signatures ({label})", unit="q", disable=not progress):
            step0 = query_only(store, q, ctx.k0, text=text, fusion=fusion, depth=ctx.candidates)
            sig = [s["id"] for s in select_signature(store, text, q, step0, ctx)]
            fused, *_, found = head_inputs(store, q.astype(np.float64), sig, max(RECALL_K, ctx.candidates), text=text, fusion=fusion)
            signatures.append(sig)
            evidence.append(found.tolist())
            fused_ids.append([c for c, _ in fused])
            fused_scores.append([f for _, f in fused])
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, queries=queries, rest=np.asarray(json.dumps([signatures, evidence, fused_ids, fused_scores])))
        tmp.replace(path)
    with np.load(path, allow_pickle=False) as z:
        queries = z["queries"]
        signatures, evidence, fused_ids, fused_scores = json.loads(str(z["rest"]))
    row = {c: n for n, c in enumerate(collection.chunk_ids)}
    fused = [(np.asarray([row[c] for c in ids], dtype=np.int64), np.asarray(scores)) for ids, scores in zip(fused_ids, fused_scores)]
    gold_rows = []
    for q in questions:
        gold = [(g["book"], g["start"], g["end"]) for g in q["gold"]]
        gold_rows.append(np.asarray([i for i, (b, s, e) in enumerate(collection.spans)
                                     if any(b == gb and s < ge and gs < e for gb, gs, ge in gold)], dtype=np.int64))
    return Examples(list(questions), queries, signatures, [np.asarray(e, dtype=np.float64).reshape(len(s), len(EVIDENCE))
                                                           for e, s in zip(evidence, signatures)], fused, gold_rows)


# --------------------------------------------------------------------------- the head in torch


class TorchHead:
    """``SignatureHead`` in torch, the same function (tests check the two agree), for training."""

    def __init__(self, dim: int, rank: int, fusion_rank: int, seed: int, mean: np.ndarray, std: np.ndarray,
                 radius: int = 0, continuity: float = 1.0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        scale = 0.01
        self.u = torch.nn.Parameter(torch.randn(dim, rank, generator=g, dtype=torch.float64) * scale)
        self.v = torch.nn.Parameter(torch.randn(dim, rank, generator=g, dtype=torch.float64) * scale)
        self.w = torch.nn.Parameter(torch.zeros(len(EVIDENCE), dtype=torch.float64))
        self.p = torch.nn.Parameter(torch.randn(dim, fusion_rank, generator=g, dtype=torch.float64) * scale)
        self.q = torch.nn.Parameter(torch.zeros(fusion_rank, dim, dtype=torch.float64))
        # (γ, κ, λ, β, β_near): λ = β = β_near = 0 starts at rag's own ranking; training moves away from
        # it only where it gains.
        self.scalars = torch.nn.Parameter(torch.tensor([0.0, KAPPA_START, 0.0, 0.0, 0.0], dtype=torch.float64))
        self.radius, self.continuity = radius, continuity
        self.mean = torch.as_tensor(mean, dtype=torch.float64)
        self.std = torch.as_tensor(std, dtype=torch.float64)

    def parameters(self) -> list[Any]:
        return [self.u, self.v, self.w, self.p, self.q, self.scalars]

    def forward(self, q: Any, s: Any, evidence: Any, mask: Any, delta: float) -> tuple[Any, Any]:
        """(e, a) for a batch: q (B, d), s (B, m, d) signature vectors, evidence (B, m, len(EVIDENCE)),
        mask (B, m) real summaries."""
        import torch

        z = (evidence - self.mean) / self.std
        logits = ((s @ self.v) * (q @ self.u)[:, None, :]).sum(-1) + z @ self.w
        a = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        sigma = (a[..., None] * s).sum(1)
        aware = torch.nn.functional.normalize(q + self.scalars[0] * sigma + (sigma @ self.p) @ self.q, dim=-1)
        return torch.nn.functional.normalize((1.0 - delta) * q + delta * aware, dim=-1), a

    def keep_non_negative(self) -> None:
        """κ, λ, β, β_near ≥ 0 is what lets E2 find its exact top k in its candidate set (``load_head`` checks it)."""
        import torch

        with torch.no_grad():
            self.scalars[1:].clamp_(min=0.0)

    def numpy(self, embedder: str) -> SignatureHead:
        d = lambda t: t.detach().double().numpy().copy()  # noqa: E731
        gamma, kappa, lam, beta, beta_near = (float(x) for x in self.scalars.detach())
        return SignatureHead(d(self.u), d(self.v), d(self.w), d(self.mean), d(self.std), d(self.p), d(self.q),
                             gamma, kappa, lam, beta, embedder, beta_near if self.radius else 0.0, self.radius,
                             self.continuity)


@dataclass
class Tensors:
    """The collection as the loss reads it, converted once."""

    chunks: Any
    summaries: Any
    """The summaries' vectors and a zero row after them, where padded signature places point."""
    owner: Any
    region: Any
    """region[i, j] = 1 when session j is in signature session i's region: within the head's radius
    in its book (``stores.mindscape.neighbour_sessions``) and continuing it (``SignatureHead.session_lift``);
    all 0 at radius 0."""

    @classmethod
    def of(cls, collection: Collection, radius: int = 0, continuity: float = 1.0) -> Tensors:
        import torch

        d, n = collection.chunks.shape[1], len(collection.summary_ids)
        summaries = np.vstack([np.asarray(collection.summaries, dtype=np.float64), np.zeros((1, d))])
        index = {s: i for i, s in enumerate(collection.summary_ids)}
        region = np.zeros((n + 1, n + 1))
        for i, summary_id in enumerate(collection.summary_ids if radius else []):
            near = [index[s] for s in neighbour_sessions(summary_id, radius) if s in index]
            region[i, [j for j in near if j == i or float(collection.summaries[i] @ collection.summaries[j]) >= continuity]] = 1.0
        return cls(torch.from_numpy(np.asarray(collection.chunks, dtype=np.float64)), torch.from_numpy(summaries),
                   torch.from_numpy(np.asarray(collection.owner, dtype=np.int64)), torch.from_numpy(region))


def batch_scores(head: TorchHead, collection: Collection, tensors: Tensors, ex: Examples, idx: Sequence[int],
                 delta: float) -> tuple[Any, Any]:
    """(score, gold): E2's score κ·rrf + λ·e·e_c + β·a_{π(c)} + β_near·(a's mass on π(c)'s region)
    of every chunk for each question of the batch (B, N), and which chunks are gold."""
    import torch

    n_sum = len(collection.summary_ids)
    index = {s: i for i, s in enumerate(collection.summary_ids)}
    width = max(len(ex.signatures[i]) for i in idx)
    rows = np.full((len(idx), width), n_sum, dtype=np.int64)
    evidence = np.zeros((len(idx), width, len(EVIDENCE)))
    rrf = torch.zeros(len(idx), len(collection.chunk_ids), dtype=torch.float64)
    gold = torch.zeros(len(idx), len(collection.chunk_ids), dtype=torch.bool)
    for n, i in enumerate(idx):
        m = len(ex.signatures[i])
        rows[n, :m] = [index[s] for s in ex.signatures[i]]
        evidence[n, :m] = ex.evidence[i]
        evidence[n, m:] = head.mean.numpy()  # padding: standardised to 0, masked out anyway
        rrf[n, torch.from_numpy(ex.fused[i][0])] = torch.from_numpy(ex.fused[i][1])
        gold[n, torch.from_numpy(ex.gold_rows[i])] = True
    sig_rows = torch.from_numpy(rows)
    e, a = head.forward(torch.from_numpy(np.asarray(ex.queries[list(idx)], dtype=np.float64)), tensors.summaries[sig_rows],
                        torch.from_numpy(evidence), sig_rows < n_sum, delta)
    member = torch.zeros(len(idx), n_sum + 1, dtype=torch.float64).scatter_add(1, sig_rows, a)
    _, kappa, lam, beta, beta_near = head.scalars
    lift = beta * member + (beta_near * (member @ tensors.region) if head.radius else 0.0)
    return kappa * rrf + lam * (e @ tensors.chunks.T) + lift[:, tensors.owner], gold


def batch_loss(head: TorchHead, collection: Collection, tensors: Tensors, ex: Examples, idx: Sequence[int],
               delta: float) -> Any:
    """Multi-positive InfoNCE over every chunk of the collection: −log Σ_gold softmax(score)."""
    import torch

    score, gold = batch_scores(head, collection, tensors, ex, idx, delta)
    return (torch.logsumexp(score, dim=1) - torch.logsumexp(score.masked_fill(~gold, float("-inf")), dim=1)).mean()


def epoch_batches(keeps: Sequence[Sequence[int]], batch_size: int, rng: np.random.Generator) -> list[tuple[int, list[int]]]:
    """One epoch's batches as (collection, question rows): each collection's questions shuffled and cut
    into batches of their own, since a question's scores are over its collection's chunks, then every
    batch shuffled together, so that no collection trains in one block at the end of an epoch."""
    batches = []
    for which, keep in enumerate(keeps):
        order = rng.permutation(np.asarray(keep, dtype=np.int64))
        batches += [(which, order[lo: lo + batch_size].tolist()) for lo in range(0, len(order), batch_size)]
    return [batches[n] for n in rng.permutation(len(batches))]


def train_head(sets: Sequence[tuple[Collection, Examples]], *, epochs: int, lr: float, weight_decay: float, rank: int,
               fusion_rank: int, radius: int, continuity: float, batch_size: int, delta: float, seed: int, embedder: str,
               on_epoch: Callable[[SignatureHead], dict[str, float]] | None = None,
               progress: bool = True, blind: bool = False) -> tuple[SignatureHead, list[dict[str, Any]]]:
    """Train on the questions of every (collection, examples) pair for ``epochs``; after each (and
    before the first), ``on_epoch(head)`` scores the head (its ``score`` picks the best, the earliest
    on ties), and the best head is returned with the curve. ``blind`` trains on the same questions
    with their signatures emptied (the ablation)."""
    import torch

    torch.manual_seed(seed)
    keeps = [[n for n, g in enumerate(ex.gold_rows) if len(g) and ex.signatures[n]] for _, ex in sets]
    stacked = np.concatenate([ex.evidence[n] for (_, ex), keep in zip(sets, keeps) for n in keep])
    head = TorchHead(sets[0][0].chunks.shape[1], rank, fusion_rank, seed, stacked.mean(0),
                     np.maximum(stacked.std(0), 1e-6), radius, continuity)
    if blind:  # the same questions, nothing of their signatures
        sets = [(collection, without_signatures(ex)) for collection, ex in sets]
    optimiser = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed)
    tensors = [Tensors.of(collection, radius, continuity) for collection, _ in sets]
    curve: list[dict[str, Any]] = []
    best: tuple[float, SignatureHead] | None = None
    for epoch in range(epochs + 1):
        losses = []
        if epoch:
            for which, idx in tqdm(epoch_batches(keeps, batch_size, rng), desc=f"epoch {epoch}/{epochs}", unit="batch",
                                   disable=not progress, leave=False):
                collection, ex = sets[which]
                loss = batch_loss(head, collection, tensors[which], ex, idx, delta)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                head.keep_non_negative()
                losses.append(loss.item())
        current = head.numpy(embedder)
        row: dict[str, Any] = {"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else None}
        if on_epoch is not None:
            row |= on_epoch(current)
            if best is None or row["score"] > best[0]:
                best = (row["score"], current)
            print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items() if v is not None),
                  flush=True)
        curve.append(row)
    return (best[1] if best else head.numpy(embedder)), curve


def ranking_recall(sets: Sequence[tuple[Collection, Examples]], head: SignatureHead | None,
                   ctx: MiaRagSettings) -> tuple[float, float]:
    """Mean R@1 and R@10 of E2 under ``head`` (None: rag's query-only E1) over every question of the
    sets, each ranked in its own collection through the graphs' own retrieval functions, fused with
    BM25 as the context says."""
    r1, r10 = [], []
    fusion = Fusion.of(ctx)
    for collection, ex in sets:
        assert collection.store is not None
        rows = {c: n for n, c in enumerate(collection.chunk_ids)}
        for q, vec, sig in zip(ex.questions, ex.queries, ex.signatures):
            if head is None:
                ids = [h.id for h in query_only(collection.store, vec, RECALL_K, text=q["question"], fusion=fusion,
                                                depth=ctx.candidates, for_signature=False)]
            else:
                ids = [h.id for h in trained_signature(collection.store, head, vec, sig, ctx.delta, RECALL_K, ctx.candidates,
                                                       text=q["question"], fusion=fusion)]
            at1, at10 = question_recalls(collection, [rows[i] for i in ids], q)
            r1.append(at1)
            r10.append(at10)
    return float(np.mean(r1)), float(np.mean(r10))


def best_first(best: int, scores: np.ndarray) -> list[int]:
    """The top RECALL_K chunk rows by ``scores``, the first stage's best hit ``best`` leading whatever its
    score, as E2 ranks."""
    top = np.argsort(-scores, kind="stable")[:RECALL_K].tolist()
    return [best, *[n for n in top if n != best]][:RECALL_K]


def question_recalls(collection: Collection, ranking: Sequence[int], question: dict[str, Any]) -> tuple[float, float]:
    """Recall@1 and Recall@10 (%) of a ranking of the collection's chunk rows against the question's gold spans."""
    spans = [collection.spans[n] for n in ranking[:RECALL_K]]
    gold = [(g["book"], g["start"], g["end"]) for g in question["gold"]]
    return 100.0 * metrics.recall_at_k(spans, gold, 1), 100.0 * metrics.recall_at_k(spans, gold, RECALL_K)


CEILING_BETAS = (0.1, 0.3, 1.0, 3.0)


def attention_ceiling(collection: Collection, ex: Examples) -> dict[str, Any]:
    """What a perfect reading of the step-0 signature could give: the share of questions whose gold
    session is in their signature, and R@10 when the membership term lifts exactly the gold sessions
    among the signature's (β·1 on their chunks, the first stage's best hit leading, as in E2).

    A head passes it only by what its other terms find outside those sessions (the region term's
    neighbouring sessions, the nearest chunks to e); beyond that, what remains is the signature's
    selection (and the first stage it comes from)."""
    index = {s: n for n, s in enumerate(collection.summary_ids)}
    inside, recall = [], {beta: [] for beta in CEILING_BETAS}
    for q, sig, (rows, fused), gold in zip(ex.questions, ex.signatures, ex.fused, ex.gold_rows):
        gold_sessions = set(collection.owner[gold].tolist()) & {index[s] for s in sig}
        inside.append(100.0 * bool(gold_sessions))
        rrf = np.zeros(len(collection.chunk_ids))
        rrf[rows] = fused
        lifted = np.isin(collection.owner, list(gold_sessions))
        for beta in CEILING_BETAS:
            recall[beta].append(question_recalls(collection, best_first(int(rows[0]), rrf + beta * lifted), q)[1])
    return {"gold_session_in_signature": float(np.mean(inside)),
            "r10_perfect_attention": {str(beta): float(np.mean(r)) for beta, r in recall.items()}}


def continuity_quantiles(collection: Collection) -> dict[str, float]:
    """The 10th, 50th and 90th percentile of the cosine between the summaries of neighbouring sessions
    in a book: where ``--continuity`` sits among them says which neighbours the region term lifts."""
    index = {s: n for n, s in enumerate(collection.summary_ids)}
    cosines = [float(collection.summaries[n] @ collection.summaries[index[near]])
               for s, n in index.items() for near in neighbour_sessions(s, 1) if near > s and near in index]
    return {f"q{q}": float(np.percentile(cosines, q)) if cosines else float("nan") for q in (10, 50, 90)}


def examples_cache() -> Path:
    """Where each collection's step-0 inputs are cached, so that a rerun reuses them."""
    return mia_home() / "train-retriever"


def load_split(dataset: str, split: str, data: str, options: IngestOptions, embedder: Embedder, ctx: MiaRagSettings,
               progress: bool) -> QuestionSet:
    """The split's data set and collection, built and ingested as `mia eval` builds them (under
    MIA_HOME, with the name it gives them, books already in it kept), with its questions' step-0 inputs."""
    part = prepare_parts(dataset, split, [], 0, mia_home())[0]
    name = collection_name(part, options, embedder.name, None)
    ingest(part.dataset.sources, name, embedder, options=options, progress=progress)
    collection = open_collection(name, part.dataset.book_names)
    return QuestionSet(data, name, collection, build_examples(collection, part.dataset.questions, embedder, ctx,
                                                              examples_cache(), split, progress))


def multihop_split(questions: Sequence[dict[str, Any]],
                   share: float = MULTIHOP_VAL_SHARE) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held out) of multihop-synth questions, each with its own document (``meta.book``).

    Held out by document, and further by gold article: questions whose gold paragraphs share a 2Wiki
    title are one group (2Wiki asks several questions about one film or person), so no held-out
    question's evidence is a training question's evidence. Groups are taken in the order of the
    sha256 of their first document's name until ``share`` of the questions are held out: computed over
    the whole data set, so a document's side does not depend on how many ``--multihop`` takes.
    Distractors come from one pool, so a held-out question's gold paragraph can still be a distractor
    in a training document, as it can between train and dev documents."""
    parent = list(range(len(questions)))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    first: dict[str, int] = {}
    for n, q in enumerate(questions):
        for title in q["meta"]["gold_titles"]:
            parent[root(n)] = root(first.setdefault(title.casefold(), n))
    groups: dict[int, list[int]] = {}
    for n in range(len(questions)):
        groups.setdefault(root(n), []).append(n)
    held: set[int] = set()
    for group in sorted(groups.values(), key=lambda g: hashlib.sha256(questions[g[0]]["meta"]["book"].encode()).hexdigest()):
        if len(held) >= share * len(questions):
            break
        held.update(group)
    return ([q for n, q in enumerate(questions) if n not in held], [q for n, q in enumerate(questions) if n in held])


def load_multihop(documents: int, length: int, options: IngestOptions, embedder: Embedder, ctx: MiaRagSettings,
                  progress: bool) -> tuple[list[QuestionSet], list[QuestionSet]]:
    """The first ``documents`` training documents of the 2Wiki train questions (data set order) and
    every held-out one (``multihop_split``), each its own collection, built, named and ingested as
    `mia eval --dataset multihop-synth --split train --length LENGTH` builds them."""
    part = prepare_parts("multihop-synth", "train", [length], MULTIHOP_SEED, mia_home())[0]
    train, held_out = multihop_split(part.dataset.questions)
    if documents > len(train):
        raise ValueError(f"--multihop must be at most {len(train)} (the 2Wiki train documents not held out), got {documents}")
    paths = dict(zip(part.dataset.books, part.dataset.sources))
    book_map = part.dataset.book_names
    sets: dict[str, list[QuestionSet]] = {"training": [], "held out": []}
    chosen = [("training", q) for q in train[:documents]] + [("held out", q) for q in held_out]
    for role, q in tqdm(chosen, desc="2Wiki documents", unit="doc", disable=not progress):
        book = q["meta"]["book"]
        name = collection_name(part, options, embedder.name, book)
        ingest([paths[book]], name, embedder, options=options, progress=False)
        collection = open_collection(name, book_map)
        examples = build_examples(collection, [q], embedder, ctx, examples_cache(), "2wiki", False)
        sets[role].append(QuestionSet(f"multihop-synth train, {length} tokens, seed {MULTIHOP_SEED}, {role}: {book}",
                                      name, collection, examples))
    return sets["training"], sets["held out"]


VAL_LABELS = {"fairytale": "fairy-tale series val", "multihop": "2Wiki train, held out"}
"""The validation sets by the key their Recall@k carries in the curve (``fairytale_r10``, ...)."""


def plot_curve(curve: Sequence[dict[str, Any]], rag: dict[str, float], best_epoch: int, path: Path) -> None:
    """Each validation set's Recall@10 per epoch beside rag's on it, and the epoch kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for n, (key, label) in enumerate((k, v) for k, v in VAL_LABELS.items() if f"{k}_r10" in rag):
        ax.plot([r["epoch"] for r in curve], [r[f"{key}_r10"] for r in curve], marker="o", color=f"C{n}",
                label=f"{label}: trained head")
        ax.axhline(rag[f"{key}_r10"], color=f"C{n}", linestyle="--", alpha=0.7, label=f"{label}: rag")
    ax.axvline(best_epoch, color="grey", linestyle=":", label="epoch kept")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch (0: untrained head = rag's ranking)")
    ax.set_ylabel("val Recall@10 (%)")
    ax.set_title("signature head: validation")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces the run, every setting explicit."""
    argv = ["mia", "train", "retriever"]
    for name in (*HYPERPARAMETERS, "multihop", "multihop_length", *(["window"] if args.window else [])):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.without_signature:
        argv.append("--without-signature")
    return shlex.join([*argv, "--out", str(args.out)])


def run(args: argparse.Namespace) -> int:
    for name in ("epochs", "batch_size", "rank", "fusion_rank", "multihop_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.multihop < 0:
        raise ValueError(f"--multihop must be 0 (none) or more documents, got {args.multihop}")
    if args.window is not None and args.window < 1:
        raise ValueError(f"--window must be at least 1, got {args.window}")
    if not 0 <= args.radius <= MAX_RADIUS or not -1.0 <= args.continuity <= 1.0:
        raise ValueError(f"--radius must be in [0, {MAX_RADIUS}] and --continuity in [-1, 1], got {args.radius} and "
                         f"{args.continuity}")
    if not 0.0 <= args.delta <= 1.0:
        raise ValueError(f"--delta must be in [0, 1], got {args.delta}")
    if args.lr <= 0 or args.weight_decay < 0:
        raise ValueError("--lr must be positive and --weight-decay not negative")
    if args.without_signature and args.out.resolve() == DEFAULT_WEIGHTS.parent.resolve():
        raise ValueError("--without-signature is an ablation: give it another --out than the shipped head's folder")
    started = time.time()
    progress = not args.quiet
    options = IngestOptions(**({"window": args.window} if args.window else {}))  # ingestion's defaults unless asked
    embedder = load_embedder("minilm")
    ctx = MiaRagSettings(collection="unused", delta=args.delta, signature_init="coverage")
    fairy_train = load_split("fairytale-train", "train", "fairytale-train train: every FairytaleQA origin's train stories, "
                             "one book per origin", options, embedder, ctx, progress)
    fairy_val = load_split("fairytale-series", "val", "fairytale-series val", options, embedder, ctx, progress)
    print(f"fairy tales: train {fairy_train.name}, {len(fairy_train.collection.chunk_ids)} chunks, "
          f"{len(fairy_train.examples.questions)} questions; val {fairy_val.name}, {len(fairy_val.examples.questions)} "
          f"questions ({time.time() - started:.0f} s)", flush=True)
    multihop_train: list[QuestionSet] = []
    multihop_val: list[QuestionSet] = []
    if args.multihop:
        loading = time.time()
        multihop_train, multihop_val = load_multihop(args.multihop, args.multihop_length, options, embedder, ctx, progress)
        print(f"2Wiki train documents of {args.multihop_length} tokens: {len(multihop_train)} for training "
              f"({sum(len(s.collection.chunk_ids) for s in multihop_train)} chunks), {len(multihop_val)} held out "
              f"({time.time() - loading:.0f} s)", flush=True)
    val_sets = {"fairytale": [fairy_val], **({"multihop": multihop_val} if multihop_val else {})}
    val = {key: [(s.collection, without_signatures(s.examples) if args.without_signature else s.examples) for s in sets]
           for key, sets in val_sets.items()}

    def validate(head: SignatureHead | None) -> dict[str, float]:
        """Each validation set's R@1 and R@10 under the head (None: rag), and their mean R@10 as the score."""
        row: dict[str, float] = {}
        for key, sets in val.items():
            row[f"{key}_r1"], row[f"{key}_r10"] = ranking_recall(sets, head, ctx)
        return row | {"score": float(np.mean([row[f"{key}_r10"] for key in val]))}

    rag = validate(None)
    ceiling = attention_ceiling(*fairy_val.pair)
    print(f"fairy-tale val: gold session in the signature for {ceiling['gold_session_in_signature']:.1f}% of questions; "
          "lifting exactly those would give R@10 " + ", ".join(f"{r:.1f} (β {b})" for b, r in ceiling["r10_perfect_attention"].items())
          + f" against rag's {rag['fairytale_r10']:.1f}", flush=True)
    continuity = {"train": continuity_quantiles(fairy_train.collection), "val": continuity_quantiles(fairy_val.collection)}
    print("neighbouring session summaries' cosine in the fairy tales (10th / 50th / 90th percentile): " + "; ".join(
        f"{split} " + " / ".join(f"{v:.2f}" for v in q.values()) for split, q in continuity.items())
        + f"; --continuity {args.continuity}", flush=True)
    hyper = {name: getattr(args, name) for name in HYPERPARAMETERS}
    train_sets = [fairy_train, *multihop_train]
    head, curve = train_head([s.pair for s in train_sets], embedder=embedder.name, progress=progress, on_epoch=validate,
                             blind=args.without_signature, **hyper)
    best = max(curve, key=lambda r: (r["score"], -r["epoch"]))
    card = {
        "command": command_line(args),
        "recipe": {
            "train": [s.entry() for s in train_sets],
            "val": [s.entry() for sets in val_sets.values() for s in sets],
            "multihop": {"length": args.multihop_length, "data_seed": MULTIHOP_SEED, "train_documents": len(multihop_train),
                         "held_out_documents": len(multihop_val), "held_out": MULTIHOP_HELD_OUT} if args.multihop else None,
            "selection": "the epoch with the best mean val Recall@10 over " + " and ".join(VAL_LABELS[k] for k in val),
            "ingestion": json.dumps(vars(options)),
            "signature": f"step 0 {ctx.retriever} E1 (k0 {ctx.k0}) + coverage-aware InitSignature (k_sum {ctx.k_sum}), as mia_rag",
            "first_stage": {name: getattr(ctx, name) for name in ("retriever", "bm25_weight", "rrf_k", "bm25_stemming", "candidates")},
            "embedder": embedder.name,
        },
        "hyperparameters": hyper,
        "without_signature": args.without_signature,
        "best_epoch": best["epoch"],
        "val_rag": rag,
        "val_ceiling": ceiling,
        "neighbour_summary_cosine": continuity,
        "curve": curve,
        "seconds": round(time.time() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    digest = head.save(args.out / "signature-head.npz", card)
    plot_curve(curve, rag, best["epoch"], args.out / "curve.png")
    for key in val:
        print(f"{VAL_LABELS[key]}: rag R@1 {rag[f'{key}_r1']:.1f} R@10 {rag[f'{key}_r10']:.1f}; head (epoch {best['epoch']}) "
              f"R@1 {best[f'{key}_r1']:.1f} R@10 {best[f'{key}_r10']:.1f} ({best[f'{key}_r10'] / rag[f'{key}_r10']:.3f}×)")
    print(f"wrote {args.out / 'signature-head.npz'} (sha256 {digest[:12]}…) in {time.time() - started:.0f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from mia.evals.cli import add_train_arguments

    p = argparse.ArgumentParser(prog="python -m mia.evals.train_retriever", description=__doc__.split("\n\n")[0])
    add_train_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
