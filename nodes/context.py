"""Each question graph's run settings: its typed ``context_schema``, the settings form Studio shows.

A graph's form holds exactly the settings that change what it does under its own defaults,
assembled from mixins shared by the graphs that read them, so a form never offers a knob that does
nothing (``tests/test_settings.py`` checks each class against its nodes' code). A knob read only by
a strategy a graph's defaults do not use is a ``ClassVar`` constant of that graph instead (same
value as the field it is elsewhere; ``fixed_settings`` lists them), so the nodes read one typed
``ctx.X`` whatever the graph. A knob in a form that the run's chosen strategy ignores is refused when
the run sets it (``only_when``), not silently dropped. Each field carries a description and falls
back to an environment variable ``MIA_<FIELD NAME IN CAPITALS>``, so a deployment configures
defaults once and a run overrides any of them. It lives beside the nodes because the nodes read it,
and imports only flow from graph to nodes.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from functools import cache
from typing import Any, ClassVar, Literal, get_args, get_origin

from mia.stores.units import SignatureLevels

AnswerFormat = Literal["open", "choice", "verify"]
Retriever = Literal["dense", "hybrid"]
PassageOrder = Literal["score", "document"]
SignatureInit = Literal["coverage", "first_k"]
SigStrategy = Literal["trained", "centroid", "mia"]
SignatureAnswerInputs = Literal["chunks", "chunks+sig"]
EvidenceAnswerInputs = Literal["chunks", "chunks+evi"]
AgentAnswerInputs = Literal["chunks", "chunks+sig", "chunks+evi", "chunks+sig+evi"]


def _setting(default: Any, description: str, *, minimum: float | None = None, maximum: float | None = None,
             only_when: tuple[str, tuple[str, ...]] | None = None) -> Any:
    """A field with a plain default (shown in Studio's form) and the range ``validate`` holds it to;
    ``__post_init__`` replaces a value left at its default by ``MIA_<NAME>`` when that variable is set.
    ``only_when=(switch, choices)``: the nodes read this field only when setting ``switch`` is one of
    ``choices``, so ``validate`` refuses a value the run sets under another choice."""
    return field(default=default, metadata={"description": description, "minimum": minimum, "maximum": maximum,
                                            "only_when": only_when})


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
        """Reject a value outside its field's range or choices with a message that names both, and a
        value the run set for a knob its chosen strategy does not read (``only_when``)."""
        hints = _hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            choices = get_args(hints[f.name]) if get_origin(hints[f.name]) is Literal else ()
            if choices and value not in choices:
                raise ValueError(f"invalid setting: {f.name} must be one of {', '.join(choices)}, got {value!r}")
            problem = _out_of_range(f, value)
            if problem:
                raise ValueError(f"invalid setting: {problem}")
        for f in fields(self):
            problem = _ignored(self, f)
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


def _ignored(settings: GraphSettings, f: Field[Any]) -> str:
    """Why ``f``'s value is refused because the run's choice of ``only_when``'s switch does not read
    it, or "". Only a value the run chose is refused: one at the default, or the one ``MIA_<NAME>``
    sets (a deployment's default for another strategy), is left alone, since it changes nothing."""
    if f.metadata.get("only_when") is None:
        return ""
    switch, readers = f.metadata["only_when"]
    chosen = getattr(settings, switch)
    if chosen in readers or not _set_by_run(f, getattr(settings, f.name)):
        return ""
    return (f"{f.name} is read only by {switch}={' or '.join(readers)}, and this run uses {chosen}: "
            f"drop {f.name} or set {switch}={readers[0]}")


def _set_by_run(f: Field[Any], value: Any) -> bool:
    """Whether ``value`` differs from both the field's default and what ``MIA_<NAME>`` sets."""
    if value == f.default:
        return False
    raw = os.environ.get(f"MIA_{f.name.upper()}")
    if raw is None:
        return True
    try:
        return bool(coerce_setting(str(f.type), raw, f.name) != value)
    except ValueError:
        return True


@cache
def _hints(cls: type[GraphSettings]) -> dict[str, Any]:
    """The class's resolved annotations (they are strings here), for its Literal choices."""
    return typing.get_type_hints(cls)


def fixed_settings(cls: type[GraphSettings]) -> dict[str, Any]:
    """The knobs the nodes may read that ``cls``'s form does not offer, because its defaults do not
    read them: its ``ClassVar`` constants (besides ``graph``), by name, with their values."""
    own = set(_hints(GraphSettings))
    return {name: getattr(cls, name) for name, hint in _hints(cls).items()
            if get_origin(hint) is ClassVar and name not in own}


# ---- mixins: the settings a family of graphs shares -----------------------------------------------

@dataclass(kw_only=True)
class CommonSettings(GraphSettings):
    """Read by every graph: the collection, the chat model and the answer."""

    collection: str = _setting("", "Mindscape (collection) to answer from; `mia ls` lists them.")
    chat_base_url: str = _setting(
        "", "OpenAI-compatible chat endpoint to answer with; leave empty to use the embedded model that chat_model names."
    )
    chat_model: str = _setting(
        "", "Model at the chat endpoint; with no endpoint, empty is the embedded qwen2.5-coder-1.5b-instruct-q4_k_m, or "
        "name qwen2.5-coder-0.5b-instruct-q4_k_m (faster)."
    )
    max_new_tokens: int = _setting(256, "Most tokens the model may write for an answer; raise it for long answers.",
                                   minimum=1)
    answer_format: AnswerFormat = _setting(
        "open", "Shape of the answer: open (a short phrase), choice (an option's letter) or verify (TRUE or FALSE); "
        "match it to the questions."
    )
    injection_guard: bool = _setting(
        True, "Cut instructions planted in documents out of every prompt and refuse answers traced to them. Turn off "
        "only to ask about such text itself."
    )


@dataclass(kw_only=True)
class RetrievalSettings(GraphSettings):
    """Read by the graphs that rank the mindscape's chunks."""

    top_k: int = _setting(10, "Chunks given to the model with the question; more gives it more to read, in a longer "
                              "prompt.", minimum=1)
    book_card: bool = _setting(
        False, "Also give the model the card of each book its chunks come from (title, narrator, characters, places, "
        "plot); needs `mia ingest --cards`."
    )
    passage_order: PassageOrder = _setting(
        "document", "Order of the chunks in the prompt: document (story order, books in the collection's order) or "
        "score (best match first)."
    )
    retriever: Retriever = _setting(
        "hybrid", "hybrid: fuse the embedder's ranking with BM25 keyword search (bm25_weight, rrf_k). dense: the "
        "embedder's ranking alone, as in the paper."
    )
    bm25_weight: float = _setting(
        4.0, "Hybrid retrieval: weight of the BM25 ranking when fused with the embedder's, which weighs 1; raise it to "
        "favour exact words.", minimum=0, only_when=("retriever", ("hybrid",))
    )
    rrf_k: int = _setting(
        10, "Hybrid retrieval: rank offset of the fusion, each ranking adding weight/(rrf_k + rank); smaller trusts the "
        "top ranks more.", minimum=0, only_when=("retriever", ("hybrid",))
    )
    bm25_stemming: bool = _setting(
        True, "Hybrid retrieval: BM25 matches English words by their stems (carted finds cart); turn off for sources "
        "in other languages.", only_when=("retriever", ("hybrid",))
    )
    candidates: int = _setting(
        100, "How deep each first ranking goes (dense, BM25, chunks rescored with the signature); raise it for recall, "
        "lower it for speed.", minimum=1
    )


@dataclass(kw_only=True)
class StaticSettings(GraphSettings):
    """Read by the static pipelines: a fixed path of nodes, so a run can stop after retrieval and be scored on it."""

    retrieval_only: bool = _setting(False, "Stop after retrieval, with no answer from the model (evaluation, debugging); "
                                           "a hypothetical passage is still written.")
    hypothetical_passage: bool = _setting(
        False, "The model first writes a short passage that could answer the question; retrieval searches with both, "
        "finding passages in words the question lacks."
    )


@dataclass(kw_only=True)
class SignatureSettings(GraphSettings):
    """Read by the graphs that select a signature and retrieve with it, whatever their strategies
    (their own defaults for ``signature_init`` and ``sig_strategy`` are fields of their classes; the
    knobs of one strategy are in the mixins below)."""

    k0: int = _setting(50, "Chunks retrieved for the question alone, whose session summaries the signature is "
                           "chosen from; raise it to choose from more.", minimum=1)
    k_sum: int = _setting(5, "Session summaries in the signature that steers retrieval; more steers it more broadly.",
                          minimum=1)
    signature_levels: SignatureLevels = _setting(
        "sessions", "Units the signature is chosen from besides the session summaries: written parts and whole-book "
        "story, each book's card (books), its who-is-who (names)."
    )


_COVERAGE = ("signature_init", ("coverage",))


@dataclass(kw_only=True)
class CoverageSelectionSettings(GraphSettings):
    """Read only under ``signature_init=coverage``: in the form of a graph whose default that is."""

    lambda_q: float = _setting(0.3, "Coverage selection: weight of a summary's match with the question; raise it to "
                                    "keep the signature on topic.", minimum=0, only_when=_COVERAGE)
    lambda_c: float = _setting(0.4, "Coverage selection: weight of the top chunks a summary explains that chosen ones "
                                    "do not; raise it to cover more of them.", minimum=0, only_when=_COVERAGE)
    lambda_d: float = _setting(0.3, "Coverage selection: weight of a summary's difference from those already chosen; "
                                    "raise it for variety.", minimum=0, only_when=_COVERAGE)
    selection_embedder: str = _setting(
        "", "Coverage selection: embedder that scores it, e.g. bge-m3:PATH for a local BGE-M3 as in the paper; empty "
        "uses the collection's vectors.", only_when=_COVERAGE
    )


_TRAINED = ("sig_strategy", ("trained",))


@dataclass(kw_only=True)
class TrainedHeadSettings(GraphSettings):
    """Read only under ``sig_strategy=trained``: in the form of a graph whose default that is."""

    sig_weights: str = _setting(
        "", "Trained strategy: the signature head's weights (.npz, its .json card beside it); empty uses the shipped "
        "head.", only_when=_TRAINED
    )
    delta: float = _setting(
        0.5, "Trained strategy: mix of the question's own embedding (0) and the head's signature-aware one (1).",
        minimum=0, maximum=1, only_when=_TRAINED
    )


@dataclass(kw_only=True)
class SignatureMixSettings(GraphSettings):
    """Read only under ``sig_strategy`` centroid or mia: in the form of a graph whose default that is."""

    alpha: float = _setting(
        0.2, "Centroid or mia strategy: weight of the signature against the question in each chunk's score, from 0 "
        "(question only) to 1.", minimum=0, maximum=1, only_when=("sig_strategy", ("centroid", "mia"))
    )


@dataclass(kw_only=True)
class AgentLoopSettings(GraphSettings):
    """Read by the iterative agents' Retrieve → Update loop."""

    max_steps: int = _setting(3, "Most rounds of retrieving and updating the agent runs; raise it for questions that "
                                 "need more hops.", minimum=1)
    step_k: int = _setting(20, "Chunks retrieved in each round.", minimum=1)
    rewrite_query: bool = _setting(True, "Let the agent rewrite its search query between rounds.")


@dataclass(kw_only=True)
class StreamingSettings(GraphSettings):
    """Read by the graphs that stream the whole source through a bounded memory."""

    stream_chunk_tokens: int = _setting(5000, "Tokens of the source read in each step; larger means fewer, longer "
                                              "steps.", minimum=100)
    memory_tokens: int = _setting(1024, "Most tokens the memory may hold.", minimum=16)


def _signature_init(default: SignatureInit) -> Any:
    return _setting(default, "How the signature is chosen: coverage (summaries that together explain the best chunks, "
                             "kept varied) or first_k (those of the best chunks).")


def _sig_strategy(default: SigStrategy) -> Any:
    return _setting(default, "How retrieval uses the signature: trained (the head `mia train retriever` made), "
                             "centroid (its summaries' mean vector) or mia (a decoder embedder).")


def _answer_inputs(choices: str) -> Any:
    """The graph's ``answer_inputs``: always the chunks by default; ``choices`` lists what it can add."""
    return _setting("chunks", f"What the model reads besides the question: {choices}.")


# ---- one class per graph: the fields of its nodes, and nothing else -------------------------------
# Bases are listed last-first: a dataclass orders its fields from the last base, so the form opens
# with the common settings. A knob that only a strategy off the graph's defaults reads is a ClassVar
# constant with the value of the field it is in the mixin: out of the form, still read as ``ctx.X``.

@dataclass(kw_only=True)
class RagSettings(StaticSettings, RetrievalSettings, CommonSettings):
    """``rag``: query-only retrieval → answer."""

    graph: ClassVar[str] = "rag"


@dataclass(kw_only=True)
class MiaRagSettings(TrainedHeadSettings, CoverageSelectionSettings, SignatureSettings, StaticSettings, RetrievalSettings,
                     CommonSettings):
    """``mia_rag``: step 0 → InitSignature → retrieval with the signature → answer."""

    graph: ClassVar[str] = "mia_rag"
    signature_init: SignatureInit = _signature_init("coverage")
    sig_strategy: SigStrategy = _sig_strategy("trained")
    answer_inputs: SignatureAnswerInputs = _answer_inputs("chunks, or chunks+sig (plus the signature's summaries)")
    alpha: ClassVar[float] = SignatureMixSettings.alpha
    """Read by sig_strategy centroid and mia only."""


@dataclass(kw_only=True)
class AgentSettings(AgentLoopSettings, RetrievalSettings, CommonSettings):
    """``agent``: the Retrieve → Update loop without a signature."""

    graph: ClassVar[str] = "agent"
    answer_inputs: EvidenceAnswerInputs = _answer_inputs("chunks, or chunks+evi (plus the facts the loop gathered)")


@dataclass(kw_only=True)
class MiaAgentSettings(SignatureMixSettings, SignatureSettings, AgentLoopSettings, RetrievalSettings, CommonSettings):
    """``mia_agent``: InitSignature, then the Retrieve → Update loop over (query, signature, evidence).
    Its defaults differ from mia_rag's: the first_k signature and the centroid, since the trained head
    never saw the agent's rewritten queries and first_k signatures."""

    graph: ClassVar[str] = "mia_agent"
    signature_init: SignatureInit = _signature_init("first_k")
    sig_strategy: SigStrategy = _sig_strategy("centroid")
    answer_inputs: AgentAnswerInputs = _answer_inputs(
        "chunks, chunks+sig (plus the final signature's summaries), chunks+evi (plus the loop's facts) or chunks+sig+evi"
    )
    lambda_q: ClassVar[float] = CoverageSelectionSettings.lambda_q
    lambda_c: ClassVar[float] = CoverageSelectionSettings.lambda_c
    lambda_d: ClassVar[float] = CoverageSelectionSettings.lambda_d
    selection_embedder: ClassVar[str] = CoverageSelectionSettings.selection_embedder
    """Read by signature_init=coverage only."""
    sig_weights: ClassVar[str] = TrainedHeadSettings.sig_weights
    delta: ClassVar[float] = TrainedHeadSettings.delta
    """Read by sig_strategy=trained only."""


@dataclass(kw_only=True)
class MemAgentSettings(StreamingSettings, CommonSettings):
    """``memagent``: the source streamed through an overwritten memory."""

    graph: ClassVar[str] = "memagent"


@dataclass(kw_only=True)
class InfMemSettings(StreamingSettings, CommonSettings):
    """``infmem``: PreThink → Retrieve → Write with early stop."""

    graph: ClassVar[str] = "infmem"
    bm25_window: int = _setting(500, "Tokens in each window of the source that BM25 retrieves.", minimum=1)
    bm25_overlap: int = _setting(100, "Tokens shared by neighbouring BM25 windows; less than bm25_window.", minimum=0)
    stop_after: int = _setting(3, "Stop reading after this many STOP decisions in a row; 1 stops soonest.", minimum=1)

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
    would be taken for one that used it. So is one the graph holds fixed (``fixed_settings``), saying
    so; and ``validate`` refuses a setting the run's chosen strategy does not read."""
    cls = settings_class(graph)
    known = {f.name: f for f in fields(cls)}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        fixed = fixed_settings(cls)
        held = "".join(f"; {cls.graph} holds {name} fixed at {fixed[name]!r}, since its defaults do not read it"
                       for name in unknown if name in fixed)
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} for graph {cls.graph}; it reads {', '.join(known)}{held}")
    return cls(**{k: coerce_setting(known[k].type, v, k) if isinstance(v, str) else v for k, v in overrides.items()})
