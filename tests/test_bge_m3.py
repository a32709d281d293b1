"""BGE-M3 through FlagEmbedding, against a tiny random XLM-RoBERTa and a tokenizer trained here.

No BGE-M3 weights exist offline; random weights suffice because what is checked is structural
(CLS pooling, normalisation, no truncation, which vectors the selection objective reads).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

from mia.stores.bge_m3 import BGEM3Embeddings
from tests.conftest import STORIES, requires_data, story_text

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
TEXTS = [
    "",
    "fox",
    "The fox crossed the river at dawn and hid the golden key under the old mill.",
    "Who hid the key? " * 40,  # 200 tokens
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer trained on the test stories (shared data) and a 2-layer random XLM-RoBERTa."""
    path = tmp_path_factory.mktemp("tiny-bge-m3")
    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator([story_text(s) for s in STORIES] + TEXTS,
                              trainers.WordLevelTrainer(special_tokens=SPECIALS, show_progress=False))
    words.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", cls_token="<s>", eos_token="</s>",
                                        sep_token="</s>", pad_token="<pad>", unk_token="<unk>", model_max_length=1024)
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=1026, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2)
    torch.manual_seed(0)
    XLMRobertaModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _cls(model_dir: Path, texts: list[str]) -> np.ndarray:
    """Normalised CLS vectors computed by hand, one text at a time (no padding involved)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    rows = []
    with torch.no_grad():
        for text in texts:
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state
            rows.append(F.normalize(hidden[0, 0], dim=-1).numpy())
    return np.stack(rows)


@requires_data
def test_vectors_are_normalised_cls_states_whatever_the_batch(model_dir: Path) -> None:
    model = BGEM3Embeddings(str(model_dir), device="cpu", batch_size=2)
    assert model.max_length == 1024  # the tokenizer's limit, below the positions' 1026 - 2
    vectors = np.asarray(model.embed_documents(TEXTS))
    np.testing.assert_allclose(vectors, _cls(model_dir, TEXTS), atol=1e-5)
    np.testing.assert_allclose(model.embed_query(TEXTS[2]), vectors[2], atol=1e-6)
    assert model.count_tokens(TEXTS[3]) == 200  # 5 words and "?" per repeat, no special tokens


@requires_data
def test_long_inputs_are_not_cut_at_flagembeddings_default_limit(model_dir: Path) -> None:
    """FlagEmbedding truncates passages to 512 tokens unless told otherwise; ours go to the model's limit."""
    long_text = " ".join(["fox"] * 700)
    model = BGEM3Embeddings(str(model_dir), device="cpu")
    np.testing.assert_allclose(model.embed_query(long_text), _cls(model_dir, [long_text])[0], atol=1e-5)


def test_a_missing_folder_is_named_without_trying_the_hub(tmp_path: Path) -> None:
    from mia.stores.embeddings import load_embedder

    with pytest.raises(ValueError, match=r"bge-m3:.*nowhere.*no model folder with a config.json"):
        load_embedder(f"bge-m3:{tmp_path / 'nowhere'}")


@requires_data
def test_mia_rag_scores_the_selection_with_the_selection_embedder(model_dir: Path, tiny_collection, minilm, cli) -> None:
    """The picks, with the relevance each was credited (λ_Q·e_q·e_s over the pool's max), are what
    coverage-aware selection makes of the tiny BGE-M3's vectors, not of the collection's MiniLM ones."""
    from mia.nodes.context import MiaRagSettings
    from mia.nodes.signature import coverage_aware, summary_pool

    question = "Who hid the golden key?"
    result = cli("ask", question, "--collection", tiny_collection.name, "--graph", "mia_rag", "--json",
                 "--set", "retrieval_only=true", "--set", f"selection_embedder=bge-m3:{model_dir}")
    assert result.code == 0, result.err
    state = json.loads(result.out)
    store = tiny_collection.store
    records = store.chunk_records([r["id"] for r in state["step0"]])
    pool, coverage = summary_pool([r["summary_id"] for r in records])
    ctx = MiaRagSettings()

    def select(e_q: np.ndarray, e_s: np.ndarray, e_c: np.ndarray) -> list[tuple[str, float]]:
        picks = coverage_aware(e_q, pool, e_s, e_c, coverage, k=ctx.k_sum, lambdas=(ctx.lambda_q, ctx.lambda_c, ctx.lambda_d))
        return [(p.summary_id, p.relevance) for p in picks]

    model = BGEM3Embeddings(str(model_dir), device="cpu")
    by_bge = select(np.asarray(model.embed_query(question)),
                    np.asarray(model.embed_documents([r["text"] for r in store.summary_records(pool)])),
                    np.asarray(model.embed_documents([r["text"] for r in records])))
    by_minilm = select(minilm.embed_query(question), store.vectors("summaries", pool),
                       store.vectors("chunks", [r["id"] for r in records]))
    got = [(s["id"], s["relevance"]) for s in state["signature"]]
    assert [i for i, _ in got] == [i for i, _ in by_bge]
    assert [r for _, r in got] == pytest.approx([r for _, r in by_bge], abs=1e-5)
    assert [r for _, r in got] != pytest.approx([r for _, r in by_minilm], abs=1e-3)
