"""The run configuration shared by every graph: a typed ``context_schema`` for LangGraph.

Each field carries a description (LangGraph Studio shows these as the settings form) and falls
back to an environment variable ``MIA_<FIELD NAME IN CAPITALS>``, so a deployment configures
defaults once and a run overrides any of them. It lives beside the nodes because the nodes read
it, and imports only flow from graph to nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

AnswerInputs = Literal["chunks", "chunks+sig", "chunks+evi", "chunks+sig+evi", "auto"]
SignatureInit = Literal["auto", "coverage", "first_k"]
SigStrategy = Literal["auto", "trained", "centroid", "concat", "mia"]
AnswerFormat = Literal["open", "choice", "verify"]
OpenAnswer = Literal["trim", "sentence", "phrase", "schema", "extract"]
Retriever = Literal["dense", "hybrid"]


SettingGroup = Literal["common", "retrieval", "signature", "streaming"]
"""Which graphs read a setting: every graph (common), those that retrieve from the mindscape
(retrieval), those that also select a signature (signature), or the streaming agents (streaming).
``graph.registry`` says which groups each graph reads; the evaluation runner keeps the settings a
graph never reads out of its results' fingerprint."""


def _setting(default: Any, description: str, group: SettingGroup = "common") -> Any:
    """A field with a plain default (shown in Studio's form); ``__post_init__`` replaces a value
    left at its default by ``MIA_<NAME>`` when that variable is set."""
    return field(default=default, metadata={"description": description, "group": group})


def settings_in(groups: frozenset[str]) -> frozenset[str]:
    """The names of the settings that belong to any of ``groups``."""
    return frozenset(f.name for f in fields(Context) if f.metadata["group"] in groups)


@dataclass(kw_only=True)
class Context:
    collection: str = _setting("", "Mindscape (collection) to answer from; `mia ls` lists them.")
    embedder: str = _setting(
        "minilm", "Embedder spec: minilm, use, openai:MODEL, decoder:PATH or a local Hugging Face folder. Must match the collection's."
    )
    chat_base_url: str = _setting("", "OpenAI-compatible chat endpoint; empty uses the embedded Qwen2.5-0.5B.")
    chat_model: str = _setting("", "Model name at the chat endpoint.")
    max_new_tokens: int = _setting(256, "Most tokens the generator may write for an answer.")

    retrieval_only: bool = _setting(False, "Stop after retrieval, with no LLM call (evaluation, debugging).")
    top_k: int = _setting(10, "Chunks given to the generator (static graphs).", group="retrieval")
    retriever: Retriever = _setting(
        "hybrid", "hybrid: fuse every ranking (step 0, E2, the agents' steps) with BM25 over the chunks by weighted reciprocal rank fusion (bm25_weight, rrf_k; measured best, issues 8 and 21). dense: the embedder alone, as in the paper (with sig_strategy=centroid: the trained head learned on hybrid scores).", group="retrieval"
    )
    bm25_weight: float = _setting(
        4.0, "Hybrid retrieval: weight of BM25's ranking in the reciprocal rank fusion, the dense ranking's being 1 (chosen with bm25_stemming on the fairy-tale train and validation questions; 1 is plain RRF).", group="retrieval"
    )
    rrf_k: int = _setting(
        10, "Hybrid retrieval: k of the reciprocal rank fusion, w/(k + rank); smaller trusts the top ranks more (chosen on the validation split; RRF's usual is 60).", group="retrieval"
    )
    bm25_stemming: bool = _setting(
        True, "Hybrid retrieval: BM25 matches English words by their Snowball stems (carted = cart), chosen on the fairy-tale train and validation questions; turn off for sources in other languages.", group="retrieval"
    )
    k0: int = _setting(50, "Step-0 query-only candidates (K0) from which the signature is selected.", group="signature")
    k_sum: int = _setting(5, "Summaries in the signature (K_sum).", group="signature")
    signature_init: SignatureInit = _setting(
        "auto", "InitSignature variant: coverage-aware (Alg. 2), first_k, or auto (coverage for mia_rag, first_k for the agent).", group="signature"
    )
    lambda_q: float = _setting(0.3, "Weight of query relevance in the selection objective (λ_Q).", group="signature")
    lambda_c: float = _setting(0.4, "Weight of chunk coverage in the selection objective (λ_C).", group="signature")
    lambda_d: float = _setting(0.3, "Weight of diversity in the selection objective (λ_D).", group="signature")
    alpha: float = _setting(
        0.2, "sig_strategy centroid/concat/mia: signature weight α in s = (1 − α)·s_qry + α·s_sig (Eq. 4); 0.2 was best on the validation split, the paper uses 0.5.", group="signature"
    )
    sig_strategy: SigStrategy = _setting(
        "auto", "How E2 reads the signature: trained (the signature head of `mia train retriever`, shipped in stores/weights, adds to rag's own fused ranking a learned signature-aware cosine, a session membership term and a region term over the neighbouring sessions that continue it), the paper's Eq. 4 with s_sig from the centroid of the summary vectors, concat (embed signature text + query) or mia (a decoder embedder's δ-interpolated query), or auto: trained for mia_rag, centroid for mia_agent (measured on the fairy-tale val split: the head lifts mia_rag's Recall@10 and lowered the agent's).", group="signature"
    )
    sig_weights: str = _setting(
        "", "sig_strategy=trained: the head's weights (.npz with its .json card beside it); empty: the shipped head (stores/weights/signature-head.npz).", group="signature"
    )
    delta: float = _setting(
        0.5, "sig_strategy=trained: interpolation δ between the query-only embedding and the head's signature-aware one, as MiA-Emb; the shipped head was trained at 0.5 (its card records it).", group="signature"
    )
    selection_embedder: str = _setting(
        "", "Embedder whose vectors score the signature selection (coverage-aware InitSignature): bge-m3:PATH (a local BGE-M3 folder: its CLS vectors, as in the paper) or any embedder spec. Empty: the collection's own vectors, no extra model.", group="signature"
    )
    candidates: int = _setting(100, "Depth of every first stage: dense and BM25 candidates fused, chunks fetched by the interpolated vector search before exact Eq. 4 rescoring, and the trained head's nearest chunks to its query.", group="retrieval")

    answer_inputs: AnswerInputs = _setting(
        "chunks", "What the generator sees besides the question: chunks, +sig, +evi, +sig+evi, or auto (our per-question rule).", group="retrieval"
    )
    answer_format: AnswerFormat = _setting("open", "open (a short phrase), choice (a letter) or verify (TRUE/FALSE).")
    open_answer: OpenAnswer = _setting(
        "trim", "How an open answer is asked for: trim (as sentence, then a reply that restates the question around a name, number or date is cut to it, and a yes/no reply to its first word; no extra call; measured best on multihop-synth train and fairy-tale val), sentence (a short phrase, the prompt of reports before issue 25), phrase (the answer itself first, with an example), schema (JSON-constrained answer of at most 80 characters + passage numbers) or extract (phrase, then a short second call cuts a long reply down to the phrase inside it). The supporting sentence comes with the citations."
    )
    injection_guard: bool = _setting(
        True, "Keep instructions planted in documents away from the model: cut instruction-like spans out of every prompt and reject an answer or query traced to one. Turn off only to ask about such text itself."
    )

    max_steps: int = _setting(3, "Agent: most Retrieve→Update steps (N_stop).", group="retrieval")
    step_k: int = _setting(20, "Agent: chunks retrieved per step.", group="retrieval")
    rewrite_query: bool = _setting(True, "Agent: let Update rewrite the query between steps.", group="retrieval")

    stream_chunk_tokens: int = _setting(5000, "InfMem/MemAgent: tokens of source read per step.", group="streaming")
    memory_tokens: int = _setting(1024, "InfMem/MemAgent: bound on the memory, in tokens.", group="streaming")
    bm25_window: int = _setting(500, "InfMem: tokens per BM25 retrieval window.", group="streaming")
    bm25_overlap: int = _setting(100, "InfMem: overlap between BM25 windows, in tokens.", group="streaming")
    stop_after: int = _setting(3, "InfMem: stop after this many consecutive STOP decisions (1-stop, 3-stop).", group="streaming")

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
        """Reject settings out of range with a message that names the setting and its range."""
        checks = [
            (self.top_k >= 1, "top_k must be at least 1"),
            (self.k0 >= 1, "k0 must be at least 1"),
            (self.bm25_weight >= 0, "bm25_weight must be non-negative"),
            (self.rrf_k >= 0, "rrf_k must be non-negative"),
            (self.k_sum >= 1, "k_sum must be at least 1"),
            (0.0 <= self.alpha <= 1.0, "alpha must be in [0, 1]"),
            (0.0 <= self.delta <= 1.0, "delta must be in [0, 1]"),
            (min(self.lambda_q, self.lambda_c, self.lambda_d) >= 0, "lambda_q, lambda_c and lambda_d must be non-negative"),
            (self.candidates >= 1, "candidates must be at least 1"),
            (self.max_steps >= 1, "max_steps must be at least 1"),
            (self.step_k >= 1, "step_k must be at least 1"),
            (self.max_new_tokens >= 1, "max_new_tokens must be at least 1"),
            (self.stream_chunk_tokens >= 100, "stream_chunk_tokens must be at least 100"),
            (self.memory_tokens >= 16, "memory_tokens must be at least 16"),
            (0 <= self.bm25_overlap < self.bm25_window, "bm25_overlap must be in [0, bm25_window)"),
            (self.stop_after >= 1, "stop_after must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid setting: {message}")
        for name, kind in (("retriever", Retriever), ("signature_init", SignatureInit), ("sig_strategy", SigStrategy),
                           ("answer_inputs", AnswerInputs), ("answer_format", AnswerFormat),
                           ("open_answer", OpenAnswer)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"invalid setting: {name} must be one of {', '.join(get_args(kind))}, got {getattr(self, name)!r}")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def resolved_sig_strategy(ctx: Context, graph: str) -> str:
    """The strategy ``graph``'s E2 uses: ``auto`` is the trained head for mia_rag and the centroid
    for the agents, whose rewritten queries and First-K signatures the head was not trained on
    (evals/results/signature-head-agent-fairytale-series-val)."""
    if ctx.sig_strategy != "auto":
        return ctx.sig_strategy
    return "centroid" if graph == "mia_agent" else "trained"


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


def context_from(overrides: dict[str, Any] | None = None) -> Context:
    """A Context from loose key/value pairs (CLI ``--set``, API payloads), converting strings."""
    overrides = dict(overrides or {})
    known = {f.name: f for f in fields(Context)}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    values = {k: coerce_setting(known[k].type, v, k) if isinstance(v, str) else v for k, v in overrides.items()}
    return Context(**values)

