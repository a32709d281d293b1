"""``mia bench serve``: concurrent chat requests against the LangGraph server, checked and timed.

Each request opens its own thread and asks a question that names the request ("Request 3: ..."),
so an answer delivered to the wrong request, or a lost one, is caught by comparing the run's
final state with what was asked: the state's ``question`` and the human message just before the
reply must be this request's, and the reply must be a non-empty AI message. One warm-up request
(loading the models) is made first and reported apart, so the percentiles measure serving.

Loopback only and bounded: at most ``MAX_REQUESTS`` requests, ``MAX_CONCURRENCY`` at once, and
one overall deadline. Without ``--url`` it starts its own server (no API keys) on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from mia.graph.registry import QUESTION_GRAPHS
from mia.graph.server import LOOPBACK, start_server
from mia.nodes.context import context_from

MAX_REQUESTS = 64
MAX_CONCURRENCY = 16
QUESTIONS = (
    "Who is the main character?",
    "Where does the story take place?",
    "What happens at the end?",
    "What does the main character want?",
)


@dataclass(frozen=True)
class Outcome:
    index: int
    question: str
    seconds: float
    problem: str | None
    answer: str


def question_for(index: int) -> str:
    return f"Request {index}: {QUESTIONS[index % len(QUESTIONS)]}"


def check_reply(question: str, output: dict[str, Any]) -> str | None:
    """None when ``output`` (a run's final state) answers ``question``; else what is wrong."""
    if "__error__" in output:
        return f"run failed: {output['__error__']}"
    if output.get("question") != question:
        return f"state holds another question: {output.get('question')!r}"
    messages = output.get("messages") or []
    if len(messages) < 2 or messages[-1].get("type") != "ai" or messages[-2].get("type") != "human":
        return "the conversation does not end with this question and its reply"
    if messages[-2].get("content") != question:
        return f"the reply follows another message: {messages[-2].get('content')!r}"
    if not str(messages[-1].get("content") or "").strip():
        return "empty reply"
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with 8 samples, p95 is the slowest)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


async def _ask(client: Any, index: int, graph: str, context: dict[str, Any], gate: asyncio.Semaphore) -> Outcome:
    question = question_for(index)
    async with gate:
        started = time.perf_counter()
        try:
            thread = await client.threads.create()
            output = await client.runs.wait(thread["thread_id"], graph, context=context,
                                            input={"messages": [{"role": "user", "content": question}]})
        except Exception as exc:  # noqa: BLE001 - every failure is a result to report, not a crash
            return Outcome(index, question, time.perf_counter() - started, f"{type(exc).__name__}: {exc}", "")
        seconds = time.perf_counter() - started
    problem = check_reply(question, output) if isinstance(output, dict) else f"unexpected output {output!r}"
    answer = str(((output or {}).get("messages") or [{}])[-1].get("content", "")) if not problem else ""
    return Outcome(index, question, seconds, problem, answer)


async def bench(url: str, *, graph: str, collection: str, requests: int = 8, concurrency: int = 4,
                max_new_tokens: int = 32, settings: Mapping[str, Any] | None = None, api_key: str | None = None,
                deadline: float = 900.0) -> dict[str, Any]:
    """Run the benchmark against the server at ``url``; returns the summary and each outcome.

    ``settings`` are further run-context settings (e.g. ``{"top_k": 3}``) sent with every request.
    """
    from langgraph_sdk import get_client

    if urlparse(url).hostname not in LOOPBACK:
        raise ValueError(f"bench serve talks to loopback servers only, not {url}")
    if not 1 <= requests <= MAX_REQUESTS or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"--requests must be in 1..{MAX_REQUESTS} and --concurrency in 1..{MAX_CONCURRENCY}")
    if graph not in QUESTION_GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; choose one of {', '.join(QUESTION_GRAPHS)}")
    context = {**(settings or {}), "collection": collection, "max_new_tokens": max_new_tokens}
    client = get_client(url=url, api_key=api_key, timeout=deadline)
    started = time.perf_counter()
    warm = await asyncio.wait_for(_ask(client, 0, graph, context, asyncio.Semaphore(1)), deadline)
    if warm.problem:
        raise ValueError(f"the warm-up request failed: {warm.problem}")
    gate = asyncio.Semaphore(concurrency)
    remaining = max(1.0, deadline - (time.perf_counter() - started))
    clock = time.perf_counter()
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(_ask(client, i, graph, context, gate) for i in range(1, requests + 1))), remaining)
    wall = time.perf_counter() - clock
    latencies = [o.seconds for o in outcomes if not o.problem]
    return {
        "graph": graph, "collection": collection, "requests": requests, "concurrency": concurrency,
        "max_new_tokens": max_new_tokens, "warmup_seconds": round(warm.seconds, 3),
        "ok": len(latencies), "failed": requests - len(latencies), "wall_seconds": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 4) if wall else 0.0,
        "latency_p50_seconds": round(percentile(latencies, 50), 3),
        "latency_p95_seconds": round(percentile(latencies, 95), 3),
        "outcomes": [asdict(o) for o in outcomes],
    }


def cmd_serve_bench(args: argparse.Namespace) -> int:
    raw = dict(kv.split("=", 1) for kv in args.set or [])
    typed = context_from(args.graph, raw)  # JSON carries types: send 3, not "3"; settings the graph lacks fail here
    settings = {name: getattr(typed, name) for name in raw}
    options = dict(graph=args.graph, collection=args.collection, requests=args.requests, concurrency=args.concurrency,
                   max_new_tokens=args.max_new_tokens, settings=settings, api_key=args.api_key or None,
                   deadline=args.timeout)
    if args.url:
        result = asyncio.run(bench(args.url, **options))
    else:
        # Its own server has no API keys: it listens on loopback only and lives as long as the run.
        with start_server(env={"MIA_API_KEYS": ""}, jobs=args.concurrency) as server:
            result = asyncio.run(bench(server.url, **options))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"bench serve: {result['graph']} on {result['collection']}, {result['requests']} requests, "
              f"concurrency {result['concurrency']}, max_new_tokens {result['max_new_tokens']}")
        print(f"  warm-up {result['warmup_seconds']:.1f}s (model loading, not counted)")
        print(f"  ok {result['ok']}/{result['requests']}, wall {result['wall_seconds']:.1f}s, "
              f"throughput {result['throughput_rps']:.3f} req/s, latency p50 {result['latency_p50_seconds']:.1f}s, "
              f"p95 {result['latency_p95_seconds']:.1f}s")
        for outcome in result["outcomes"]:
            if outcome["problem"]:
                print(f"  request {outcome['index']}: {outcome['problem']}")
    return 0 if result["failed"] == 0 else 1


def add_serve_bench(bench_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to ``mia bench``'s subcommands; the handler is ``args.func``."""
    p = bench_subparsers.add_parser(
        "serve", help="concurrent chat requests against the server: errors, lost or mixed-up answers, throughput, p50/p95")
    p.add_argument("--collection", required=True, help="collection to ask about (must exist in the server's store)")
    p.add_argument("--graph", choices=QUESTION_GRAPHS, default="rag")
    p.add_argument("--requests", type=int, default=8, help=f"requests after the warm-up (default 8, at most {MAX_REQUESTS})")
    p.add_argument("--concurrency", type=int, default=4, help=f"requests in flight at once (default 4, at most {MAX_CONCURRENCY})")
    p.add_argument("--max-new-tokens", type=int, default=32, help="answer length bound (default 32)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a run setting for every request, e.g. --set top_k=3")
    p.add_argument("--url", default="", help="a running loopback server (default: start one on a free port)")
    p.add_argument("--api-key", default="", help="API key for --url when it has MIA_API_KEYS")
    p.add_argument("--timeout", type=float, default=900.0, help="overall deadline in seconds (default 900)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_serve_bench)
    return p
