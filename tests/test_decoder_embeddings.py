"""DecoderEmbeddings against a tiny random Qwen3 and a tokenizer trained here: no weights, no network.

Random weights suffice because every property checked here is structural (pooling positions, padding,
causal masking, normalisation, length limits), not semantic.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModel, PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

from mia.stores.decoder_embeddings import END_OF_TEXT, SIGNATURE_BRIDGE, TASK_TOKENS, DecoderEmbeddings

HIDDEN = 32
INSTRUCTION = "Given a question, retrieve relevant passages that answer it"
CORPUS = [
    INSTRUCTION,
    SIGNATURE_BRIDGE,
    "The fox crossed the river at dawn and hid the golden key under the old mill.",
    "Marple noticed the clock had stopped at ten past nine on the night of the murder.",
    "Who hid the key? Where did the fox go after the river?",
    "Summary: a fox, a mill, a river; a detective, a clock, a murder in the village.",
]
DOCUMENTS = [
    "",
    "fox",
    "The fox crossed the river at dawn and hid the golden key under the old mill.",
    "Marple noticed the clock.",
    "The clock had stopped at ten past nine on the night of the murder, Marple noticed, and the fox"
    " crossed the river at dawn.",
    "under the old mill",
]
QUERIES = ["Who hid the key?", "Where did the fox go after crossing the river at dawn?", "clock"]
SIGNATURES = [
    "a fox, a mill, a river",
    "a detective, a clock, a murder in the village; the fox crossed the river and hid the key",
    "",
]
PAIRS = list(zip(QUERIES, SIGNATURES)) + [(QUERIES[2], SIGNATURES[1]), (QUERIES[1], SIGNATURES[0])]
ATOL = 1e-5


def _build(path: Path, specials: list[str]) -> Path:
    """Save a byte-level BPE tokenizer and a 2-layer random Qwen3 where the adapter expects a checkpoint."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[s for s in specials if s != END_OF_TEXT],
    )
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=512,
        initializer_range=0.2,  # large enough that attention mixes tokens visibly
        eos_token_id=end_id,  # no pad_token_id, as in Qwen3: it would zero the <|endoftext|> embedding
    )
    torch.manual_seed(0)
    Qwen3Model(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("tiny-qwen3"), [END_OF_TEXT, *TASK_TOKENS])


def _embedder(model_dir: Path, *, delta: float = 0.5, max_length: int = 8192) -> DecoderEmbeddings:
    """Batches of 4 so that the 6 documents span two batches and both batch paths are covered."""
    return DecoderEmbeddings(str(model_dir), device="cpu", batch_size=4, delta=delta, max_length=max_length)


def _assert_rows_close(batched: list[list[float]], single: list[list[float]]) -> None:
    assert torch.allclose(torch.tensor(batched), torch.tensor(single), atol=ATOL)


def test_documents_batched_equal_single(model_dir: Path) -> None:
    emb = _embedder(model_dir)
    lengths = {len(emb.tokenizer(t)["input_ids"]) for t in DOCUMENTS}
    assert len(lengths) == len(DOCUMENTS), "texts must differ in length to exercise left padding"
    _assert_rows_close(emb.embed_documents(DOCUMENTS), [emb.embed_documents([t])[0] for t in DOCUMENTS])


def test_queries_batched_equal_single(model_dir: Path) -> None:
    emb = _embedder(model_dir)
    _assert_rows_close(emb.embed_queries(QUERIES), [emb.embed_query(q) for q in QUERIES])


def test_query_signature_pairs_batched_equal_single(model_dir: Path) -> None:
    emb = _embedder(model_dir)
    _assert_rows_close(
        emb.embed_queries_with_signatures(PAIRS),
        [emb.embed_query_with_signature(q, s) for q, s in PAIRS],
    )


def test_signature_vector_matches_hand_computation(model_dir: Path) -> None:
    delta = 0.3
    emb = _embedder(model_dir, delta=delta)
    query, signature = PAIRS[1]
    text = (
        f"Instruct: {INSTRUCTION}\nQuery: {query}{END_OF_TEXT}{SIGNATURE_BRIDGE}{signature}"
        f"{''.join(TASK_TOKENS)}"
    )
    ids = emb.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[-2:] == emb.tokenizer.convert_tokens_to_ids(list(TASK_TOKENS))
    model = AutoModel.from_pretrained(model_dir, local_files_only=True)
    with torch.inference_mode():
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    h_q = F.normalize(hidden[ids.index(emb.end_id)], dim=-1)
    h_t = F.normalize(hidden[-1], dim=-1)
    expected = F.normalize(delta * h_q + (1 - delta) * h_t, dim=-1)

    got = torch.tensor(emb.embed_query_with_signature(query, signature))
    assert torch.allclose(got, expected, atol=ATOL)
    # Mixing matters: the result is neither part alone.
    assert not torch.allclose(got, h_q, atol=1e-3) and not torch.allclose(got, h_t, atol=1e-3)


def test_delta_one_is_the_query_only_embedding(model_dir: Path) -> None:
    """Causal attention hides the signature from h_q, and the query-only format is a prefix of the
    signature format, so at δ=1 the signature is ignored exactly and embed_query is reproduced."""
    emb = _embedder(model_dir, delta=1.0)
    query = QUERIES[1]
    with_a, with_b = (emb.embed_query_with_signature(query, s) for s in SIGNATURES[:2])
    _assert_rows_close([with_a, with_b], [emb.embed_query(query)] * 2)

    mixed = _embedder(model_dir)
    a, b = (torch.tensor(mixed.embed_query_with_signature(query, s)) for s in SIGNATURES[:2])
    assert not torch.allclose(a, b, atol=1e-3)


def test_outputs_are_unit_vectors_of_hidden_size(model_dir: Path) -> None:
    emb = _embedder(model_dir)
    vectors = torch.tensor(
        emb.embed_documents(DOCUMENTS) + emb.embed_queries(QUERIES) + emb.embed_queries_with_signatures(PAIRS)
    )
    assert vectors.shape[1] == HIDDEN
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(len(vectors)), atol=1e-5)


def test_too_long_inputs_raise(model_dir: Path) -> None:
    emb = _embedder(model_dir, max_length=100)
    long_text = "the fox crossed the river " * 40
    with pytest.raises(ValueError, match=r"text 1 is \d+ tokens.*max_length=100"):
        emb.embed_documents(["fox", long_text])
    with pytest.raises(ValueError, match=r"query 0 is \d+ tokens"):
        emb.embed_query(long_text)
    with pytest.raises(ValueError, match=r"query 1 is \d+ tokens"):
        emb.embed_queries_with_signatures([("fox", "mill"), ("fox", long_text)])


def test_task_tokens_stay_text_without_special_tokens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mia.stores.decoder_embeddings"):
        emb = _embedder(_build(tmp_path, [END_OF_TEXT]))
    assert "<|node_mode|>" in caplog.text and "plain text" in caplog.text
    assert len(emb.tokenizer("".join(TASK_TOKENS), add_special_tokens=False)["input_ids"]) > 2
    _assert_rows_close(
        emb.embed_queries_with_signatures(PAIRS[:2]),
        [emb.embed_query_with_signature(q, s) for q, s in PAIRS[:2]],
    )
