"""Turn a run's per-question records into the numbers, tables and plots we publish.

Everything here is computed from ``results.jsonl`` records alone, so a report can be regenerated
(rerun the same ``mia eval`` command: every question is cached) and a reader can recompute any
number from the committed records. Intervals are percentile bootstraps over questions with the
run's seed; differences against ``rag`` (or the ``--baseline`` variants) are *paired* (the same
questions resampled jointly), which is the comparison that can actually tell two systems apart on a
few hundred questions.

Scores are percentages; cost columns are per-question averages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from mia.evals.plots import save_png
from mia.evals.metrics import TOKEN_BUDGETS, bootstrap_ci, pair_accuracy, paired_bootstrap_ci

SCORE_METRICS = ("strict_recall@1", "strict_recall@5", "strict_recall@10", "strict_recall@20",
                 "recall@1", "recall@5", "recall@10", "recall@20",
                 "answer_in@5", "answer_in@10", "answer_in@20",
                 "f1", "em", "sub_em", "answer_in_passages", "first_citation_holds", "accuracy", "claim_accuracy")
"""The results table's scores. Strict recall leads: plain recall credits a chunk with every gold
section it touches, so it rewards where a chunker cuts (``metrics.strict_recall_at_k``). Questions
with reference answers and no gold spans are scored in a retrieval-only run by ``answer_in@k``: a
reference's words in the first k chunks."""
TOKEN_METRICS = tuple(f"{kind}@{budget}tok" for budget in TOKEN_BUDGETS
                      for kind in ("strict_recall", "recall", "answer_in"))
"""Recall at equal retrieved tokens, in a table of its own: systems whose chunks differ in size
compared on the same amount of text."""
COST_METRICS = ("llm_calls", "prompt_tokens", "generated_tokens", "seconds")
PRIMARY_SCORES = ("f1", "accuracy", "claim_accuracy", "recall@10", "recall@5", "recall@1", "answer_in@10")
"""The score plotted against source length: the answer metric when there is one, else recall."""
DECIMALS = {"llm_calls": 2, "seconds": 3}
"""Scores and token counts read well to 0.1; calls and seconds per question are often below 1."""
BASELINE = "rag"
"""Without ``--baseline``, paired differences are taken against this system, or against the first
``rag[...]`` variant of a sweep."""
MISSED_BELOW_F1 = 50.0
"""An open answer below this F1 is a miss in the reading-against-retrieval table: it got less than
half of the best reference's words right."""
ANSWER_CELL_CHARS = 120
"""Longest answer or reference shown in a cell of the answers table (the records hold them whole)."""
REPORT_FILE = "report.md"
RECALL_PLOT = "recall_at_k.png"
COST_PLOT = "cost_vs_length.png"


def _by_system(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[record["system"]].append(record)
    return grouped


def metric_values(records: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-question values of every metric defined on *all* of a system's questions: averaging a
    metric over the subset where it happens to exist would compare systems on different questions."""
    values: dict[str, list[float]] = {}
    for metric in (*SCORE_METRICS, *TOKEN_METRICS):
        if records and all(metric in r["scores"] for r in records):
            values[metric] = [float(r["scores"][metric]) for r in records]
    for metric in COST_METRICS:
        values[metric] = [float(r[metric]) for r in records]
    return values


def pair_values(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """NoCha pair accuracy per pair of claims (``pair`` in the records), 100 when both of its claims
    were judged right, else 0; pairs with a claim not answered are left out."""
    claims: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("pair") and "claim_accuracy" in record["scores"]:  # retrieval-only runs judged nothing
            claims[record["pair"]].append(record)
    return {pair: 100.0 * pair_accuracy([(a["answer"].strip().upper(), a["label"], b["answer"].strip().upper(), b["label"])])
            for pair, (a, b) in ((p, c) for p, c in claims.items() if len(c) == 2)}


def summarise(run: dict[str, Any], records: Sequence[dict[str, Any]], systems: Sequence[str]) -> dict[str, Any]:
    """The ``--json`` object: per-system averages over questions (and over pairs of claims)."""
    grouped = _by_system(records)
    summary: dict[str, Any] = {
        "dataset": run["dataset"],
        "split": run["split"],
        "questions": run["questions"],
        "systems": {
            name: {metric: round(float(np.mean(vals)), 3) for metric, vals in metric_values(grouped[name]).items()}
            for name in systems
        },
    }
    for name in systems:
        if pairs := pair_values(grouped[name]):
            summary["systems"][name]["pair_accuracy"] = round(float(np.mean(list(pairs.values()))), 3)
            summary["systems"][name]["pairs"] = len(pairs)
    lengths = [p["length"] for p in run["parts"] if p["length"] is not None]
    if lengths:
        summary["lengths"] = lengths
    return summary


def _fmt(metric: str, stats: tuple[float, float, float]) -> str:
    places = DECIMALS.get(metric, 1)
    mean, lo, hi = stats
    return f"{mean:.{places}f} [{lo:.{places}f}, {hi:.{places}f}]"


def _aligned(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["part"], r["id"]): r for r in records}


def _default_baselines(systems: Sequence[str]) -> list[str]:
    """``rag``, else the first ``rag[...]`` variant of a sweep; none when that is the only system."""
    baseline = next((n for n in systems if n == BASELINE), None) or next((n for n in systems if n.startswith(f"{BASELINE}[")), None)
    return [baseline] if baseline is not None and len(systems) > 1 else []


def _paired_table(grouped: dict[str, list[dict[str, Any]]], columns: Sequence[str], systems: Sequence[str],
                  baseline: str, seed: int, what: str = "") -> list[str]:
    """Every other system minus ``baseline`` on the questions both answered, with paired intervals
    (``what`` names the metrics in the heading when they are not the results table's)."""
    lines = [
        "",
        f"## Paired difference{what} against `{baseline}` (system − baseline, same questions, 95% paired bootstrap interval)",
        "",
        "| system | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name in systems:
        if name != baseline:
            lines.append(f"| {name} | " + " | ".join(_paired_cells(grouped[name], grouped[baseline], columns, seed)[1]) + " |")
    return lines


def _paired_cells(mine: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]], columns: Sequence[str],
                  seed: int) -> tuple[int, list[str]]:
    """(questions both answered, one cell per metric): ``mine`` − ``base`` on those questions, for
    each metric defined on all questions of both sides (``metric_values``' rule), else "–"."""
    mine_by, base_by = _aligned(mine), _aligned(base)
    keys = [k for k in mine_by if k in base_by]
    defined = metric_values(mine).keys() & metric_values(base).keys()
    return len(keys), [
        _fmt(metric, paired_bootstrap_ci([_value(mine_by[k], metric) for k in keys], [_value(base_by[k], metric) for k in keys],
                                         seed=seed)) if metric in defined else "–"
        for metric in columns
    ]


def _tables(run: dict[str, Any], grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str], seed: int,
            baselines: Sequence[str] = ()) -> list[str]:
    """The results table, one paired table per baseline (``_default_baselines`` when none are named)
    and, for multi-length runs, the per-length and cost-growth tables."""
    values = {name: metric_values(grouped[name]) for name in systems}
    columns = [m for m in (*SCORE_METRICS, *COST_METRICS) if any(m in values[n] for n in systems)]
    lines = _ci_table("## Results (mean over questions, 95% bootstrap interval)", values, columns, systems, seed)
    for baseline in baselines or _default_baselines(systems):
        lines += _paired_table(grouped, columns, systems, baseline, seed)
    lines += _token_tables(grouped, values, systems, seed, baselines or _default_baselines(systems))
    lines += _pair_table(grouped, systems, baselines or _default_baselines(systems), seed)
    lines += _misses_table(grouped, systems)
    if len(run["parts"]) > 1:
        lines += ["", "## By source length (mean over questions)", ""]
        lines += ["| system | length | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
        for name in systems:
            for part in run["parts"]:
                subset = [r for r in grouped[name] if r["part"] == part["tag"]]
                sub_values = metric_values(subset)
                cells = [f"{np.mean(sub_values[m]):.{DECIMALS.get(m, 1)}f}" if m in sub_values else "–" for m in columns]
                lines.append(f"| {name} | {part['length']} | " + " | ".join(cells) + " |")
        for baseline in baselines or _default_baselines(systems):
            lines += _paired_by_part(run, grouped, systems, baseline, seed)
        lines += _growth(run, grouped, systems)
    return lines


def _misses_table(grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str]) -> list[str]:
    """Open answers that missed (F1 below ``MISSED_BELOW_F1``), split by whether every word of a
    reference was in the passages the reader was given: a retrieval miss needs other passages, a
    reading miss a better reader or prompt."""
    rows = []
    for name in systems:
        scored = [r["scores"] for r in grouped[name] if "f1" in r["scores"] and "answer_in_passages" in r["scores"]]
        if not scored:
            continue
        missed = [s for s in scored if s["f1"] < MISSED_BELOW_F1]
        reading = sum(1 for s in missed if s["answer_in_passages"])
        right = [s for s in scored if s["f1"] >= MISSED_BELOW_F1 and "first_citation_holds" in s]
        held = f"{sum(1 for s in right if s['first_citation_holds'])} of {len(right)}" if right else "–"
        rows.append(f"| {name} | {len(scored)} | {len(scored) - len(missed)} | {held} | {len(missed)} | {reading} | "
                    f"{len(missed) - reading} |")
    if not rows:
        return []
    return ["", f"## Reading against retrieval (open answers; a miss has F1 below {MISSED_BELOW_F1:g})", "",
            "A reading miss had every word of some reference answer (SQuAD-normalised) in the passages its reader "
            "was given; a retrieval miss did not. Of the answers, how many quote in their first citation a sentence "
            "(or up to three consecutive ones) that holds every word of the answer (stemmed, stopwords dropped).", "",
            "| system | questions | answered (F1 ≥ 50) | of them, first citation holds the answer | missed | reading misses "
            "| retrieval misses |",
            "|---|---|---|---|---|---|---|", *rows]


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= ANSWER_CELL_CHARS else text[: ANSWER_CELL_CHARS - 1] + "…"


def answers_section(grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str]) -> list[str]:
    """Every question's references beside each system's answer and its F1, so that a reader can
    judge the answers, not only their scores (records without references, e.g. retrieval-only runs,
    have none)."""
    answered = [name for name in systems if any("references" in r and "f1" in r["scores"] for r in grouped[name])]
    if not answered:
        return []
    by_id: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    order: list[str] = []
    for name in answered:
        for record in grouped[name]:
            key = f"{record['part']}/{record['id']}"
            if key not in by_id:
                order.append(key)
            by_id[key][name] = record
    lines = ["", "## Answers (each system's answer, its F1, and `·` when the reference's words were in its passages)", "",
             "| question | references | " + " | ".join(f"`{n}`" for n in answered) + " |",
             "|---|---|" + "---|" * len(answered)]
    for key in order:
        first = next(iter(by_id[key].values()))
        cells = []
        for name in answered:
            record = by_id[key].get(name)
            if record is None or "f1" not in record["scores"]:
                cells.append("–")
                continue
            seen = " ·" if record["scores"].get("answer_in_passages") else ""
            cells.append(f"{_cell(record['answer'])} ({record['scores']['f1']:.0f}{seen})")
        references = " / ".join(_cell(r) for r in first.get("references", []))
        lines.append(f"| {_cell(first['question'])} | {references} | " + " | ".join(cells) + " |")
    return lines


def _ci_table(heading: str, values: dict[str, dict[str, list[float]]], columns: Sequence[str], systems: Sequence[str],
              seed: int) -> list[str]:
    """One row per system, each cell the mean with its bootstrap interval ("–": not defined on all its questions)."""
    lines = [heading, "", "| system | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name in systems:
        cells = [_fmt(m, bootstrap_ci(values[name][m], seed=seed)) if m in values[name] else "–" for m in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _token_tables(grouped: dict[str, list[dict[str, Any]]], values: dict[str, dict[str, list[float]]],
                  systems: Sequence[str], seed: int, baselines: Sequence[str]) -> list[str]:
    """Strict and plain recall at equal retrieved tokens with their intervals, then paired against
    each baseline; nothing when no system has them (records made before they existed)."""
    columns = [m for m in TOKEN_METRICS if any(m in values[n] for n in systems)]
    if not columns:
        return []
    heading = ("## Recall at equal retrieved tokens (the first N tokens of each ranking, the chunk that crosses N cut "
               "at N; mean over questions, 95% bootstrap interval; –: some ranking held fewer than N tokens)")
    lines = ["", *_ci_table(heading, values, columns, systems, seed)]
    for baseline in baselines:
        lines += _paired_table(grouped, columns, systems, baseline, seed, what=" in recall at equal retrieved tokens")
    return lines


def _paired_by_part(run: dict[str, Any], grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str],
                    baseline: str, seed: int) -> list[str]:
    """The paired difference against ``baseline`` at each length on its own: whether a margin
    grows with the source is a claim about these rows, which the pooled table above cannot show."""
    columns = [m for m in SCORE_METRICS if any(m in metric_values(grouped[n]) for n in systems)]
    lines = ["", f"## Paired difference against `{baseline}` by source length (95% paired bootstrap interval)", "",
             "| system | length | questions | " + " | ".join(columns) + " |", "|---|---|---|" + "---|" * len(columns)]
    for name in systems:
        if name == baseline:
            continue
        for part in run["parts"]:
            questions, cells = _paired_cells([r for r in grouped[name] if r["part"] == part["tag"]],
                                             [r for r in grouped[baseline] if r["part"] == part["tag"]], columns, seed)
            lines.append(f"| {name} | {part['length']} | {questions} | " + " | ".join(cells) + " |")
    return lines


def _pair_table(grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str], baselines: Sequence[str], seed: int) -> list[str]:
    """Pair accuracy with its interval (bootstrap over pairs), and against each baseline on the same pairs."""
    pairs = {name: pair_values(grouped[name]) for name in systems}
    if not any(pairs.values()):
        return []
    heads = [f"Δ vs `{b}` (paired)" for b in baselines]
    lines = ["", "## NoCha pair accuracy (a pair counts only when both its claims are judged right; 95% bootstrap over pairs)", "",
             "| system | pairs | pair accuracy | " + " | ".join(heads) + (" |" if heads else ""),
             "|---|---|---|" + "---|" * len(heads)]
    for name in systems:
        mine = pairs[name]
        if not mine:
            continue
        cells = [str(len(mine)), _fmt("pair_accuracy", bootstrap_ci(list(mine.values()), seed=seed))]
        for baseline in baselines:
            shared = [p for p in mine if p in pairs[baseline]]
            cells.append("–" if name == baseline or not shared else _fmt("pair_accuracy", paired_bootstrap_ci(
                [mine[p] for p in shared], [pairs[baseline][p] for p in shared], seed=seed)))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


GROWTH_METRICS = ("source_tokens", "llm_calls", "prompt_tokens", "generated_tokens")


def _growth(run: dict[str, Any], grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str]) -> list[str]:
    """How each system's cost grows with the source: the mean at each length over the mean at the
    shortest, on the questions finished at both (the InfMem paper's claim is about this slope, and
    a partly finished run must not compare different questions)."""
    shortest = run["parts"][0]["tag"]
    lines = ["", f"## Cost growth with source length (mean ÷ mean at {run['parts'][0]['length']} tokens, same questions)",
             "", "| system | length | questions | " + " | ".join(GROWTH_METRICS) + " |",
             "|---|---|---|" + "---|" * len(GROWTH_METRICS)]
    for name in systems:
        base = {r["id"]: r for r in grouped[name] if r["part"] == shortest}
        for part in run["parts"][1:]:
            pairs = [(base[r["id"]], r) for r in grouped[name] if r["part"] == part["tag"] and r["id"] in base]
            cells = []
            for metric in GROWTH_METRICS:
                before = sum(float(b[metric]) for b, _ in pairs)
                after = sum(float(a[metric]) for _, a in pairs)
                cells.append(f"×{after / before:.2f}" if before > 0 else "–")
            lines.append(f"| {name} | {part['length']} | {len(pairs)} | " + " | ".join(cells) + " |")
    return lines


def _value(record: dict[str, Any], metric: str) -> float:
    return float(record[metric] if metric in COST_METRICS else record["scores"][metric])


def plot_recall(path: Path, grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str], seed: int) -> bool:
    """Recall@k curves with their intervals, and strict recall@k dashed in the same colour where the
    results have it; False (no file) when no system has gold-span recall."""
    fig = Figure(figsize=(7 + 3 * (len(systems) > 4), 4.5), layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for name in systems:
        values = metric_values(grouped[name])
        ks = [int(m.split("@")[1]) for m in SCORE_METRICS if m.startswith("recall@") and m in values]
        if not ks:
            continue
        stats = np.array([bootstrap_ci(values[f"recall@{k}"], seed=seed) for k in ks])
        bars = ax.errorbar(ks, stats[:, 0], yerr=[stats[:, 0] - stats[:, 1], stats[:, 2] - stats[:, 0]],
                           marker="o", capsize=3, label=name)
        if all(f"strict_recall@{k}" in values for k in ks):
            ax.plot(ks, [np.mean(values[f"strict_recall@{k}"]) for k in ks], linestyle="--", marker=".",
                    color=bars.lines[0].get_color(), label=f"{name} (strict)")
        drawn = True
    if not drawn:
        return False
    ax.set_xscale("log")
    ax.set_xticks([1, 5, 10, 20], labels=["1", "5", "10", "20"])
    ax.set_xlabel("k (chunks retrieved)")
    ax.set_ylabel("Recall@k (%); dashed: strict recall@k")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="x-small")
    save_png(fig, path)
    return True


def _primary_score(grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str]) -> str | None:
    available = [set(metric_values(grouped[n])) for n in systems]
    return next((m for m in PRIMARY_SCORES if all(m in a for a in available)), None)


def plot_cost(path: Path, run: dict[str, Any], grouped: dict[str, list[dict[str, Any]]], systems: Sequence[str]) -> None:
    """Score, LLM tokens and wall time per question against the question's source length: points
    per question, and each system's mean per data set part joined by a line."""
    score = _primary_score(grouped, systems)
    panels = ([(score, f"{score} (%)")] if score else []) + [
        ("tokens", "prompt + generated tokens"), ("seconds", "wall time (s)"),
    ]
    fig = Figure(figsize=(5 * len(panels) + 3 * (len(systems) > 4), 4.2), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (metric, label) in zip(axes, panels):
        for index, name in enumerate(systems):
            color = f"C{index % 10}"
            records = grouped[name]
            x = [r["source_tokens"] for r in records]
            y = [_plotted(r, metric) for r in records]
            ax.scatter(x, y, s=8, alpha=0.25, color=color)
            by_part = [[r for r in records if r["part"] == p["tag"]] for p in run["parts"]]
            means = [(np.mean([r["source_tokens"] for r in rs]), np.mean([_plotted(r, metric) for r in rs]))
                     for rs in by_part if rs]
            ax.plot(*zip(*means), marker="D", color=color, label=name)
        lengths = [r["source_tokens"] for name in systems for r in grouped[name]]
        if max(lengths) > 3 * min(lengths):  # 16k / 32k / 64k runs: equal spacing per doubling
            ax.set_xscale("log")
        ax.set_xlabel("source length (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="x-small")
    if run["retrieval_only"]:
        fig.suptitle("retrieval only: no LLM calls, so no tokens", fontsize="small")
    save_png(fig, path)


def _plotted(record: dict[str, Any], metric: str) -> float:
    if metric == "tokens":
        return float(record["prompt_tokens"] + record["generated_tokens"])
    return _value(record, metric)


def _shared_settings(variants: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Settings every variant has in common: said once in the header, not on every line."""
    first = variants[0]["settings"]
    return {k: v for k, v in first.items() if all(v2["settings"].get(k) == v for v2 in variants)}


def _settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in settings.items())


def _summarizers_text(run: dict[str, Any]) -> str:
    """The run's summariser, or "per variant" when a sweep gave the variants different ones (the
    run-level flag alone would then misname most of them)."""
    kinds = {variant["ingest"]["summarizer"] for variant in run["variants"] if "ingest" in variant}  # peers have none
    return run["summarizer"] if kinds <= {run["summarizer"]} else "per variant (" + ", ".join(sorted(kinds)) + ")"


def write_report(out: Path, run: dict[str, Any], records: Sequence[dict[str, Any]], systems: Sequence[str], *, seed: int,
                 baselines: Sequence[str] = ()) -> Path:
    """``report.md`` plus its two plots in ``out``; the header carries everything needed to
    reproduce the numbers (data, split, models, seed, command)."""
    out = Path(out)
    grouped = _by_system(records)
    parts = "; ".join(
        f"{p['tag']} ({p['questions']} question{'s' * (p['questions'] != 1)}, {p['source_tokens']:,} source tokens per question)"
        for p in run["parts"]
    )
    shared = _shared_settings(run["variants"])
    lines = [
        f"# {run['dataset']} · {run['split']} split{' · retrieval only' if run['retrieval_only'] else ''}",
        "",
        f"- Data: {parts}",
        "- Questions per system: " + str(run["questions"])
        + (f" ({len(run['parts'])} lengths)" if len(run["parts"]) > 1 else "")
        + (f" (limit {run['limit']})" if run["limit"] else ""),
        f"- Embedder: {run['embedder']}; chat model: {run['chat_model']}; session summaries: {_summarizers_text(run)}",
        f"- Seed: {seed} (data building and bootstrap); scores in %, costs per question; finished {run['finished']}",
        f"- Settings of every variant: {_settings_text(shared) or 'defaults'}",
        *(f"- {count} results taken from `{folder}` (identical settings, collection and question)"
          for folder, count in run["reused"].items()),
        "- Variants:",
    ]
    for variant in run["variants"]:
        own = {k: v for k, v in variant["settings"].items() if k not in shared}
        if "peer" in variant:
            lines.append(f"  - `{variant['name']}`: peer, {_settings_text(own) or 'no other settings'}; its own chunks "
                         f"and index, recipe below (config {variant['config']})")
            continue
        ingest = variant["ingest"]
        lines.append(
            f"  - `{variant['name']}`: graph `{variant['graph']}`, {_settings_text(own) or 'no other settings'}; "
            f"{ingest.get('chunker', 'window')} chunks of {ingest['chunk_size']} tokens (overlap {ingest['overlap']})"
            f"{'' if ingest.get('keep_front_matter', True) else ', front matter left out'}, session window W={ingest['window']}"
            f", {ingest['summarizer']} summaries "
            f"(config {variant['config']})"
        )
    recipes = [variant for variant in run["variants"] if "peer" in variant]
    if recipes:
        lines += ["", "Peers: what a user would write with a retrieval library, built from its documented calls rather "
                  "than from MiA's retrieval code, over the same source files (whole, front matter included) with "
                  "character offsets, scored by the same rules; retrieval only (they have no answer step).", ""]
        lines += [f"- `{variant['name']}`: {variant['peer']}" for variant in recipes]
    lines += ["", "Command:", "", "```", run["command"], "```", ""]
    lines += _tables(run, grouped, systems, seed, baselines)
    lines.append("")
    if plot_recall(out / RECALL_PLOT, grouped, systems, seed):
        lines += [f"![Recall@k]({RECALL_PLOT})", ""]
    else:
        lines += ["No gold evidence spans in this data set, so no recall plot.", ""]
    plot_cost(out / COST_PLOT, run, grouped, systems)
    lines += [f"![Score and cost against source length]({COST_PLOT})", ""]
    lines += answers_section(grouped, systems)
    path = out / REPORT_FILE
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
