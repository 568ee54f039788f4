"""Held-out learning curves over RL seeds: the policies an RL run kept every k steps (``ckpt.hf_every_n_steps``),
evaluated with ``experiments/eval.py`` on the same tasks as the warm start, one evaluation folder per seed.

Each folder's results.jsonl holds the checkpoints ``warm_start`` and ``s<step>`` (``s10``, ``s20``, ...) on the same
tasks. Per step this gives a [K seeds, T tasks] matrix of paired differences (the step's EM on a task minus the warm
start's), read with the seed-plus-task t-interval a study's verdict reads (``mempo.eval.stats``), and the seed SD
that sizes a study: the half-width a study of K seeds on T tasks would have at that spread.

    python -m mempo.eval.seed_curves seed0=runs/curve50/fast_val seed1=runs/curve50/fast_s1_val \\
        --out docs/figures/curve_40_steps_grpo_cpu_fast_val_2seeds.png
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mempo.eval.report import RECORD_KEY, read_records, record_keys, results_file
from mempo.eval.stats import seed_task_t_interval, t_quantile
from mempo.eval.tables import pyplot, refuse_repeats, save_figure

STEP = re.compile(r"^s(\d+)$")


def step_of(checkpoint: str) -> int | None:
    """The RL step of a kept policy's label (``s40`` -> 40; ``warm_start`` -> 0); None for any other label."""
    if checkpoint == "warm_start":
        return 0
    m = STEP.match(checkpoint)
    return int(m.group(1)) if m else None


def curve_tensor(
    evals: Mapping[str, Sequence[dict[str, Any]]], *, metric: str = "em", objectives: int | None = None
) -> tuple[list[str], list[int], list[str], np.ndarray]:
    """(seeds, steps, task ids, values [K seeds, S steps, T tasks]) of ``metric`` from each seed's evaluation
    records (memory agent; one N: ``objectives``, or the only one present). Step 0 is the warm start. Every seed must
    hold the same steps and every step the same tasks, each once; else a ValueError naming the seed and what differs."""
    seeds = list(evals)
    if not seeds:
        raise ValueError("curve_tensor: no evaluations given")
    per_seed: dict[str, dict[int, dict[str, float]]] = {}
    for seed, records in evals.items():
        refuse_repeats(record_keys(records), RECORD_KEY, unit="record", where=f"seed {seed}: ")
        recs = [r for r in records if r.get("agent", "memory") == "memory"]
        ns = sorted({int(r["objectives"]) for r in recs})
        if objectives is None and len(ns) > 1:
            raise ValueError(f"seed {seed}: evaluations at N = {ns}; pass objectives= to choose one")
        n = objectives if objectives is not None else (ns[0] if ns else None)
        table: dict[int, dict[str, float]] = {}
        for r in recs:
            step = step_of(str(r["checkpoint"]))
            if step is not None and int(r["objectives"]) == n:
                table.setdefault(step, {})[str(r["task_id"])] = float(r[metric])
        if 0 not in table:
            raise ValueError(f"seed {seed}: no 'warm_start' checkpoint at N = {n} (the curve's reference)")
        if len(table) < 2:
            raise ValueError(f"seed {seed}: no kept policy ('s<step>' checkpoint) at N = {n}")
        per_seed[seed] = table
    steps = sorted(per_seed[seeds[0]])
    tasks = sorted(per_seed[seeds[0]][0])
    for seed, table in per_seed.items():
        if sorted(table) != steps:
            raise ValueError(f"seed {seed}: steps {sorted(table)} differ from seed {seeds[0]}'s {steps}")
        for step in steps:
            if sorted(table[step]) != tasks:
                raise ValueError(f"seed {seed}, step {step}: not the same {len(tasks)} tasks as seed {seeds[0]}'s")
    x = np.array([[[per_seed[s][st][t] for t in tasks] for st in steps] for s in seeds], dtype=np.float64)
    return seeds, steps, tasks, x


def half_width(seed_sd: float, task_sd: float, *, k: int, t: int) -> float:
    """The 95% half-width of the seed-plus-task t-interval for K seeds and T tasks, given the SD of the per-seed mean
    differences and of the per-task mean differences (Welch-Satterthwaite df, as ``seed_task_t_interval``): what a
    study of that size would resolve at that spread."""
    if k < 2 or t < 2:
        raise ValueError(f"half_width: needs K >= 2 seeds and T >= 2 tasks, got K = {k}, T = {t}")
    seeds, tasks = seed_sd**2 / k, task_sd**2 / t
    var = seeds + tasks
    if var == 0:
        return 0.0
    df = var**2 / (seeds**2 / (k - 1) + tasks**2 / (t - 1))
    return float(t_quantile(df) * np.sqrt(var))


def curve_rows(seeds: list[str], steps: list[int], x: np.ndarray) -> list[dict[str, Any]]:
    """One row per step: each seed's mean, the seed mean, and (steps after 0) the paired difference from the warm
    start with its seed-plus-task interval (K >= 2) and the SDs of the per-seed and per-task mean differences."""
    rows = []
    for j, step in enumerate(steps):
        row: dict[str, Any] = {"step": step, "per_seed": [float(v) for v in x[:, j].mean(axis=1)]}
        row["mean"] = float(x[:, j].mean())
        if step != 0:
            d = x[:, j] - x[:, 0]  # [K, T]
            row["diff"] = float(d.mean())
            row["seed_sd"] = float(d.mean(axis=1).std(ddof=1)) if len(seeds) > 1 else float("nan")
            row["task_sd"] = float(d.mean(axis=0).std(ddof=1))
            if len(seeds) > 1:
                _, row["lo"], row["hi"], row["df"] = seed_task_t_interval(d)
        rows.append(row)
    return rows


def curve_markdown(seeds: list[str], rows: list[dict[str, Any]], *, tasks: int, metric: str = "em") -> str:
    """The rows as a markdown table (the interval is the seed-plus-task t-interval; needs K >= 2)."""
    m = metric.upper()
    head = (f"| step | {m} per seed ({', '.join(seeds)}) | seed mean | minus warm start [95% seed-plus-task CI] "
            "| SD of seed means | SD of task means |")  # fmt: skip
    lines = [head, "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        per = ", ".join(f"{v:.3f}" for v in r["per_seed"])
        if r["step"] == 0:
            lines.append(f"| warm start | {per} | {r['mean']:.3f} | | | |")
            continue
        ci = f" [{r['lo']:+.3f}, {r['hi']:+.3f}]" if "lo" in r else ""
        lines.append(f"| {r['step']} | {per} | {r['mean']:.3f} | {r['diff']:+.3f}{ci} | {r['seed_sd']:.3f} "
                     f"| {r['task_sd']:.3f} |")  # fmt: skip
    lines.append(f"\n{len(seeds)} seeds x {tasks} tasks; the warm start is one checkpoint (the same in every seed).")
    return "\n".join(lines)


def plot_seed_curves(
    seeds: list[str], steps: list[int], x: np.ndarray, rows: list[dict[str, Any]], out: str | Path, *, title: str = ""
) -> Path:
    """Per-seed held-out curves (thin), their mean (bold) and, with K >= 2, the seed-plus-task interval of the mean
    (the warm start's value plus the difference's interval) -> ``out`` (PNG)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, seed in enumerate(seeds):
        ax.plot(steps, x[i].mean(axis=1), "o-", lw=1, ms=3, alpha=0.5, color=f"C{i % 10}", label=seed)
    ax.plot(steps, [r["mean"] for r in rows], "o-", lw=2.5, color="black", label=f"mean of {len(seeds)} seeds")
    band = [r for r in rows if "lo" in r]
    if band:
        base = rows[0]["mean"]
        ax.fill_between([0] + [r["step"] for r in band], [base] + [base + r["lo"] for r in band],
                        [base] + [base + r["hi"] for r in band], color="gray", alpha=0.25,
                        label="95% CI of the mean's gain (seeds and tasks)")  # fmt: skip
    ax.axhline(rows[0]["mean"], color="gray", ls=":", lw=1)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"held-out EM ({x.shape[2]} tasks)")
    ax.set_title(title or "held-out EM of the policies kept during RL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out, dpi=80)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Held-out learning curves over RL seeds (one evaluation folder a seed)")
    ap.add_argument("evals", nargs="+", help="LABEL=FOLDER: an experiments/eval.py output (its eval/ or run_dir)")
    ap.add_argument("--out", default=None, help="PNG path (none: no figure)")
    ap.add_argument("--metric", default="em", choices=("em", "f1", "reward"))
    ap.add_argument("--objectives", type=int, default=None, help="the N to read (needed if several were evaluated)")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    evals: dict[str, list[dict[str, Any]]] = {}
    for item in args.evals:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            raise SystemExit(f"{item!r}: expected LABEL=FOLDER")
        try:
            evals[label] = read_records(results_file(Path(folder)))
        except ValueError as e:
            raise SystemExit(f"{label}: {e}") from None
    seeds, steps, tasks, x = curve_tensor(evals, metric=args.metric, objectives=args.objectives)
    rows = curve_rows(seeds, steps, x)
    print(curve_markdown(seeds, rows, tasks=len(tasks), metric=args.metric))
    if args.out:
        print(plot_seed_curves(seeds, steps, x, rows, args.out, title=args.title))


if __name__ == "__main__":
    main()
