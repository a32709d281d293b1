"""The trained signature head: MiA-Emb's reading of query + signature at our scale, over frozen vectors.

MiA-Emb reads the query together with the signature and is trained so that this reading ranks the
gold chunks; generic vectors mixed by a fixed rule (the centroid, Eq. 4) do not (issue 22). The
head learns that reading over the collection's own vectors, so chunks are never re-embedded. For a
question with query vector e_q, signature summaries s_1..s_m and the first stage's fused ranking
(the same E1 as rag's):

* attention over the summaries, ``a = softmax((e_s V)·(U^T e_q) + w·z_j)``, where z_j is the
  standardised *evidence* of summary j (``EVIDENCE``: its cosine to the question, what the first
  stage found in its session, its place in the signature): which summary speaks for the question;
* a signature-aware query ``ê = norm(e_q + γ·σ + σ P Q)``, ``σ = Σ_j a_j e_{s_j}``, interpolated with
  the query-only embedding as MiA-Emb does: ``e = norm((1 − δ)·e_q + δ·ê)``;
* the chunk score ``κ·rrf(c) + λ·e·e_c + β·a_{π(c)} + β_near·Σ_{j: π(c) continues s_j} a_j``: the
  first stage's fused score, the signature-aware cosine, a membership term that lifts the chosen
  session's chunks together (gold sections come in runs of neighbouring chunks), and a coarser region
  term: the sessions within ``radius`` r of s_j in its book whose summary *continues* s_j's (cosine
  ≥ ``continuity``), s_j itself included, are lifted as well. That is a second, coarser level of the
  memory (the story a session belongs to) without a second level of summaries. On the fairy-tale
  val split it added ~0.9 Recall@10 over three seeds; whole windows of 40–80 chunks did about as
  well for the head (88.8 and 89.0 against 89.5, seed 0) but would change every summary the other
  graphs read. Without the continuity gate it lifted unrelated neighbours in the multi-hop documents
  (Recall@10 −4.2 at 128k), whose summaries are far less alike than neighbouring fairy-tale
  sessions' (median cosine 0.42 in the train collection; issue 22, evals/README).

Inference is numpy (no torch on the question path); ``evals.train_retriever`` trains the same
function in torch and writes the weights here with a JSON card (sha256, command, data recipe,
validation curve). A weights file that is missing, corrupt or for another embedder (its name or its
dimension) is refused with a message that says what to do, never replaced by an untrained head.
It was trained under the default hybrid first stage and δ = 0.5 (its card records both); under
``retriever=dense`` the first stage's scores are on another scale than it learned.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mia.stores.units import neighbour_sessions

DEFAULT_WEIGHTS = Path(__file__).with_name("weights") / "signature-head.npz"
"""The shipped head (trained by ``mia train retriever`` on FairytaleQA train stories; its card beside it)."""

EVIDENCE = ("summary_cosine", "session_best_fused", "session_fused_mass", "session_best_cosine",
            "session_top3_cosine", "session_best_rank", "session_in_top10", "signature_place")
"""What the attention reads of each signature summary j, in this order: e_q·e_s; the best and the
summed fused score of its chunks in the first stage's ranking; the best and the mean top-3 cosine
of its chunks to the question; 1 / the rank of its best chunk (0 when none ranked); how many of its
chunks the first stage put in its top 10; 1/(j + 1)."""

ARRAYS = ("u", "v", "w", "mean", "std", "p", "q", "scalars")
"""What a weights file holds: attention maps U, V (d × r), evidence weights w with the training
evidence's mean and standard deviation, fusion maps P (d × r') and Q (r' × d), and (γ, κ, λ, β, β_near);
beside them ``radius``, ``continuity`` and the embedder's name. A file without ``radius`` and β_near is
a head from before the region term and loads as one without it."""


class HeadError(ValueError):
    """A weights file that cannot serve: the message names it and says how to get a good one."""


@dataclass(frozen=True)
class SignatureHead:
    u: np.ndarray
    v: np.ndarray
    w: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    p: np.ndarray
    q: np.ndarray
    gamma: float
    kappa: float
    lam: float
    beta: float
    """κ, λ, β ≥ 0 (training keeps them so, loading checks): the exact top k then needs only the
    first stage, the lifted sessions and the nearest chunks to e."""
    embedder: str
    """The embedder whose vectors it was trained on; its dimension must match the collection's."""
    beta_near: float = 0.0
    """β_near ≥ 0, the weight of the region term (nothing when ``radius`` is 0)."""
    radius: int = 0
    """How many sessions either side of a signature summary its region reaches (0: no region term,
    as in heads written before it existed)."""
    continuity: float = 1.0
    """The summary cosine at which a neighbouring session counts as continuing a signature summary."""

    @property
    def dim(self) -> int:
        return int(self.u.shape[0])

    def attend(self, query_vec: np.ndarray, summary_vecs: np.ndarray, evidence: np.ndarray) -> np.ndarray:
        """a_j, the weight of each signature summary (in signature order), summing to 1."""
        z = (np.asarray(evidence, dtype=np.float64) - self.mean) / self.std
        logits = (summary_vecs @ self.v) @ (self.u.T @ query_vec) + z @ self.w
        weights = np.exp(logits - logits.max())
        return weights / weights.sum()

    def query(self, query_vec: np.ndarray, summary_vecs: np.ndarray, evidence: np.ndarray,
              delta: float) -> tuple[np.ndarray, np.ndarray]:
        """(e, a): the interpolated signature-aware query vector and the attention over the summaries.

        With no summaries the signature says nothing, and e is the query's own vector."""
        e_q = _unit(np.asarray(query_vec, dtype=np.float64))
        if len(summary_vecs) == 0:
            return e_q, np.zeros(0)
        s = np.asarray(summary_vecs, dtype=np.float64)
        a = self.attend(e_q, s, evidence)
        sigma = a @ s
        aware = _unit(e_q + self.gamma * sigma + (sigma @ self.p) @ self.q)
        return _unit((1.0 - delta) * e_q + delta * aware), a

    def session_lift(self, summary_ids: Sequence[str], attention: np.ndarray,
                     cosine: Callable[[str, str], float | None]) -> dict[str, float]:
        """What the membership terms add to each chunk of a session: β·a_j on session j's own
        chunks and β_near·a_j on those of j's region, the sessions within ``radius`` of it whose
        summary has ``cosine(s_j, s) ≥ continuity`` (j itself included; None: no such session)."""
        lift: dict[str, float] = {}
        for summary_id, a in zip(summary_ids, attention):
            lift[summary_id] = lift.get(summary_id, 0.0) + self.beta * float(a)
            for near in neighbour_sessions(summary_id, self.radius) if self.radius else []:
                similar = 1.0 if near == summary_id else cosine(summary_id, near)
                if similar is not None and similar >= self.continuity:
                    lift[near] = lift.get(near, 0.0) + self.beta_near * float(a)
        return lift

    def save(self, path: Path, card: dict[str, Any]) -> str:
        """Write the weights and their card (``path`` with ``.json``); returns the weights' sha256."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, u=self.u, v=self.v, w=self.w, mean=self.mean, std=self.std, p=self.p, q=self.q,
                 scalars=np.asarray([self.gamma, self.kappa, self.lam, self.beta, self.beta_near]),
                 radius=np.asarray(self.radius), continuity=np.asarray(self.continuity), embedder=np.asarray(self.embedder))
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        card_path = path.with_suffix(".json")
        card_tmp = card_path.with_suffix(".tmp.json")
        card_tmp.write_text(json.dumps({**card, "weights": path.name, "sha256": digest}, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        card_tmp.replace(card_path)
        return digest


def _unit(x: np.ndarray) -> np.ndarray:
    return x / max(float(np.linalg.norm(x)), 1e-12)


MAX_RADIUS = 16
"""The widest region a weights file may ask for (sessions either side): past it E2 would read a whole book."""

LOADED_HEADS = 4
"""Heads kept loaded per process (the least recently used go first)."""
_LOADED: OrderedDict[tuple[str, float], SignatureHead] = OrderedDict()


def weights_path(path: str | Path = "") -> Path:
    return Path(path) if path else DEFAULT_WEIGHTS


def head_digest(path: str | Path = "") -> str:
    """The sha256 its card records for the weights at ``path`` ("" when unreadable): what names a
    head in an evaluation's fingerprint, so results of a retrained head are not reused."""
    try:
        return str(json.loads(weights_path(path).with_suffix(".json").read_text(encoding="utf-8"))["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def load_head(path: str | Path = "") -> SignatureHead:
    """The head at ``path`` (empty: the shipped one), checked against the sha256 of its card.

    Loaded once per file and modification time: every mia_rag question needs it."""
    target = weights_path(path)
    retrain = ("retrain it with `mia train retriever --out DIR` and point `sig_weights` at DIR/signature-head.npz"
               if path else "restore it with `git checkout stores/weights`, or retrain it with `mia train retriever`")
    card_path = target.with_suffix(".json")
    if not target.is_file() or not card_path.is_file():
        missing = target if not target.is_file() else card_path
        raise HeadError(f"signature head weights {missing} are missing (sig_strategy=trained needs the .npz and its .json card): {retrain}")
    key = (str(target.resolve()), target.stat().st_mtime)
    if key in _LOADED:
        _LOADED.move_to_end(key)
        return _LOADED[key]
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
        expected = str(card["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise HeadError(f"signature head card {card_path} is unreadable ({exc}): {retrain}") from exc
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != expected:
        raise HeadError(f"signature head weights {target} do not match the sha256 in {card_path.name} "
                        f"({digest[:12]}… against {expected[:12]}…): the file is corrupt or was replaced; {retrain}")
    try:
        with np.load(target, allow_pickle=False) as z:
            arrays = {name: np.asarray(z[name], dtype=np.float64) for name in ARRAYS}
            embedder = str(z["embedder"])
            region = [float(z[name]) for name in ("radius", "continuity") if name in z.files]  # none: written before it
    except Exception as exc:  # a zip that is not an .npz, a plain .npy, a missing array: all the same to the user
        raise HeadError(f"signature head weights {target} cannot be read ({type(exc).__name__}: {exc}): {retrain}") from exc
    radius, continuity, region_ok = 0, 1.0, len(region) in (0, 2)  # both or neither
    if len(region) == 2:  # a whole radius within MAX_RADIUS (NaN is in no range), a cosine for continuity
        region_ok = region[0] in range(MAX_RADIUS + 1) and -1.0 <= region[1] <= 1.0
        radius, continuity = (int(region[0]), region[1]) if region_ok else (0, 1.0)
    d, n = arrays["u"].shape[0], len(EVIDENCE)
    shapes_ok = (arrays["v"].shape[0] == d and arrays["u"].shape[1] == arrays["v"].shape[1]
                 and arrays["w"].shape == arrays["mean"].shape == arrays["std"].shape == (n,)
                 and arrays["p"].shape[0] == d and arrays["q"].shape == (arrays["p"].shape[1], d)
                 and arrays["scalars"].shape == ((5,) if region else (4,)) and region_ok)
    # κ, λ, β, β_near ≥ 0 is what makes E2's candidate set hold the exact top k (nodes.retrieval.trained_signature).
    values_ok = (shapes_ok and all(bool(np.all(np.isfinite(a))) for a in arrays.values())
                 and bool(np.all(arrays["std"] > 0)) and bool(np.all(arrays["scalars"][1:] >= 0)))
    if not values_ok:
        raise HeadError(f"signature head weights {target} have shapes or values this version cannot use "
                        f"(non-finite, a zero spread, a negative κ, λ, β or β_near, or a radius or continuity out of "
                        f"range): {retrain}")
    gamma, kappa, lam, beta, *near = (float(x) for x in arrays["scalars"])
    head = SignatureHead(arrays["u"], arrays["v"], arrays["w"], arrays["mean"], arrays["std"], arrays["p"], arrays["q"],
                         gamma, kappa, lam, beta, embedder, near[0] if near else 0.0, radius, continuity)
    _LOADED[key] = head
    while len(_LOADED) > LOADED_HEADS:
        _LOADED.popitem(last=False)
    return head
