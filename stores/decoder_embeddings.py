"""LangChain adapter for decoder-only (Qwen3-based) embedding models: SFT-Emb, MiA-Emb, Qwen3-Embedding.

These models are causal LMs used as encoders, so the embedding is the last-layer hidden state of a
chosen token rather than a mean over tokens. MiA-Emb additionally reads a query *and* a signature in
one pass and mixes two of its hidden states (MiA-Signature paper, Appendix B; docs/design.md §3):

* ``h_q`` at the ``<|endoftext|>`` that closes the query. Causal attention means it has seen the
  instruction and the query but none of the signature, so it is exactly the query-only embedding.
* ``h_t`` at the final token, after the signature: the signature-situated query.

``q = normalise(δ·normalise(h_q) + (1−δ)·normalise(h_t))``. Both parts are normalised *before* mixing
so that δ weighs two directions, not two arbitrary norms (the states at mid-sequence and at the
end need not have the same length). With unit parts,
``q·c ∝ δ·cos(h_q, c) + (1−δ)·cos(h_t, c)``: ranking chunks by ``q`` is ranking them by the paper's
Eq. 4 score ``(1−α)·s_qry + α·s_sig`` with ``α = 1−δ``.

Query format with a signature, after Fig. 16 of the MiA-RAG paper (the format MiA-Emb was trained on)::

    Instruct: {instruction}\\nQuery: {query}<|endoftext|>{SIGNATURE_BRIDGE}{signature}<|node_mode|><|chunk_mode|>

with ``SIGNATURE_BRIDGE`` = "Here is the summary providing possibly useful global information. Please
encode the query based on the summary:\\nSummary: ".

The published figure is extracted from a PDF, so the exact whitespace around the special tokens is
a best reading, not a certainty. ``<|node_mode|>``/``<|chunk_mode|>`` are the task tokens that end
the MiA-Emb query. They become single special tokens only when the checkpoint's tokenizer defines
them; otherwise (e.g. a plain Qwen3-Embedding or SFT-Emb folder) they are tokenised as ordinary
text, and a warning at load time says so, since such a model was not trained on this format.

Padding is done on the left (the pad token is also ``<|endoftext|>``), so every sequence ends at the
last column, and positions are taken from the attention mask, never by searching for the token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from langchain_core.embeddings import Embeddings
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

END_OF_TEXT = "<|endoftext|>"
TASK_TOKENS = ("<|node_mode|>", "<|chunk_mode|>")
SIGNATURE_BRIDGE = (
    "Here is the summary providing possibly useful global information. "
    "Please encode the query based on the summary:\nSummary: "
)


class DecoderEmbeddings(Embeddings):
    """Embeds chunks and queries with a local Qwen3-style decoder embedder, with or without a signature."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str | None = None,
        max_length: int = 8192,
        batch_size: int = 8,
        query_instruction: str = "Given a question, retrieve relevant passages that answer it",
        delta: float = 0.5,
    ) -> None:
        """Load the model from a local folder only: the project runs offline, and a silent download of an
        8B model would be worse than a clear failure.

        ``delta`` is δ, the weight of the query-only state in the query–signature mix (0.5 as in MiA-Emb).
        """
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta must lie in [0, 1], got {delta}")
        if max_length < 1 or batch_size < 1:
            raise ValueError(f"max_length and batch_size must be positive, got {max_length}, {batch_size}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.max_length = max_length
        self.batch_size = batch_size
        self.query_instruction = query_instruction
        self.delta = delta

        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            model_path, local_files_only=True
        )
        self.tokenizer.padding_side = "left"
        # Segments are tokenised apart (to know where the query ends) and padded afterwards, so the
        # advice "use __call__ rather than pad" that fast tokenizers print does not apply here.
        self.tokenizer.deprecation_warnings["Asking-to-pad-a-fast-tokenizer"] = True
        self.end_id = self._end_of_text_id()
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.convert_ids_to_tokens(self.end_id)
        missing = [t for t in TASK_TOKENS if t not in self.tokenizer.get_added_vocab()]
        if missing:
            logger.warning(
                "%s: tokenizer has no special token %s; the MiA query format will carry it as plain text",
                model_path,
                ", ".join(missing),
            )

        # bfloat16 is the checkpoints' own precision and halves GPU memory; CPUs get float32 because
        # their bfloat16 matmuls are slow and too coarse for batch-invariant results.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model: PreTrainedModel = AutoModel.from_pretrained(
            model_path, local_files_only=True, dtype=dtype
        ).to(self.device)
        self.model.eval()

    def count_tokens(self, text: str) -> int:
        """Tokens of a document before its end token: what ingestion checks against ``max_length - 1``."""
        return len(self._ids(text))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Chunks end with ``<|endoftext|>`` and are pooled there, as Qwen3-Embedding was trained."""
        seqs = [self._ids(text) + [self.end_id] for text in texts]
        return [vecs[0].tolist() for vecs in self._pooled(seqs, [[len(s) - 1] for s in seqs], "text")]

    def embed_query(self, text: str) -> list[float]:
        """Query-only embedding (SFT-Emb / Qwen3-Embedding style)."""
        return self.embed_queries([text])[0]

    def embed_queries(self, queries: Sequence[str]) -> list[list[float]]:
        """Batched :meth:`embed_query`; equal, up to float rounding, to the signature form at δ=1."""
        seqs = [self._query_ids(q) for q in queries]
        return [vecs[0].tolist() for vecs in self._pooled(seqs, [[len(s) - 1] for s in seqs], "query")]

    def embed_query_with_signature(self, query: str, signature: str) -> list[float]:
        """MiA-Emb query embedding conditioned on a MiA-Signature."""
        return self.embed_queries_with_signatures([(query, signature)])[0]

    def embed_queries_with_signatures(self, pairs: Sequence[tuple[str, str]]) -> list[list[float]]:
        """Batched :meth:`embed_query_with_signature`: one forward pass yields both h_q and h_t."""
        seqs: list[list[int]] = []
        marks: list[list[int]] = []
        for query, signature in pairs:
            head = self._query_ids(query)
            tail = self._ids(f"{SIGNATURE_BRIDGE}{signature}{''.join(TASK_TOKENS)}")
            seqs.append(head + tail)
            marks.append([len(head) - 1, len(head) + len(tail) - 1])
        return [
            F.normalize(self.delta * h_q + (1.0 - self.delta) * h_t, dim=-1).tolist()
            for h_q, h_t in self._pooled(seqs, marks, "query")
        ]

    def _end_of_text_id(self) -> int:
        """Prefer the literal ``<|endoftext|>``: Qwen3 tokenizers declare ``<|im_end|>`` as eos, but the
        embedders were trained with ``<|endoftext|>`` closing each input."""
        vocab = self.tokenizer.get_vocab()
        if END_OF_TEXT in vocab:
            return vocab[END_OF_TEXT]
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer has neither {END_OF_TEXT} nor an eos token to end inputs with")
        return self.tokenizer.eos_token_id

    def _ids(self, text: str) -> list[int]:
        """Tokenise without the tokenizer's own specials, so an end token is never added twice (some
        Qwen3-Embedding tokenizers append ``<|endoftext|>`` themselves)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _query_ids(self, query: str) -> list[int]:
        return self._ids(f"Instruct: {self.query_instruction}\nQuery: {query}") + [self.end_id]

    def _pooled(self, seqs: list[list[int]], marks: list[list[int]], kind: str) -> list[torch.Tensor]:
        """Return, per sequence, the L2-normalised last-layer states at its marked (unpadded) positions.

        Every length is checked before any compute, so a bad input fails fast instead of after
        minutes of embedding. Sequences are batched longest first so each batch carries little
        padding; results come back in input order.
        """
        for index, seq in enumerate(seqs):
            if len(seq) > self.max_length:
                raise ValueError(
                    f"{kind} {index} is {len(seq)} tokens with its format, over max_length="
                    f"{self.max_length}; split or shorten it (nothing is truncated)"
                )
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]), reverse=True)
        out: dict[int, torch.Tensor] = {}
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            out.update(zip(batch, self._forward([seqs[i] for i in batch], [marks[i] for i in batch])))
        return [out[i] for i in range(len(seqs))]

    @torch.inference_mode()
    def _forward(self, seqs: list[list[int]], marks: list[list[int]]) -> list[torch.Tensor]:
        """Run one left-padded batch; gather and normalise the states at the marked positions.

        A mark is an index into the unpadded sequence; its column is that index plus the row's
        padding, counted from the attention mask (the pad token is ``<|endoftext|>`` too, so a token
        search would find the padding). Position ids also come from the mask, so each text gets
        positions 0..n-1 whatever its padding and its vectors do not depend on its batch-mates.
        """
        padded = self.tokenizer.pad({"input_ids": seqs}, padding=True, return_tensors="pt")
        mask = padded["attention_mask"].to(self.device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        hidden = self.model(
            input_ids=padded["input_ids"].to(self.device), attention_mask=mask, position_ids=positions
        ).last_hidden_state
        padding = (mask == 0).sum(dim=-1).tolist()
        return [
            F.normalize(hidden[row, [padding[row] + m for m in row_marks]].float(), dim=-1).cpu()
            for row, row_marks in enumerate(marks)
        ]
