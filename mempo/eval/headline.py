"""The headline comparison's table and figures (``<run_dir>/eval/`` of ``+exp=headline``).

Per arm and N: EM, F1, TT and PT with 95% percentile-bootstrap intervals over tasks, the format-failure rate and the
mean turns; the token ratios of every memory-agent arm against every full-history (ReAct) arm at the largest N; and
the paper's figures, F1, PT and TT against N with one line per arm. Everything is computed from the per-rollout
records of the evaluation (``trajectory_record``), so the table can be recomputed from ``results.jsonl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mempo.core.base import atomic_write_text, write_csv
from mempo.eval.report import plot_vs_objectives
from mempo.eval.stats import bootstrap_ci
from mempo.eval.tables import markdown_table

HEADLINE_COLUMNS = [
    "arm", "agent", "objectives", "tasks", "em", "em_lo", "em_hi", "f1", "f1_lo", "f1_hi", "format_fail", "turns",
    "tt", "tt_lo", "tt_hi", "pt", "pt_lo", "pt_hi",
]  # fmt: skip
INTERVAL_METRICS = ("em", "f1", "tt", "pt")  # mean with a bootstrap interval over tasks
MEAN_METRICS = ("format_fail", "turns")  # mean only


def headline_rows(
    records: Sequence[dict[str, Any]], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> list[dict[str, Any]]:
    """records: one per rollout (``checkpoint`` = the arm, ``agent``, ``objectives`` and the per-task metrics).

    -> one row per arm x N (arms in first-seen order, N ascending): the means over tasks, and for EM, F1, TT and PT
    the percentile bootstrap interval of the mean (``bootstrap_ci``, the same ``seed`` for every cell). An arm is
    evaluated with one agent; a cell holding two is an error, not an average over agents.
    """
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["checkpoint"], int(r["objectives"])), []).append(r)
    rows = []
    for arm in dict.fromkeys(a for a, _ in groups):
        for n in sorted(n for a, n in groups if a == arm):
            rs = groups[(arm, n)]
            agents = sorted({r["agent"] for r in rs})
            if len(agents) != 1:
                raise ValueError(f"arm {arm!r} at N={n} was evaluated with agents {agents}; the headline gives one")
            row: dict[str, Any] = {"arm": arm, "agent": agents[0], "objectives": n, "tasks": len(rs)}
            for m in INTERVAL_METRICS:
                values = [float(r[m]) for r in rs]
                row[m], row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_ci(
                    values, level=level, n_resamples=n_resamples, seed=seed
                )
            for m in MEAN_METRICS:
                row[m] = sum(float(r[m]) for r in rs) / len(rs)
            rows.append(row)
    return rows


def token_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """At the largest N in ``rows``: PT and TT of every memory-agent arm divided by every full-history arm's (below 1:
    the memory agent processed fewer tokens). Ratios of the means over the same tasks."""
    if not rows:
        return []
    n = max(r["objectives"] for r in rows)
    at_n = [r for r in rows if r["objectives"] == n]

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    return [
        {
            "memory_arm": m["arm"],
            "react_arm": x["arm"],
            "objectives": n,
            "pt_ratio": ratio(m["pt"], x["pt"]),
            "tt_ratio": ratio(m["tt"], x["tt"]),
        }
        for m in at_n
        if m["agent"] == "memory"
        for x in at_n
        if x["agent"] == "full_history"
    ]


def ratio_lines(ratios: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines, one per memory arm x ReAct arm."""
    if not ratios:
        return []
    head = (
        f"Token ratios at N={ratios[0]['objectives']} (memory-agent arm / ReAct arm, means over the same tasks; "
        "below 1 = fewer tokens with memory):"
    )
    body = [f"- {r['memory_arm']} / {r['react_arm']}: PT {r['pt_ratio']:.3f}, TT {r['tt_ratio']:.3f}" for r in ratios]
    return [head, "", *body]


def write_headline(
    out: Path, records: Sequence[dict[str, Any]], *, num_tasks: int, seed: int = 0
) -> tuple[dict[str, Path], list[dict[str, Any]], list[dict[str, Any]]]:
    """table.csv, table.md (with the ratio lines) and f1_vs_n.png, pt_vs_n.png, tt_vs_n.png in ``out``.

    -> (name -> path, the rows, the ratios)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = headline_rows(records, seed=seed)
    ratios = token_ratios(rows)
    files = {"table_csv": out / "table.csv", "table_md": out / "table.md"}
    write_csv(files["table_csv"], rows, HEADLINE_COLUMNS)
    lines = [markdown_table(rows, HEADLINE_COLUMNS), "", "Intervals: 95% percentile bootstrap over tasks.", ""]
    atomic_write_text(files["table_md"], "\n".join([*lines, *ratio_lines(ratios)]) + "\n")
    sub = f"({num_tasks} tasks per N, greedy; bars: 95% bootstrap intervals)"
    figures = {
        "f1_vs_n": ("f1", "F1 (mean over objectives and tasks)", f"Answer F1 vs N\n{sub}", {"ylim": (-0.05, 1.05)}),
        "pt_vs_n": ("pt", "PT: peak tokens of one turn (mean)", f"Peak tokens vs N\n{sub}", {"from_zero": True}),
        "tt_vs_n": ("tt", "TT: all tokens processed per task (mean)", f"Total tokens vs N\n{sub}", {"from_zero": True}),
    }
    for name, (key, ylabel, title, kw) in figures.items():
        files[name] = plot_vs_objectives(rows, key, out / f"{name}.png", ylabel=ylabel, title=title, series="arm", **kw)
    return files, rows, ratios
