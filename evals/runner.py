"""Run question graphs over a built data set and record every (system, question) result.

One run compares several *variants* (a graph plus its settings, e.g. ``mia_rag[k_sum=3]``) on the
same questions, because paired comparisons on the same questions are what the reports rest on
(docs/design.md §5). The expensive parts are done once and cached:

* data sets are built under ``MIA_HOME/datasets`` (``custom`` ones under the output folder) and
  reused when the arguments match;
* each source is ingested into a collection whose name is a hash of the data set, the ingestion
  options and the embedder, so ingestion runs once and later runs only check book hashes;
* every finished (variant, question) result is appended to ``results.jsonl`` in the output folder
  with a fingerprint of the variant's fully resolved settings and a version of the collection's
  content, so an interrupted run resumes where it stopped, and changing a setting (or re-ingesting
  with a new summariser) reruns exactly what it changes.

Questions that carry ``meta["book"]`` (every ``multihop-synth`` question is its own long document)
are answered from a collection holding only that book: the retrieval nodes search a whole
collection and have no book filter, so a shared collection would let a question retrieve other
questions' documents.

All scores (recall, F1, EM, sub-EM, accuracy) are percentages, per question and on average.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shlex
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from tqdm import tqdm

from mia.evals import metrics, peers
from mia.evals.datasets import BUILDERS, Dataset, load_dataset
from mia.graph import registry
from mia.nodes import resources
from mia.nodes.context import (GraphSettings, RetrievalSettings, SignatureSettings, StaticSettings, coerce_setting,
                               context_from)
from mia.stores.chat import EMBEDDED_NAME, forget_prompts
from mia.stores.embeddings import Embedder, load_embedder
from mia.stores.ingest import LLM_SUMMARIZERS, IngestOptions, Summarizer, ingest
from mia.stores.mindscape import Mindscape
from mia.stores.settings import mia_home
from mia.stores.signature_head import head_digest
from mia.stores.units import SIGNATURE_LEVELS, Level

RECALL_KS = (1, 5, 10, 20)
RANKING_DEPTH = 100
"""Chunks a retrieval-only run keeps (its default ``top_k``, and the peers'): recall at the largest
token budget (``metrics.TOKEN_BUDGETS``) needs 4,000 tokens of ranking, 20 chunks only when each
holds the full 200. 100 is the first stages' depth (``candidates``): every first stage reads
``max(top_k, candidates)`` candidates, so the first 20 of these chunks are those a ``top_k`` of 20
gives, and keeping 100 costs the graphs no extra search."""
INGEST_KEYS = tuple(f.name for f in fields(IngestOptions))
"""Settings that shape the collection rather than the run: changing one means another collection."""
RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
DEFAULT_LENGTH = 32000
HYBRID_ONLY = frozenset({"bm25_weight", "rrf_k", "bm25_stemming"})
"""Settings read only by hybrid retrieval (``nodes.retrieval.Fusion``)."""
ADDED_SWITCHES = {"hypothetical_passage": False}
"""Switches added after results were cached, with the value that does what the graphs did before
them: at that value a switch is left out of the fingerprint, so those results stay reusable."""


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a graph with its own settings and ingestion options, or a
    peer (``evals.peers``) with its settings."""

    name: str
    graph: str
    """The graph's name, or the peer's."""
    settings: dict[str, Any]
    ingest: IngestOptions
    """A peer reads only its ``chunk_size`` (bm25), and the collection name made from it keys its index."""
    context: GraphSettings | None
    """None for a peer: no graph runs."""

    @property
    def peer(self) -> bool:
        return self.context is None

    @property
    def retrieval_only(self) -> bool:
        """Whether the graph stops after retrieval (only the static pipelines can; peers always do)."""
        return self.peer or (isinstance(self.context, StaticSettings) and self.context.retrieval_only)

    @property
    def fingerprint(self) -> str:
        """Every resolved setting the graph reads (``graph.registry.settings_read``), with the
        ingestion options: ``k0=50`` typed or left at its default of 50 is one configuration, an
        environment variable that changes a setting changes it too, and a changed default is another
        configuration, so a cached result never stands for a setting it was not made under. (Code
        changes are not tracked: after changing what a setting does, write to a new ``--out``.)
        The fusion's settings are left out under dense retrieval (``HYBRID_ONLY``); under
        ``sig_strategy=trained`` the head's sha256 is part of it. A peer's is its resolved settings; its
        texts, recipe parameters and embedder make its index's version, which results are keyed by too."""
        if self.context is None:
            return hashlib.sha256(json.dumps({"peer": self.graph, "settings": self.settings}, sort_keys=True).encode()).hexdigest()[:16]
        read = registry.settings_read(self.graph) - {"collection"}
        settings = {name: getattr(self.context, name) for name in read}
        if settings.get("retriever") == "dense":
            settings = {name: value for name, value in settings.items() if name not in HYBRID_ONLY}
        settings = {name: value for name, value in settings.items()
                    if not (name in ADDED_SWITCHES and value == ADDED_SWITCHES[name])}
        if "chat_model" in settings and not settings["chat_model"] and not settings.get("chat_base_url"):
            settings["chat_model"] = EMBEDDED_NAME  # the default reader by name: a changed default is another configuration
        payload = {"graph": self.graph, "context": settings, "ingest": asdict(self.ingest)}
        if settings.get("sig_strategy") == "trained":
            payload["head"] = head_digest(self.context.sig_weights)  # a retrained head is another configuration
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Part:
    """One built data set of the run (a run over several ``--length`` values has one per length)."""

    dataset: Dataset
    tag: str
    length: int | None
    tokens: dict[str, int]
    """Tokens per data set book: the x axis of the cost plots."""


@dataclass(frozen=True)
class Job:
    """One (variant, question) to run, with the collection it is answered from."""

    part: Part
    question: dict[str, Any]
    variant: Variant
    collection: str


@dataclass
class EvalResults:
    """What a run returns to code: the same numbers the files in ``out`` hold."""

    dataset: str
    split: str
    out: Path
    run: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- settings and variants


LINK = "&"
"""Joins settings swept together (``--sweep 'passage_order&chat_model=score&A,document&B'``): a
configuration that differs from another in several settings is then one variant, paired against
the other on the same questions, without running the combinations nobody asked for."""


def parse_assignments(items: Sequence[str], *, multi: bool) -> dict[str, Any]:
    """``KEY=VALUE`` (or ``SYSTEM:KEY=VALUE``, for one system only) from ``--set`` / ``--sweep``;
    with ``multi`` the value is a comma-separated list of the values to sweep, and a key of linked
    settings (``LINK``) takes a tuple per value."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            flag = "--sweep" if multi else "--set"
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE{',VALUE...' if multi else ''} (optionally SYSTEM:KEY=...)")
        key = key.strip()
        if multi:
            values = [v.strip() for v in value.split(",") if v.strip()]
            if not values:
                raise ValueError(f"--sweep {item!r}: give at least one value")
            width = len(key.split(LINK))
            if width > 1:
                # Linked settings move together: one variant per value tuple, not per combination.
                tuples = [tuple(part.strip() for part in v.split(LINK)) for v in values]
                if any(len(t) != width or not all(t) for t in tuples):
                    raise ValueError(f"--sweep {item!r}: each value of {width} linked settings needs {width} parts joined by "
                                     f"{LINK!r}, e.g. a{LINK}b=1{LINK}x,2{LINK}y")
                out[key] = tuples
            else:
                out[key] = values
        else:
            out[key] = value.strip()
    return out


def _reads(system: str) -> frozenset[str]:
    """What a system's variants take: its graph's settings and the ingestion options, or a peer's settings."""
    if system in peers.PEERS:
        return peers.READS[system]
    return registry.settings_read(system) | frozenset(INGEST_KEYS)


def _scoped(assignments: dict[str, Any], system: str, systems: Sequence[str]) -> dict[str, Any]:
    """The global assignments ``system`` reads, then those scoped to it (which win, and which it must
    read: its settings class refuses the others)."""
    plain: dict[str, Any] = {}
    mine: dict[str, Any] = {}
    for key, value in assignments.items():
        scope, sep, name = key.partition(":")
        if not sep:
            read = [part in _reads(system) for part in key.split(LINK)]
            if all(read):
                plain[key] = value
            elif any(read):
                raise ValueError(f"linked sweep {key!r}: {system} reads only some of these settings; scope it to the "
                                 f"systems that read them all (SYSTEM:{key}=...)")
        elif scope not in systems:
            raise ValueError(f"setting {key!r} names system {scope!r}, which is not among the systems {list(systems)}")
        elif scope == system:
            mine[name] = value
    return {**plain, **mine}


def expand_variants(
    systems: Sequence[str],
    settings: dict[str, Any],
    sweeps: dict[str, list[Any]],
    *,
    retrieval_only: bool,
    summarizer: Summarizer,
) -> list[Variant]:
    """Every system once per combination of its swept values, named after the swept values only
    (the ``--set`` values apply to the whole run and go in the report header). A global setting or
    sweep applies to the systems whose graph reads it, and one that none of them reads is refused."""
    if not systems:
        raise ValueError("no systems given: pass e.g. --systems rag,mia_rag")
    unknown = [s for s in systems if s not in registry.QUESTION_GRAPHS and s not in peers.PEERS]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(registry.QUESTION_GRAPHS + peers.PEERS)}")
    if len(set(systems)) != len(systems):
        raise ValueError(f"systems listed twice in {list(systems)}")
    chosen_peers = [s for s in systems if s in peers.PEERS]
    if chosen_peers and not retrieval_only:
        # Refused rather than quietly run retrieval-only: a report that answers would show peers without answer
        # metrics beside graphs with them, and the paired tables would compare them on recall alone.
        raise ValueError(f"{', '.join(chosen_peers)}: peers retrieve but do not answer; add --retrieval-only, "
                         "or compare them in a retrieval-only run of their own")
    if retrieval_only:
        refused = [s for s in systems if s not in registry.RETRIEVAL_ONLY_GRAPHS and s not in peers.PEERS]
        if refused:
            raise ValueError(
                f"{', '.join(refused)} cannot run retrieval-only (what each retrieves depends on the chat model's "
                f"decisions); retrieval-only works for {', '.join(registry.RETRIEVAL_ONLY_GRAPHS)}: "
                "drop --retrieval-only or remove those systems"
            )
    keys = [*settings, *(part for key in sweeps for part in key.split(LINK))]
    unread = sorted(key for key in keys if ":" not in key and not any(key in _reads(s) for s in systems))
    if unread:
        raise ValueError(f"unknown setting(s) {', '.join(unread)}: no graph of {', '.join(systems)} reads them")
    variants: list[Variant] = []
    for system in systems:
        base = _scoped(settings, system, systems)
        axes = list(_scoped(sweeps, system, systems).items())
        for combo in itertools.product(*(values for _, values in axes)):
            swept = {}
            for (key, _), value in zip(axes, combo):
                swept.update(zip(key.split(LINK), value) if LINK in key else [(key, value)])
            name = system + (f"[{','.join(f'{k}={v}' for k, v in swept.items())}]" if swept else "")
            variants.append(_variant(name, system, {**base, **swept}, retrieval_only, summarizer))
    return variants


def _variant(name: str, graph: str, raw: dict[str, Any], retrieval_only: bool, summarizer: Summarizer) -> Variant:
    """Ingestion options are split off the settings because they choose the collection; the rest
    must be settings of the graph, checked now rather than at the first question. A peer's settings
    are checked by ``peers.settings``; its options hold only its chunk budget, which keys its index."""
    if "collection" in raw:
        raise ValueError("collection is chosen by the runner (one per data set and ingestion options); do not set it")
    if graph in peers.PEERS:
        resolved = peers.settings(graph, raw, RANKING_DEPTH)
        options = IngestOptions(summarizer=summarizer, **{k: v for k, v in resolved.items() if k in INGEST_KEYS})
        return Variant(name, graph, resolved, options, None)
    kinds = {f.name: f.type for f in fields(IngestOptions)}
    ingest_values = {
        key: coerce_setting(kinds[key], raw[key], key) if isinstance(raw[key], str) else raw[key]
        for key in INGEST_KEYS if key in raw
    }
    options = IngestOptions(**{"summarizer": summarizer, **ingest_values})
    options.validate()
    overrides = {k: v for k, v in raw.items() if k not in INGEST_KEYS}
    if retrieval_only:
        overrides["retrieval_only"] = True
        overrides.setdefault("top_k", RANKING_DEPTH)
    return Variant(name, graph, overrides, options, context_from(graph, overrides))


# --------------------------------------------------------------------------- data sets


def _default_split(dataset: str) -> str:
    return {"multihop-synth": "dev", "fairytale-train": "train"}.get(dataset, "test")


def prepare_parts(
    dataset: str,
    split: str | None,
    lengths: Sequence[int],
    seed: int,
    out: Path,
    texts: Path | None = None,
    questions_file: Path | None = None,
    origins: Sequence[str] = (),
    interference: Sequence[int] = (),
) -> list[Part]:
    """Build (or reuse) the data set(s) of a run: one per length for multihop-synth, one per
    interference size for a fairytale series with ``interference``, else one.

    ``dataset`` is a builder name or the folder of an already built data set. Missing shared data
    surfaces as ``ValueError`` so the CLI reports it as a user error, not a traceback.
    """
    path = Path(dataset)
    if dataset not in BUILDERS and (path / "manifest.json").is_file():
        built = load_dataset(path)
        if split and split != built.split:
            raise ValueError(f"{path} holds the {built.split!r} split, not {split!r}")
        if lengths:
            raise ValueError("--length applies to multihop-synth only")
        return [_part(built, f"{built.name}-{built.split}", None)]
    if dataset not in BUILDERS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(BUILDERS)} or give a built data set's folder")
    if dataset != "multihop-synth" and lengths:
        raise ValueError("--length applies to multihop-synth only")
    if dataset != "custom" and (texts or questions_file):
        raise ValueError("--texts and --questions apply to --dataset custom only")
    if origins and not dataset.startswith("fairytale-series"):
        raise ValueError("--origins applies to fairytale-series and fairytale-series-titled only")
    if interference and not dataset.startswith("fairytale-series"):
        raise ValueError("--interference applies to fairytale-series and fairytale-series-titled only")
    split = split or _default_split(dataset)
    home = mia_home() / "datasets"
    try:
        if dataset == "multihop-synth":
            suffix = "" if split == "dev" else f"-{split}"
            return [
                _part(BUILDERS[dataset](home / f"multihop-synth-{n}-seed{seed}{suffix}", target_tokens=n, seed=seed, split=split),
                      f"multihop-synth-{n}{suffix}", n)
                for n in (lengths or [DEFAULT_LENGTH])
            ]
        if dataset == "custom":
            if texts is None or questions_file is None:
                raise ValueError("--dataset custom needs --texts DIR or FILE (.txt/.md files, one per book) and --questions FILE.jsonl "
                                 "(or a folder of .jsonl files)")
            built = BUILDERS[dataset](out / "dataset", texts, questions_file, split=split)
        elif origins:
            subset = "+".join(origins)
            if interference:
                raise ValueError("--interference adds books to the default series; it does not combine with --origins")
            built = BUILDERS[dataset](home / f"{dataset}-{split}-{subset}", split=split, origins=tuple(origins))
            return [_part(built, f"{built.name}-{built.split}-{subset}", None)]
        elif interference:
            # One data set per size, its length the whole mindscape's tokens: the x axis of recall at scale.
            parts = []
            for n in interference:
                suffix = f"-library{n}" if n else ""
                built = BUILDERS[dataset](home / f"{dataset}-{split}{suffix}", split=split, interference_tokens=n)
                parts.append(_part(built, f"{built.name}-{built.split}{suffix}", int(built.manifest["tokens"])))
            return parts
        else:
            built = BUILDERS[dataset](home / f"{dataset}-{split}", split=split)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from exc
    return [_part(built, f"{built.name}-{built.split}", None)]


def _part(dataset: Dataset, tag: str, length: int | None) -> Part:
    tokens = {source["book"]: int(source["tokens"]) for source in dataset.manifest["sources"]}
    return Part(dataset, tag, length, tokens)


def select_questions(questions: Sequence[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` questions, taken in turn from each ``meta["source"]`` group (else each
    ``meta["book"]``), so a small multi-hop run mixes HotpotQA, MuSiQue and 2Wiki, and a small run
    over a folder of per-book question files asks about every book, instead of taking only the
    first file's."""
    if limit is None:
        return list(questions)
    if limit <= 0:
        raise ValueError(f"--limit must be positive, got {limit}")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for question in questions:
        meta = question.get("meta") or {}
        groups[str(meta.get("source", meta.get("book", "")))].append(question)
    interleaved = (q for row in itertools.zip_longest(*groups.values()) for q in row if q is not None)
    return list(itertools.islice(interleaved, limit))


# --------------------------------------------------------------------------- collections


def collection_name(part: Part, options: IngestOptions, embedder: str, book: str | None) -> str:
    """A stable name for (data set, ingestion options, embedder[, book]): equal inputs share one
    collection across runs, different ones never collide. Content changes are caught by ingestion's
    own per-book hashes, so the name need not hash the text."""
    manifest = part.dataset.manifest
    key = json.dumps(
        [manifest["name"], manifest["split"], manifest["seed"], manifest["params"], asdict(options), embedder, book],
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    prefix = "".join(ch for ch in manifest["name"].lower() if ch.isalnum() or ch == "-")[:24].strip("-")
    return f"ev-{prefix}-{'b' if book else 'c'}{digest}"


def _question_book(question: dict[str, Any]) -> str | None:
    return (question.get("meta") or {}).get("book")


@dataclass(frozen=True)
class _Ingestion:
    part: Part
    options: IngestOptions
    context: GraphSettings
    """The first variant's settings that needs the collection: for LLM summaries, they name the chat model."""
    book: str | None


def _ingestions(jobs: Sequence[Job]) -> dict[str, _Ingestion]:
    plans: dict[str, _Ingestion] = {}
    for job in jobs:
        plans.setdefault(job.collection, _Ingestion(job.part, job.variant.ingest, job.variant.context, _question_book(job.question)))
    return plans


def _card_readers(jobs: Sequence[Job]) -> dict[str, GraphSettings]:
    """Per collection, the settings of the first variant that reads book cards (its generator, or its
    signature's book units): they name the chat model that writes the cards. Collections no variant
    reads cards from pay nothing."""
    readers: dict[str, GraphSettings] = {}
    for job in jobs:
        context = job.variant.context
        reads_cards = isinstance(context, RetrievalSettings) and context.book_card
        selects_books = isinstance(context, SignatureSettings) and Level.BOOK in SIGNATURE_LEVELS[context.signature_levels]
        if reads_cards or selects_books:
            readers.setdefault(job.collection, context)
    return readers


def _run_ingestions(plans: dict[str, _Ingestion], cards: dict[str, GraphSettings], embedder: Embedder,
                    progress: bool) -> None:
    """Ingest every collection the jobs need, and write book cards where a variant reads them (with
    that variant's chat model). Per-book bars only for a few collections: hundreds of per-question
    documents get one bar."""
    from mia.stores.chat import load_chat_model

    chat_models: dict[tuple[str, str], BaseChatModel] = {}  # loading the embedded model checks its sha256

    def chat(context: GraphSettings) -> BaseChatModel:
        key = (context.chat_base_url, context.chat_model)
        if key not in chat_models:
            chat_models[key] = load_chat_model(*key)
        return chat_models[key]

    detailed = progress and len(plans) <= 4
    for collection, plan in tqdm(plans.items(), desc="ingesting", unit="collection", disable=not progress or len(plans) < 2):
        llm = chat(plan.context) if plan.options.summarizer in LLM_SUMMARIZERS else None
        card_model = chat(cards[collection]) if collection in cards else None
        ingest([path for _, path in _books(plan.part, plan.book)], collection, embedder, options=plan.options, llm=llm,
               cards="llm" if card_model else "none", card_model=card_model, progress=detailed)


def _books(part: Part, book: str | None) -> list[tuple[str, Path]]:
    """(data set book name, file) of what a collection holds: every book of the part, or one."""
    dataset = part.dataset
    pairs = list(zip(dataset.books, dataset.sources))
    return pairs if book is None else [pairs[dataset.books.index(book)]]


def _peer_indexes(jobs: Sequence[Job], embedder: Embedder, progress: bool) -> dict[str, peers.PeerIndex]:
    """Each peer's index of the books a collection of these jobs holds, built once (and cached)."""
    wanted = {job.collection: job for job in jobs if job.variant.peer}
    return {name: peers.open_index(job.variant.graph, _books(job.part, _question_book(job.question)), job.variant.settings, embedder)
            for name, job in tqdm(wanted.items(), desc="peer indexes", unit="index", disable=not progress or len(wanted) < 2)}


# --------------------------------------------------------------------------- one question


def score_question(
    question: dict[str, Any], answer: str, spans: Sequence[metrics.Span], tokens: Sequence[int], available: int,
    retrieval_only: bool, passages: Sequence[str] | None = None, first_citation_holds: bool | None = None,
) -> dict[str, float]:
    """Percentages for every metric that applies: recall@k needs gold spans and k chunks retrieved,
    or all ``available`` ones (fewer would make recall@20 silently equal recall@10); recall at N
    tokens needs chunks of N ``tokens`` retrieved (the last may cross N), or all ``available``
    ones; answer metrics need a run that answered, and ``answer_in_passages`` the texts of the
    ``passages`` its reader was given (a graph that reads the whole source has none), and
    ``first_citation_holds`` whether the answer's first citation quotes a sentence (or a short run of them) holding all of its
    words (None: the graph cites nothing)."""
    scores: dict[str, float] = {}
    gold = [(g["book"], g["start"], g["end"]) for g in question.get("gold") or []]
    if gold:
        for k in RECALL_KS:
            if len(spans) >= min(k, available):
                scores[f"recall@{k}"] = 100.0 * metrics.recall_at_k(spans, gold, k)
                scores[f"strict_recall@{k}"] = 100.0 * metrics.strict_recall_at_k(spans, gold, k)
        for budget in metrics.TOKEN_BUDGETS:
            if sum(tokens) >= budget or len(spans) >= available:
                scores[f"recall@{budget}tok"] = 100.0 * metrics.recall_at_tokens(spans, tokens, gold, budget)
                scores[f"strict_recall@{budget}tok"] = 100.0 * metrics.strict_recall_at_tokens(spans, tokens, gold, budget)
    if retrieval_only:
        if passages is not None and question.get("answers"):
            # Reader's questions have no gold spans: whether a reference's words are in the first k
            # chunks, or the first N tokens, is their retrieval score, measured without a reader.
            for k in RECALL_KS[1:]:
                if len(passages) >= min(k, available):
                    scores[f"answer_in@{k}"] = 100.0 * metrics.answer_in_passages(passages[:k], question["answers"])
            for budget in metrics.TOKEN_BUDGETS:
                if sum(tokens) >= budget or len(spans) >= available:
                    scores[f"answer_in@{budget}tok"] = 100.0 * metrics.answer_in_passages(
                        _first_tokens(passages, spans, tokens, budget), question["answers"])
        return scores
    if question.get("claim"):
        scores["claim_accuracy"] = 100.0 * float(answer.strip().upper() == question["label"])
    elif question.get("options"):
        scores["accuracy"] = 100.0 * metrics.choice_accuracy(answer, question["label"])
    elif question.get("answers"):
        scores["f1"] = 100.0 * metrics.f1(answer, question["answers"])
        scores["em"] = 100.0 * metrics.exact_match(answer, question["answers"])
        scores["sub_em"] = 100.0 * metrics.sub_em(answer, question["answers"])
        if passages is not None:
            scores["answer_in_passages"] = 100.0 * metrics.answer_in_passages(passages, question["answers"])
        if first_citation_holds is not None:
            scores["first_citation_holds"] = 100.0 * first_citation_holds
    return scores


def _first_tokens(passages: Sequence[str], spans: Sequence[metrics.Span], tokens: Sequence[int],
                  budget: int) -> list[str]:
    """The ranked passages (each its span's text) a reader of ``budget`` tokens holds, cut where
    ``metrics.within_budget`` cuts their spans."""
    return [text[: end - start] for text, (_, start, end) in zip(passages, metrics.within_budget(spans, tokens, budget))]


@dataclass(frozen=True)
class _Opened:
    """A collection as the jobs use it."""

    store: Mindscape
    embedder: Embedder
    """The one the graphs read it with (the one it was built with)."""
    size: int
    """Chunks in it: a system that returned them all has a defined recall@k for any k."""
    version: str
    """Digest of its books' ingestion hashes (text, options, embedder, summary method): results
    computed against other contents are not reused."""


def _open(name: str) -> _Opened:
    store = Mindscape(name)
    hashes = sorted((book, str(record.get("hash"))) for book, record in store.commits.records().items())
    version = hashlib.sha256(json.dumps(hashes).encode()).hexdigest()[:12]
    return _Opened(store, resources.embedder(store), store.chunks.count(), version)


def _spans(opened: _Opened, ids: Sequence[str], book_map: dict[str, str]) -> tuple[list[metrics.Span], list[int]]:
    """The retrieved chunks' spans in the data set's books, and their token counts (ingestion's)."""
    records = opened.store.chunk_records(ids, documents=False)
    return ([(book_map.get(r["book"], r["book"]), int(r["start"]), int(r["end"])) for r in records],
            [int(r["tokens"]) for r in records])


def _run_job(job: Job, opened: _Opened, book_map: dict[str, str]) -> dict[str, Any]:
    question = job.question
    payload: dict[str, Any] = {"question": question["question"]}
    overrides = {**job.variant.settings, "collection": job.collection}
    if question.get("options"):
        payload["options"] = list(question["options"])
        overrides.setdefault("answer_format", "choice")
    elif question.get("claim"):
        overrides.setdefault("answer_format", "verify")
    graph = registry.load_graph(job.variant.graph)
    # Every variant of a question asks the same query; without this, the first one would pay for
    # the embedding that the rest then read from the embedder's memo, and wall times would lie.
    opened.embedder.forget_queries()
    forget_prompts()  # nor may it read the prompt the previous variant left in the model
    ctx = context_from(job.variant.graph, overrides)
    started = time.perf_counter()
    state = graph.invoke(payload, context=ctx)
    seconds = time.perf_counter() - started
    ids = [r["id"] for r in state.get("retrieved") or []]
    spans, tokens = _spans(opened, ids, book_map)
    if job.variant.retrieval_only:
        read = ids if question.get("answers") else None
    else:
        read = ids[: ctx.top_k] if hasattr(ctx, "top_k") else None
    passages = [c["text"] for c in opened.store.chunk_records(read)] if read is not None else None
    cites = [c for c in state.get("citations") or [] if not c.get("card")]
    return _record(job, opened.version, str(state.get("answer") or ""), ids, spans, tokens, opened.size,
                   state.get("usage") or {}, seconds, passages, bool(cites[0].get("holds_answer")) if cites else None)


def _run_peer_job(job: Job, index: peers.PeerIndex) -> dict[str, Any]:
    """A peer's ranking of ``top_k`` chunks for the question, scored as a graph's is."""
    started = time.perf_counter()
    hits = index.search(job.question["question"], job.variant.settings["top_k"])
    seconds = time.perf_counter() - started
    return _record(job, index.version, "", [h.id for h in hits], [(h.book, h.start, h.end) for h in hits],
                   [h.tokens for h in hits], index.size, {}, seconds)


def _record(job: Job, version: str, answer: str, ids: list[str], spans: list[metrics.Span], tokens: list[int],
            available: int, usage: dict[str, Any], seconds: float, passages: Sequence[str] | None = None,
            first_citation_holds: bool | None = None) -> dict[str, Any]:
    """One line of ``results.jsonl``: the job, its ranking (ids and each chunk's tokens, so recall at
    any budget can be recomputed from the record), the reference answers beside the answer, its
    scores and costs. ``passages``: the texts the reader was given, when it was given chunks."""
    question = job.question
    return {
        "system": job.variant.name,
        "graph": job.variant.graph,
        "config": job.variant.fingerprint,
        "index": version,
        "part": job.part.tag,
        "length": job.part.length,
        "id": question["id"],
        "question": question["question"],
        "source_tokens": _source_tokens(job.part, question),
        "collection": job.collection,
        "answer": answer,
        **({"references": list(question["answers"])} if question.get("answers") else {}),
        **({"label": question["label"], "pair": question["meta"]["pair"]} if question.get("claim") and "pair" in question["meta"] else {}),
        "scores": score_question(question, answer, spans, tokens, available, job.variant.retrieval_only, passages,
                                 first_citation_holds),
        "retrieved": ids,
        "tokens": tokens,
        "llm_calls": int(usage.get("llm_calls", 0)),
        "prompt_tokens": int(usage.get("input_tokens", 0)),
        "generated_tokens": int(usage.get("output_tokens", 0)),
        "seconds": round(seconds, 4),
    }


# --------------------------------------------------------------------------- the run


JobKey = tuple[str, str, str, str]


def _job_key(config: str, index: str, part: str, qid: str) -> JobKey:
    """Results belong to a configuration and a collection's content, not to a display name:
    renaming a variant (adding a sweep whose value equals the default) reuses its results."""
    return (config, index, part, qid)


def load_cached(path: Path) -> dict[JobKey, dict[str, Any]]:
    """Finished results by (config, index, part, question); a torn last line (the run was killed
    mid-write) is ignored, so that question simply runs again."""
    cached: dict[JobKey, dict[str, Any]] = {}
    if not path.exists():
        return cached
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "index" in record:  # records of code before collection versions can match no job
                cached[_job_key(record["config"], record["index"], record["part"], record["id"])] = record
    return cached


def adopt_results(sources: Sequence[Path], keys: Sequence[JobKey], cached: dict[JobKey, dict[str, Any]],
                  results_path: Path) -> None:
    """Copy into this run the results that earlier runs finished for exactly these jobs.

    The key (settings fingerprint, collection content version, data set part, question) is the one
    that lets a run resume, so an adopted result is one this run would have computed; copying it
    keeps the output folder self-contained, and a rerun without ``--reuse`` skips it as finished.
    Each copy records the folder it came from (``reused_from``), so the report says so on every
    regeneration, not only on the run that copied it.
    """
    wanted = [key for key in dict.fromkeys(keys) if key not in cached]
    if not sources or not wanted:
        return
    with _appending(results_path) as append:
        for source in sources:
            theirs = load_cached(source / RESULTS_FILE)
            for key in wanted:
                if key in theirs and key not in cached:
                    record = {"reused_from": str(source), **theirs[key]}
                    append(record)
                    cached[key] = record


@contextmanager
def _appending(path: Path) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A writer of result records to ``path``, one JSON line each, flushed as written, after a line
    that a killed run left unfinished has been ended."""
    _end_torn_line(path)
    with path.open("a", encoding="utf-8") as sink:
        def append(record: dict[str, Any]) -> None:
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
            sink.flush()

        yield append


def _end_torn_line(path: Path) -> None:
    """Terminate a line left unfinished by a killed run, so the next result starts a line of its own."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, 2)
        if handle.read(1) != b"\n":
            handle.write(b"\n")


def _execute(jobs: Sequence[Job], results_path: Path, concurrency: int, progress: bool,
             opened: dict[str, _Opened | peers.PeerIndex], book_maps: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Run jobs on a bounded thread pool, appending each result as soon as it exists.

    Threads, not processes: embedded Chroma is not process-safe, and the models are loaded once per
    process. The first failure stops the run (finished results stay cached, a rerun resumes), so a
    misconfiguration costs one question, not hundreds of identical tracebacks.
    """
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    lock = threading.Lock()
    with _appending(results_path) as append, \
            tqdm(total=len(jobs), desc="questions", unit="q", disable=not progress) as bar, \
            ThreadPoolExecutor(max_workers=concurrency) as pool:
        def run(job: Job) -> dict[str, Any]:
            index = opened[job.collection]
            record = (_run_peer_job(job, index) if isinstance(index, peers.PeerIndex)
                      else _run_job(job, index, book_maps[job.part.tag]))
            with lock:
                append(record)
                bar.update(1)
            return record

        futures: list[Future[dict[str, Any]]] = [pool.submit(run, job) for job in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            for future in pending:
                future.cancel()
            raise failed.exception()  # type: ignore[misc]
        return [future.result() for future in futures]


def run_eval(
    dataset: str,
    split: str | None,
    systems: Sequence[str],
    *,
    length: int | Sequence[int] | None = None,
    retrieval_only: bool = False,
    limit: int | None = None,
    seed: int = 0,
    out: Path,
    settings: dict[str, Any] | None = None,
    sweeps: dict[str, list[Any]] | None = None,
    concurrency: int = 1,
    progress: bool = True,
    summarizer: Summarizer = "extractive",
    texts: Path | None = None,
    questions_file: Path | None = None,
    command: str | None = None,
    reuse: Sequence[Path] = (),
    baselines: Sequence[str] = (),
    origins: Sequence[str] = (),
    interference: Sequence[int] = (),
) -> EvalResults:
    """Run every question for every variant (resuming from ``out/results.jsonl``), then write
    ``run.json``, ``summary.json`` and the report into ``out``.

    ``settings`` and ``sweeps`` take the graphs' settings and the ingestion options (``INGEST_KEYS``);
    a key written ``SYSTEM:KEY`` applies to that system only. ``length`` is the
    multihop-synth target length in tokens; several lengths make one data set each. ``command`` is
    what the report names as the command that made it (default: this process's command line).
    ``reuse`` names earlier runs' output folders whose results stand in for identical jobs here.
    ``baselines`` names the variants the report's paired tables subtract (default: ``rag``).
    ``origins`` restricts a fairytale series to those FairytaleQA origin books (a smaller mindscape,
    for runs whose ingestion is the cost, such as LLM summaries).
    ``interference`` makes one fairytale-series data set per size, each with that many tokens of
    the shared books library added as interference (0: none): recall at scale.
    """
    from mia.evals import report

    out = Path(out)
    lengths = [length] if isinstance(length, int) else list(length or [])
    variants = expand_variants(systems, settings or {}, sweeps or {}, retrieval_only=retrieval_only, summarizer=summarizer)
    # Validation first: a mistyped command must not leave an empty output folder behind.
    names = [v.name for v in variants]
    for baseline in baselines:
        if baseline not in names:
            raise ValueError(f"--baseline {baseline}: not a variant of this run; pick one of {', '.join(names)}")
    parts = prepare_parts(dataset, split, lengths, seed, out, texts, questions_file, origins, interference)
    reuse = [Path(folder) for folder in reuse]
    for folder in reuse:
        if not (folder / RESULTS_FILE).is_file():
            raise ValueError(f"--reuse {folder}: no {RESULTS_FILE} there; pass the --out folder of an earlier `mia eval`")
    embedder = load_embedder()  # MIA_EMBEDDINGS, as `mia ingest` reads it
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[Job] = []
    for part in parts:
        for question in select_questions(part.dataset.questions, limit):
            for variant in variants:
                name = collection_name(part, variant.ingest, embedder.name, _question_book(question))
                jobs.append(Job(part, question, variant, f"{variant.graph}:{name}" if variant.peer else name))
    plans = _ingestions([job for job in jobs if not job.variant.peer])
    _run_ingestions(plans, _card_readers(jobs), embedder, progress)
    opened: dict[str, _Opened | peers.PeerIndex] = {name: _open(name) for name in plans}
    opened.update(_peer_indexes(jobs, embedder, progress))
    book_maps = {part.tag: part.dataset.book_names for part in parts}

    results_path = out / RESULTS_FILE
    cached = load_cached(results_path)
    keys = [_job_key(j.variant.fingerprint, opened[j.collection].version, j.part.tag, j.question["id"]) for j in jobs]
    adopt_results(reuse, keys, cached, results_path)
    todo = list({key: job for job, key in zip(jobs, keys) if key not in cached}.values())
    fresh = {
        _job_key(r["config"], r["index"], r["part"], r["id"]): r
        for r in _execute(todo, results_path, concurrency, progress, opened, book_maps)
    }
    records = [{**(cached.get(key) or fresh[key]), "system": job.variant.name} for job, key in zip(jobs, keys)]

    first = parts[0].dataset
    run = {
        "dataset": first.name,
        "split": first.split,
        "parts": [_part_info(p, limit) for p in parts],
        "questions": len(records) // len(variants),
        "seed": seed,
        "limit": limit,
        "retrieval_only": retrieval_only,
        "summarizer": summarizer,
        "embedder": embedder.name,
        "chat_model": _chat_label(variants, retrieval_only),
        "command": command or shlex.join([sys.executable, *sys.argv]),
        "settings": settings or {},
        "sweeps": sweeps or {},
        "reused": dict(Counter(r["reused_from"] for r in records if "reused_from" in r)),
        "variants": [
            {"name": v.name, "graph": v.graph, "settings": v.settings, "config": v.fingerprint,
             **({"peer": peers.recipe(v.graph, v.settings, embedder)} if v.peer else {"ingest": asdict(v.ingest)})}
            for v in variants
        ],
        "collections": sorted(plans) if len(plans) <= 20 else f"{len(plans)} per-book collections",
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results = EvalResults(first.name, first.split, out, run, records)
    results.summary = report.summarise(run, records, names)
    (out / RUN_FILE).write_text(json.dumps(run, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / SUMMARY_FILE).write_text(json.dumps(results.summary, indent=2) + "\n", encoding="utf-8")
    report.write_report(out, run, records, names, seed=seed, baselines=baselines)
    return results


def _source_tokens(part: Part, question: dict[str, Any]) -> int:
    """What the question is answered from: its own book, or the whole collection."""
    book = _question_book(question)
    return part.tokens[book] if book else sum(part.tokens.values())


def _part_info(part: Part, limit: int | None) -> dict[str, Any]:
    questions = select_questions(part.dataset.questions, limit)
    return {
        "tag": part.tag, "length": part.length, "dir": str(part.dataset.dir), "questions": len(questions),
        "source_tokens": round(sum(_source_tokens(part, q) for q in questions) / len(questions)),
    }


def _chat_label(variants: Sequence[Variant], retrieval_only: bool) -> str:
    """Names the chat model(s) without loading one: the report header must not cost a model load. A
    retrieval-only run calls one only for the variants that write a hypothetical passage."""
    calling = [v for v in variants if v.context is not None
               and (not retrieval_only or getattr(v.context, "hypothetical_passage", False))]
    labels = {
        f"{v.context.chat_model or 'default'} at {v.context.chat_base_url}" if v.context.chat_base_url
        else v.context.chat_model or EMBEDDED_NAME
        for v in calling
    }
    if retrieval_only:
        return "none (retrieval only)" if not labels else f"{', '.join(sorted(labels))} (hypothetical passages only)"
    return ", ".join(sorted(labels))
