"""``mia bench scale``: what ingestion, storage and retrieval cost as one mindscape grows to a library.

The shared books (~2.6M tokens) are ingested into one fresh collection in growing prefixes (the
books in path order, each prefix ending at the book boundary closest to the asked fraction of the
library), with extractive summaries, in a temporary store. After each step:

* ingestion tokens/s, and its ratio to pure embedding: the step's ingestion (chunking, extractive
  summaries, writing, the BM25 chunk index and the in-memory vectors brought up to date) over
  ``embed_documents`` on the very chunk and summary texts it embedded, with the same batch size;
  book by book, each book's ingestion followed at once by the embedding of its texts, so that the
  machine's drift over a step of many minutes falls on both sides alike;
* the process's peak RSS so far and the store's bytes on disk (Chroma plus the BM25 index);
* retrieval latency p50 / p95 of ``rag`` and ``mia_rag`` through the compiled graphs (retrieval
  only, ``evals.bench.time_graphs``) on the same questions at every size: sentences of the first
  step's collection (``evals.bench.questions_from``), so each has matching text at every size; the
  order of the two graphs alternates between questions. The growth exponent between sizes is
  log(p50 ratio) / log(token ratio): 1 is linear growth.

At the largest size, one more book (the held-out one, ~100k tokens) is added, timed against
ingesting it alone into an empty collection (before and after the add; their mean). Then the same
library is ingested into a ``chroma run`` server on 127.0.0.1 (book by book, paired with pure
embedding as above) and the figures of the largest size are measured again against it. Nothing
here asserts a time: the goals are printed beside the figures for a person to read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from mia.evals.plots import save_png
from mia.stores.settings import data_root
from mia.stores.units import Level

INGEST_GOAL = 1.15
ADD_GOAL = 1.3
RSS_GOAL_GB = 4.0
LATENCY_GROWTH_GOAL = 2.0
RETRIEVAL_GOAL = 1.5
DEFAULT_FRACTIONS = (0.1, 0.3, 1.0)
DEFAULT_HELD_OUT = "northangerabbey"
"""Northanger Abbey, ~102k tokens: the "100k-token book" added to the full library."""
SYSTEMS = ("rag", "mia_rag")


def prefix_ends(tokens: Sequence[int], fractions: Sequence[float]) -> list[int]:
    """How many books (in order) each step holds: for each fraction, the book boundary whose
    running total is closest to that share of all the tokens; at least one book, each step larger
    than the one before (a fraction that would not add a book is dropped)."""
    total = sum(tokens)
    running = np.cumsum(tokens)
    ends: list[int] = []
    for fraction in sorted(fractions):
        if not 0 < fraction <= 1:
            raise ValueError(f"--fractions must lie in (0, 1], got {fraction}")
        end = int(np.argmin(np.abs(running - fraction * total))) + 1
        if not ends or end > ends[-1]:
            ends.append(end)
    return ends


def growth_exponent(small: tuple[float, float], large: tuple[float, float]) -> float:
    """d log(value) / d log(size) between two (size, value) points: 1 is linear, below 1 sublinear."""
    return math.log(large[1] / small[1]) / math.log(large[0] / small[0])


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _bytes_under(*paths: Path) -> int:
    return sum(f.stat().st_size for p in paths if p.exists() for f in p.rglob("*") if f.is_file())


@contextlib.contextmanager
def chroma_server(path: Path) -> Iterator[tuple[str, int]]:
    """A ``chroma run`` server on a free loopback port over ``path``; yields (URL, pid)."""
    import httpx

    from mia.graph.server import free_port

    port = free_port()
    log = path.parent / "chroma.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(["chroma", "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
                                   stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"`chroma run` exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/v2/heartbeat", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"`chroma run` did not answer within 60 s: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


class _Library:
    """One store (a folder or a server) that the steps grow; all timing goes through here."""

    def __init__(self, name: str, client: Any, embedder: Any, cache_path: Path, stem: bool) -> None:
        from mia.stores.ingest import IngestOptions
        from mia.stores.summaries import SummaryCache

        self.name, self.client, self.embedder, self.stem = name, client, embedder, stem
        self.options = IngestOptions()
        self.cache = SummaryCache(cache_path)

    def add(self, sources: Sequence[Any], collection: str | None = None) -> dict[str, Any]:
        """Ingest ``sources`` and bring the BM25 chunk index and the in-memory vectors up to date,
        as the first question after an ingestion would; timed end to end."""
        from mia.stores.ingest import ingest

        name = collection or self.name
        started = time.perf_counter()
        report = ingest([s.path for s in sources], name, self.embedder, options=self.options, client=self.client,
                        cache=self.cache, progress=False)
        ingested = time.perf_counter()
        index_seconds = self.refresh(name)
        return {"seconds": ingested - started + index_seconds, "ingest_seconds": ingested - started,
                "index_seconds": index_seconds, "tokens": report.tokens, "chunks": report.chunks,
                "summaries": report.summaries}

    def add_paired(self, sources: Sequence[Any]) -> tuple[dict[str, Any], float]:
        """``add`` of ``sources`` one book at a time, each book followed by the pure embedding of its
        texts, then one index update: (the step's figures, its pure-embedding seconds).

        A whole step's ingestion then a whole step's embedding are minutes apart, and this
        machine's speed drifts over minutes: three runs of the same ingestion code gave ratios of
        1.05, 1.12 and 1.17. Pairs seconds apart put the drift on both sides alike."""
        from mia.stores.ingest import ingest

        seconds = pure = 0.0
        tokens = chunks = summaries = 0
        for source in sources:
            started = time.perf_counter()
            report = ingest([source.path], self.name, self.embedder, options=self.options, client=self.client,
                            cache=self.cache, progress=False)
            seconds += time.perf_counter() - started
            tokens, chunks, summaries = tokens + report.tokens, chunks + report.chunks, summaries + report.summaries
            pure += self.pure_embedding([source])
        index_seconds = self.refresh(self.name)
        return ({"seconds": seconds + index_seconds, "ingest_seconds": seconds, "index_seconds": index_seconds,
                 "tokens": tokens, "chunks": chunks, "summaries": summaries}, pure)

    def refresh(self, collection: str) -> float:
        """Seconds to bring the BM25 chunk index and the in-memory vectors up to date."""
        from mia.stores.bm25 import ChunkIndex
        from mia.stores.mindscape import Mindscape

        started = time.perf_counter()
        store = Mindscape(collection, self.client)
        ChunkIndex.for_collection(store, stem=self.stem)
        store.vector_rows(Level.CHUNK)
        store.vector_rows(Level.SESSION)
        return time.perf_counter() - started

    def pure_embedding(self, sources: Sequence[Any]) -> float:
        """``embed_documents`` alone on the chunk and summary texts the ingestion of ``sources`` embedded."""
        from mia.stores.ingest import EMBED_BATCH
        from mia.stores.ingest.chunks import chunk_book
        from mia.stores.mindscape import Mindscape

        texts = [c.text for s in sources for c in chunk_book(s.text, self.options, self.embedder)[1]]
        got = Mindscape(self.name, self.client).summaries.get(
            where={"book": {"$in": [s.book for s in sources]}}, include=["documents"])
        texts += list(got["documents"])
        started = time.perf_counter()
        for start in range(0, len(texts), EMBED_BATCH):
            self.embedder.embed_documents(texts[start : start + EMBED_BATCH])
        return time.perf_counter() - started

    def drop(self, collection: str) -> None:
        from mia.stores.chroma import delete_mindscape
        from mia.stores.settings import mia_home

        delete_mindscape(collection, self.client)
        shutil.rmtree(mia_home() / "bm25" / collection, ignore_errors=True)


def _latencies(collection: str, questions: Sequence[str]) -> dict[str, dict[str, float]]:
    from mia.evals.bench import time_graphs

    totals = {name: stages["total"] for name, stages in time_graphs(collection, questions).items()}
    out = {name: {"p50": percentile(t, 50), "p95": percentile(t, 95), "mean": statistics.fmean(t)} for name, t in totals.items()}
    out["ratio_p50"] = {"mia_rag/rag": out["mia_rag"]["p50"] / out["rag"]["p50"]}
    return out


def _add_one_book(library: _Library, book: Any) -> dict[str, Any]:
    """The held-out book added to the full collection, against the same book alone into an empty
    one, measured before and after the add (their mean), so drift of the machine's load cancels."""
    alone = []
    for attempt in range(2):
        scratch = f"{library.name}-alone"
        run = library.add([book], scratch)
        library.drop(scratch)
        alone.append(run["seconds"])
        if attempt == 0:
            added = library.add([book])
    return {"book": book.book, "tokens": added["tokens"], "add_seconds": added["seconds"], "add_index_seconds": added["index_seconds"],
            "alone_seconds": alone, "ratio": added["seconds"] / statistics.fmean(alone), "goal": ADD_GOAL}


def measure_scale(books: Path, fractions: Sequence[float] = DEFAULT_FRACTIONS, held_out: str = DEFAULT_HELD_OUT,
                  n_questions: int = 50, server: bool = True, progress: bool = True) -> dict[str, Any]:
    from mia.evals.bench import machine, questions_from
    from mia.nodes.context import RagSettings
    from mia.stores.embeddings import load_embedder
    from mia.stores.ingest import collect_sources
    from mia.stores.chroma import chroma_client
    from mia.stores.mindscape import Mindscape
    from mia.stores.settings import Settings, mia_home
    from mia.stores.tokens import count_tokens

    sources = collect_sources([books])
    by_book = {s.book: s for s in sources}
    if held_out not in by_book:
        raise ValueError(f"--held-out {held_out!r} is not one of the books under {books} ({', '.join(sorted(by_book))})")
    extra = by_book[held_out]
    grown = [s for s in sources if s.book != held_out]
    if not grown:
        raise ValueError(f"{books} holds no book besides the held-out one; give a folder of several .txt books")
    ends = prefix_ends([count_tokens(s.text) for s in grown], fractions)
    embedder = load_embedder("")
    embedder.embed_documents(["warm-up"] * 4)
    stem = RagSettings().bm25_stemming
    name = f"scale-{os.getpid()}"
    saved = {k: os.environ.get(k) for k in ("MIA_CHROMA_PATH", "MIA_CHROMA_URL")}
    result: dict[str, Any] = {"books": str(books), "held_out": held_out, "embedder": embedder.name, "machine": machine(),
                              "summarizer": "extractive", "questions": n_questions, "steps": [], "server": None,
                              "goals": {"ingest_ratio": INGEST_GOAL, "add_ratio": ADD_GOAL, "peak_rss_gb": RSS_GOAL_GB,
                                        "p50_growth": LATENCY_GROWTH_GOAL, "mia_rag/rag": RETRIEVAL_GOAL}}
    bar = tqdm(total=len(ends) + (3 if server else 1), desc="bench scale", unit="step", disable=not progress)
    with tempfile.TemporaryDirectory(prefix="mia-scale-") as tmp:
        try:
            os.environ.pop("MIA_CHROMA_URL", None)
            os.environ["MIA_CHROMA_PATH"] = str(Path(tmp) / "chroma")
            client = chroma_client(Settings())
            library = _Library(name, client, embedder, Path(tmp) / "summaries.sqlite", stem)
            questions: list[str] = []
            done = 0
            for end in ends:
                bar.set_postfix_str(f"ingesting {end} of {len(grown)} books")
                step, pure = library.add_paired(grown[done:end])
                done = end
                store = Mindscape(name, client)
                questions = questions or questions_from(store, n_questions)
                bar.set_postfix_str(f"timing {len(questions)} questions")
                stats = store.stats()
                result["steps"].append({
                    "books": end, "tokens": stats["tokens"], "chunks": stats["chunks"], "summaries": stats["summaries"],
                    "added_tokens": step["tokens"], "ingest_seconds": step["seconds"], "index_seconds": step["index_seconds"],
                    "tokens_per_s": step["tokens"] / step["seconds"], "pure_embedding_seconds": pure,
                    "ingest_ratio": step["seconds"] / pure, "peak_rss_bytes": _peak_rss_bytes(),
                    "disk_bytes": _bytes_under(Path(tmp) / "chroma", mia_home() / "bm25" / name),
                    "latency": _latencies(name, questions),
                })
                bar.update()
            bar.set_postfix_str(f"adding {held_out}")
            result["add_one_book"] = _add_one_book(library, extra)
            result["add_one_book"]["peak_rss_bytes"] = _peak_rss_bytes()
            bar.update()
            library.drop(name)
            if server:
                result["server"] = _on_server(Path(tmp), grown, extra, embedder, stem, questions, bar)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(mia_home() / "bm25" / name, ignore_errors=True)
            bar.close()
    steps = result["steps"]
    result["growth"] = [
        {"from_tokens": a["tokens"], "to_tokens": b["tokens"],
         **{f"{s}_p50_exponent": growth_exponent((a["tokens"], a["latency"][s]["p50"]), (b["tokens"], b["latency"][s]["p50"]))
            for s in SYSTEMS},
         **{f"{s}_p50_ratio": b["latency"][s]["p50"] / a["latency"][s]["p50"] for s in SYSTEMS}}
        for a, b in zip(steps, steps[1:])
    ]
    return result


def _on_server(tmp: Path, grown: Sequence[Any], extra: Any, embedder: Any, stem: bool,
               questions: Sequence[str], bar: tqdm) -> dict[str, Any]:
    """The largest size again, in a ``chroma run`` server: ingestion, latency and one more book.
    The ingestion is paired book by book with pure embedding, as the embedded steps are: reusing
    their embedding seconds, timed many minutes earlier, lets the machine's drift into the ratio."""
    import psutil

    from mia.stores.chroma import chroma_client

    from mia.stores.mindscape import Mindscape
    from mia.stores.settings import Settings, mia_home

    name = f"scale-{os.getpid()}-server"
    with chroma_server(tmp / "chroma-server") as (url, pid):
        os.environ["MIA_CHROMA_URL"] = url
        client = chroma_client(Settings())
        library = _Library(name, client, embedder, tmp / "summaries-server.sqlite", stem)
        try:
            bar.set_postfix_str("ingesting into the Chroma server")
            step, pure = library.add_paired(grown)
            stats = Mindscape(name, client).stats()
            bar.update()
            bar.set_postfix_str("timing questions against the server")
            out = {"tokens": stats["tokens"], "chunks": stats["chunks"], "ingest_seconds": step["seconds"],
                   "tokens_per_s": step["tokens"] / step["seconds"], "pure_embedding_seconds": pure,
                   "ingest_ratio": step["seconds"] / pure, "latency": _latencies(name, questions),
                   "server_rss_bytes": psutil.Process(pid).memory_info().rss,
                   "disk_bytes": _bytes_under(tmp / "chroma-server", mia_home() / "bm25" / name)}
            out["add_one_book"] = _add_one_book(library, extra)
            bar.update()
            return out
        finally:
            shutil.rmtree(mia_home() / "bm25" / name, ignore_errors=True)
            shutil.rmtree(mia_home() / "bm25" / f"{name}-alone", ignore_errors=True)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def table(result: dict[str, Any]) -> str:
    """The report as Markdown: one row per size, then the add and server figures with their goals."""
    g = result["goals"]
    lines = [
        f"Library: {result['books']} ({result['embedder']}, {result['machine']}, {result['summarizer']} summaries); "
        f"{result['questions']} questions, retrieval only.",
        "",
        "| books | tokens | chunks | ingest tok/s | ingest / pure embedding | index update s | peak RSS GB | disk GB "
        "| rag p50 / p95 ms | mia_rag p50 / p95 ms | mia_rag / rag p50 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["steps"]:
        lat = s["latency"]
        lines.append(
            f"| {s['books']} | {s['tokens']:,} | {s['chunks']:,} | {s['tokens_per_s']:,.0f} | {s['ingest_ratio']:.3f} "
            f"| {s['index_seconds']:.2f} | {_gb(s['peak_rss_bytes'])} | {_gb(s['disk_bytes'])} "
            f"| {lat['rag']['p50'] * 1e3:.0f} / {lat['rag']['p95'] * 1e3:.0f} "
            f"| {lat['mia_rag']['p50'] * 1e3:.0f} / {lat['mia_rag']['p95'] * 1e3:.0f} | {lat['ratio_p50']['mia_rag/rag']:.2f} |")
    lines.append("")
    for grow in result["growth"]:
        lines.append(f"- {grow['from_tokens']:,} → {grow['to_tokens']:,} tokens: p50 × {grow['rag_p50_ratio']:.2f} (`rag`), "
                     f"× {grow['mia_rag_p50_ratio']:.2f} (`mia_rag`); growth exponent {grow['rag_p50_exponent']:.2f} / "
                     f"{grow['mia_rag_p50_exponent']:.2f} (1 = linear)")
    first, last = result["steps"][0], result["steps"][-1]
    for system in SYSTEMS:
        ratio = last["latency"][system]["p50"] / first["latency"][system]["p50"]
        lines.append(f"- `{system}` p50 at the largest size / at the smallest: {ratio:.2f} (goal ≤ {g['p50_growth']:g}: "
                     f"{'met' if ratio <= g['p50_growth'] else 'NOT met'})")
    worst = max(s["ingest_ratio"] for s in result["steps"])
    lines.append(f"- ingestion / pure embedding, worst step: {worst:.3f} (goal ≤ {g['ingest_ratio']:g}: "
                 f"{'met' if worst <= g['ingest_ratio'] else 'NOT met'})")
    peak = max(s["peak_rss_bytes"] for s in result["steps"] + [result["add_one_book"]])
    lines.append(f"- peak RSS {_gb(peak)} GB (goal ≤ {g['peak_rss_gb']:g}: {'met' if peak / 1e9 <= g['peak_rss_gb'] else 'NOT met'})")
    worst_ratio = max(s["latency"]["ratio_p50"]["mia_rag/rag"] for s in result["steps"])
    lines.append(f"- `mia_rag` / `rag` p50, worst size: {worst_ratio:.2f} (goal ≤ {g['mia_rag/rag']:g}: "
                 f"{'met' if worst_ratio <= g['mia_rag/rag'] else 'NOT met'})")
    lines.append(_add_line("embedded store", result["add_one_book"], last["tokens"]))
    server = result.get("server")
    if server:
        lat = server["latency"]
        lines += [
            "",
            f"Chroma server (`chroma run` on 127.0.0.1), the largest size again ({server['tokens']:,} tokens, {server['chunks']:,} chunks):",
            f"- ingestion {server['tokens_per_s']:,.0f} tokens/s, / pure embedding {server['ingest_ratio']:.3f}; "
            f"server RSS {_gb(server['server_rss_bytes'])} GB; disk {_gb(server['disk_bytes'])} GB",
            f"- `rag` p50 / p95 {lat['rag']['p50'] * 1e3:.0f} / {lat['rag']['p95'] * 1e3:.0f} ms; `mia_rag` "
            f"{lat['mia_rag']['p50'] * 1e3:.0f} / {lat['mia_rag']['p95'] * 1e3:.0f} ms; mia_rag / rag p50 {lat['ratio_p50']['mia_rag/rag']:.2f}",
            _add_line("server", server["add_one_book"], server["tokens"]),
        ]
    return "\n".join(lines)


def _add_line(where: str, add: dict[str, Any], tokens: int) -> str:
    return (f"- adding {add['book']} ({add['tokens']:,} tokens) to the {tokens:,}-token collection ({where}): "
            f"{add['add_seconds']:.1f} s (of which index update {add['add_index_seconds']:.2f} s), alone into an empty "
            f"collection {statistics.fmean(add['alone_seconds']):.1f} s; ratio {add['ratio']:.2f} (goal ≤ {add['goal']:g}: "
            f"{'met' if add['ratio'] <= add['goal'] else 'NOT met'})")


def plot(path: Path, result: dict[str, Any]) -> None:
    from matplotlib.figure import Figure

    steps = result["steps"]
    tokens = [s["tokens"] / 1e6 for s in steps]
    fig = Figure(figsize=(11, 3.6))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    for i, (system, marker) in enumerate(zip(SYSTEMS, "os")):
        ax1.plot(tokens, [s["latency"][system]["p50"] * 1e3 for s in steps], marker=marker, color=f"C{i}", label=f"{system} p50")
        ax1.plot(tokens, [s["latency"][system]["p95"] * 1e3 for s in steps], marker=marker, color=f"C{i}", linestyle=":",
                 label=f"{system} p95")
    ax1.set(xlabel="collection (M tokens)", ylabel="retrieval latency (ms)", title="Retrieval, retrieval only")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=7)
    ax2.plot(tokens, [s["tokens_per_s"] for s in steps], marker="o", label="ingestion")
    ax2.plot(tokens, [s["added_tokens"] / s["pure_embedding_seconds"] for s in steps], marker="s", label="pure embedding")
    ax2.set(xlabel="collection (M tokens)", ylabel="tokens/s of the step", title="Ingestion throughput")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=7)
    ax3.plot(tokens, [s["peak_rss_bytes"] / 1e9 for s in steps], marker="o", label="peak RSS")
    ax3.plot(tokens, [s["disk_bytes"] / 1e9 for s in steps], marker="s", label="on disk")
    ax3.set(xlabel="collection (M tokens)", ylabel="GB", title="Memory and disk")
    ax3.set_ylim(bottom=0)
    ax3.legend(fontsize=7)
    fig.suptitle(f"mia bench scale: {result['embedder']}, {result['machine']}", fontsize=9)
    fig.tight_layout()
    save_png(fig, path)


def cmd_scale_bench(args: argparse.Namespace) -> int:
    books = Path(args.books) if args.books else data_root() / "books"
    if not books.is_dir():
        raise ValueError(f"{books}: no such folder; pass --books DIR or set MIA_DATA to the shared data folder")
    if args.questions < 1:
        raise ValueError(f"--questions must be at least 1, got {args.questions}")
    try:
        fractions = [float(f) for f in args.fractions.split(",")]
    except ValueError:
        raise ValueError(f"--fractions must be numbers separated by commas, e.g. 0.1,0.3,1; got {args.fractions!r}") from None
    started = time.perf_counter()
    result = measure_scale(books, fractions, args.held_out, args.questions, server=not args.no_server, progress=not args.json)
    result["wall_minutes"] = (time.perf_counter() - started) / 60
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        print(f"({result['wall_minutes']:.1f} min)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1))
        (out / "table.md").write_text(table(result) + "\n")
        plot(out / "scale.png", result)
    return 0


def add_scale_bench(benches: Any) -> argparse.ArgumentParser:
    p = benches.add_parser("scale", help="ingestion, memory, disk and retrieval latency as one collection grows to the whole books library")
    p.add_argument("--books", help="a folder of .txt books (default: books/ in the shared data, ~2.6M tokens)")
    p.add_argument("--fractions", default=",".join(f"{f:g}" for f in DEFAULT_FRACTIONS),
                   help="the sizes measured, as fractions of the library (default 0.1,0.3,1)")
    p.add_argument("--held-out", default=DEFAULT_HELD_OUT, help=f"the book added to the full collection at the end (default {DEFAULT_HELD_OUT})")
    p.add_argument("--questions", type=int, default=50, help="questions timed at each size (default 50)")
    p.add_argument("--no-server", action="store_true", help="skip the `chroma run` server measurements")
    p.add_argument("--out", help="also write results.json, table.md and scale.png into this folder")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_scale_bench)
    return p
