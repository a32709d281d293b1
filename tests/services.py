"""Postgres and Redis on loopback for the production-server tests, from Debian's ``postgresql`` and
``redis-server`` packages (``.ci/run`` installs them), each in a temporary folder on a free port.

Postgres refuses to run as root, so under root its cluster lives in a folder of its own that belongs
to the ``postgres`` user the package creates (pytest's folders are private to root), and its
commands run as that user. Both are stopped, and their folders removed, when the block exits.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mia.graph.server import free_port

TIMEOUT = 60


def postgres_bin() -> Path | None:
    """The newest installed Postgres server's bin folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def services_available() -> bool:
    return postgres_bin() is not None and shutil.which("redis-server") is not None


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], timeout: float = TIMEOUT) -> None:
    done = subprocess.run(_as_postgres(command), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}"


@dataclass(frozen=True)
class Postgres:
    """A running cluster: its address, and what it takes to restart it."""

    uri: str
    bin_dir: Path
    data: Path
    options: str
    log: Path

    def start(self) -> None:
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", self.options, "-l", str(self.log), "-w",
              "-t", str(TIMEOUT), "start"], TIMEOUT + 10)

    def stop(self, mode: str = "fast") -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_postgres([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
                              capture_output=True, text=True, timeout=TIMEOUT)

    def restart(self) -> None:
        """Stop (every client connection is closed) and start again on the same port."""
        stopped = self.stop()
        assert stopped.returncode == 0, f"pg_ctl stop failed:\n{stopped.stdout}{stopped.stderr}"
        self.start()


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """A fresh cluster (user ``mia``, trust auth, loopback only), stopped and removed on exit."""
    bin_dir = postgres_bin()
    assert bin_dir is not None, "install Debian's postgresql package (see .ci/run)"
    folder = Path(tempfile.mkdtemp(prefix="mia-postgres-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
        data, port = folder / "data", free_port()
        _run([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "mia", "--no-sync"])
        cluster = Postgres(f"postgresql://mia@127.0.0.1:{port}/postgres", bin_dir, data,
                           f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off", folder / "log")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def redis(folder: Path) -> Iterator[str]:
    """A Redis server with its files in ``folder``; yields its URI."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                                "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + TIMEOUT
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() != "PONG":
            assert process.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=TIMEOUT)
