"""Written session summaries, faithfulness and cost: ``mia bench summaries``.

Each chat model named writes the session summaries of one book as ingestion would (``llm-excerpt``
by default: structure chunks, 20-chunk windows, the excerpt of each window), and every summary is
checked against the window it summarises (``stores.summaries.grounded``). The report gives, per
model: the share of the names the model wrote that its window names, the sentences it repeated, the
sentences grounding dropped (the kept summaries hold only grounded names and no repeat, by
construction), and the cost: seconds and tokens per 100k tokens of book. Nothing is cached: every
window is written afresh, so the times are the model's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from mia.stores.settings import data_root

BOOK = Path("literaryqa") / "texts" / "siddhartha.txt"
"""A literaryqa dev book (tuning data), short enough that two models write all its windows in minutes."""
MODELS = ("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m")


def summarise_book(path: Path, model: str, summarizer: str, windows: int | None) -> dict[str, Any]:
    """One model's summaries of the book's windows (the first ``windows`` of them), with their checks."""
    from mia.stores import summaries as summ
    from mia.stores.chat import load_chat_model
    from mia.stores.embeddings import load_embedder
    from mia.stores.ingest import IngestOptions
    from mia.stores.ingest.chunks import chunk_book
    from mia.stores.ingest.sessions import session_windows
    from mia.stores.tokens import count_tokens

    options = IngestOptions(summarizer=summarizer)
    embedder = load_embedder("minilm")
    text = path.read_text(encoding="utf-8")
    _, chunks = chunk_book(text, options, embedder)
    picked = session_windows(chunks, options)[:windows]
    llm = load_chat_model(model=model)
    total = summ.Faithfulness()
    rows, seconds, book_tokens, usage = [], 0.0, 0, {"input_tokens": 0, "output_tokens": 0}
    for j, window in enumerate(picked):
        window_text = text[window[0].start:window[-1].end]
        passage = summ.excerpt([c.text for c in window], embedder) if summarizer == "llm-excerpt" else window_text
        started = time.perf_counter()
        written, used = summ.llm_summary(llm, passage, path.stem, j + 1, len(picked), excerpt=summarizer == "llm-excerpt")
        seconds += time.perf_counter() - started
        kept, check = summ.grounded(written, window_text)
        total.add(check)
        book_tokens += count_tokens(window_text)
        usage = {k: usage[k] + used[k] for k in usage}
        rows.append({"window": j, "written": written, "kept": kept, "names": check.names, "grounded": check.grounded,
                     "repeated": check.repeated, "dropped": check.dropped})
        print(f"{model} window {j + 1}/{len(picked)}: {seconds:.0f}s, names {total.grounded}/{total.names}, "
              f"repeated {total.repeated}, dropped {total.dropped} of {total.sentences}", flush=True)
    per = 100_000 / max(book_tokens, 1)
    return {"model": model, "windows": len(picked), "book_tokens": book_tokens, "seconds": round(seconds, 1),
            "seconds_per_100k": round(seconds * per, 1), "input_tokens_per_100k": round(usage["input_tokens"] * per),
            "output_tokens_per_100k": round(usage["output_tokens"] * per), "names": total.names,
            "names_grounded": total.grounded, "sentences": total.sentences, "repeated": total.repeated,
            "dropped": total.dropped, "summaries": rows}


def report(results: list[dict[str, Any]], book: Path, summarizer: str, command: str) -> str:
    lines = ["# Written session summaries: faithfulness and cost", "",
             f"Book: `{book}`; summarizer `{summarizer}` (structure chunks of 200 tokens, 20-chunk windows); "
             "MiniLM picks the excerpt; each embedded model at temperature 0; this machine, one job at a time.", "",
             f"Command: `{command}`", "",
             "| model | windows | book tokens | names in its window (model's text) | sentences repeated | "
             "sentences dropped | s per 100k tokens of book | prompt tokens per 100k | written tokens per 100k |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        share = 100.0 * r["names_grounded"] / r["names"] if r["names"] else 100.0
        lines.append(f"| {r['model']} | {r['windows']} | {r['book_tokens']:,} | {share:.1f}% ({r['names_grounded']}/{r['names']}) "
                     f"| {r['repeated']} | {r['dropped']} of {r['sentences']} | {r['seconds_per_100k']:,.0f} | "
                     f"{r['input_tokens_per_100k']:,} | {r['output_tokens_per_100k']:,} |")
    lines += ["", "The summaries kept (what ingestion stores) hold only names their window writes and no repeated "
              "sentence: grounding drops the rest, and a window left with nothing gets its extractive summary.", ""]
    for r in results:
        lines += [f"## {r['model']}: the first three windows", ""]
        for row in r["summaries"][:3]:
            lines += [f"- window {row['window'] + 1}, written: {row['written']}", f"  - kept: {row['kept'] or '(none)'}"]
        lines.append("")
    return "\n".join(lines)


def cmd_summaries_bench(args: argparse.Namespace) -> int:
    import shlex
    import sys

    book = args.book if args.book.is_absolute() or args.book.is_file() else data_root() / args.book
    if not book.is_file():
        print(f"error: {book}: no such book; pass --book PATH (a .txt file)", file=sys.stderr)
        return 2
    results = [summarise_book(book, model, args.summarizer, args.windows) for model in args.models]
    command = "mia " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = report(results, args.book, args.summarizer, command)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text + "\n", encoding="utf-8")
        (args.out / "summary.json").write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "summaries"} for r in results], indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


def add_summaries_bench(benches: Any) -> argparse.ArgumentParser:
    p = benches.add_parser("summaries", help="written session summaries per chat model: names grounded in their window, "
                                             "repeats, and the cost per 100k tokens of book")
    p.add_argument("--book", type=Path, default=BOOK, help=f"a book, or a path under MIA_DATA (default {BOOK})")
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS),
                   help="comma-separated embedded chat models (default both)")
    p.add_argument("--summarizer", choices=["llm-excerpt", "llm"], default="llm-excerpt")
    p.add_argument("--windows", type=int, default=None, help="only the first N windows (default all)")
    p.add_argument("--out", type=Path, default=None, help="write report.md and summary.json there")
    p.set_defaults(func=cmd_summaries_bench)
    return p
