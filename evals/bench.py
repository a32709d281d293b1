"""Speed benchmarks, ``mia bench NAME``: figures measured in one run, printed with their goals.

Every figure that is compared with another is measured in the same process, on the same input,
one right after the other, because absolute times on a shared two-core machine vary by a factor of
two from minute to minute while ratios measured side by side do not. Nothing here asserts a time:
the goals are printed next to the figures for a person to read.

* ``mia bench ingest [PATH]``: ingestion throughput (tokens/s) per stage, and the overhead of
  ingestion over pure embedding: (ingestion without summaries) / (``embed_documents`` on the same
  chunk texts with the same batch size). Goal ≤ 1.15: ingestion should cost little beyond the
  embedding it cannot avoid.
* ``mia bench retrieval --collection NAME``: per-question retrieval time of ``mia_rag`` and ``rag``
  (retrieval only, no LLM) through the compiled graphs, per node (``mia_rag``: step 0 and the
  signature's selection, then E2) and end to end, with and without the query embedding. Goals:
  mia_rag / rag ≤ 1.5, selection ≤ 5 ms at K0 = 50.
* ``mia bench llm``: the embedded model's prompt and generated tokens/s through the project's call
  path against a bare llama.cpp call, idle and beside one busy process (``evals/bench_llm.py``).

Adding a benchmark (``serve``, ``cost``, ...): write ``add_NAME_bench(benches)``, which adds its
parser with ``func=`` its handler (returning an exit code), and list it in :data:`BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from mia.evals.bench_llm import add_llm_bench
from mia.evals.bench_scale import add_scale_bench
from mia.evals.bench_serve import add_serve_bench
from mia.evals.bench_summaries import add_summaries_bench
from mia.evals.web_page import add_web_bench
from mia.stores.settings import data_root

if TYPE_CHECKING:
    from mia.nodes.context import CommonSettings, GraphSettings
    from mia.stores.embeddings import Embedder

DEFAULT_BOOK = Path("books") / "holmes" / "the_sign_of_the_four.txt"
"""A mid-size real novel (~62k tokens, ~300 chunks at the default size): long enough that the
per-chunk costs dominate, short enough to ingest three times in about a minute on two cores."""
INGEST_GOAL = 1.15
RETRIEVAL_GOAL = 1.5
SELECTION_GOAL_MS = 5.0
SYSTEMS = ("rag", "mia_rag")
MEMOISED = "query memoised"


def machine() -> str:
    """Cores and device, printed beside every time: times are only compared within one machine's run."""
    import torch

    return f"{os.cpu_count()} cores, {'cuda' if torch.cuda.is_available() else 'cpu'}"


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "median": statistics.median(values)}


# ---------------------------------------------------------------------------------------------
# ingestion


def measure_ingest(path: Path, summarizer: str = "extractive", embedder_spec: str = "", repeat: int = 1) -> dict[str, Any]:
    """Ingest ``path`` into throwaway stores and embed its chunk texts on their own, in one process.

    One ingestion with the asked summarizer gives the per-stage table. The ratio comes from
    ``repeat`` pairs of (ingestion without summaries, pure embedding of the same chunk texts with
    the same batch size), run back to back with the order alternating between pairs, so slow
    drift of the machine's load affects both sides alike; its median over the pairs is reported.
    Every ingestion gets a fresh store and summary cache, so nothing is skipped as unchanged or
    served from a cache, and the embedder is warmed up first, so no run pays for loading it.
    """
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    from mia.stores.embeddings import load_embedder
    from mia.stores.ingest import EMBED_BATCH, IngestOptions, collect_sources, ingest
    from mia.stores.ingest.chunks import chunk_book
    from mia.stores.summaries import SummaryCache
    from mia.stores.tokens import count_tokens

    (source,) = collect_sources([path])
    embedder = load_embedder(embedder_spec)
    embedder.embed_documents([source.text[:2000]] * 4)  # warm-up
    tokens = count_tokens(source.text)
    options = IngestOptions()
    texts = [c.text for c in chunk_book(source.text, options, embedder)[1]]

    def ingest_once(summary_mode: str) -> tuple[Any, float]:
        with tempfile.TemporaryDirectory(prefix="mia-bench-") as tmp:
            client = chromadb.PersistentClient(path=str(Path(tmp) / "chroma"), settings=ChromaSettings(anonymized_telemetry=False))
            started = time.perf_counter()
            report = ingest([path], "bench", embedder, options=IngestOptions(summarizer=summary_mode), client=client,
                            cache=SummaryCache(Path(tmp) / "summaries.sqlite"), progress=False)
            return report, time.perf_counter() - started

    def embed_only() -> float:
        started = time.perf_counter()
        for start in range(0, len(texts), EMBED_BATCH):
            embedder.embed_documents(texts[start : start + EMBED_BATCH])
        return time.perf_counter() - started

    report, total = ingest_once(summarizer)
    pairs = []
    for r in range(repeat):
        if r % 2 == 0:
            (plain_report, plain), pure = ingest_once("none"), embed_only()
        else:
            pure, (plain_report, plain) = embed_only(), ingest_once("none")
        pairs.append({"ingest_without_summaries_seconds": plain, "pure_embedding_seconds": pure, "ratio": plain / pure,
                      "ratio_within_run": plain / plain_report.seconds["embedding"]})

    stages = {name: {"seconds": s, "tokens_per_s": tokens / s if s > 0 else float("inf")} for name, s in report.seconds.items()}
    return {
        "book": str(path), "tokens": tokens, "chunks": report.chunks, "summaries": report.summaries,
        "embedder": embedder.name, "machine": machine(), "summarizer": summarizer, "batch": EMBED_BATCH,
        "stages": stages, "total_seconds": total, "total_tokens_per_s": tokens / total,
        "pure_embedding_chunks": len(texts), "pairs": pairs,
        "ratio": statistics.median(p["ratio"] for p in pairs),
        "ratio_within_run": statistics.median(p["ratio_within_run"] for p in pairs), "goal": INGEST_GOAL,
    }


def print_ingest(result: dict[str, Any]) -> None:
    print(f"mia bench ingest: {result['book']}")
    print(f"  {result['tokens']:,} tokens, {result['chunks']} chunks, {result['summaries']} summaries; "
          f"embedder {result['embedder']} ({result['machine']}), batch {result['batch']}")
    print(f"  ingestion with --summarizer {result['summarizer']}:")
    print(f"    {'stage':<12}{'seconds':>10}{'tokens/s':>12}")
    for name, stage in result["stages"].items():
        label = f"{name}*" if name == "embedding" and result["summaries"] else name
        print(f"    {label:<12}{stage['seconds']:>10.2f}{stage['tokens_per_s']:>12,.0f}")
    print(f"    {'total':<12}{result['total_seconds']:>10.2f}{result['total_tokens_per_s']:>12,.0f}"
          "   (end to end, incl. reading, hashing, opening the store)")
    if result["summaries"]:
        print("    * chunks and summaries")
    for i, pair in enumerate(result["pairs"], 1):
        print(f"  pair {i}: ingestion without summaries {pair['ingest_without_summaries_seconds']:.2f} s, "
              f"pure embedding of the same {result['pure_embedding_chunks']} chunk texts {pair['pure_embedding_seconds']:.2f} s, "
              f"ratio {pair['ratio']:.3f} (to its own embedding stage {pair['ratio_within_run']:.3f})")
    ratio, goal = result["ratio"], result["goal"]
    print(f"  ratio (ingestion without summaries) / (pure embedding), median of {len(result['pairs'])} = {ratio:.3f}   "
          f"goal ≤ {goal}: {'met' if ratio <= goal else 'NOT met'}")
    print(f"  the same ingestion over its own embedding stage, median = {result['ratio_within_run']:.3f} "
          "(one run's clock, so immune to load drift between the two sides; it cannot see a slower embedding path)")


def cmd_ingest_bench(args: argparse.Namespace) -> int:
    path = Path(args.path) if args.path else data_root() / DEFAULT_BOOK
    if not path.exists():
        raise ValueError(f"{path}: no such file; pass a .txt file or set MIA_DATA to the shared data folder")
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
    result = measure_ingest(path, args.summarizer, args.embedder, args.repeat)
    if args.json:
        print(json.dumps(result))
    else:
        print_ingest(result)
    return 0


def add_ingest_bench(benches: Any) -> argparse.ArgumentParser:
    p = benches.add_parser("ingest", help="ingestion throughput per stage and its overhead over pure embedding (goal ≤ 1.15)")
    p.add_argument("path", nargs="?", help=f"a .txt book (default: {DEFAULT_BOOK} in the shared data)")
    p.add_argument("--summarizer", choices=["none", "extractive"], default="extractive",
                   help="summaries for the per-stage run (default extractive; the ratio always uses none)")
    p.add_argument("--embedder", default="", help="embedder spec (default: MIA_EMBEDDINGS or minilm)")
    p.add_argument("--repeat", type=int, default=3,
                   help="(ingestion without summaries, pure embedding) pairs behind the median ratio (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_ingest_bench)
    return p


# ---------------------------------------------------------------------------------------------
# retrieval


def questions_from(store: Any, n: int) -> list[str]:
    """``n`` questions from the collection itself, one per chunk for chunks spread evenly over it.

    Each is the second of the chunk's sentences of at least six words (the first is usually the tail of a
    sentence cut by the chunk boundary), or its first when there is no second. Any collection can
    be benchmarked this way without a question file, and each question has matching text in the
    collection, so the searches do realistic work. Deterministic for a given collection.
    """
    from mia.stores.summaries import sentences

    ids = [i for book in store.commits.ordered() for i in store.book_chunk_ids(book)]
    if not ids:
        raise ValueError(f"collection {store.name!r} has no chunks to take questions from")
    picks = [ids[int(i)] for i in np.linspace(0, len(ids) - 1, num=min(n, len(ids)))]
    questions = []
    for record in store.chunk_records(picks):
        found = [s for s in sentences(record["text"]) if len(s.split()) >= 6]
        questions.append((found[1] if len(found) > 1 else (found or [record["text"]])[0])[:300])
    return questions


def graph_embedder(ctx: CommonSettings) -> Embedder:
    """The embedder the graphs read ``ctx.collection`` with: a timed run clears its query memo first,
    so that the run pays for its own query embedding, as a new question would."""
    from mia.nodes import resources

    return resources.embedder(resources.mindscape(ctx))


def timed_run(graph: Any, question: str, ctx: GraphSettings) -> dict[str, float]:
    """One retrieval-only run of a compiled graph, streamed by updates: each node's time is the gap
    between its update and the one before (the first also holds the run's start), ``total`` the whole run."""
    stages: dict[str, float] = {}
    started = last = time.perf_counter()
    for update in graph.stream({"question": question}, context=ctx, stream_mode="updates"):
        now = time.perf_counter()
        for node in update:  # the retrieval graphs run one node a step
            stages[node] = now - last
        last = now
    stages["total"] = time.perf_counter() - started
    return stages


def time_graphs(collection: str, questions: Sequence[str], settings: dict[str, Any] | None = None,
                memoised: bool = False) -> dict[str, dict[str, list[float]]]:
    """Per question, each of ``SYSTEMS`` run through its compiled graph (retrieval only): seconds per
    node and in total, by system. Which graph runs first alternates between questions, so neither
    systematically gets the warmer caches. With ``memoised``, each run is followed by a second one
    that reads the query vector from the embedder's memo (system ``NAME, query memoised``): on a
    loaded CPU the one query embedding both graphs pay varies by several times its own length
    between calls, and these runs are free of it."""
    from mia.graph.registry import load_graph, settings_for

    given = {**(settings or {}), "collection": collection, "retrieval_only": True}
    contexts = {name: settings_for(name, given) for name in SYSTEMS}
    embedder = graph_embedder(contexts[SYSTEMS[0]])
    graphs = {name: load_graph(name) for name in SYSTEMS}

    def cold(name: str, question: str) -> dict[str, float]:
        embedder.forget_queries()
        return timed_run(graphs[name], question, contexts[name])

    for name in SYSTEMS:  # warm-up: models, Chroma segments, the BM25 index, LangGraph's caches
        cold(name, questions[0])
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i, question in enumerate(questions):
        for name in SYSTEMS if i % 2 == 0 else SYSTEMS[::-1]:
            runs = [(name, cold(name, question))]
            if memoised:
                runs.append((f"{name}, {MEMOISED}", timed_run(graphs[name], question, contexts[name])))
            for system, stages in runs:
                for stage, seconds in stages.items():
                    times[system][stage].append(seconds)
    return times


def measure_retrieval(collection: str, n_questions: int = 20, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both retrieval graphs timed per node and end to end on questions from the collection itself."""
    from mia.nodes import resources
    from mia.nodes.context import context_from
    from mia.stores.mindscape import Mindscape

    ctx = context_from("mia_rag", {**(settings or {}), "collection": collection, "retrieval_only": True})
    store = Mindscape(collection)
    if store.summaries.count() == 0:
        raise ValueError(f"collection {collection!r} has no session summaries: re-ingest it with --summarizer llm or extractive")
    questions = questions_from(store, n_questions)
    times = time_graphs(collection, questions, settings, memoised=True)
    return {
        "collection": collection, "chunks": store.chunks.count(), "summaries": store.summaries.count(),
        "embedder": resources.embedder(store).name, "machine": machine(), "questions": len(questions),
        "question_source": "one sentence from each of that many chunks spread evenly over the collection",
        "settings": {"k0": ctx.k0, "k_sum": ctx.k_sum, "top_k": ctx.top_k, "candidates": ctx.candidates,
                     "alpha": ctx.alpha, "sig_strategy": ctx.sig_strategy, "retriever": ctx.retriever},
        "stages": {system: {stage: _stats(values) for stage, values in stages.items()} for system, stages in times.items()},
        "ratios": _ratios(times),
        "goal": RETRIEVAL_GOAL, "selection_goal_ms": SELECTION_GOAL_MS,
    }


def _ratios(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """mia_rag / rag, of means and of medians: end to end, its retrieval nodes alone (without
    ``prepare`` and the graph's start), and end to end with the query vector memoised."""
    def ratio(mia: Sequence[float], rag: Sequence[float]) -> dict[str, float]:
        return {"of_means": statistics.fmean(mia) / statistics.fmean(rag),
                "of_medians": statistics.median(mia) / statistics.median(rag)}

    def retrieval(system: str) -> list[float]:
        stages = times[system]
        return [sum(values) for values in zip(*(stages[s] for s in stages if s not in ("prepare", "total")))]

    return {
        "graphs": ratio(times["mia_rag"]["total"], times["rag"]["total"]),
        "retrieval_nodes": ratio(retrieval("mia_rag"), retrieval("rag")),
        "graphs_without_query_embedding": ratio(times[f"mia_rag, {MEMOISED}"]["total"], times[f"rag, {MEMOISED}"]["total"]),
    }


def print_retrieval(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(f"mia bench retrieval: collection {result['collection']} ({result['chunks']} chunks, {result['summaries']} summaries), "
          f"embedder {result['embedder']} ({result['machine']})")
    print(f"  {result['questions']} questions ({result['question_source']}); K0={s['k0']}, K_sum={s['k_sum']}, "
          f"top_k={s['top_k']}, candidates={s['candidates']}, alpha={s['alpha']}, sig_strategy={s['sig_strategy']}, retriever={s['retriever']}")
    width = max(map(len, result["stages"])) + 2
    print(f"    {'system':<{width}}{'node':<18}{'mean ms':>10}{'median ms':>11}")
    for system, stages in result["stages"].items():
        for stage, st in stages.items():
            print(f"    {system:<{width}}{stage:<18}{st['mean'] * 1e3:>10.2f}{st['median'] * 1e3:>11.2f}")
    goal = result["goal"]
    print(f"  ratio mia_rag / rag{'':<38}{'of means':>10}{'of medians':>12}   goal ≤ {goal}")
    for key, ratio in result["ratios"].items():
        verdict = "met" if ratio["of_means"] <= goal else "NOT met"
        print(f"    {key.replace('_', ' '):<52}{ratio['of_means']:>10.2f}{ratio['of_medians']:>12.2f}   {verdict}")
    # Both nodes run one first stage on a memoised query vector; what mia_rag's adds is the selection.
    step0 = result["stages"][f"mia_rag, {MEMOISED}"]["init_signature"]["median"] * 1e3
    first_stage = result["stages"][f"rag, {MEMOISED}"]["retrieve"]["median"] * 1e3
    selection, goal_ms = step0 - first_stage, result["selection_goal_ms"]
    print(f"  selection at K0={s['k0']}: mia_rag's init_signature {step0:.2f} ms less rag's retrieve {first_stage:.2f} ms "
          f"(medians, query memoised) = {selection:.2f} ms   goal ≤ {goal_ms:g} ms: {'met' if selection <= goal_ms else 'NOT met'}")


def cmd_retrieval_bench(args: argparse.Namespace) -> int:
    if args.questions < 1:
        raise ValueError(f"--questions must be at least 1, got {args.questions}")
    settings = {}
    for pair in args.set or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r} is not KEY=VALUE; e.g. --set k0=50")
        settings[key.strip()] = value
    result = measure_retrieval(args.collection, args.questions, settings)
    if args.json:
        print(json.dumps(result))
    else:
        print_retrieval(result)
    return 0


def add_retrieval_bench(benches: Any) -> argparse.ArgumentParser:
    p = benches.add_parser("retrieval", help="per-question retrieval time of mia_rag vs rag, per stage (goal ratio ≤ 1.5)")
    p.add_argument("--collection", required=True, help="an ingested collection with session summaries")
    p.add_argument("--questions", type=int, default=20, help="questions, taken from the collection's own chunks (default 20)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a run setting, e.g. --set k0=100")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_retrieval_bench)
    return p


# ---------------------------------------------------------------------------------------------
# registration

BENCHMARKS: list[Callable[[Any], argparse.ArgumentParser]] = [add_ingest_bench, add_retrieval_bench, add_scale_bench, add_serve_bench,
                                                              add_llm_bench, add_summaries_bench, add_web_bench]
"""One entry per ``mia bench`` subcommand, in the order ``mia bench --help`` lists them."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` and its subcommands to a parser's subcommands; each handler is ``args.func``."""
    p = subparsers.add_parser("bench", help="speed benchmarks, measured in one run, printed with their goals")
    benches = p.add_subparsers(dest="bench", required=True)
    for add in BENCHMARKS:
        add(benches)
    return p
