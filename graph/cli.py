"""The ``mia`` command line: ingest sources, list and remove collections, ask, serve, and the demo.

Every user-facing failure ends as one line ``mia: error: ...`` naming the problem and the fix,
with exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mia.stores.settings import data_root, offline_environment

if TYPE_CHECKING:
    from mia.nodes.context import GraphSettings

DEMO_BOOK = Path("books") / "holmes" / "a_study_in_scarlet.txt"
DEMO_COLLECTION = "demo-holmes"
SUMMARIZER_CHOICES = ("llm", "llm-excerpt", "extractive", "none")
DEFAULT_SUMMARIZER = "extractive"
DEFAULT_CHUNKER = "structure"
CARD_CHOICES = ("llm", "names", "none")
DEFAULT_CARDS = "names"
"""stores.ingest.SUMMARIZERS, IngestOptions.summarizer and IngestOptions.chunker, stores.book_card.CardMode and
DEFAULT_CARDS, spelled out so that parsing the command line imports no store (a test keeps them equal)."""
DEMO_QUESTION = "In which country was Dr. Watson wounded while serving as an army surgeon?"


class CliError(Exception):
    """A user-facing failure with its one-line message."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from mia.stores.chat import ModelFileError
    from mia.stores.ingest import InputError
    from mia.stores.chroma import MindscapeError

    from mia.nodes.question import QuestionError

    errors: list[type[BaseException]] = [CliError, InputError, MindscapeError, ModelFileError, QuestionError]
    return tuple(errors)


def _connection_errors() -> tuple[type[BaseException], ...]:
    try:
        import openai
        import httpx

        return (openai.APIConnectionError, openai.APITimeoutError, httpx.ConnectError)
    except ImportError:
        return ()


def cmd_ingest(args: argparse.Namespace) -> int:
    from mia.stores.writer_lock import settings_store_path, writer_lock

    # A second writer is refused before importing the stores, which alone takes longer than the rest
    # of the refusal (issue 23: under 2 s); ingest_sources takes the same lock again, re-entrantly.
    with writer_lock(settings_store_path()):
        from mia.stores.ingest import IngestOptions, ingest_sources

        options = IngestOptions(chunk_size=args.chunk_size, overlap=args.overlap, window=args.window, summarizer=args.summarizer,
                                chunker=args.chunker, keep_front_matter=args.keep_front_matter, window_unit=args.window_unit)
        started = time.perf_counter()
        report = ingest_sources(args.paths, args.collection, options, embedder_spec=args.embedder or "", cards=args.cards,
                                progress=not args.quiet)
    elapsed = time.perf_counter() - started
    print(
        f"{args.collection}: {len(report.books_written)} book(s) written, {len(report.books_unchanged)} unchanged; "
        f"{report.chunks} chunks{f' ({report.chunks_reused} vectors reused)' if report.chunks_reused else ''}, "
        f"{report.summaries} summaries ({report.summaries_from_cache} from cache), "
        f"{report.llm_calls} LLM calls, {elapsed:.1f}s"
    )
    written = [(level, check) for level, check in report.faithfulness.items() if check.sentences]
    if written:  # what the chat model wrote this run, and how much of it its sources bear out
        print("written: " + ", ".join(f"{level} names in their source {check.grounded}/{check.names}, "
                                      f"{check.repeated} repeated and {check.dropped} dropped of {check.sentences} sentences"
                                      for level, check in written)
              + (f"; {report.parts} parts, {report.stories} stories" if report.stories else ""))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from mia.stores.chroma import chroma_client, list_mindscapes
    from mia.stores.mindscape import Mindscape

    client = chroma_client()
    stats = [Mindscape(name, client).stats() for name in list_mindscapes(client)]
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    if not stats:
        print("no collections yet: `mia ingest PATH --collection NAME` creates one")
    for s in stats:
        print(f"{s['collection']}: {len(s['books'])} book(s), {s['chunks']} chunks, {s['summaries']} summaries, "
              f"{s['tokens']} tokens, embedder {s['embedder']}")
        unfinished = s["unfinished"]
        if unfinished["books"] or unfinished["chunks"]:
            named = f" ({', '.join(unfinished['books'])})" if unfinished["books"] else ""
            print(f"  unfinished ingestion{named}: {unfinished['chunks']} chunks not committed, invisible to queries; "
                  f"rerun the same `mia ingest` (or `mia rm {s['collection']} --book BOOK`) to finish it")
        for b in s["books"]:
            left_out = f", {b['left_out_tokens']} tokens of front/back matter left out" if b["left_out_tokens"] else ""
            flagged = (f", {b['instruction_spans']} instruction-like span(s), kept out of prompts unless injection_guard=false "
                       "(--explain quotes them)" if b["instruction_spans"] else "")
            print(f"  {b['order']:>3}  {b['book']}: {b['chunks']} {b['chunker']} chunks, {b['summaries']} summaries, "
                  f"{b['tokens']} tokens{left_out}{flagged}")
            if b["card_text"]:
                print("       card: " + b["card_text"].replace("\n", "\n             "))
            if b["story"]:
                print(f"       story (written from {b['parts']} parts): {b['story']}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from mia.stores.chroma import delete_mindscape
    from mia.stores.mindscape import remove_book

    # Both take the store's writer lock themselves.
    if args.book:
        remove_book(args.collection, args.book)
        print(f"removed book {args.book} from {args.collection}")
    else:
        delete_mindscape(args.collection)
        print(f"removed {args.collection}")
    return 0


def run_question(graph_name: str, question: str, settings: dict[str, Any], options: Sequence[str] = ()) -> tuple[dict[str, Any], GraphSettings]:
    """Run one question graph; returns its final state and the settings it ran with (for --explain)."""
    from mia.graph.registry import load_graph
    from mia.nodes.context import context_from

    ctx = context_from(graph_name, settings)
    payload: dict[str, Any] = {"question": question}
    if options:
        payload["options"] = list(options)
    return load_graph(graph_name).invoke(payload, context=ctx), ctx


def _explain(store_name: str, state: dict[str, Any], ctx: GraphSettings) -> str:
    from mia.nodes.answer import reader_input
    from mia.nodes.context import RetrievalSettings, SignatureGraphSettings
    from mia.stores.mindscape import Mindscape

    store = Mindscape(store_name)
    lines: list[str] = []
    if state.get("hypothesis"):
        lines.append("Searched with the question and the passage the model wrote for it (hypothetical_passage):")
        lines.append("  " + state["hypothesis"].replace("\n", "\n  "))
    if state.get("signature"):
        lines.append("Signature (selection order, marginal gains: total = relevance + coverage + diversity):")
        texts = {r["id"]: r["text"] for r in store.summary_records([s["id"] for s in state["signature"]])}
        for s in state["signature"]:
            lines.append(f"  {s['id']}: {s['gain']:.3f} = {s['relevance']:.3f} + {s['coverage']:.3f} + {s['diversity']:.3f}")
            lines.append(f"      {texts.get(s['id'], '')[:160]}")
    fused = " (score: reciprocal rank fusion with BM25)" if isinstance(ctx, RetrievalSettings) and ctx.retriever == "hybrid" else ""
    final = fused
    if state.get("signature") and isinstance(ctx, SignatureGraphSettings) and ctx.sig_strategy == "trained":
        final = (" (score: the trained signature head, κ·first-stage score + λ·signature-aware cosine + β·session "
                 "attention + β_near·attention on the neighbouring sessions that continue it; s_sig: the score beyond the "
                 "first stage's, i.e. the last three terms; the first stage's best hit leads)")
    for label, key in ((f"Step-0 ranking (query only){fused}", "step0"), (f"Final ranking{final}", "retrieved")):
        rows = state.get(key) or []
        if rows:
            lines.append(f"{label}:")
            for rank, r in enumerate(rows[:20], 1):
                lines.append(f"  {rank:>2}. {r['id']}  score {r['score']:.4f}  (s_qry {r['s_qry']:.4f}, s_sig {r['s_sig']:.4f})")
    for entry in state.get("trajectory") or []:
        lines.append(f"Step: {json.dumps(entry, ensure_ascii=False)[:400]}")
    if isinstance(ctx, RetrievalSettings) and ctx.book_card:
        _, cards = reader_input(store, [r["id"] for r in state.get("retrieved") or []][: ctx.top_k], ctx, texts=False)
        lines.append("Book cards given to the generator:" if cards else
                     "Book cards given to the generator: none (the books have no card yet: `mia ingest --cards llm`)")
        lines.extend("  " + card["text"].replace("\n", "\n  ") for card in cards)
    lines.extend(_explain_guard(store, state))
    return "\n".join(lines)


def _explain_guard(store: Any, state: dict[str, Any]) -> list[str]:
    """Instruction-like text in the retrieved chunks (kept out of every prompt unless
    injection_guard=false) and any answer the guard rejected."""
    from mia.nodes.answer import cut_ranges

    lines = []
    for chunk in store.chunk_records([r["id"] for r in (state.get("retrieved") or [])[:20]]):
        for a, b in cut_ranges(chunk):
            quoted = " ".join(chunk["text"][a:b].split())[:160]
            lines.append(f"  {chunk['id']} chars {chunk['start'] + a}–{chunk['start'] + b}: {quoted!r}")
    if lines:
        lines.insert(0, "Instruction-like text in the retrieved chunks (kept out of the prompts unless injection_guard=false):")
    for rejected in (state.get("guard") or {}).get("rejected", []):
        lines.append(f"Answer rejected as traced to an instruction: {rejected!r}")
    return lines


def _settings_of(pairs: Sequence[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` pairs as a dict, refusing a pair without ``=`` by name."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--set {pair!r} is not KEY=VALUE; e.g. --set k_sum=3")
        settings[key.strip()] = value
    return settings


def cmd_ask(args: argparse.Namespace) -> int:
    settings = _settings_of(args.set or [])
    settings["collection"] = args.collection
    started = time.perf_counter()
    state, ctx = run_question(args.graph, args.question, settings, args.option or ())
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({
            "graph": args.graph, "collection": args.collection, "question": state.get("question"),
            "answer": state.get("answer"), "citations": state.get("citations", []),
            "signature": state.get("signature", []), "step0": state.get("step0", []),
            "retrieved": state.get("retrieved", []), "trajectory": state.get("trajectory", []),
            "usage": state.get("usage", {}), "guard": state.get("guard", {}), "seconds": round(elapsed, 3),
        }, ensure_ascii=False))
        return 0
    if args.explain:
        print(_explain(args.collection, state, ctx))
        print()
    messages = state.get("messages") or []
    print(messages[-1].text if messages else state.get("answer", ""))
    usage = state.get("usage", {})
    print(f"\n({usage.get('llm_calls', 0)} LLM calls, {usage.get('input_tokens', 0)} prompt + "
          f"{usage.get('output_tokens', 0)} generated tokens, {elapsed:.1f}s)", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Ingest the demo book and answer one question, first answer as early as the chunks allow.

    On a new collection the chunks go in first (no summaries) and ``rag``, which reads chunks only,
    answers at once; then the session summaries are written into the same book (its chunk vectors
    are reused) and ``mia_rag`` answers with its signature. A rerun finds everything in place.
    """
    from mia.stores.chroma import chroma_client, list_mindscapes

    book = data_root() / DEMO_BOOK
    if not book.exists():
        raise CliError(f"demo book {book} not found: set MIA_DATA to the shared data folder (it holds books/holmes/)")
    started = time.perf_counter()
    stages: list[tuple[str, float]] = []

    def stage(name: str, run: Any) -> None:
        clock = time.perf_counter()
        run()
        stages.append((name, time.perf_counter() - clock))

    def ingest_with(summarizer: str, cards: str = DEFAULT_CARDS) -> None:
        cmd_ingest(argparse.Namespace(paths=[str(book)], collection=DEMO_COLLECTION, summarizer=summarizer, chunk_size=200,
                                      overlap=0, window=20, window_unit="chunks", chunker=DEFAULT_CHUNKER,
                                      keep_front_matter=False, embedder="", cards=cards, quiet=False))

    def ask(graph_name: str) -> None:
        print(f"\n== {graph_name}: {DEMO_QUESTION}")
        cmd_ask(argparse.Namespace(question=DEMO_QUESTION, collection=DEMO_COLLECTION, graph=graph_name,
                                   explain=False, json=False, set=[], option=[]))

    fresh = DEMO_COLLECTION not in list_mindscapes(chroma_client())
    if fresh and args.summarizer != "none":
        stage("chunks in (no summaries yet)", lambda: ingest_with("none", cards="none"))
        print(f"\nsession summaries ({args.summarizer}) are written next; rag reads chunks only, so it answers now")
        stage("first answer (rag)", lambda: ask("rag"))
        stage(f"session summaries ({args.summarizer})", lambda: ingest_with(args.summarizer))
    else:
        stage(f"ingestion ({args.summarizer})", lambda: ingest_with(args.summarizer))
        stage("answer (rag)", lambda: ask("rag"))
    print()
    cmd_ls(argparse.Namespace(json=False))
    stage("answer (mia_rag)", lambda: ask("mia_rag"))
    print("\ndemo stages:", file=sys.stderr)
    for name, seconds in stages:
        print(f"  {name:<36} {seconds:7.1f} s", file=sys.stderr)
    print(f"  {'total':<36} {time.perf_counter() - started:7.1f} s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mia", description="Question answering over sources too long for a context window.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="turn text files into a mindscape (chunks + session summaries in Chroma)")
    p.add_argument("paths", nargs="+", help=".txt/.md files or folders; one file is one book, in the order given")
    p.add_argument("--collection", required=True, help="collection name (lowercase letters, digits, - and _)")
    p.add_argument("--summarizer", choices=SUMMARIZER_CHOICES, default=DEFAULT_SUMMARIZER,
                   help="session summaries: extractive (the default: the window's most central sentences, no LLM; they "
                        "retrieve as well as the LLM's), by the chat model from the whole window (llm) or from an "
                        "~800-token excerpt of it (llm-excerpt), or none")
    p.add_argument("--chunk-size", type=int, default=200, help="most tiktoken tokens per chunk (default 200)")
    p.add_argument("--overlap", type=int, default=0, help="tokens shared by consecutive chunks (default 0)")
    p.add_argument("--window", type=int, default=20, help="chunks per session summary, W (default 20)")
    p.add_argument("--window-unit", choices=["chunks", "tokens"], default="chunks",
                   help="count W in chunks (default), or in tokens: each summary covers up to W × chunk size tokens")
    p.add_argument("--chunker", choices=["structure", "window"], default=DEFAULT_CHUNKER,
                   help="structure (default): paragraphs and sentences kept whole under the token budget, a heading starts "
                        "its chunk, so a retrieved chunk is a whole passage; window: fixed token windows, which cut "
                        "across paragraphs (for text without paragraph structure)")
    p.add_argument("--keep-front-matter", action="store_true",
                   help="also chunk Project Gutenberg's licence header and footer (left out by default)")
    p.add_argument("--embedder", default="", help="embedder spec (default: MIA_EMBEDDINGS or minilm)")
    p.add_argument("--cards", choices=CARD_CHOICES, default=DEFAULT_CARDS,
                   help="book cards, written after the books are in: by the chat model (narrator, main characters, "
                        "places, plot; about a minute a book with the embedded model), without a model (the most named "
                        "names, first- or third-person narration, a Gutenberg header's title and author), or none "
                        f"(default {DEFAULT_CARDS})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("ls", help="list collections with their books, chunks, summaries and tokens")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("rm", help="delete a collection, or one book of it")
    p.add_argument("collection")
    p.add_argument("--book", help="remove only this book (as `mia ls` names it); the rest of the collection stays")
    p.set_defaults(func=cmd_rm)

    from mia.graph.registry import QUESTION_GRAPHS

    p = sub.add_parser("ask", help="answer a question from a collection")
    p.add_argument("question")
    p.add_argument("--collection", required=True)
    p.add_argument("--graph", choices=QUESTION_GRAPHS, default="mia_rag")
    p.add_argument("--option", action="append", help="an answer option (repeat) for multiple choice")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one of the graph's settings, e.g. --set k_sum=3 (one it does not read is refused)")
    p.add_argument("--explain", action="store_true", help="show the signature, the rankings and the agent's steps")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("demo", help="ingest a demo book from the shared data and answer a question about it")
    p.add_argument("--summarizer", choices=SUMMARIZER_CHOICES, default=DEFAULT_SUMMARIZER,
                   help=f"session summaries of the demo collection (default {DEFAULT_SUMMARIZER})")
    p.set_defaults(func=cmd_demo)

    from mia.graph import model_server, server

    server.register(sub)
    model_server.register(sub)
    _register_plugins(sub)
    return parser


def _register_plugins(sub: Any) -> None:
    """Add the commands other packages register under the ``mia.commands`` entry-point group.

    The evaluation harness (``mia eval``, ``mia bench``, ``mia train``) comes this way, so the
    product never imports it: where the harness or its extra (``pip install 'mia[eval]'``) is
    missing, its package refuses to import, its commands are absent and the rest of ``mia`` works."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="mia.commands"):
        try:
            register = entry.load()
        except ImportError:
            continue
        register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    offline_environment()
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "option", None) and "answer_format" not in " ".join(getattr(args, "set", None) or []):
        args.set = (args.set or []) + ["answer_format=choice"]
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("mia: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except (CliError, ValueError) as exc:  # most user errors; recognised without importing the stores (a busy store: < 1 s)
        print(f"mia: error: {exc}", file=sys.stderr)
        return 2
    except _user_errors() as exc:
        print(f"mia: error: {exc}", file=sys.stderr)
        return 2
    except _connection_errors() as exc:
        print(f"mia: error: cannot reach the chat or embedding endpoint ({exc}); check MIA_CHAT_BASE_URL / "
              "MIA_EMBEDDINGS_BASE_URL, or unset them to use the embedded models", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
