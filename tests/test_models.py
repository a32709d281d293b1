"""The embedded models load offline and do their job (integration, slow).

Each model is loaded fresh (bypassing the process-wide caches) with every socket connection
refused, so "offline" is proven rather than assumed: a model that tried to reach a hub would fail
here instead of on a user's machine without network.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel

from mia.stores import chat as chat_module
from mia.stores import embeddings as embeddings_module

pytestmark = pytest.mark.slow


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args[1:] if len(args) > 1 else kwargs}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _cosines(vectors: np.ndarray) -> np.ndarray:
    return vectors @ vectors.T


def test_loading_an_embedder_keeps_openblas_to_one_thread() -> None:
    """numpy's (and scipy's) OpenBLAS threads would otherwise spin on the cores torch embeds on."""
    from threadpoolctl import threadpool_info

    embeddings_module.load_embedder("minilm")
    pools = [p for p in threadpool_info() if p["internal_api"] == "openblas"]
    assert pools and all(p["num_threads"] == 1 for p in pools), pools


def test_minilm_loads_offline_and_embeds(no_network: None) -> None:
    embedder = embeddings_module._load_embedder.__wrapped__("minilm")
    assert embedder.name == "all-MiniLM-L6-v2"
    assert embedder.max_tokens == 254  # 256 word pieces less [CLS] and [SEP]
    assert embedder.count_tokens("Sherlock Holmes") >= 2
    texts = [
        "The detective examined the footprints in the garden.",
        "The investigator studied the tracks left in the yard.",
        "Interest rates rose sharply in the third quarter.",
    ]
    vectors = embedder.embed_documents(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = _cosines(vectors)
    assert sims[0, 1] > sims[0, 2] + 0.2 and sims[0, 1] > sims[1, 2] + 0.2
    query = embedder.embed_query("Who looked at the footprints?")
    assert query.shape == (384,) and abs(float(np.linalg.norm(query)) - 1.0) < 1e-5
    assert int(np.argmax(vectors @ query)) == 0


def test_use_embedder_works_on_chinese(no_network: None) -> None:
    embedder = embeddings_module._load_embedder.__wrapped__("use")
    assert embedder.name == "use-multilingual-v3"
    texts = ["我喜欢吃苹果。", "我很爱吃水果，比如苹果。", "股票市场今天大幅下跌。"]
    vectors = embedder.embed_documents(texts)
    assert vectors.shape == (3, 512)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = _cosines(vectors)
    assert sims[0, 1] > sims[0, 2] + 0.1 and sims[0, 1] > sims[1, 2] + 0.1
    # Cross-lingual: the English sentence lands nearest its Chinese translation.
    english = embedder.embed_query("I like eating apples.")
    assert int(np.argmax(vectors @ english)) in (0, 1)


def test_embedded_chat_model_is_assembled_and_verified(embedded_model_file: Path) -> None:
    assert embedded_model_file.name == chat_module.QWEN_CODER_0_5B.file
    assert embedded_model_file.stat().st_size == chat_module.QWEN_CODER_0_5B.size
    digest = hashlib.sha256()
    with embedded_model_file.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    assert digest.hexdigest() == chat_module.QWEN_CODER_0_5B.sha256
    assert not list(embedded_model_file.parent.glob("*.part*")), "assembly left a temporary file"
    assert chat_module.embedded_model_path(model=chat_module.QWEN_CODER_0_5B) == embedded_model_file  # reused


@pytest.fixture(scope="module")
def embedded_chat(embedded_model_file: Path) -> chat_module.LlamaCppChat:
    # The default context, so the process's one cached llama.cpp load serves these tests and every graph test.
    return chat_module.LlamaCppChat(model_path=str(embedded_model_file), model_name=chat_module.QWEN_CODER_0_5B.name,
                                    max_tokens=48)


def test_embedded_chat_model_answers_offline(embedded_chat: chat_module.LlamaCppChat, no_network: None) -> None:
    reply = embedded_chat.invoke(
        [SystemMessage("Answer with one word."), HumanMessage("What is the capital of France?")]
    )
    assert "paris" in reply.text.lower()
    usage = reply.usage_metadata
    assert usage["input_tokens"] > 5 and 0 < usage["output_tokens"] <= 48
    assert reply.response_metadata["model_name"] == chat_module.QWEN_CODER_0_5B.name


def test_the_embedded_model_loads_without_extra_cpu_buffers(embedded_chat: chat_module.LlamaCppChat) -> None:
    """AMX tile buffers kill the process on machines that advertise AMX without enabling it; the
    loader keeps them off, and the library's own defaults are restored after loading."""
    import llama_cpp.llama_cpp as bindings

    llama, _ = embedded_chat.llama()
    assert llama.model_params.use_extra_bufts is False
    assert bindings.llama_model_default_params().use_extra_bufts is True


def test_forgotten_prompts_are_read_again_from_the_start(embedded_chat: chat_module.LlamaCppChat) -> None:
    llama, _ = embedded_chat.llama()
    embedded_chat.invoke([HumanMessage("What is the capital of France?")])
    assert llama.n_tokens > 0  # the prompt and reply stay evaluated, for the next prompt's shared prefix
    chat_module.forget_prompts()
    assert llama.n_tokens == 0


def test_embedded_chat_model_streams_with_usage(embedded_chat: chat_module.LlamaCppChat) -> None:
    chunks = list(embedded_chat.stream([HumanMessage("Count from one to three in words.")]))
    assert len(chunks) > 2, "tokens must arrive one by one"
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk  # what a LangGraph "messages" stream consumer sees in the end
    assert "two" in merged.text.lower()
    usage = merged.usage_metadata
    assert usage["input_tokens"] > 5 and usage["output_tokens"] >= 1


class Capital(BaseModel):
    country: str
    city: str
    population_millions: float


def test_structured_output_parses(embedded_chat: chat_module.LlamaCppChat) -> None:
    parsed, raw = chat_module.json_call(
        embedded_chat,
        [SystemMessage("Reply with JSON only."), HumanMessage("Give the capital of Japan and its population in millions.")],
        Capital,
    )
    assert parsed is not None, raw.text
    assert "tokyo" in parsed.city.lower() and "japan" in parsed.country.lower()
    assert parsed.population_millions > 0
    assert raw.usage_metadata["output_tokens"] > 0


def test_free_cores_counts_the_cores_other_processes_keep_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-computed: half of 4 cores busy leaves 2; all busy still leaves 1; no /proc leaves all."""
    samples = iter([(100, 1000), (300, 1400)])  # 200 busy of 400 jiffies
    monkeypatch.setattr(chat_module, "_cpu_ticks", lambda: next(samples))
    monkeypatch.setattr(chat_module.os, "cpu_count", lambda: 4)
    assert chat_module.free_cores(sample_s=0) == 2
    samples = iter([(0, 0), (400, 400)])
    assert chat_module.free_cores(sample_s=0) == 1

    def missing() -> tuple[int, int]:
        raise FileNotFoundError("/proc/stat")

    monkeypatch.setattr(chat_module, "_cpu_ticks", missing)
    assert chat_module.free_cores(sample_s=0) == 4


def test_free_cores_sees_a_real_busy_process() -> None:
    cores = os.cpu_count() or 1
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)
        assert chat_module.free_cores() == 1
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_embedded_model_runs_with_the_threads_free_cores_allows(embedded_chat: chat_module.LlamaCppChat,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_cpp

    monkeypatch.setattr(chat_module, "free_cores", lambda: 1)
    reply = embedded_chat.invoke([HumanMessage("Say yes.")], max_tokens=4)
    llama, _ = embedded_chat.llama()
    assert reply.text and llama_cpp.llama_n_threads(llama.ctx) == 1 == llama_cpp.llama_n_threads_batch(llama.ctx)


def test_llm_bench_measures_bare_and_project_paths_on_the_same_prompt(embedded_model_file: Path) -> None:
    from mia.evals import bench_llm
    from mia.stores.settings import data_root

    if not (data_root() / bench_llm.BOOK).is_file():
        pytest.skip("the demo book is not in the shared data")
    result = bench_llm.measure(prompt_tokens=200, max_tokens=2, repeat=1, variants=["shipped"])
    for condition in ("idle", "beside one busy process"):
        bare, ours = result["rows"][condition]["bare llama.cpp"], result["rows"][condition]["project: shipped"]
        assert abs(bare["prompt_tokens"] - ours["prompt_tokens"]) <= 2, "both paths must prefill the same prompt"
        assert bare["prompt_tokens"] > 150 and all(row["prompt_tps"] > 0 and row["wall_s"] > 0 for row in (bare, ours))
