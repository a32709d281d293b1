"""BGE-M3 dense (CLS) embeddings through FlagEmbedding, from a local model folder.

The MiA paper scores the signature selection objective with BGE-M3's CLS vectors while retrieval
uses its own embedder; ``selection_embedder = "bge-m3:PATH"`` does that here, and the same spec
also works as a collection's retrieval embedder. No weights ship with a package, so the folder
must already be on disk: FlagEmbedding would otherwise try the model hub, which fails offline
after a long wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings


class BGEM3Embeddings(Embeddings):
    """L2-normalised CLS vectors of a BGE-M3 checkpoint; queries and passages alike (BGE-M3 takes
    no instruction). Inputs are never truncated below the model's own limit (``max_length``)."""

    def __init__(self, path: str, device: str | None = None, batch_size: int = 32) -> None:
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"bge-m3:{path}: no model folder with a config.json there; download BGE-M3 "
                "(BAAI/bge-m3) on a machine with internet and copy the folder here"
            )
        import torch
        from FlagEmbedding import BGEM3FlagModel

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._model = BGEM3FlagModel(str(folder), use_fp16=device.startswith("cuda"), devices=device,
                                     normalize_embeddings=True, batch_size=batch_size)
        self.tokenizer: Any = self._model.tokenizer
        positions = int(self._model.model.model.config.max_position_embeddings)
        # XLM-RoBERTa positions start after the padding index: two fewer usable positions.
        self.max_length = min(int(self.tokenizer.model_max_length), positions - 2)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        out = self._model.encode(list(texts), max_length=self.max_length, return_dense=True)
        return np.asarray(out["dense_vecs"], dtype=np.float32).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]
