"""Learning curves of RL runs, drawn from their ``metrics.csv`` (one row per RL step, ``MetricsFile``).

``plot_runs([run_dir, ...], out)`` writes one PNG with four panels, one line per run (arms of a comparison share
the figure): training reward and EM per step (faint) with a moving average (bold); validation EM and F1 at each
validation point; P(gold answer | question, memory) per step; tokens per step. Standalone:

    python -m mempo.eval.curves runs/demo/rl                       # -> runs/demo/rl/curves.png
    python -m mempo.eval.curves runs/a/rl runs/b/rl --out cmp.png --labels mempo nomem
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path

from mempo.eval.tables import pyplot, save_figure


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """Rows of a metrics.csv as floats (an empty cell, or a column a row lacks, becomes NaN), sorted by step."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no rows")
    if "step" not in rows[0]:
        raise ValueError(f"{path}: no 'step' column")

    def num(v: str | None) -> float:
        try:
            return float(v) if v not in (None, "") else math.nan
        except ValueError:
            return math.nan

    return sorted(({k: num(v) for k, v in r.items()} for r in rows), key=lambda r: r["step"])


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start); NaNs are skipped."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(sum(part) / len(part) if part else math.nan)
    return out


def _series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r.get(key, math.nan)) for r in rows]
    pts = [(s, v) for s, v in pts if not math.isnan(v)]
    return [s for s, _ in pts], [v for _, v in pts]


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    *,
    labels: Sequence[str] | None = None,
    window: int = 5,
) -> Path:
    """One figure of the learning curves of ``run_dirs`` (each holding a metrics.csv) -> ``out`` (PNG)."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} run dirs")
    runs = [read_metrics(Path(d) / "metrics.csv") for d in run_dirs]
    names = list(labels) if labels is not None else [Path(d).resolve().name for d in run_dirs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (ax_r, ax_v), (ax_p, ax_t) = axes
    for i, (rows, name) in enumerate(zip(runs, names)):
        color = f"C{i % 10}"
        dot = "o" if len(rows) <= 20 else None  # a short run: every step's point, not only the line between them
        for key, style, what in (("rollout/reward_mean", "-", "reward"), ("rollout/em_mean", ":", "EM")):
            steps, vals = _series(rows, key)
            if steps:
                ax_r.plot(steps, vals, style, marker=dot, ms=3, color=color, alpha=0.25, lw=1)
                ax_r.plot(steps, moving_average(vals, window), style, color=color, lw=2, label=f"{name} {what}")
        for key, style, marker in (("val/em", "-", "o"), ("val/f1", "--", "s")):
            steps, vals = _series(rows, key)
            if steps:
                ax_v.plot(steps, vals, style, marker=marker, color=color, label=f"{name} {key.split('/')[1].upper()}")
        steps, vals = _series(rows, "memory/p_ans_mean")
        if steps:
            ax_p.plot(steps, vals, marker=dot, ms=3, color=color, alpha=0.25, lw=1)
            ax_p.plot(steps, moving_average(vals, window), color=color, lw=2, label=name)
        steps, vals = _series(rows, "perf/tokens")
        if steps:
            ax_t.plot(steps, vals, marker=dot, ms=3, color=color, lw=1.5, label=f"{name} all tokens")
        steps, vals = _series(rows, "perf/response_tokens")
        if steps:
            ax_t.plot(steps, vals, "--", marker=dot, ms=3, color=color, lw=1.5, label=f"{name} generated")
    ax_r.set_title(f"training reward and EM per step (bold: mean of last {window})")
    ax_v.set_title("validation (greedy, held-out tasks)")
    ax_p.set_title("P(gold answer | question, memory), mean per step")
    ax_t.set_title("tokens per step")
    empty = {  # what an empty panel means, said as what the runs did
        ax_r: "no rollout metrics in metrics.csv",
        ax_v: "no in-training validation in these runs\n(eval.every_n_steps = 0, or more than their steps)",
        ax_p: "no memories scored in these runs\n(memory.alpha = 0 and memory.log_p_ans = false)",
        ax_t: "no token counts in metrics.csv",
    }
    all_steps = [r["step"] for rows in runs for r in rows if r.get("step") is not None]
    for ax, ylabel in ((ax_r, "mean over rollouts"), (ax_v, "mean over tasks"), (ax_p, "probability"),
                       (ax_t, "tokens")):  # fmt: skip
        if all_steps:  # one step axis for every panel: a validation logged at one step sits on the run's axis
            pad = max(0.1, 0.03 * (max(all_steps) - min(all_steps)))
            ax.set_xlim(min(all_steps) - pad, max(all_steps) + pad)
        ax.set_xlabel("RL step")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no ticks at 1.2, 1.4, ...
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, empty[ax], ha="center", va="center", transform=ax.transAxes, color="gray")
    ax_r.set_ylim(-0.02, 1.02)
    ax_v.set_ylim(-0.02, 1.02)
    ax_t.set_ylim(bottom=0)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out, dpi=80)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Learning curves of RL run dirs (from their metrics.csv)")
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--out", default=None, help="PNG path (default: <first run_dir>/curves.png)")
    ap.add_argument("--labels", nargs="*", default=None)
    ap.add_argument("--window", type=int, default=5)
    args = ap.parse_args(argv)
    out = args.out or str(Path(args.run_dirs[0]) / "curves.png")
    print(plot_runs(args.run_dirs, out, labels=args.labels, window=args.window))


if __name__ == "__main__":
    main()
