"""Each question graph's run settings: its typed ``context_schema``, the settings form Studio shows.

A graph's class holds exactly the settings its nodes read, assembled from mixins shared by the
graphs that read them, so a form never offers a knob that does nothing (``tests/test_settings.py``
checks each class against its nodes' code). Each field carries a description and falls back to an
environment variable ``MIA_<FIELD NAME IN CAPITALS>``, so a deployment configures defaults once and
a run overrides any of them. It lives beside the nodes because the nodes read it, and imports only
flow from graph to nodes.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from functools import cache
from typing import Any, ClassVar, Literal, get_args, get_origin

AnswerFormat = Literal["open", "choice", "verify"]
Retriever = Literal["dense", "hybrid"]
PassageOrder = Literal["score", "document"]
SignatureInit = Literal["coverage", "first_k"]
SigStrategy = Literal["trained", "centroid", "mia"]
SignatureLevels = Literal["sessions", "sessions+books"]
SignatureAnswerInputs = Literal["chunks", "chunks+sig"]
EvidenceAnswerInputs = Literal["chunks", "chunks+evi"]
AgentAnswerInputs = Literal["chunks", "chunks+sig", "chunks+evi", "chunks+sig+evi"]


def _setting(default: Any, description: str, *, minimum: float | None = None, maximum: float | None = None) -> Any:
    """A field with a plain default (shown in Studio's form) and the range ``validate`` holds it to;
    ``__post_init__`` replaces a value left at its default by ``MIA_<NAME>`` when that variable is set."""
    return field(default=default, metadata={"description": description, "minimum": minimum, "maximum": maximum})


@dataclass(kw_only=True)
class GraphSettings:
    """What every graph's settings do on construction: environment fallback, string coercion and
    validation, so a bad value fails before any node runs, with the setting's name in the message."""

    graph: ClassVar[str] = ""
    """The graph whose ``context_schema`` this class is (empty for a mixin)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            raw = os.environ.get(f"MIA_{f.name.upper()}")
            if raw is not None and value == f.default:
                setattr(self, f.name, coerce_setting(f.type, raw, f.name))
            elif isinstance(value, str) and f.type in ("int", "float", "bool"):
                # API payloads and Studio forms may send numbers as strings.
                setattr(self, f.name, coerce_setting(f.type, value, f.name))
        self.validate()

    def validate(self) -> None:
        """Reject a value outside its field's range or choices with a message that names both."""
        hints = _hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            choices = get_args(hints[f.name]) if get_origin(hints[f.name]) is Literal else ()
            if choices and value not in choices:
                raise ValueError(f"invalid setting: {f.name} must be one of {', '.join(choices)}, got {value!r}")
            problem = _out_of_range(f, value)
            if problem:
                raise ValueError(f"invalid setting: {problem}")


def _out_of_range(f: Field[Any], value: Any) -> str:
    """Why ``value`` is outside ``f``'s range, or "". Written so that NaN is outside every range."""
    low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
    if low is not None and high is not None:
        return "" if low <= value <= high else f"{f.name} must be in [{low:g}, {high:g}]"
    if low is not None and not value >= low:
        return f"{f.name} must be non-negative" if low == 0 else f"{f.name} must be at least {low:g}"
    return ""


@cache
def _hints(cls: type[GraphSettings]) -> dict[str, Any]:
    """The class's resolved annotations (they are strings here), for its Literal choices."""
    return typing.get_type_hints(cls)


# ---- mixins: the settings a family of graphs shares -----------------------------------------------

@dataclass(kw_only=True)
class CommonSettings(GraphSettings):
    """Read by every graph: the collection, the chat model and the answer."""

    collection: str = _setting("", "Mindscape (collection) to answer from; `mia ls` lists them.")
    chat_base_url: str = _setting("", "OpenAI-compatible chat endpoint; empty uses the embedded model chat_model names.")
    chat_model: str = _setting(
        "", "Model name at the chat endpoint; without one, the embedded reader: empty for the default "
        "qwen2.5-coder-1.5b-instruct-q4_k_m, or qwen2.5-coder-0.5b-instruct-q4_k_m (faster, and weaker on reader's questions)."
    )
    max_new_tokens: int = _setting(256, "Most tokens the generator may write for an answer.", minimum=1)
    answer_format: AnswerFormat = _setting(
        "open", "open (a short phrase; a reply that restates the question around a name, number or date is cut to it), "
        "choice (a letter) or verify (TRUE/FALSE)."
    )
    injection_guard: bool = _setting(
        True, "Keep instructions planted in documents away from the model: cut instruction-like spans out of every prompt "
        "and reject an answer or query traced to one. Turn off only to ask about such text itself."
    )


@dataclass(kw_only=True)
class RetrievalSettings(GraphSettings):
    """Read by the graphs that rank the mindscape's chunks."""

    top_k: int = _setting(10, "Chunks given to the generator.", minimum=1)
    book_card: bool = _setting(
        False, "Give the generator the card of each book its chunks come from (written by `mia ingest --cards`): "
        "title, narrator, main characters, places, plot outline, the most named names."
    )
    passage_order: PassageOrder = _setting(
        "document", "Order of the chunks in the generator's prompt: document (story order: by position in their book, "
        "books in the collection's order; +2 F1 for rag and mia_rag on 40 literaryqa dev questions) or score (best first)."
    )
    retriever: Retriever = _setting(
        "hybrid", "hybrid: fuse every ranking with BM25 over the chunks by weighted reciprocal rank fusion (bm25_weight, "
        "rrf_k). dense: the embedder's ranking alone, as in the paper."
    )
    bm25_weight: float = _setting(
        4.0, "Hybrid retrieval: weight of BM25's ranking in the reciprocal rank fusion, the dense ranking's being 1 "
        "(1 is plain RRF).", minimum=0
    )
    rrf_k: int = _setting(
        10, "Hybrid retrieval: k of the reciprocal rank fusion, w/(k + rank); smaller trusts the top ranks more "
        "(RRF's usual is 60).", minimum=0
    )
    bm25_stemming: bool = _setting(
        True, "Hybrid retrieval: BM25 matches English words by their Snowball stems (carted = cart); turn off for "
        "sources in other languages."
    )
    candidates: int = _setting(
        100, "Depth of every first stage: the dense and BM25 candidates fused, and the chunks that signature-aware "
        "retrieval scores exactly.", minimum=1
    )


@dataclass(kw_only=True)
class StaticSettings(GraphSettings):
    """Read by the static pipelines, whose retrieval does not depend on the chat model."""

    retrieval_only: bool = _setting(False, "Stop after retrieval, with no LLM call (evaluation, debugging).")


@dataclass(kw_only=True)
class SignatureSettings(GraphSettings):
    """Read by the graphs that select a signature and retrieve with it (their own defaults for
    ``signature_init`` and ``sig_strategy`` are fields of their classes)."""

    k0: int = _setting(50, "Step-0 query-only candidates (K0) from which the signature is selected.", minimum=1)
    k_sum: int = _setting(5, "Summaries in the signature (K_sum).", minimum=1)
    lambda_q: float = _setting(0.3, "signature_init coverage: weight of query relevance in the selection objective (λ_Q).",
                               minimum=0)
    lambda_c: float = _setting(0.4, "signature_init coverage: weight of chunk coverage in the selection objective (λ_C).",
                               minimum=0)
    lambda_d: float = _setting(0.3, "signature_init coverage: weight of diversity in the selection objective (λ_D).",
                               minimum=0)
    signature_levels: SignatureLevels = _setting(
        "sessions", "Units the signature is selected from: sessions (session summaries), or sessions+books (also each "
        "book's unit, its card as text, a level above its sessions; needs book cards). Retrieval reads the sessions only."
    )
    selection_embedder: str = _setting(
        "", "signature_init coverage: embedder whose vectors score the selection, bge-m3:PATH (a local BGE-M3 folder, as "
        "in the paper) or any embedder spec. Empty: the collection's own vectors, no extra model."
    )
    alpha: float = _setting(
        0.2, "sig_strategy centroid or mia: signature weight α in s = (1 − α)·s_qry + α·s_sig (Eq. 4); the paper uses 0.5.",
        minimum=0, maximum=1
    )
    sig_weights: str = _setting(
        "", "sig_strategy trained: the head's weights (.npz with its .json card beside it); empty: the shipped head."
    )
    delta: float = _setting(
        0.5, "sig_strategy trained: interpolation δ between the query-only embedding and the head's signature-aware one, "
        "as in MiA-Emb.", minimum=0, maximum=1
    )


@dataclass(kw_only=True)
class AgentLoopSettings(GraphSettings):
    """Read by the iterative agents' Retrieve → Update loop."""

    max_steps: int = _setting(3, "Most Retrieve→Update steps (N_stop).", minimum=1)
    step_k: int = _setting(20, "Chunks retrieved per step.", minimum=1)
    rewrite_query: bool = _setting(True, "Let Update rewrite the query between steps.")


@dataclass(kw_only=True)
class StreamingSettings(GraphSettings):
    """Read by the graphs that stream the whole source through a bounded memory."""

    stream_chunk_tokens: int = _setting(5000, "Tokens of source read per step.", minimum=100)
    memory_tokens: int = _setting(1024, "Bound on the memory, in tokens.", minimum=16)


def _signature_init(default: SignatureInit) -> Any:
    return _setting(default, "InitSignature: coverage (coverage-aware greedy selection, Alg. 2, weighted by lambda_q, "
                             "lambda_c and lambda_d) or first_k (the summaries of the best step-0 chunks, in rank order).")


def _sig_strategy(default: SigStrategy) -> Any:
    return _setting(default, "How retrieval reads the signature: trained (the signature head of `mia train retriever`), "
                             "centroid (Eq. 4 with the mean of the summaries' vectors) or mia (the collection's decoder "
                             "embedder reads the signature).")


def _answer_inputs(choices: str) -> Any:
    """The graph's ``answer_inputs``: always the chunks by default; ``choices`` lists what it can add."""
    return _setting("chunks", f"What the generator sees besides the question: {choices}.")


# ---- one class per graph: the fields of its nodes, and nothing else -------------------------------
# Bases are listed last-first: a dataclass orders its fields from the last base, so the form opens
# with the common settings.

@dataclass(kw_only=True)
class RagSettings(StaticSettings, RetrievalSettings, CommonSettings):
    """``rag``: query-only retrieval → answer."""

    graph: ClassVar[str] = "rag"


@dataclass(kw_only=True)
class MiaRagSettings(SignatureSettings, StaticSettings, RetrievalSettings, CommonSettings):
    """``mia_rag``: step 0 → InitSignature → retrieval with the signature → answer."""

    graph: ClassVar[str] = "mia_rag"
    signature_init: SignatureInit = _signature_init("coverage")
    sig_strategy: SigStrategy = _sig_strategy("trained")
    answer_inputs: SignatureAnswerInputs = _answer_inputs("the chunks alone, or chunks+sig (with the signature's summaries)")


@dataclass(kw_only=True)
class AgentSettings(AgentLoopSettings, RetrievalSettings, CommonSettings):
    """``agent``: the Retrieve → Update loop without a signature."""

    graph: ClassVar[str] = "agent"
    answer_inputs: EvidenceAnswerInputs = _answer_inputs("the chunks alone, or chunks+evi (with the facts the loop gathered)")


@dataclass(kw_only=True)
class MiaAgentSettings(SignatureSettings, AgentLoopSettings, RetrievalSettings, CommonSettings):
    """``mia_agent``: InitSignature, then the Retrieve → Update loop over (query, signature, evidence).
    Its defaults differ from mia_rag's: First-K σ_0 (App. A) and the centroid, since the trained head
    never saw the agent's rewritten queries and First-K signatures."""

    graph: ClassVar[str] = "mia_agent"
    signature_init: SignatureInit = _signature_init("first_k")
    sig_strategy: SigStrategy = _sig_strategy("centroid")
    answer_inputs: AgentAnswerInputs = _answer_inputs(
        "chunks, chunks+sig (with the final signature's summaries), chunks+evi (with the facts the loop gathered) or "
        "chunks+sig+evi"
    )


@dataclass(kw_only=True)
class MemAgentSettings(StreamingSettings, CommonSettings):
    """``memagent``: the source streamed through an overwritten memory."""

    graph: ClassVar[str] = "memagent"


@dataclass(kw_only=True)
class InfMemSettings(StreamingSettings, CommonSettings):
    """``infmem``: PreThink → Retrieve → Write with early stop."""

    graph: ClassVar[str] = "infmem"
    bm25_window: int = _setting(500, "Tokens per BM25 retrieval window.", minimum=1)
    bm25_overlap: int = _setting(100, "Overlap between BM25 windows, in tokens; less than bm25_window.", minimum=0)
    stop_after: int = _setting(3, "Stop after this many consecutive STOP decisions (1-stop, 3-stop).", minimum=1)

    def validate(self) -> None:
        super().validate()
        if self.bm25_overlap >= self.bm25_window:
            raise ValueError("invalid setting: bm25_overlap must be in [0, bm25_window)")


SignatureGraphSettings = MiaRagSettings | MiaAgentSettings
AgentGraphSettings = AgentSettings | MiaAgentSettings
StreamingGraphSettings = MemAgentSettings | InfMemSettings
"""What the nodes shared by two graphs read: the fields both classes hold."""

GRAPH_SETTINGS: dict[str, type[GraphSettings]] = {
    cls.graph: cls for cls in (RagSettings, MiaRagSettings, MiaAgentSettings, AgentSettings, InfMemSettings, MemAgentSettings)
}
"""Each question graph's settings class, in the order the graphs are listed to users."""


def settings_class(graph: str) -> type[GraphSettings]:
    if graph not in GRAPH_SETTINGS:
        raise ValueError(f"unknown graph {graph!r}; choose one of {', '.join(GRAPH_SETTINGS)}")
    return GRAPH_SETTINGS[graph]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def coerce_setting(kind: str, raw: str, name: str) -> Any:
    """Convert an environment or CLI string to the field's type (annotations are strings here).

    Booleans are strict: a typo such as ``maybe`` must not quietly read as False."""
    try:
        if kind == "bool":
            word = raw.strip().lower()
            if word not in _TRUE + _FALSE:
                raise ValueError(word)
            return word in _TRUE
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError as exc:
        expected = f"one of {'/'.join(_TRUE + _FALSE)}" if kind == "bool" else f"a valid {kind}"
        raise ValueError(f"setting {name}={raw!r} is not {expected}") from exc
    return raw


def context_from(graph: str, overrides: Mapping[str, Any] | None = None) -> GraphSettings:
    """``graph``'s settings from loose key/value pairs (CLI ``--set``, API payloads), converting strings.

    A setting the graph does not read is refused, not dropped: a run that ignored ``--set alpha=0.3``
    would be taken for one that used it."""
    cls = settings_class(graph)
    known = {f.name: f for f in fields(cls)}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} for graph {cls.graph}; it reads {', '.join(known)}")
    return cls(**{k: coerce_setting(known[k].type, v, k) if isinstance(v, str) else v for k, v in overrides.items()})
