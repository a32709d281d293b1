"""Token counting and token-window slicing with tiktoken, offline.

tiktoken downloads its BPE table on first use, which fails here. The ``quicktok-v1`` package ships
the same cl100k vocabulary in a binary form; we rewrite it in tiktoken's own text format into
``TIKTOKEN_CACHE_DIR`` under tiktoken's cache key, and tiktoken then verifies the published sha256
itself, so a wrong file can never be used silently.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import struct
from functools import lru_cache
from pathlib import Path

import tiktoken

from mia.stores.settings import offline_environment, writable_dir

ENCODING = "cl100k_base"
_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
# The hash tiktoken publishes for this file (tiktoken_ext.openai_public). tiktoken deletes a cached
# file that does not match it and then tries the network, so a bad file must be rewritten here.
_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def _quicktok_vocab() -> Path:
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("quicktok-v1 is not installed; run `pip install -e .` from the project root")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "cl100k.vocab"


def _tiktoken_text(vocab: bytes) -> bytes:
    """quicktok's layout: u32 count, then per token u16 length, bytes, u32 rank (little endian)."""
    (count,) = struct.unpack_from("<I", vocab, 0)
    offset, ranked = 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", vocab, offset)
        token = vocab[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", vocab, offset + 2 + length)
        offset += 6 + length
        ranked.append((rank, token))
    ranked.sort()
    return b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for rank, tok in ranked)


def ensure_tiktoken_cache() -> None:
    """Write the cl100k table where tiktoken looks for it, unless a file with the right hash is there.

    A file with another hash (truncated, from another vocabulary) is rewritten rather than left for
    tiktoken, which would delete it and try to download the original.
    """
    offline_environment()
    cache_dir = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    target = cache_dir / hashlib.sha1(_BLOB_URL.encode()).hexdigest()
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == _SHA256:
        return
    writable_dir(cache_dir, "TIKTOKEN_CACHE_DIR (or MIA_HOME)")
    data = _tiktoken_text(_quicktok_vocab().read_bytes())
    if hashlib.sha256(data).hexdigest() != _SHA256:
        raise RuntimeError("the cl100k table from quicktok-v1 does not match tiktoken's hash; reinstall quicktok-v1==0.4.0")
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(target)


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    ensure_tiktoken_cache()
    return tiktoken.get_encoding(ENCODING)


def count_tokens(text: str) -> int:
    return len(encoding().encode_ordinary(text))


def token_spans(text: str) -> list[tuple[int, int]]:
    """Character span of every token, so windows of tokens map back to exact source slices.

    A token may end inside a multi-byte character; its boundary is moved to the next character
    boundary, so spans stay contiguous, cover the text exactly and never split a character.
    """
    tokens = encoding().encode_ordinary(text)
    raw = text.encode("utf-8")
    char_at_byte = [0] * (len(raw) + 1)
    pos = 0
    for index, char in enumerate(text):
        width = len(char.encode("utf-8"))
        for b in range(pos, pos + width):
            char_at_byte[b] = index
        pos += width
        char_at_byte[pos] = index + 1
    # Bytes inside a character map to that character's index; a cut there rounds up to its end.
    spans, start_byte = [], 0
    start_char = 0
    for token in tokens:
        end_byte = start_byte + len(encoding().decode_single_token_bytes(token))
        end_char = char_at_byte[end_byte]
        if end_byte < len(raw) and (raw[end_byte] & 0xC0) == 0x80:
            end_char += 1
        spans.append((start_char, end_char))
        start_byte, start_char = end_byte, end_char
    return spans


def truncate(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` with at most ``max_tokens`` tokens (for bounded memories)."""
    tokens = encoding().encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    return encoding().decode(tokens[:max_tokens])
