"""Accuracy and tokens against the horizon N, one line per arm: the figure a long-horizon study is read by.

Per arm (its RL seeds; a warm start is an arm of one seed) and N: EM and F1 with an interval of the level, and the
mean TT (tokens processed per task) and PT (peak tokens of one turn). The interval is the crossed design's
seed-plus-task t-interval (``mempo.eval.stats.seed_task_t_interval``: every seed scored on the same tasks) where the
arm has two seeds or more, else the percentile bootstrap over tasks. Token ratios per N compare pairs of arms on the
same tasks (below 1: the first arm processed fewer tokens). Pure functions over an evaluation's results.jsonl rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mempo.eval.report import AGENT_LABELS, AGENT_STYLES
from mempo.eval.seeds import checkpoint_scores, seed_matrix
from mempo.eval.stats import bootstrap_ci, seed_task_t_interval
from mempo.eval.tables import markdown_table, pyplot, save_figure

LEVEL_METRICS = ("em", "f1")
TOKEN_METRICS = ("tt", "pt")


def _seed_matrix(
    records: Sequence[Mapping[str, Any]], labels: Mapping[int, str], *, agent: str, n: int, metric: str
) -> np.ndarray:
    """[K seeds, T tasks] of ``metric`` (``seed_matrix``: a ValueError when the seeds hold other tasks)."""
    per_seed = {s: checkpoint_scores(records, labels[s], agent=agent, n=n, metric=metric) for s in labels}
    return seed_matrix(per_seed, what=f"{'/'.join(labels[s] for s in sorted(labels))} at N={n}")[2]


def horizon_rows(
    records: Sequence[Mapping[str, Any]],
    arms: Mapping[str, Mapping[int, str]],
    *,
    agents: Mapping[str, str] | None = None,
    agent: str = "memory",
    level: float = 0.95,
) -> list[dict[str, Any]]:
    """One row per arm (``arms``: arm -> seed -> checkpoint label in ``records``) and N it was evaluated at, arms in
    the given order, N ascending: {"arm", "agent", "objectives", "seeds", "tasks", "interval" ("seed+task t" or
    "task bootstrap"), em/f1 with _lo/_hi, tt, pt (means over seeds and tasks; absent where a record lacks them)}.
    ``agents``: checkpoint label -> the agent it was evaluated as, where not ``agent``."""
    rows = []
    for arm, labels in arms.items():
        if not labels:
            raise ValueError(f"arm {arm!r} has no checkpoints")
        kinds = {(agents or {}).get(label, agent) for label in labels.values()}
        if len(kinds) != 1:
            raise ValueError(f"arm {arm!r} mixes agents {sorted(kinds)} across its seeds")
        kind, own_labels = kinds.pop(), set(labels.values())
        ns = sorted({r["objectives"] for r in records if r["checkpoint"] in own_labels and r["agent"] == kind})
        for n in ns:
            row: dict[str, Any] = {"arm": arm, "agent": kind, "objectives": n, "seeds": len(labels)}
            for m in LEVEL_METRICS:
                x = _seed_matrix(records, labels, agent=kind, n=n, metric=m)
                row["tasks"] = x.shape[1]
                if x.shape[0] >= 2 and x.shape[1] >= 2:
                    mean, lo, hi, _ = seed_task_t_interval(x, level=level)
                    row["interval"] = "seed+task t"
                else:
                    mean, lo, hi = bootstrap_ci(x.mean(axis=0), level=level)
                    row["interval"] = "task bootstrap"
                row |= {m: mean, f"{m}_lo": lo, f"{m}_hi": hi}
            own = [r for r in records if r["checkpoint"] in own_labels and r["agent"] == kind and r["objectives"] == n]
            for m in TOKEN_METRICS:
                if all(m in r for r in own):
                    row[m] = float(np.mean([float(r[m]) for r in own]))
            rows.append(row)
    return rows


def token_ratios_by_n(rows: Sequence[Mapping[str, Any]], pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Per (a, b) in ``pairs`` and every N both were evaluated at: TT and PT of arm a over arm b's (ratios of the
    means over the same tasks; NaN where b's is 0). Pairs where either side has no tokens are left out."""
    at = {(r["arm"], r["objectives"]): r for r in rows}
    out = []
    for a, b in pairs:
        for n in sorted({n for (arm, n) in at if arm == a}):
            ra, rb = at[(a, n)], at.get((b, n))
            if rb is None or not all(m in ra and m in rb for m in TOKEN_METRICS):
                continue
            ratio = {f"{m}_ratio": ra[m] / rb[m] if rb[m] else float("nan") for m in TOKEN_METRICS}
            out.append({"arm": a, "against": b, "objectives": n, **ratio})
    return out


def horizon_markdown(rows: Sequence[Mapping[str, Any]], ratios: Sequence[Mapping[str, Any]] = ()) -> str:
    """The rows as a table (EM and F1 with their intervals), then the token ratios as a second table."""

    def ci(r: Mapping[str, Any], m: str) -> str:
        return f"{r[m]:.3f} [{r[m + '_lo']:.3f}, {r[m + '_hi']:.3f}]"

    table = [
        {"arm": r["arm"], "agent": r["agent"], "N": r["objectives"], "K": r["seeds"], "tasks": r["tasks"],
         "EM": ci(r, "em"), "F1": ci(r, "f1"), "interval": r["interval"]}
        | {m.upper(): f"{r[m]:.0f}" for m in TOKEN_METRICS if m in r}
        for r in rows
    ]  # fmt: skip
    tokens = [m.upper() for m in TOKEN_METRICS if any(m in r for r in rows)]
    text = markdown_table(table, ["arm", "agent", "N", "K", "tasks", "EM", "F1", "interval", *tokens])
    if ratios:
        text += "\n\nToken ratios (arm / against, means over the same tasks; below 1 = fewer tokens):\n\n"
        cells = [{"arm / against": f"{r['arm']} / {r['against']}", "N": r["objectives"],
                  "TT ratio": f"{r['tt_ratio']:.3f}", "PT ratio": f"{r['pt_ratio']:.3f}"} for r in ratios]  # fmt: skip
        text += markdown_table(cells, ["arm / against", "N", "TT ratio", "PT ratio"])
    return text


def plot_horizon(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str) -> Path:
    """Two panels against N: EM with its interval, and PT from 0; one line per arm (solid: memory agents, dashed:
    full-history ones), the seeds and tasks behind each line in its legend entry."""
    plt = pyplot()
    fig, (em_ax, pt_ax) = plt.subplots(1, 2, figsize=(11.0, 4.4))
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        lines.setdefault(r["arm"], []).append(r)
    for i, (arm, rs) in enumerate(lines.items()):
        rs = sorted(rs, key=lambda r: r["objectives"])
        ns = [r["objectives"] for r in rs]
        style = dict(fmt=AGENT_STYLES.get(rs[0]["agent"], ":"), marker="o", capsize=3, color=f"C{i % 10}")
        label = (f"{arm}: {AGENT_LABELS.get(rs[0]['agent'], rs[0]['agent'])}, K={rs[0]['seeds']}, "
                 f"{rs[0]['tasks']} tasks")  # fmt: skip
        err = [[r["em"] - r["em_lo"] for r in rs], [r["em_hi"] - r["em"] for r in rs]]
        em_ax.errorbar(ns, [r["em"] for r in rs], yerr=np.clip(err, 0.0, None), label=label, **style)
        if all("pt" in r for r in rs):
            pt_ax.errorbar(ns, [r["pt"] for r in rs], label=label, **style)
    ticks = sorted({r["objectives"] for r in rows})
    for ax, ylabel in ((em_ax, "EM (mean over seeds and tasks; 95% interval)"), (pt_ax, "PT: peak tokens of one turn")):
        ax.set_xlabel("objectives per task (N)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(ticks)
        ax.grid(alpha=0.3)
    em_ax.set_ylim(0.0, 1.0)
    pt_ax.set_ylim(bottom=0)
    em_ax.legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(fig, path)
