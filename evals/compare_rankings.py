"""Where two runs' rankings differ: ``python -m evals.compare_rankings A/results.jsonl B/results.jsonl``.

Two runs of one ``mia eval`` command should retrieve the same chunks in the same order; figures
alone hide a few swapped questions. Per (system, source length), over the questions both runs hold,
this prints how many rankings differ anywhere and at rank 1 (how the exact search was checked
against Chroma's approximate index, evals/README "Scale").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

Key = tuple[str, int | None, str]
"""(system, source length, question id); the length is None for data sets of one length per question."""


def rankings(path: Path) -> dict[Key, list[str]]:
    """(system, length, question id) → retrieved chunk ids, from a run's ``results.jsonl``."""
    with path.open(encoding="utf-8") as lines:
        return {(r["system"], r["length"], r["id"]): r["retrieved"] for r in map(json.loads, lines)}


def compare(a: dict[Key, list[str]], b: dict[Key, list[str]]) -> dict[tuple[str, int | None], dict[str, int]]:
    """Per (system, length): questions in both runs, rankings that differ, and those whose first hit differs."""
    counts: dict[str, Counter[tuple[str, int | None]]] = {"questions": Counter(), "differ": Counter(), "differ_at_1": Counter()}
    for key in a.keys() & b.keys():
        group = key[:2]
        counts["questions"][group] += 1
        counts["differ"][group] += a[key] != b[key]
        counts["differ_at_1"][group] += a[key][:1] != b[key][:1]
    groups = sorted(counts["questions"], key=lambda g: (g[0], g[1] or 0))
    return {g: {name: c[g] for name, c in counts.items()} for g in groups}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.compare_rankings", description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="one run's results.jsonl")
    parser.add_argument("b", type=Path, help="the other run's results.jsonl")
    args = parser.parse_args(argv)
    for path in (args.a, args.b):
        if not path.is_file():
            print(f"no such results file: {path} (a run folder of `mia eval` holds results.jsonl)", file=sys.stderr)
            return 2
    a, b = rankings(args.a), rankings(args.b)
    table = compare(a, b)
    print("| system | length | questions | rankings that differ | first hit differs |\n|---|---|---|---|---|")
    for (system, length), c in table.items():
        n = c["questions"]
        print(f"| {system} | {'-' if length is None else f'{length:,}'} | {n} | {c['differ']} ({100 * c['differ'] / n:.1f}%) "
              f"| {c['differ_at_1']} ({100 * c['differ_at_1'] / n:.1f}%) |")
    total, differ = sum(c["questions"] for c in table.values()), sum(c["differ"] for c in table.values())
    print(f"\n{differ} of {total} rankings differ ({100 * differ / max(total, 1):.1f}%); "
          f"{len(a.keys() ^ b.keys())} (system, length, question) keys are in one run only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
