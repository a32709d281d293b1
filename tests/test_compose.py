"""compose.yaml, the production topology for Docker users, checked against the code it starts.

No Docker engine runs here, so the containers are not brought up; what can drift silently is
checked instead: every ``mia`` command in the file parses with MiA's own CLI, the replicas share
every service and differ only in their state folder and published port, the addresses point at
services the file defines (on the ports those services listen on), and the keys are required,
because the replicas listen beyond loopback.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from mia.graph.cli import build_parser

COMPOSE = Path(__file__).resolve().parents[1] / "compose.yaml"
REPLICAS = ("mia-a", "mia-b")
SHARED = ("DATABASE_URI", "REDIS_URI", "MIA_CHROMA_URL", "MIA_CHAT_BASE_URL", "MIA_API_KEYS")


def _services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _mia_args(service: dict[str, Any]) -> Any:
    words = shlex.split(service["command"])
    assert words[0] == "mia"
    return build_parser().parse_args(words[1:])  # an unknown option exits, failing the test


def test_every_mia_command_parses() -> None:
    commands = {name: _mia_args(s) for name, s in _services().items() if str(s.get("command", "")).startswith("mia ")}
    assert set(commands) == {"model", *REPLICAS}
    assert {commands[name].command for name in REPLICAS} == {"serve"} and commands["model"].command == "serve-model"


def test_replicas_share_every_service_and_keep_their_own_state() -> None:
    services = _services()
    a, b = (services[name] for name in REPLICAS)
    assert all(a["environment"][k] == b["environment"][k] for k in SHARED)
    assert _mia_args(a).state_dir != _mia_args(b).state_dir
    assert {p.split(":")[0] for p in a["ports"]}.isdisjoint(p.split(":")[0] for p in b["ports"])
    assert a["environment"]["MIA_API_KEYS"].startswith("${MIA_API_KEYS:?"), "replicas on 0.0.0.0 need keys"


def test_addresses_name_services_of_the_file_on_their_ports() -> None:
    services = _services()
    env = services[REPLICAS[0]]["environment"]
    listens = {"postgres": 5432, "redis": 6379, "chroma": 8000, "model": _mia_args(services["model"]).port}
    for name in ("DATABASE_URI", "REDIS_URI", "MIA_CHROMA_URL", "MIA_CHAT_BASE_URL"):
        address = urlsplit(env[name])
        assert address.hostname in services, f"{name} points at {address.hostname}, not a service of compose.yaml"
        assert address.port == listens[address.hostname], f"{name} uses port {address.port}"
    assert set(services[REPLICAS[0]]["depends_on"]) == set(listens)
