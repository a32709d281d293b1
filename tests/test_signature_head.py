"""The trained signature head (issue 22): its function, its weights file, its training and its E2.

(a) The numpy head (inference) and the torch head (training) compute the same function.
(b) Weights round-trip through their file and card; a corrupt, missing or foreign file is refused
    with a message that says what to do, never replaced by an untrained head.
(c) Training on a small built-in collection where the query alone cannot tell twin chunks apart
    lowers the loss and ranks better than the untrained head (which is query-only).
(d) E2 under the shipped head, on a real collection with the embedded MiniLM, ranks exactly like
    scoring every chunk of the collection, and mia_rag runs with it end to end.
(e) fairytale-train holds train-split stories only: no val or test story, not even as a negative;
    the held-out 2Wiki train questions share no document and no gold article with training ones;
    a batch never mixes two collections' questions.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from mia.evals.train_retriever import Collection, Examples, TorchHead, train_head
from mia.nodes.retrieval import signature_evidence
from mia.stores.units import Level, neighbour_sessions
from mia.stores.signature_head import DEFAULT_WEIGHTS, EVIDENCE, HeadError, SignatureHead, load_head
from tests.conftest import requires_data

N_EVIDENCE = len(EVIDENCE)


def _random_head(seed: int = 0, d: int = 12, rank: int = 3, fusion_rank: int = 4, radius: int = 1,
                 continuity: float = 0.0) -> TorchHead:
    import torch

    rng = np.random.default_rng(seed)
    head = TorchHead(d, rank, fusion_rank, seed, rng.normal(size=N_EVIDENCE), rng.uniform(0.5, 2.0, size=N_EVIDENCE),
                     radius, continuity)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # every parameter away from its start, so each term of the function is exercised
        for param in head.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.5)
        head.scalars[1:].abs_()  # κ, λ, β, β_near as training leaves them: non-negative, here none 0
    return head


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# --------------------------------------------------------------------------- (a) one function


def test_numpy_head_equals_torch_head() -> None:
    import torch

    rng = np.random.default_rng(0)
    torch_head = _random_head()
    head = torch_head.numpy("test")
    q = _unit_rows(rng, 4, 12)
    s = _unit_rows(rng, 4 * 3, 12).reshape(4, 3, 12)
    evidence = rng.normal(size=(4, 3, N_EVIDENCE))
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False], [True, True, True]])
    e_t, a_t = torch_head.forward(torch.tensor(q), torch.tensor(s), torch.tensor(evidence), mask, 0.5)
    for n in range(4):
        m = int(mask[n].sum())
        e, a = head.query(q[n], s[n, :m], evidence[n, :m], 0.5)
        np.testing.assert_allclose(e, e_t[n].detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(a, a_t[n, :m].detach().numpy(), atol=1e-5)
        assert abs(a.sum() - 1.0) < 1e-9 and float(a_t[n, m:].detach().sum()) == 0.0


def test_delta_zero_or_no_signature_is_the_query() -> None:
    rng = np.random.default_rng(1)
    head = _random_head().numpy("test")
    q = _unit_rows(rng, 1, 12)[0]
    np.testing.assert_allclose(head.query(q, _unit_rows(rng, 3, 12), rng.normal(size=(3, N_EVIDENCE)), 0.0)[0], q, atol=1e-12)
    e, a = head.query(q, np.zeros((0, 12)), np.zeros((0, N_EVIDENCE)), 0.7)
    np.testing.assert_allclose(e, q, atol=1e-12)
    assert a.size == 0


# --------------------------------------------------------------------------- (b) the weights file


def test_weights_round_trip(tmp_path: Path) -> None:
    head = _random_head().numpy("all-MiniLM-L6-v2")
    path = tmp_path / "head.npz"
    digest = head.save(path, {"command": "test"})
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["sha256"] == digest and card["weights"] == "head.npz" and card["command"] == "test"
    loaded = load_head(path)
    for name in ("u", "v", "w", "mean", "std", "p", "q"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(head, name))
    scalars = ("gamma", "kappa", "lam", "beta", "beta_near", "radius", "continuity", "embedder")
    assert [getattr(loaded, n) for n in scalars] == [getattr(head, n) for n in scalars]
    assert loaded.radius == 1 and loaded.beta_near > 0
    rng = np.random.default_rng(2)
    q, s, z = _unit_rows(rng, 1, 12)[0], _unit_rows(rng, 5, 12), rng.normal(size=(5, N_EVIDENCE))
    np.testing.assert_array_equal(loaded.query(q, s, z, 0.5)[0], head.query(q, s, z, 0.5)[0])


def _raw_weights(path: Path, head: SignatureHead, scalars: int, **region: float) -> Path:
    """A weights file written array by array (with its card), as another version might write it."""
    values = [head.gamma, head.kappa, head.lam, head.beta, head.beta_near][:scalars]
    np.savez(path, u=head.u, v=head.v, w=head.w, mean=head.mean, std=head.std, p=head.p, q=head.q,
             scalars=np.asarray(values), embedder=np.asarray("x"), **{k: np.asarray(v) for k, v in region.items()})
    path.with_suffix(".json").write_text(json.dumps({"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}))
    return path


def test_a_head_from_before_the_region_term_loads_without_it(tmp_path: Path) -> None:
    """Files written before ``radius`` existed hold four scalars: they are that head, no region term."""
    head = _random_head().numpy("x")
    loaded = load_head(_raw_weights(tmp_path / "old.npz", head, 4))
    assert (loaded.radius, loaded.beta_near, loaded.beta) == (0, 0.0, head.beta)
    assert loaded.session_lift(["b:s00003"], np.asarray([1.0]), lambda a, b: 1.0) == {"b:s00003": head.beta}


def test_the_region_term_lifts_the_sessions_around_each_summary_that_continue_it() -> None:
    head = dataclasses.replace(_random_head().numpy("x"), beta=2.0, beta_near=0.5, radius=1, continuity=0.3)
    similar = {("b:s00000", "b:s00001"): 0.3, ("b:s00002", "b:s00001"): 0.5, ("b:s00002", "b:s00003"): 0.9,
               ("c:s00007", "c:s00006"): 0.29, ("c:s00007", "c:s00008"): 0.8}  # c:s00006 does not continue c:s00007
    lift = head.session_lift(["b:s00000", "b:s00002", "c:s00007"], np.asarray([0.5, 0.3, 0.2]),
                             lambda a, b: similar.get((a, b)))
    assert lift == pytest.approx({"b:s00000": 2.0 * 0.5 + 0.5 * 0.5, "b:s00001": 0.5 * (0.5 + 0.3),
                                  "b:s00002": 2.0 * 0.3 + 0.5 * 0.3, "b:s00003": 0.5 * 0.3,
                                  "c:s00007": 2.0 * 0.2 + 0.5 * 0.2, "c:s00008": 0.5 * 0.2})
    unlimited = lambda a, b: 1.0  # noqa: E731
    assert dataclasses.replace(head, radius=0).session_lift(["b:s00000"], np.asarray([1.0]), unlimited) == {"b:s00000": 2.0}
    assert neighbour_sessions("a:b:s00010", 2) == [f"a:b:s{i:05d}" for i in range(8, 13)]  # a book id may hold ':'
    assert neighbour_sessions("b:s00000", 1) == ["b:s00000", "b:s00001"] and neighbour_sessions("odd", 3) == ["odd"]


def test_corrupt_weights_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "head.npz"
    _random_head().numpy("x").save(path, {})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(HeadError, match=r"do not match the sha256 .*`mia train retriever"):
        load_head(path)


def test_weights_a_version_cannot_use_are_refused(tmp_path: Path) -> None:
    """Negative κ, λ or β would break E2's exact top k; a zip that is no .npz is no weights file."""
    head = _random_head().numpy("x")
    path = tmp_path / "head.npz"
    SignatureHead(head.u, head.v, head.w, head.mean, head.std, head.p, head.q, 0.1, 20.0, 1.0, -0.5, "x").save(path, {})
    with pytest.raises(HeadError, match="negative"):
        load_head(path)
    dataclasses.replace(head, beta_near=-0.1).save(path, {})
    with pytest.raises(HeadError, match="negative"):
        load_head(path)
    bad_regions = [(4, {"radius": 1, "continuity": 0.3}),  # a region term without its weight β_near
                   (5, {"radius": 1}), (5, {"continuity": 0.3}),  # half of the region's settings
                   (5, {"radius": 1.5, "continuity": 0.3}), (5, {"radius": float("nan"), "continuity": 0.3}),
                   (5, {"radius": -1, "continuity": 0.3}), (5, {"radius": 10**9, "continuity": 0.3}),
                   (5, {"radius": 1, "continuity": float("nan")}), (5, {"radius": 1, "continuity": 2.0})]
    for n, (scalars, region) in enumerate(bad_regions):
        with pytest.raises(HeadError, match="out of range"):
            load_head(_raw_weights(tmp_path / f"region{n}.npz", head, scalars, **region))
    assert load_head(_raw_weights(tmp_path / "good.npz", head, 5, radius=2, continuity=-0.5)).radius == 2
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "not weights")
    path.with_suffix(".json").write_text(json.dumps({"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}))
    with pytest.raises(HeadError, match="cannot be read"):
        load_head(path)


def test_missing_weights_or_card_are_refused(tmp_path: Path) -> None:
    with pytest.raises(HeadError, match=r"missing .*`mia train retriever"):
        load_head(tmp_path / "none.npz")
    path = tmp_path / "head.npz"
    _random_head().numpy("x").save(path, {})
    path.with_suffix(".json").write_text("{not json")
    with pytest.raises(HeadError, match="unreadable"):
        load_head(path)


def test_shipped_weights_load_and_carry_their_recipe() -> None:
    head = load_head("")
    card = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    assert head.embedder == "all-MiniLM-L6-v2" and head.dim == 384 and head.lam >= 0
    assert card["command"].startswith("mia train retriever") and "fairytale-train" in json.dumps(card["recipe"]["train"])
    assert DEFAULT_WEIGHTS.stat().st_size < 20 * 2**20


# --------------------------------------------------------------------------- (c) training


def _twins(seed: int = 0, sessions: int = 8) -> tuple[Collection, Examples]:
    """Eight (``sessions``) sessions telling the same four motifs: chunk (s, m) = norm(story_s + motif_m). A
    question about (s*, m) is the motif alone, so the query (and the first stage, its cosine
    ranking) ties every session's chunk of that motif; its signature names s* first and two other
    sessions after it. Only a reading of the signature can find the right twin."""
    rng = np.random.default_rng(seed)
    d, motifs = 16, 4
    story, motif = _unit_rows(rng, sessions, d), _unit_rows(rng, motifs, d)
    chunks = np.stack([story[s] + motif[m] for s in range(sessions) for m in range(motifs)])
    chunks /= np.linalg.norm(chunks, axis=1, keepdims=True)
    owner = np.repeat(np.arange(sessions), motifs)
    chunk_ids = [f"c{i}" for i in range(len(chunks))]
    summary_ids = [f"twins:s{s:05d}" for s in range(sessions)]
    session_of = {c: summary_ids[o] for c, o in zip(chunk_ids, owner)}
    queries, signatures, evidence, fused, gold = [], [], [], [], []
    for _ in range(4):
        for s in range(sessions):
            for m in range(motifs):
                q = motif[m] + 0.05 * rng.normal(size=d)
                q /= np.linalg.norm(q)
                others = rng.choice([o for o in range(sessions) if o != s], size=2, replace=False)
                sig = [summary_ids[s]] + [summary_ids[o] for o in others]
                cosine = chunks @ q
                order = np.argsort(-cosine, kind="stable")
                ranking = [(chunk_ids[i], 1.0 / (10 + r)) for r, i in enumerate(order, start=1)]
                members = {c: o for c, o in session_of.items() if o in sig}
                queries.append(q)
                signatures.append(sig)
                evidence.append(signature_evidence(q, story[[summary_ids.index(x) for x in sig]], sig, ranking, members,
                                                   dict(zip(chunk_ids, cosine))))
                fused.append((order, np.asarray([f for _, f in ranking])))
                gold.append(np.asarray([s * motifs + m]))
    collection = Collection(None, chunk_ids, chunks, owner, summary_ids, story, [])
    return collection, Examples([{}] * len(queries), np.asarray(queries), signatures, evidence, fused, gold)


def _scores(head: SignatureHead, collection: Collection, ex: Examples, n: int) -> np.ndarray:
    """E2's score κ·rrf + λ·e·e_c + the membership terms of every chunk for question n, by the numpy head."""
    index = {s: i for i, s in enumerate(collection.summary_ids)}
    sig_rows = [index[s] for s in ex.signatures[n]]
    e, a = head.query(ex.queries[n], collection.summaries[sig_rows], ex.evidence[n], 0.5)
    lift = head.session_lift(ex.signatures[n], a, lambda x, y: float(collection.summaries[index[x]] @ collection.summaries[index[y]])
                             if x in index and y in index else None)
    bonus = np.asarray([lift.get(s, 0.0) for s in collection.summary_ids])
    rrf = np.zeros(len(collection.chunk_ids))
    rows, fused = ex.fused[n]
    rrf[rows] = fused
    return head.kappa * rrf + head.lam * (collection.chunks @ e) + bonus[collection.owner]


def _recall_at_1(head: SignatureHead, collection: Collection, ex: Examples) -> float:
    """How often the head's score, over every chunk, ranks the gold first."""
    return sum(int(np.argmax(_scores(head, collection, ex, n)) in ex.gold_rows[n]) for n in range(len(ex.queries))) / len(ex.queries)


def test_training_scores_are_the_numpy_heads() -> None:
    """The loss is taken over the very scores E2 ranks by (apart from the pin of the first stage's best)."""
    from mia.evals.train_retriever import Tensors, batch_scores

    collection, ex = _twins()
    torch_head = _random_head(d=16)
    score, gold = batch_scores(torch_head, collection, Tensors.of(collection, 1, 0.0), ex, [0, 5, 17, 31], 0.5)
    head = torch_head.numpy("test")
    assert head.radius == 1 and head.beta_near > 0  # the region term is exercised
    for row, n in enumerate([0, 5, 17, 31]):
        np.testing.assert_allclose(score[row].detach().numpy(), _scores(head, collection, ex, n), atol=1e-9)
        assert np.flatnonzero(gold[row].numpy()).tolist() == ex.gold_rows[n].tolist()


def test_continuity_quantiles_are_over_neighbouring_sessions_only() -> None:
    from mia.evals.train_retriever import continuity_quantiles

    collection, _ = _twins()
    s = collection.summaries
    pairs = [float(s[j] @ s[j + 1]) for j in range(len(s) - 1)]  # one book: each session and the next
    got = continuity_quantiles(collection)
    assert got == pytest.approx({"q10": np.percentile(pairs, 10), "q50": np.median(pairs), "q90": np.percentile(pairs, 90)})


def test_training_lowers_the_loss_and_beats_the_untrained_head() -> None:
    collection, ex = _twins()
    head, curve = train_head([(collection, ex)], epochs=30, lr=0.03, weight_decay=0.0, rank=4, fusion_rank=4, radius=1,
                             continuity=0.0, batch_size=32, delta=0.5, seed=0, embedder="test",
                             on_epoch=lambda h: {"score": _recall_at_1(h, collection, ex)}, progress=False)
    losses = [r["train_loss"] for r in curve[1:]]
    assert losses[-1] < 0.5 * losses[0]
    before, after = curve[0]["score"], _recall_at_1(head, collection, ex)  # epoch 0: the untrained head
    assert before < 0.5  # the query alone ties eight twins
    assert after >= 0.9 and after == max(r["score"] for r in curve)


# --------------------------------------------------------------------------- (d) E2 on a real collection


@pytest.mark.slow
@requires_data
@pytest.mark.parametrize("hybrid", [False, True])
def test_trained_e2_is_exact_over_the_whole_collection(tiny_collection, minilm, hybrid: bool) -> None:
    """Scoring every chunk of the collection gives the ranking E2 finds in its candidate set, with a
    shallow first stage (so the nearest chunks to e and the sessions' chunks must add the rest)."""
    from mia.nodes.context import MiaRagSettings
    from mia.nodes.signature_init import select_signature
    from mia.nodes.retrieval import Fusion, head_inputs, query_only, trained_signature

    store, head = tiny_collection.store, load_head("")
    rows, matrix = store.vector_rows(Level.CHUNK)
    ids = sorted(rows, key=rows.get)
    owners = store.summary_of(ids)
    ctx = MiaRagSettings(collection=store.name, signature_init="coverage")
    fusion = Fusion.of(ctx) if hybrid else None
    k, candidates = 8, 3
    for question in ("Who stole the lovely Rose-Red?", "Why did the fox trick the wolf?"):
        q = minilm.embed_query(question).astype(np.float64)
        step0 = query_only(store, q, ctx.k0)
        sig = [p["id"] for p in select_signature(store, question, q, step0, ctx)]
        fused, _, _, _, summary_vecs, evidence = head_inputs(store, q, sig, max(k, candidates), text=question, fusion=fusion)
        e, a = head.query(q, summary_vecs, evidence, 0.5)
        summary_rows, summary_matrix = store.vector_rows(Level.SESSION)
        weight = head.session_lift(sig, a, lambda x, y: float(summary_matrix[summary_rows[x]] @ summary_matrix[summary_rows[y]])
                                   if y in summary_rows else None)
        rrf = dict(fused)
        score = (head.kappa * np.asarray([rrf.get(i, 0.0) for i in ids])
                 + head.lam * (matrix.astype(np.float64)[[rows[i] for i in ids]] @ e)
                 + np.asarray([weight.get(o, 0.0) for o in owners]))
        order = [ids[n] for n in np.argsort(-score, kind="stable")]
        expected = [fused[0][0]] + [i for i in order if i != fused[0][0]][: k - 1]  # the first stage's best leads
        got = trained_signature(store, head, q, sig, 0.5, k=k, candidates=candidates, text=question, fusion=fusion)
        assert [h.id for h in got] == expected
        assert any(h.s_sig != 0 for h in got)
        assert set(weight) - set(sig)  # the region term lifted a neighbouring session: its chunks were candidates too
        if not hybrid:  # three dense candidates: the nearest chunks to e and the sessions' chunks had to add the rest
            assert not set(expected[1:]) <= {c for c, _ in fused}


@pytest.mark.slow
@requires_data
def test_trained_e2_with_an_empty_signature_is_the_first_stage_reweighed(tiny_collection, minilm) -> None:
    from mia.nodes.retrieval import first_stage, trained_signature

    store, head = tiny_collection.store, load_head("")
    q = minilm.embed_query("Who stole the lovely Rose-Red?")
    got = trained_signature(store, head, q, [], 0.5, k=5, candidates=10)
    assert len(got) == 5 and got[0].id == first_stage(store, q, 10)[0][0]
    assert all(h.s_sig == pytest.approx(head.lam * h.s_qry) for h in got)  # e is the query itself, nothing lifted


@pytest.mark.slow
@requires_data
def test_session_members_are_the_chunks_ingestion_gave_each_session(tiny_collection) -> None:
    store = tiny_collection.store
    got = store.chunks.get(include=["metadatas"])
    truth: dict[str, set[str]] = {}
    for cid, meta in zip(got["ids"], got["metadatas"]):
        truth.setdefault(meta["summary_id"], set()).add(cid)
    summaries = store.summaries.get()["ids"]
    members: dict[str, set[str]] = {}
    for cid, sid in store.session_members(summaries + ["no-such-book:s00000", "golden-goose:s99999"]):
        members.setdefault(sid, set()).add(cid)
    assert members == truth and len(summaries) > 3


@pytest.mark.slow
@requires_data
def test_mia_rag_runs_with_the_trained_head_and_refuses_a_bad_one(tiny_collection, tmp_path: Path) -> None:
    from mia.graph.registry import load_graph
    from mia.nodes.context import MiaRagSettings

    graph = load_graph("mia_rag")
    out = graph.invoke({"question": "Who stole the lovely Rose-Red?"},
                       context=MiaRagSettings(collection=tiny_collection.name, retrieval_only=True, sig_strategy="trained"))
    assert len(out["retrieved"]) == 10 and out["signature"]
    with pytest.raises(HeadError, match="missing"):
        graph.invoke({"question": "Who stole the lovely Rose-Red?"},
                     context=MiaRagSettings(collection=tiny_collection.name, retrieval_only=True, sig_strategy="trained",
                                            sig_weights=str(tmp_path / "none.npz")))


def test_cli_refuses_bad_training_settings(cli) -> None:
    result = cli("train", "retriever", "--epochs", "0")
    assert result.code == 2 and "--epochs must be at least 1" in result.err
    for flag, value in (("--radius", "17"), ("--continuity", "1.5")):
        result = cli("train", "retriever", flag, value)
        assert result.code == 2 and "--radius must be in [0, 16] and --continuity in [-1, 1]" in result.err
    result = cli("train", "retriever", "--window", "0")
    assert result.code == 2 and "--window must be at least 1" in result.err
    result = cli("train", "retriever", "--multihop", "-1")
    assert result.code == 2 and "--multihop must be 0 (none) or more documents" in result.err
    result = cli("train", "retriever", "--multihop-length", "0")
    assert result.code == 2 and "--multihop-length must be at least 1" in result.err


# --------------------------------------------------------------------------- (e) the training data


@requires_data
def test_fairytale_train_holds_train_stories_only(tmp_path: Path) -> None:
    from mia.evals.datasets import BUILDERS, DatasetError, read_source
    from tests.conftest import shared_data

    built = BUILDERS["fairytale-train"](tmp_path / "ft", split="train")
    with (shared_data() / "fairytaleqa" / "story_meta.csv").open(newline="", encoding="utf-8") as handle:
        meta = list(csv.DictReader(handle))
    text = "".join(read_source(p) for p in built.sources)
    train = [r for r in meta if r["split"] == "train"]
    held_out = [r for r in meta if r["split"] != "train"]
    assert len({q["meta"]["story"] for q in built.questions}) == len(train)
    assert len(built.questions) == sum(int(r["questions"]) for r in train)
    from mia.evals.datasets import _story_title

    for row in held_out:
        assert f"\n\n{_story_title(row['filename'])}\n\n" not in text and not text.startswith(_story_title(row["filename"]) + "\n\n")
    with pytest.raises(DatasetError, match="train-split stories only"):
        BUILDERS["fairytale-train"](tmp_path / "ft-test", split="test")


def test_the_blind_ablation_cannot_tell_the_twins_apart() -> None:
    """`--without-signature` trains the same head with every signature emptied: on the twins, where only
    the signature tells the sessions apart, it stays where the query alone is."""
    from mia.evals.train_retriever import without_signatures

    collection, ex = _twins()
    blind_ex = without_signatures(ex)
    assert all(s == [] for s in blind_ex.signatures) and blind_ex.gold_rows == ex.gold_rows
    _, curve = train_head([(collection, ex)], epochs=10, lr=0.03, weight_decay=0.0, rank=4, fusion_rank=4, radius=1, continuity=0.0, batch_size=32,
                          delta=0.5, seed=0, embedder="test", blind=True,
                          on_epoch=lambda h: {"score": _recall_at_1(h, collection, blind_ex)}, progress=False)
    assert max(r["score"] for r in curve) < 0.5


def test_batches_never_mix_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores are over one collection's chunks, so every batch holds one collection's questions; each
    epoch takes every question once, the collections' batches interleaved, in the seed's order."""
    from mia.evals import train_retriever

    sets = [_twins(0), _twins(1, sessions=5)]  # 32 and 20 chunks: a mixed batch could not even be scored
    calls: list[tuple[int, list[int]]] = []
    loss = train_retriever.batch_loss

    def recording(head, collection, tensors, ex, idx, delta):  # type: ignore[no-untyped-def]
        which = next(n for n, (c, e) in enumerate(sets) if c is collection and e is ex)
        calls.append((which, list(idx)))
        return loss(head, collection, tensors, ex, idx, delta)

    monkeypatch.setattr(train_retriever, "batch_loss", recording)
    settings = dict(epochs=2, lr=0.01, weight_decay=0.0, rank=2, fusion_rank=2, radius=1, continuity=0.0, batch_size=32,
                    delta=0.5, seed=0, embedder="test", progress=False)
    train_head(sets, **settings)
    first = list(calls)
    per_epoch = sum(-(-len(ex.queries) // 32) for _, ex in sets)  # 4 + 3 batches
    assert len(first) == 2 * per_epoch
    for epoch in (first[:per_epoch], first[per_epoch:]):
        for which, (_, ex) in enumerate(sets):
            taken = [n for w, idx in epoch if w == which for n in idx]
            assert sorted(taken) == list(range(len(ex.queries)))  # every question once, in its own collection
        assert all(len(idx) <= 32 for _, idx in epoch)
    order = [w for w, _ in first]
    assert order[:per_epoch] != sorted(order[:per_epoch]) or order[per_epoch:] != sorted(order[per_epoch:])  # interleaved
    calls.clear()
    train_head(sets, **settings)
    assert calls == first


def test_held_out_2wiki_questions_share_no_document_or_gold_article_with_training() -> None:
    from mia.evals.train_retriever import multihop_split

    def question(n: int, *titles: str) -> dict:
        return {"id": f"wikihop-q{n}", "meta": {"book": f"wikihop-q{n}", "gold_titles": list(titles)}}

    questions = [question(n, f"Film {n}", f"Director {n}") for n in range(40)]
    questions[1] = question(1, "Film 0", "Director 1")  # 2Wiki asks several questions about one article...
    questions[2] = question(2, "director 1", "Director 2")  # ...whatever its case
    questions[30] = question(30, "Film 30", "Director 7")
    train, held = multihop_split(questions, share=0.2)
    assert multihop_split(questions, share=0.2) == (train, held)  # deterministic
    assert sorted(q["id"] for q in train + held) == sorted(q["id"] for q in questions)
    assert not {q["meta"]["book"] for q in train} & {q["meta"]["book"] for q in held}  # no document on both sides
    titles = lambda qs: {t.casefold() for q in qs for t in q["meta"]["gold_titles"]}  # noqa: E731
    assert not titles(train) & titles(held)  # nor a gold article
    assert 8 <= len(held) < 8 + 3  # a fifth, overshooting by less than a group
    assert [q["id"] for q in train] == [q["id"] for q in questions if q in train]  # data set order: --multihop N takes a prefix
