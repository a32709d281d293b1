"""``mia eval``: the evaluation harness on the command line.

Kept out of the product's command line (``graph/cli.py``), which finds :func:`register` and
:func:`register_train` through the ``mia.commands`` entry points. User errors are raised as
``ValueError`` for it to print as one line.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("evals") / "results"
MULTIHOP_DOCUMENTS = 200
"""The suggested `mia train retriever --multihop N`: each 2Wiki document is one training step an epoch, so
200 weigh about as much as the fairy tales' ~270 batches, as the mean of the two val sets that picks the
epoch does; with the 100 held out, 300 documents take ~35-50 min to build once (training then adds ~1 min).
It is not the default: trained so (2026-12-04), the head's mean val R@10 was 85.4 against the
fairy-tale-only head's 85.7 (evals/README.md), so the shipped head is still the fairy-tale one, and its
card's command must still make it."""


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _lengths(text: str) -> list[int]:
    try:
        return [int(item) for item in _csv(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected token counts like 16000 or 16000,32000, got {text!r}") from exc


def default_out(dataset: str, split: str | None, lengths: list[int], retrieval_only: bool) -> Path:
    """``evals/results/<dataset>-<split>[-<lengths>][-retrieval]``: one folder per comparison, so a
    rerun of the same command resumes into, and regenerates, the same report."""
    name = Path(dataset).name if Path(dataset).is_dir() else dataset
    parts = [name, split or ("dev" if dataset == "multihop-synth" else "test"), *map(str, lengths)]
    return DEFAULT_OUT / ("-".join(parts) + ("-retrieval" if retrieval_only else ""))


def cmd_eval(args: argparse.Namespace) -> int:
    from mia.evals.runner import parse_assignments, run_eval  # heavy (LangGraph, the graphs): only for `mia eval`

    settings = parse_assignments(args.set or [], multi=False)
    sweeps = parse_assignments(args.sweep or [], multi=True)
    out = args.out or default_out(args.dataset, args.split, args.length or [], args.retrieval_only)
    results = run_eval(
        args.dataset, args.split, _csv(args.systems),
        length=args.length, retrieval_only=args.retrieval_only, limit=args.limit, seed=args.seed, out=out,
        settings=settings, sweeps=sweeps, concurrency=args.concurrency, progress=not args.json and not args.quiet,
        summarizer=args.summarizer, texts=args.texts, questions_file=args.questions, command=command_line(args, out),
        reuse=args.reuse or [], baselines=args.baseline or [], origins=_csv(args.origins) if args.origins else (),
        interference=args.interference or (),
    )
    if args.json:
        print(json.dumps(results.summary))
        return 0
    print(_table(results.summary))
    print(f"\nreport: {results.out / 'report.md'}")
    return 0


def command_line(args: argparse.Namespace, out: Path) -> str:
    """The command that reproduces this run, rebuilt from the parsed options (whatever entry point
    parsed them), with the output folder made explicit."""
    argv = ["mia", "eval", "--dataset", args.dataset]
    if args.split:
        argv += ["--split", args.split]
    if args.length:
        argv += ["--length", ",".join(map(str, args.length))]
    argv += ["--systems", args.systems]
    if args.retrieval_only:
        argv.append("--retrieval-only")
    if args.limit is not None:
        argv += ["--limit", str(args.limit)]
    if args.origins:
        argv += ["--origins", args.origins]
    if args.interference:
        argv += ["--interference", ",".join(map(str, args.interference))]
    argv += ["--seed", str(args.seed)]
    for item in args.set or []:
        argv += ["--set", item]
    for item in args.sweep or []:
        argv += ["--sweep", item]
    if args.summarizer != "extractive":
        argv += ["--summarizer", args.summarizer]
    if args.texts:
        argv += ["--texts", str(args.texts), "--questions", str(args.questions)]
    for folder in args.reuse or []:
        argv += ["--reuse", str(folder)]
    for name in args.baseline or []:
        argv += ["--baseline", name]
    argv += ["--concurrency", str(args.concurrency), "--out", str(out)]
    return shlex.join(argv)


def _table(summary: dict[str, Any]) -> str:
    """A plain-text glance at the averages; the report has the intervals."""
    systems = summary["systems"]
    columns = list(dict.fromkeys(metric for row in systems.values() for metric in row))
    width = max(len(name) for name in systems)
    lines = [f"{summary['dataset']} / {summary['split']}: {summary['questions']} questions",
             " ".join([" " * width, *(f"{c:>16}" for c in columns)])]
    for name, row in systems.items():
        lines.append(" ".join([name.ljust(width), *(f"{row[c]:>16.2f}" if c in row else f"{'–':>16}" for c in columns)]))
    return "\n".join(lines)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("evals/results/train-retriever"),
                   help="folder for signature-head.npz, its card and curve.png (stores/weights replaces the shipped head)")
    p.add_argument("--epochs", type=int, default=8,
                   help="epochs; the one with the best val Recall@10 (the mean over the fairy-tale and 2Wiki val sets) is kept")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--rank", type=int, default=8, help="rank of the query→summary attention map")
    p.add_argument("--fusion-rank", type=int, default=16, help="rank of the signature→query map P·Q")
    p.add_argument("--multihop", type=int, default=0, metavar="N",
                   help="train on N multi-document collections too: documents multihop-synth builds from 2Wiki train "
                        "questions, one per question and each its own collection (as `mia eval --dataset multihop-synth "
                        "--split train` builds them); with N > 0 a fixed fifth of those questions (100) is held out as a second val "
                        "set (default 0: fairy tales only, as the shipped head; "
                        f"{MULTIHOP_DOCUMENTS} weighs about as much as the fairy tales)")
    p.add_argument("--multihop-length", type=int, default=32000, metavar="TOKENS",
                   help="tokens per 2Wiki document (the multi-hop reports' 32000 by default)")
    p.add_argument("--window", type=int,
                   help="session window (chunks) of the train and val collections (default: ingestion's own); "
                        "a head trained on one window was not measured on collections of another")
    p.add_argument("--radius", type=int, default=1,
                   help="sessions either side of a signature summary that its region term lifts too (0: none)")
    p.add_argument("--continuity", type=float, default=0.3,
                   help="summary cosine at which a neighbouring session continues a signature summary's region "
                        "(0.3: about the 10th percentile of neighbouring fairy-tale train summaries, which the command prints)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--delta", type=float, default=0.5, help="δ used in training; set the same `delta` when asking")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--without-signature", action="store_true",
                   help="ablation: the same head on the same questions with their signatures emptied, so what it gains is "
                        "a re-weighted first stage, not the signature's (give another --out)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def cmd_train_retriever(args: argparse.Namespace) -> int:
    from mia.evals.train_retriever import run  # heavy (torch, the graphs' nodes): only for `mia train retriever`

    return run(args)


def register_train(subparsers: Any) -> None:
    """Add ``train retriever`` to a parser's subcommands."""
    p = subparsers.add_parser("train", help="train models on train splits (the signature head)")
    models = p.add_subparsers(dest="model", required=True)
    r = models.add_parser("retriever", help="train the signature head (sig_strategy=trained) on FairytaleQA train stories "
                                            "and 2Wiki train documents",
                          description="Train the signature head (sig_strategy=trained) on FairytaleQA train stories and "
                                      "multi-document collections of 2Wiki train questions, pick its epoch on the fairy-tale "
                                      "val split and held-out 2Wiki train questions; see evals/train_retriever.py.")
    add_train_arguments(r)
    r.set_defaults(func=cmd_train_retriever)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval`` to a parser's subcommands; the handler is ``args.func``."""
    p = subparsers.add_parser(
        "eval", help="run systems on a benchmark and write a report (tables with intervals, plots)",
        description="Every system on the same questions; resumable (finished questions are cached in the output folder).",
    )
    p.add_argument("--dataset", required=True,
                   help="fairytale-series, fairytale-series-titled, fairytale-train (train stories only: training), multihop-synth, custom, or a built data set's folder")
    p.add_argument("--split", help="question split (default: test; multihop-synth: dev, or train: 2Wiki train questions for tuning)")
    p.add_argument("--length", type=_lengths, metavar="TOKENS[,TOKENS...]",
                   help="multihop-synth document length(s) in tokens (default 32000)")
    p.add_argument("--origins", help="fairytale-series: comma-separated FairytaleQA origin books to merge (default: "
                                     "norwegian, scottish, swedish and lilac fairybooks), e.g. scottish-fairybook")
    p.add_argument("--interference", type=_lengths, metavar="TOKENS[,TOKENS...]",
                   help="fairytale-series: add whole books of the shared books/ library (path order) until this many "
                        "tokens are added, as interference; several sizes make one data set each, 0 none (recall at scale)")
    p.add_argument("--systems", required=True,
                   help="comma-separated graph names, e.g. rag,mia_rag, and with --retrieval-only the peers bm25 and "
                        "langchain (evals/peers.py)")
    p.add_argument("--retrieval-only", action="store_true",
                   help="stop after retrieval (no chat model); top_k defaults to 100, so recall@20 and recall at "
                        "4,000 tokens are defined")
    p.add_argument("--limit", type=int, help="first N questions (taken in turn from each source of multihop-synth)")
    p.add_argument("--seed", type=int, default=0, help="data building and bootstrap seed (default 0)")
    p.add_argument("--out", type=Path, help="output folder (default evals/results/<dataset>-<split>[-<length>][-retrieval])")
    p.add_argument("--json", action="store_true", help="print one JSON object with per-system averages")
    p.add_argument("--set", action="append", metavar="[SYSTEM:]KEY=VALUE",
                   help="a context setting (e.g. k_sum=3) or ingestion option (chunk_size, overlap, window, chunker, "
                        "keep_front_matter, summarizer); repeat")
    p.add_argument("--sweep", action="append", metavar="[SYSTEM:]KEY=V1,V2",
                   help="run each system once per value, named e.g. mia_rag[k_sum=3]; several sweeps combine; settings "
                        "linked by & move together: 'passage_order&chat_model=score&A,document&B' is two variants, not four")
    p.add_argument("--concurrency", type=int, default=1, help="questions in flight at once (default 1)")
    p.add_argument("--summarizer", choices=["extractive", "llm", "llm-excerpt"], default="extractive",
                   help="session summaries for ingestion (default extractive: no LLM); --sweep summarizer=... "
                        "compares several in one run")
    p.add_argument("--texts", type=Path, help="custom: a .txt/.md file (one book) or a folder of them, one per book")
    p.add_argument("--questions", type=Path, help="custom: a JSONL file of questions, or a folder of .jsonl files read as one set "
                        "(a question with meta.book is asked over a collection of that book alone)")
    p.add_argument("--reuse", action="append", type=Path, metavar="DIR",
                   help="take results an earlier run (its --out folder) finished for identical jobs: same settings, "
                        "collection content and question; they are copied here; repeat for several folders")
    p.add_argument("--baseline", action="append", metavar="VARIANT",
                   help="a paired-difference table against this variant, e.g. agent or 'rag[retriever=hybrid]' "
                        "(default: rag); repeat for several")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_eval)
    return p
