"""How fast a second writer is refused: ``python -m mia.evals.bench_lock``.

Holds the writer lock of a scratch store (as a running ingestion would), runs a real
``mia ingest`` into that store five times, and prints each run's wall time to its refusal, the
interpreter's start included. The goal (issue 23) is under 2 s; the test suite checks the
refusal and its message, this script its speed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mia.stores.writer_lock import writer_lock

RUNS = 5


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        store, book = Path(folder) / "chroma", Path(folder) / "book.txt"
        book.write_text("A short book.\n", encoding="utf-8")
        env = {**os.environ, "MIA_CHROMA_PATH": str(store), "MIA_HOME": str(Path(folder) / "home")}
        command = [sys.executable, "-m", "mia.graph.cli", "ingest", str(book), "--collection", "busy", "--summarizer", "extractive"]
        times = []
        with writer_lock(store.resolve()):
            for _ in range(RUNS):
                started = time.perf_counter()
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
                times.append(time.perf_counter() - started)
                if done.returncode != 2 or "is being written by PID" not in done.stderr:
                    print(f"not refused as expected (exit {done.returncode}): {done.stderr.strip()[-300:]}", file=sys.stderr)
                    return 1
    print(f"second writer refused in {', '.join(f'{t:.2f}' for t in times)} s (median {statistics.median(times):.2f} s, "
          f"goal < 2 s; {RUNS} runs, interpreter start included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
