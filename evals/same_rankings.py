"""Whether two runs ranked the same: the top ``--depth`` chunks of every (system, question) that
both runs' ``results.jsonl`` hold, compared in order. A refactor that must leave retrieval as it
was is checked with it (`evals/README.md`): run the same `mia eval --retrieval-only` command before
and after, into two folders, then ``python -m mia.evals.same_rankings BEFORE AFTER``; it exits 1 if
any ranking differs, or if the runs share no question."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from mia.evals.runner import RESULTS_FILE


def rankings(folder: Path, depth: int) -> dict[tuple[str, str, str], list[str]]:
    """(system, part, question id) → its first ``depth`` retrieved ids; a later line for the same
    key (a resumed run) replaces an earlier one."""
    path = folder / RESULTS_FILE
    if not path.is_file():
        raise SystemExit(f"{path}: no such file; pass a folder that `mia eval --out` wrote")
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        out[(record["system"], record["part"], record["id"])] = record["retrieved"][:depth]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mia.evals.same_rankings", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--depth", type=int, default=10, help="compare the first N retrieved chunks (default 10)")
    args = parser.parse_args(argv)
    before, after = rankings(args.before, args.depth), rankings(args.after, args.depth)
    shared = sorted(set(before) & set(after))
    compared, differ = Counter(k[0] for k in shared), Counter(k[0] for k in shared if before[k] != after[k])
    print(f"| system | questions compared | top-{args.depth} rankings that differ |\n|---|---|---|")
    for system in sorted(compared):
        print(f"| {system} | {compared[system]} | {differ[system]} |")
    for key in [k for k in shared if before[k] != after[k]][:5]:
        print(f"differs: {key}: {before[key]} → {after[key]}")
    only = len(set(before) ^ set(after))
    if only:
        print(f"{only} (system, question) pairs are in one run only and were not compared")
    return 1 if not shared or sum(differ.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
