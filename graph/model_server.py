"""``mia serve-model``: the embedded chat model served once, over llama.cpp's OpenAI-compatible
server, for every replica of a production server to read (``MIA_CHAT_BASE_URL``).

Each replica loading the GGUF itself would hold one copy of the model per replica and let them
compete for the same cores; one model server answers them in turn. This is llama-cpp-python's own
server (its ``server`` extra), with the model file MiA assembles from its registry packages, the
context length the embedded reader uses, and the same load-time guard (:func:`mia.stores.chat.new_llama`:
no extra CPU buffer types, which kill the process on machines that advertise AMX without it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from unittest.mock import patch

DEFAULT_PORT = 8081


def model_settings(model: str = "") -> dict[str, Any]:
    """llama.cpp server settings for the embedded model ``model`` names (default: the reader)."""
    from mia.stores.chat import LlamaCppChat, embedded_model, embedded_model_path  # not at `mia` start-up

    embedded = embedded_model(model)
    return {"model": str(embedded_model_path(model=embedded)), "model_alias": embedded.name,
            "n_ctx": LlamaCppChat.model_fields["n_ctx"].default, "n_gpu_layers": -1,
            "verbose": False}


def serve_model(host: str, port: int, model: str = "") -> int:
    import llama_cpp.llama_cpp as bindings
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    settings = model_settings(model)
    defaults = bindings.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    print(f"MiA model server: {settings['model_alias']} on http://{host}:{port}/v1 "
          f"(set MIA_CHAT_BASE_URL=http://{host}:{port}/v1 on each replica)", file=sys.stderr)
    with patch.object(bindings, "llama_model_default_params", without_extra_buffers):  # this process loads one model
        app = create_app(server_settings=ServerSettings(host=host, port=port), model_settings=[ModelSettings(**settings)])
        uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0


def register(subparsers: Any) -> None:
    """Add ``serve-model`` to the ``mia`` command line."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve-model", help="serve the embedded chat model once (OpenAI-compatible) for every replica to read")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--model", default="", help="an embedded model's name (default: the reader, MIA_CHAT_MODEL)")
    p.set_defaults(func=lambda args: serve_model(args.host, args.port, args.model))
