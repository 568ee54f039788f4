"""What an evaluation leaves in ``<run_dir>/eval/``: results.jsonl, table.md/csv, memory_p_ans.csv and figures.

Figures are drawn with matplotlib's Agg backend (no display) and label everything a reader needs: axes, units,
one legend entry per checkpoint x agent, and the number of tasks behind each point.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mempo.core.base import atomic_write_text, wandb_mode, write_csv
from mempo.eval.memory_scores import read_turn_scores, score_markdown, score_means
from mempo.eval.seeds import (
    parse_arm,
    pool_studies,
    pooled_markdown,
    seed_study,
    study_from_per_task,
    study_markdown,
)
from mempo.eval.tables import markdown_table, pyplot, refuse_repeats, save_figure

TABLE_COLUMNS = [
    "checkpoint", "agent", "objectives", "tasks", "em", "em_lo", "em_hi", "f1", "f1_lo", "f1_hi", "reward",
    "format_fail", "turns", "tt", "pt",
]  # fmt: skip
KL_COLUMNS = ["kl_k1", "kl_k3", "kl_tokens"]  # mempo.eval.compare.kl_to_reference
P_ANS_COLUMNS = ["checkpoint", "agent", "objectives", "task_id", "turn", "p_ans"]
AGENT_LABELS = {"memory": "memory agent", "full_history": "full-history agent (ReAct)"}  # not the RL algorithm
AGENT_STYLES = {"memory": "-", "full_history": "--"}


RECORD_KEY = ("checkpoint", "agent", "objectives", "task_id")  # one rollout of an evaluation


def record_keys(records: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each record's ``RECORD_KEY`` values."""
    return [tuple(r[k] for k in RECORD_KEY) for r in records]


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a results.jsonl (one rollout a line); a ValueError naming the file, both lines and the key when
    one (checkpoint, agent, N, task) has two (``refuse_repeats``)."""
    numbered = [(i, json.loads(line)) for i, line in enumerate(Path(path).read_text().splitlines(), start=1)
                if line.strip()]  # fmt: skip
    records = [r for _, r in numbered]
    refuse_repeats(record_keys(records), RECORD_KEY, where=f"{path}, ", numbers=[i for i, _ in numbered])
    return records


def interval_table(rows: list[dict[str, Any]], records: list[dict[str, Any]], *, base: str | None = None) -> str:
    """Markdown: per checkpoint and N, EM and F1 with 95% bootstrap intervals over tasks; then, per N and for every
    other checkpoint, the paired difference (that checkpoint - ``base``, the first checkpoint when None) over the
    same tasks, with its interval and whether it excludes 0. ``rows``/``records``: a ``GridResult``'s (memory agent
    rows and others)."""
    from mempo.eval.stats import fmt_ci, paired_bootstrap_diff

    refuse_repeats(record_keys(records), RECORD_KEY, unit="record")

    def key(r: dict[str, Any]) -> str:
        return r["checkpoint"] if r.get("agent", "memory") == "memory" else f"{r['checkpoint']} ({r['agent']})"

    table_rows = [
        {
            "model": key(r),
            "N": r["objectives"],
            "tasks": r["tasks"],
            "EM [95% CI]": fmt_ci(r["em"], r["em_lo"], r["em_hi"]),
            "F1 [95% CI]": fmt_ci(r["f1"], r["f1_lo"], r["f1_hi"]),
            "format_fail": r["format_fail"],
            "turns": r["turns"],
            "tt": r["tt"],
            "pt": r["pt"],
        }
        for r in rows
    ]
    cols = ["model", "N", "tasks", "EM [95% CI]", "F1 [95% CI]", "format_fail", "turns", "tt", "pt"]
    out = [markdown_table(table_rows, cols)]
    models = list(dict.fromkeys(key(r) for r in rows))
    if base is not None:
        if base not in models:
            raise ValueError(f"base checkpoint {base!r} is not among {models}")
        models = [base] + [m for m in models if m != base]
    if len(models) < 2:
        return out[0]
    diff_rows = []
    for n in sorted({r["objectives"] for r in rows}):
        by = {m: {x["task_id"]: x for x in records if key(x) == m and x["objectives"] == n} for m in models}
        for m in models[1:]:
            ids = sorted(set(by[models[0]]) & set(by[m]))
            if not ids:
                continue
            row: dict[str, Any] = {"comparison": f"{m} - {models[0]}", "N": n, "tasks": len(ids)}
            for metric in ("em", "f1"):
                d = paired_bootstrap_diff([by[models[0]][i][metric] for i in ids], [by[m][i][metric] for i in ids])
                verdict = "excludes 0" if d[1] > 0 or d[2] < 0 else "includes 0"
                row[f"{metric.upper()} diff [95% CI]"] = f"{fmt_ci(*d)} {verdict}"
            diff_rows.append(row)
    out += ["", "Paired differences over the same tasks:", ""]
    out.append(markdown_table(diff_rows, ["comparison", "N", "tasks", "EM diff [95% CI]", "F1 diff [95% CI]"]))
    return "\n".join(out)


def _series(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(checkpoint, agent) -> its rows sorted by N, in first-seen order."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["checkpoint"], r["agent"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["objectives"]) for k, v in out.items()}


def _colors(rows: list[dict[str, Any]]) -> dict[str, str]:
    ckpts = list(dict.fromkeys(r["checkpoint"] for r in rows))
    return {c: f"C{i % 10}" for i, c in enumerate(ckpts)}


def plot_f1(rows: list[dict[str, Any]], path: Path, *, num_tasks: int) -> Path:
    """F1 vs N, one line per checkpoint x agent, each point with its 95% bootstrap interval over tasks where the
    rows carry one (``f1_lo``, ``f1_hi``); the series are set slightly apart along N so their intervals do not hide
    each other (at a single N the figure is then its points side by side with their intervals)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    colors = _colors(rows)
    series = _series(rows)
    ns = sorted({r["objectives"] for r in rows})
    width = 0.3 * (min(b - a for a, b in zip(ns, ns[1:])) if len(ns) > 1 else 1)  # the spread of the series at one N
    for i, ((ckpt, agent), rs) in enumerate(series.items()):
        dx = (i - (len(series) - 1) / 2) * width / max(len(series) - 1, 1)
        yerr = None
        if all("f1_lo" in r and "f1_hi" in r for r in rs):
            yerr = [[max(r["f1"] - r["f1_lo"], 0.0) for r in rs], [max(r["f1_hi"] - r["f1"], 0.0) for r in rs]]
        ax.errorbar(
            [r["objectives"] + dx for r in rs],
            [r["f1"] for r in rs],
            yerr=yerr,
            fmt=AGENT_STYLES.get(agent, ":"),
            marker="o",
            capsize=3,
            color=colors[ckpt],
            label=f"{ckpt} / {AGENT_LABELS.get(agent, agent)}",
        )
    ax.set_xlabel("objectives per task (N)")
    ax.set_ylabel("F1 (mean over objectives and tasks)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(ns)
    if len(ns) == 1:
        ax.set_xlim(ns[0] - 0.5, ns[0] + 0.5)
    ax.set_title(f"Answer F1 vs objectives per task ({num_tasks} tasks per N, greedy; bars: 95% CI)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_tokens(rows: list[dict[str, Any]], path: Path, *, num_tasks: int) -> Path:
    """TT and PT vs N side by side, one line per checkpoint x agent."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    colors = _colors(rows)
    panels = (
        ("tt", "TT: all tokens processed per task\n(every prompt + every generation)"),
        ("pt", "PT: peak tokens of one turn\n(its context + its generation)"),
    )
    for ax, (key, ylabel) in zip(axes, panels):
        for (ckpt, agent), rs in _series(rows).items():
            ax.plot(
                [r["objectives"] for r in rs],
                [r[key] for r in rs],
                AGENT_STYLES.get(agent, ":"),
                marker="o",
                color=colors[ckpt],
                label=f"{ckpt} / {AGENT_LABELS.get(agent, agent)}",
            )
        ax.set_xlabel("objectives per task (N)")
        ax.set_ylabel(f"{ylabel}, tokens (mean)")
        ax.set_xticks(sorted({r["objectives"] for r in rows}))
        ax.grid(alpha=0.3)
    axes[0].set_title("Total tokens (TT) vs N")
    axes[1].set_title("Peak tokens (PT) vs N")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Token cost vs number of objectives ({num_tasks} tasks per N, greedy)")
    return save_figure(fig, path)


def plot_vs_objectives(
    rows: list[dict[str, Any]],
    key: str,
    path: Path,
    *,
    ylabel: str,
    title: str,
    series: str = "checkpoint",
    from_zero: bool = False,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """``key`` against N, one line per value of ``rows[i][series]`` (solid for memory agents, dashed for
    full-history ones), with error bars from ``{key}_lo``/``{key}_hi`` where rows carry them. from_zero: the y axis
    starts at 0 (token counts: a ratio read off the plot is then the ratio of the values)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    lines: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        lines.setdefault(r[series], []).append(r)
    for i, (name, rs) in enumerate(lines.items()):
        rs = sorted(rs, key=lambda r: r["objectives"])
        y = [r[key] for r in rs]
        yerr = None
        if all(f"{key}_lo" in r and f"{key}_hi" in r for r in rs):  # [2, n]: distances below and above the mean
            yerr = [[max(r[key] - r[f"{key}_lo"], 0.0) for r in rs], [max(r[f"{key}_hi"] - r[key], 0.0) for r in rs]]
        ax.errorbar(
            [r["objectives"] for r in rs],
            y,
            yerr=yerr,
            fmt=AGENT_STYLES.get(rs[0].get("agent", ""), ":"),
            marker="o",
            capsize=3,
            color=f"C{i % 10}",
            label=f"{name}: {AGENT_LABELS.get(rs[0].get('agent', ''), rs[0].get('agent', '?'))}",
        )
    ax.set_xlabel("objectives per task (N)")
    ax.set_ylabel(ylabel)
    ax.set_xticks(sorted({r["objectives"] for r in rows}))
    if ylim is not None:
        ax.set_ylim(*ylim)
    elif from_zero:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def p_ans_by_turn(p_ans: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, list[float]]]:
    """(checkpoint, agent) -> turn -> the P(ans | q, m) of every memory written at that turn (all N pooled)."""
    key = ("checkpoint", "agent", "objectives", "task_id", "turn")
    refuse_repeats([tuple(r[k] for k in key) for r in p_ans], key, unit="memory")
    out: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in p_ans:
        out[(r["checkpoint"], r["agent"])][int(r["turn"])].append(float(r["p_ans"]))
    return out


def plot_p_ans(p_ans: list[dict[str, Any]], path: Path) -> Path:
    """Mean P(ans | q, m) by turn with the interquartile range shaded, one line per checkpoint x agent."""
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    groups = p_ans_by_turn(p_ans)
    colors = _colors([{"checkpoint": c} for c, _ in groups])
    for (ckpt, agent), by_turn in groups.items():
        turns = sorted(by_turn)
        vals = [np.asarray(by_turn[t]) for t in turns]
        mean = [v.mean() for v in vals]
        lo, hi = [np.quantile(v, 0.25) for v in vals], [np.quantile(v, 0.75) for v in vals]
        count = sum(len(v) for v in vals)
        label = f"{ckpt} / {AGENT_LABELS.get(agent, agent)} ({count} memories)"
        style = AGENT_STYLES.get(agent, ":")
        ax.plot(turns, mean, style, marker="o", color=colors[ckpt], label=label)
        ax.fill_between(turns, lo, hi, color=colors[ckpt], alpha=0.15)
    if not groups:  # scoring was on (write_report draws nothing otherwise), and no memory agent wrote a <mem>
        text = "memories were scored, but no memory agent wrote a well-formed <mem>"
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("turn that wrote the memory")
    ax.set_ylabel("P(gold answer | question, memory)")
    ax.set_title("Memory quality by turn: mean, shaded 25-75% (Eq. 4)")
    ax.grid(alpha=0.3)
    if groups:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


MEAN_AGGREGATION = "EM/F1: per task the mean over its objectives (SQuAD normalisation), then the mean over tasks"
MEM1_AGGREGATION = (
    "MEM1's aggregation (em_mem1, f1_mem1): per task the sum over its objectives, MEM1's normalisation (punctuation to "
    "spaces, articles kept), set F1, 0 when the answer's part count is not N; then the mean over tasks"
)


def real_data_tables(rows: list[dict[str, Any]], source_rows: list[dict[str, Any]]) -> str:
    """What intervals.md adds for real-data evaluations, "" otherwise (a single-source run without
    eval.mem1_scores, such as the main job, prints exactly what it printed before): MEM1's aggregation beside
    mempo's, and one row per data_source when tasks of several sources were scored."""
    out = []
    mem1 = bool(rows) and "em_mem1" in rows[0]
    if mem1:
        cols = ["checkpoint", "agent", "objectives", "tasks", "em", "f1", "em_mem1", "f1_mem1"]
        out += ["", f"{MEAN_AGGREGATION}; {MEM1_AGGREGATION}.", "", markdown_table(rows, cols)]
    if source_rows:
        cols = ["checkpoint", "agent", "objectives", "source", "tasks", "em", "f1"]
        cols += ["em_mem1", "f1_mem1"] if mem1 else []
        out += ["", f"Per data_source ({MEAN_AGGREGATION}):", "", markdown_table(source_rows, cols)]
    return "".join(line + "\n" for line in out)


def write_report(out: Path, result: Any, *, num_tasks: int, memories_scored: bool = True) -> dict[str, Path]:
    """``result`` (a ``GridResult``) -> files in ``out``; returns name -> path. Without ``memories_scored``
    (``eval.score_memories=false``) there is no P(ans | q, m) to show: memory_p_ans.csv and p_ans_by_turn.png are
    not written (and an earlier run's are removed from ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "results": out / "results.jsonl",
        "table_md": out / "table.md",
        "table_csv": out / "table.csv",
    }
    atomic_write_text(files["results"], "".join(json.dumps(r, default=str) + "\n" for r in result.records))
    columns = TABLE_COLUMNS + [c for c in KL_COLUMNS if result.rows and c in result.rows[0]]  # eval.kl_reference
    atomic_write_text(files["table_md"], markdown_table(result.rows, columns) + "\n")
    write_csv(files["table_csv"], result.rows, columns)
    files["intervals"] = out / "intervals.md"
    extra = real_data_tables(result.rows, getattr(result, "source_rows", []))
    atomic_write_text(files["intervals"], interval_table(result.rows, result.records) + "\n" + extra)
    if getattr(result, "source_rows", []):
        files["table_by_source"] = out / "table_by_source.csv"
        write_csv(files["table_by_source"], result.source_rows, list(result.source_rows[0]))
    if result.failures:
        from mempo.eval.failures import VERDICTS

        files["failures"] = out / "failures.md"
        atomic_write_text(
            files["failures"], markdown_table(result.failures, ["checkpoint", "agent", "objectives", *VERDICTS])
        )
    files["f1_vs_objectives"] = plot_f1(result.rows, out / "f1_vs_objectives.png", num_tasks=num_tasks)
    files["tokens_vs_objectives"] = plot_tokens(result.rows, out / "tokens_vs_objectives.png", num_tasks=num_tasks)
    if memories_scored:
        files["memory_p_ans"] = out / "memory_p_ans.csv"
        write_csv(files["memory_p_ans"], result.p_ans, P_ANS_COLUMNS)
        files["p_ans_by_turn"] = plot_p_ans(result.p_ans, out / "p_ans_by_turn.png")
    else:
        for stale in ("memory_p_ans.csv", "p_ans_by_turn.png"):
            (out / stale).unlink(missing_ok=True)
    return files


def log_to_wandb(cfg: Any, result: Any, files: dict[str, Path]) -> None:
    """The table, sample trajectories (question, memories per turn, answer, reward) and the figures, into a W&B
    run named ``<name>-eval`` (offline unless an API key is configured, as for training)."""
    import wandb

    mode = wandb_mode(cfg.logger.mode)
    run = wandb.init(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        dir=str(files["results"].parent),
        mode=mode,
        name=f"{cfg.name}-eval",
        tags=[*cfg.logger.tags, "eval"],
        job_type="eval",
        reinit="finish_previous",
    )
    try:
        table = wandb.Table(columns=TABLE_COLUMNS, data=[[r[c] for c in TABLE_COLUMNS] for r in result.rows])
        traj_cols = ["checkpoint", "agent", "objectives", "task_id", "question", "memories", "answer", "gold", "reward"]
        taken: dict[tuple, int] = defaultdict(int)
        samples = []
        for r in result.records:
            key = (r["checkpoint"], r["agent"], r["objectives"])
            if taken[key] >= cfg.eval.max_trajectories:
                continue
            taken[key] += 1
            mems = "\n".join(f"[{s['turn']}] {s['memory']}" for s in r["trace"] if s["memory"])
            samples.append([*(r[c] for c in traj_cols[:5]), mems, r["answer"], r["gold"], r["reward"]])
        run.log(
            {
                "eval/table": table,
                "eval/trajectories": wandb.Table(columns=traj_cols, data=samples),
                **{f"eval/{k}": wandb.Image(str(p)) for k, p in files.items() if p.suffix == ".png"},
            }
        )
    finally:
        run.finish()


def read_table(folder: Path) -> list[dict[str, Any]]:
    """The rows of an evaluation folder's table.csv (beside its results.jsonl: ``results_file``), numbers parsed (its
    records: ``read_eval_records``)."""
    with (results_file(Path(folder)).parent / "table.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    text = ("checkpoint", "agent")
    return [{k: (v if k in text else int(v) if k in ("objectives", "tasks") else float(v)) for k, v in r.items()}
            for r in rows]  # fmt: skip


MEAN_FIELDS = ("em", "f1", "reward", "format_fail", "turns", "tt", "pt")  # per-task fields a --mean checkpoint averages


def mean_checkpoint(
    records: list[dict[str, Any]], name: str, labels: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, records) of a checkpoint ``name`` whose per-task values are the means of ``labels``' on that task
    (e.g. one recipe's seeds): every label must have scored the same tasks for each (agent, N). Its intervals are
    bootstraps over tasks with the labels held fixed, so they leave out the spread between seeds."""
    from mempo.eval.stats import bootstrap_ci

    if len(labels) < 2:
        raise ValueError(f"--mean {name}: needs at least two checkpoints, got {list(labels)}")
    refuse_repeats(record_keys(records), RECORD_KEY, unit="record")
    by: dict[tuple[str, int], dict[str, dict[str, dict[str, Any]]]] = {}
    for r in records:
        if r["checkpoint"] in labels:
            by.setdefault((r["agent"], r["objectives"]), {}).setdefault(r["checkpoint"], {})[r["task_id"]] = r
    if not by:
        raise ValueError(f"--mean {name}: none of {list(labels)} is in the evaluations given")
    rows, out = [], []
    for (agent, n), per_label in sorted(by.items()):
        tasks = [set(per_label.get(lab, {})) for lab in labels]
        if any(t != tasks[0] for t in tasks):
            raise ValueError(f"--mean {name}: {list(labels)} did not score the same tasks at agent={agent}, N={n}")
        recs = [
            {"checkpoint": name, "agent": agent, "objectives": n, "task_id": tid}
            | {f: sum(per_label[lab][tid][f] for lab in labels) / len(labels) for f in MEAN_FIELDS}
            for tid in sorted(tasks[0])
        ]
        row: dict[str, Any] = {"checkpoint": name, "agent": agent, "objectives": n, "tasks": len(recs)}
        for f in MEAN_FIELDS:
            row[f] = sum(r[f] for r in recs) / len(recs)
        for m in ("em", "f1"):
            _, row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_ci([r[m] for r in recs])
        rows.append(row)
        out += recs
    return rows, out


def main(argv: list[str] | None = None) -> None:
    """``python -m mempo.eval.report EVAL_DIR [EVAL_DIR ...]``: one interval table over several evaluations of the
    same tasks (same seed, N and eval.num_tasks), paired differences against the first checkpoint; with ``--arm``
    the seed-level tables instead (arms of checkpoints, one per RL seed; ``mempo.eval.seeds``); ``--per-task CSV``:
    a study's seed-level tables recomputed from its committed per_task.csv."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("eval_dirs", nargs="*", type=Path)
    ap.add_argument("--per-task", action="append", default=[], type=Path, metavar="CSV",
                    help="a study's per_task.csv (docs/studies/<name>/): its seed-level tables recomputed against the "
                    "study's reference arm (its study.json beside the CSV), or --reference; given several times "
                    "(e.g. one study per world), each study's tables and then their comparisons pooled")  # fmt: skip
    ap.add_argument("--memory-scores", default=None, type=Path, metavar="CSV",
                    help="with --per-task: the study's memory_scores.csv (one row per memory), to compare the memory "
                    "scores turn by turn too (P_GOLD_TURN)")  # fmt: skip
    ap.add_argument("--mean", action="append", default=[], metavar="NAME=A,B",
                    help="add a checkpoint NAME whose per-task values are the means of checkpoints A, B, ... "
                    "(e.g. a recipe's seeds), paired against the first like the others")  # fmt: skip
    ap.add_argument("--base", default=None, metavar="NAME",
                    help="pair the others against NAME (a label or a --mean name), not the first")  # fmt: skip
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=SEED:LABEL,...",
                    help="seed-level mode (mempo.eval.seeds): an arm NAME whose RL seed SEED is checkpoint LABEL; "
                    "arms pair by seed and task; the verdict reads the seed-plus-task t-interval")  # fmt: skip
    ap.add_argument("--reference", default=None, metavar="NAME",
                    help="with --arm: the arm the others are compared with (default: the first); with --per-task: "
                    "instead of the study's own")  # fmt: skip
    ap.add_argument("--warm-start", default=None, metavar="LABEL",
                    help="with --arm: a checkpoint every arm is also compared with, paired by task")  # fmt: skip
    ap.add_argument("--json", default=None, type=Path, metavar="PATH", help="with --arm: also write the report")
    args = ap.parse_args(argv)
    if args.per_task:
        if args.eval_dirs or args.arm or args.mean or args.base or args.warm_start:
            raise SystemExit("--per-task: the CSV holds the whole study; give no EVAL_DIR, --arm, --mean, --base or "
                             "--warm-start with it")  # fmt: skip
        if len(args.per_task) > 1:
            if args.memory_scores is not None:
                raise SystemExit("--memory-scores goes with one --per-task, not several")
            print(pooled_report(args.per_task, reference=args.reference, json_path=args.json))
            return
        print(per_task_report(args.per_task[0], reference=args.reference, json_path=args.json,
                              memory_scores=args.memory_scores))  # fmt: skip
        return
    if args.memory_scores is not None:
        raise SystemExit("--memory-scores goes with --per-task")
    if not args.eval_dirs:
        raise SystemExit("give at least one EVAL_DIR (or --per-task CSV)")
    if args.arm:
        seed_level(args)
        return
    try:
        records = read_eval_records(args.eval_dirs)  # a label two folders hold is refused, as under --arm
    except ValueError as e:
        raise SystemExit(str(e)) from None
    rows = [row for d in args.eval_dirs for row in read_table(d)]
    for spec in args.mean:
        name, sep, labels = spec.partition("=")
        if not sep or not name or not labels:
            raise SystemExit(f"--mean {spec!r}: expected NAME=A,B (checkpoint labels of the evaluations given)")
        r, rec = mean_checkpoint(records, name, labels.split(","))
        rows += r
        records += rec
    try:
        print(interval_table(rows, records, base=args.base))
    except ValueError as e:
        raise SystemExit(f"--base: {e}") from None


def results_file(folder: Path) -> Path:
    """An evaluation's results.jsonl: in ``folder`` (an evaluation's ``eval/``), or in ``folder/eval`` (the run_dir of
    ``experiments/eval.py``, which holds it); a ValueError naming both places when neither has one."""
    for path in (folder / "results.jsonl", folder / "eval" / "results.jsonl"):
        if path.is_file():
            return path
    raise ValueError(f"{folder}: no results.jsonl there or in {folder / 'eval'} (give an evaluation's folder)")


def read_eval_records(eval_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """The records of several evaluations' results.jsonl, concatenated; a ValueError naming the label and both folders
    when a checkpoint label has records at one (agent, N) in two of them (two runs that share a label, e.g. the demo's
    warm_start and rl, would merge into one by task id), or when a folder is given twice."""
    records: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, int], Path] = {}
    for d in map(Path, eval_dirs):
        own = read_records(results_file(d))
        for key in dict.fromkeys((r["checkpoint"], r["agent"], r["objectives"]) for r in own):
            if key in seen:
                raise ValueError(
                    f"checkpoint {key[0]!r} (agent={key[1]}, N={key[2]}) has records in both {seen[key]} and {d}: "
                    "one label must be one evaluated checkpoint; evaluate the runs together, or give each its own "
                    "label (eval.checkpoints)"
                )
            seen[key] = d
        records += own
    return records


def study_record(per_task: Path) -> dict[str, Any] | None:
    """The study.json beside ``per_task`` (as the study writes and docs/studies/<name>/ commits them), or None when
    there is none. A SystemExit naming the file and what is wrong with it when it is there but does not read as a
    JSON object: its design (which arm started from which warm start) would otherwise be dropped without a word."""
    where = per_task.parent / "study.json"
    if not where.is_file():
        return None
    try:
        record = json.loads(where.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--per-task {per_task}: {where} does not read as JSON ({e}); mend or remove it") from e
    if not isinstance(record, dict):
        raise SystemExit(f"--per-task {per_task}: {where} holds a JSON {type(record).__name__}, not an object; "
                         "mend or remove it")  # fmt: skip
    return record


def study_reference(per_task: Path, record: dict[str, Any] | None) -> str:
    """The reference arm of the study whose per_task.csv is ``per_task``, from its ``study_record``. A SystemExit when
    there is none to read: the comparisons would otherwise be against whichever arm comes first, which need not be
    the study's."""
    where = per_task.parent / "study.json"
    if record is None:
        raise SystemExit(f"--per-task {per_task}: the study's reference arm is read from {where}, which is missing; "
                         "give --reference ARM to choose one")  # fmt: skip
    if not record.get("reference"):
        raise SystemExit(f"--per-task {per_task}: {where} records no reference arm; give --reference ARM")
    return str(record["reference"])


def arm_warm_starts(record: dict[str, Any] | None) -> dict[str, str]:
    """arm -> its own warm start's label, for the arms that did not start from the study's warm start (a ReAct arm):
    the design a ``study_record`` records; none when it records none (or there is no study.json)."""
    design = (record or {}).get("design") or {}
    return dict(design.get("arm_warm_starts") or {})


def per_task_study(
    path: Path, *, reference: str | None = None
) -> tuple[dict[str, Any], dict[str, dict[int, str]], str | None, dict[tuple[str, int], dict[str, float]]]:
    """A study's ``seed_study`` report recomputed from its per_task.csv -> (the report, its arms, its warm start label,
    its memory means: ``study_from_per_task``'s). Against ``reference``, else the study's own (``study_reference``,
    and its study.also_reference). A SystemExit naming the file when the CSV does not make a study."""
    also: list[str] = []
    record = study_record(Path(path))
    if reference is None:
        reference = study_reference(Path(path), record)
        also = list(record.get("also_reference") or []) if record else []
    with Path(path).open(newline="") as f:
        try:
            records, arms, warm, means = study_from_per_task(list(csv.DictReader(f)))
            own = arm_warm_starts(record)
            study = seed_study(records, arms, reference=reference, warm_start=warm, arm_warm_starts=own,
                               also_reference=also)  # fmt: skip
        except ValueError as e:
            raise SystemExit(f"--per-task {path}: {e}") from None
    return study, arms, warm, means


def pooled_report(paths: Sequence[Path], *, reference: str | None = None, json_path: Path | None = None) -> str:
    """Several studies' per_task.csv (e.g. the same study command on two synthetic worlds): each study's tables
    (``per_task_study``), then their common comparisons pooled with the studies as fixed strata
    (``mempo.eval.seeds.pool_studies``), each named by its folder. With ``json_path`` also written there ({"studies",
    "pooled"})."""
    paths = [Path(p) for p in paths]
    names = [p.parent.name for p in paths]
    if len(set(names)) != len(names):
        names = [str(p) for p in paths]
    studies = [per_task_study(p, reference=reference)[0] for p in paths]
    try:
        pooled = pool_studies(studies, names)
    except ValueError as e:
        raise SystemExit(f"--per-task: {e}") from None
    out = []
    for name, study in zip(names, studies, strict=True):
        out += [f"## {name}", "", study_markdown(study), ""]
    out += [f"## Pooled over {', '.join(names)} (fixed strata: the unweighted mean of the studies' differences)", "",
            pooled_markdown(pooled)]  # fmt: skip
    if json_path:
        atomic_write_text(json_path, json.dumps({"studies": dict(zip(names, studies, strict=True)),
                                                 "pooled": pooled}, indent=1) + "\n")  # fmt: skip
    return "\n".join(out)


def per_task_report(
    path: Path,
    *,
    reference: str | None = None,
    json_path: Path | None = None,
    memory_scores: Path | None = None,
) -> str:
    """A study's seed-level tables recomputed from its per_task.csv (``mempo.eval.seeds.study_from_per_task``): the
    EM and F1 comparisons (``seed_study``) and, where the CSV holds memory scores, theirs (``score_means``); with the
    study's ``memory_scores`` CSV (one row per memory) also turn by turn (``p_gold_turn``). The comparisons are
    against ``reference``, else the study's own (``study_reference``, and its study.also_reference). With
    ``json_path`` the report is also written there ({"study", "memory_scores"})."""
    study, arms, warm, means = per_task_study(path, reference=reference)
    out, report = [study_markdown(study)], {"study": study, "memory_scores": None}
    if memory_scores is not None and not means:
        raise SystemExit(f"--memory-scores: {path} holds no memory scores to compare turn by turn")
    if means:
        try:
            turns = read_turn_scores(memory_scores) if memory_scores is not None else None
        except (OSError, ValueError) as e:
            raise SystemExit(f"--memory-scores: {e}") from None
        scores = score_means(means, arms, memories=None, reference=study["reference"], warm_start=warm, turns=turns)
        report["memory_scores"] = scores
        out += ["", "Memory scores (each task's mean P(gold | question, memory) under the study's scorer):", "",
                score_markdown(scores)]  # fmt: skip
    if json_path:
        atomic_write_text(json_path, json.dumps(report, indent=1) + "\n")
    return "\n".join(out)


def seed_level(args: Any) -> None:
    """``--arm`` mode: the seed-level tables (``mempo.eval.seeds``) of the evaluations' results.jsonl."""
    if args.mean or args.base:
        raise SystemExit("--arm: --mean and --base are the tasks-only mode's; use --reference with --arm")
    try:
        records = read_eval_records(args.eval_dirs)
        arms = dict(parse_arm(spec) for spec in args.arm)
        study = seed_study(records, arms, reference=args.reference, warm_start=args.warm_start)
    except ValueError as e:
        raise SystemExit(f"--arm: {e}") from None
    print(study_markdown(study))
    if args.json:
        atomic_write_text(args.json, json.dumps(study, indent=1) + "\n")


if __name__ == "__main__":
    main()
