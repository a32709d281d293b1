"""The shipped signature head against the one trained with 2Wiki documents too (beside this file), on the
validation sets `mia train retriever --multihop 200` picks its epoch by: fairy-tale series val and the
held-out 2Wiki train documents (built on first use, ~35 min; reused after). Run from the repository root:
`python evals/results/head-fairytale-2wiki/val_heads.py`."""

from pathlib import Path

import numpy as np

from mia.evals import train_retriever as tr
from mia.nodes.context import MiaRagSettings
from mia.stores.embeddings import load_embedder
from mia.stores.ingest import IngestOptions
from mia.stores.signature_head import load_head

embedder = load_embedder("minilm")
ctx = MiaRagSettings(collection="unused", delta=0.5, signature_init="coverage")
options = IngestOptions()
fairy_val = tr.load_split("fairytale-series", "val", "fairytale-series val", options, embedder, ctx, False)
_, held_out = tr.load_multihop(200, 32000, options, embedder, ctx, False)
sets = {"fairy-tale series val": [fairy_val.pair], "2Wiki train, held out": [s.pair for s in held_out]}
for name, path in (("shipped", ""), ("fairy tales + 2Wiki", str(Path(__file__).with_name("signature-head.npz")))):
    head = load_head(path)
    recall = {key: tr.ranking_recall(pairs, head, ctx) for key, pairs in sets.items()}
    print(f"{name}: " + "; ".join(f"{key} R@1 {r1:.1f} R@10 {r10:.1f}" for key, (r1, r10) in recall.items())
          + f"; mean R@10 {np.mean([r10 for _, r10 in recall.values()]):.1f}")
