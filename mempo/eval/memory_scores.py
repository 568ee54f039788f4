"""The mechanism MemPO claims, measured: P(gold | question, memory) (Eq. 4) of every memory the evaluated
memory agents wrote, all under one fixed scorer (the study's warm start), so that arms are compared on one scale.
A checkpoint scoring its own memories (``eval.score_memories``) mixes two changes, its memories and its weights;
one scorer leaves only the memories.

    memory_items    an evaluation's records (results.jsonl) -> one item per well-formed turn that wrote a memory
    task_means      scored items -> (checkpoint, N) -> task_id -> mean P over that task's memories
    turn_scores     scored items -> (checkpoint, N) -> task_id -> turn -> P
    score_study     per arm the per-seed means; per comparison (every arm against the reference arm and against the
                    warm start) ``mempo.eval.seeds.compare`` over the tasks both sides wrote memories for at every
                    seed, of the task means (``p_gold``) and turn by turn (``p_gold_turn``)
    score_markdown  its tables; ``plot_scores``: per arm the distribution of P (seeds pooled), the paper's figure

The scoring itself (loading the scorer) is the study stage's (``mempo.stages.study``).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mempo.eval.seeds import compare, comparison_table
from mempo.eval.tables import markdown_table, pyplot, refuse_repeats, save_figure

METRIC = "p_gold"
# The same comparison at matched turns: per seed and task, the mean over the turns both sides wrote a memory at. A
# memory's P rises with its turn (it holds more answers), so ``p_gold`` of an arm whose rollouts stop sooner is lower
# with memories no worse turn for turn; the MemPO study (docs/results.md) read -0.0068 in p_gold and +0.0010 here.
METRIC_TURN = "p_gold_turn"
TurnScores = dict[tuple[str, int], dict[str, dict[int, float]]]
LOG10_FLOOR = -8.0  # the figure's left edge: P below 1e-8 is drawn there


@dataclass(frozen=True)
class MemoryItem:
    """One memory to score: where it was written (checkpoint, N, task, turn) and what it is scored on."""

    checkpoint: str
    objectives: int
    task_id: str
    turn: int
    question: str
    memory: str
    gold: str


def memory_items(records: Sequence[Mapping[str, Any]], *, agent: str = "memory") -> list[MemoryItem]:
    """Every memory a well-formed turn of ``agent`` wrote, in record then turn order (the turns
    ``mempo.eval.compare.memory_p_ans`` scores)."""
    return [
        MemoryItem(
            r["checkpoint"],
            int(r["objectives"]),
            str(r["task_id"]),
            int(t["turn"]),
            r["question"],
            t["memory"],
            r["gold"],
        )
        for r in records
        if r["agent"] == agent
        for t in r["trace"]
        if t["ok"] and t["memory"]
    ]


ITEM_KEY = ("checkpoint", "objectives", "task_id", "turn")  # one memory: the turn of one rollout that wrote it


def _refuse_repeated_items(items: Sequence[MemoryItem], p: Sequence[float]) -> None:
    """A ValueError when the counts differ or a memory (``ITEM_KEY``) comes twice (``refuse_repeats``)."""
    if len(items) != len(p):
        raise ValueError(f"{len(items)} memories but {len(p)} scores")
    refuse_repeats([(it.checkpoint, it.objectives, it.task_id, it.turn) for it in items], ITEM_KEY, unit="memory")


def task_means(items: Sequence[MemoryItem], p: Sequence[float]) -> dict[tuple[str, int], dict[str, float]]:
    """(checkpoint, N) -> task_id -> the mean P over the memories that task's rollout wrote (one per turn; a
    repeated turn is refused)."""
    _refuse_repeated_items(items, p)
    found: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for it, v in zip(items, p):
        found[(it.checkpoint, it.objectives)][it.task_id].append(float(v))
    return {k: {t: float(np.mean(vs)) for t, vs in by.items()} for k, by in found.items()}


def _by_turn(entries: Iterable[tuple[str, int, str, int, float]]) -> TurnScores:
    """(checkpoint, N, task_id, turn, P) entries, each key once -> ``TurnScores``."""
    found: TurnScores = defaultdict(lambda: defaultdict(dict))
    for checkpoint, n, task, turn, v in entries:
        found[(checkpoint, n)][task][turn] = v
    return {k: dict(by) for k, by in found.items()}


def turn_scores(items: Sequence[MemoryItem], p: Sequence[float]) -> TurnScores:
    """(checkpoint, N) -> task_id -> turn -> P of the memory that turn wrote."""
    _refuse_repeated_items(items, p)
    return _by_turn((it.checkpoint, it.objectives, it.task_id, it.turn, float(v)) for it, v in zip(items, p))


MEMORY_SCORES_COLUMNS = ("checkpoint", "objectives", "task_id", "turn", "p_gold")  # the study's memory_scores.csv


def read_turn_scores(path: Path) -> TurnScores:
    """``turn_scores`` read back from a study's memory_scores.csv (one row per scored memory); a ValueError naming
    the file, line and column of a row it cannot read, or the file, lines and key of a repeated memory."""

    def entries(reader: csv.DictReader) -> Iterator[tuple[str, int, str, int, float]]:
        for line, row in enumerate(reader, start=2):
            key = "objectives"
            try:
                n = int(row[key])
                key = "turn"
                turn = int(row[key])
                key = "p_gold"
                yield row["checkpoint"], n, row["task_id"], turn, float(row[key])
            except (TypeError, ValueError):
                raise ValueError(f"{path}, line {line}: column {key} is {row[key]!r}, not a number") from None

    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in MEMORY_SCORES_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing}; a study's memory_scores.csv has {MEMORY_SCORES_COLUMNS}")
        rows = list(entries(reader))
    refuse_repeats([r[:4] for r in rows], ITEM_KEY, where=f"{path}, ", numbers=range(2, len(rows) + 2))
    return _by_turn(rows)


def _turn_matched(
    a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per task where both sides wrote a memory at one turn or more: each side's mean P over those common turns, so
    that b - a is the mean over the common turns of b's P minus a's."""
    out_a: dict[str, float] = {}
    out_b: dict[str, float] = {}
    for task in set(a) & set(b):
        common = sorted(set(a[task]) & set(b[task]))
        if common:
            out_a[task] = float(np.mean([a[task][t] for t in common]))
            out_b[task] = float(np.mean([b[task][t] for t in common]))
    return out_a, out_b


def _per_seed(means: Mapping[tuple[str, int], Mapping[str, float]], labels: Mapping[int, str], n: int) -> dict:
    """Per seed: the tasks with a memory and the mean over them of each task's mean P (None without any)."""
    got = [means.get((labels[s], n), {}) for s in sorted(labels)]
    per_seed = [float(np.mean(list(g.values()))) if g else None for g in got]
    known = [v for v in per_seed if v is not None]
    return {
        "tasks_with_memories": [len(g) for g in got],
        "per_seed": per_seed,
        "mean": float(np.mean(known)) if known else None,
    }


def _compare_on_common_tasks(
    a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]], names: tuple[str, str], level: float
) -> dict[str, Any]:
    """``compare`` restricted to the tasks where both sides wrote a memory at every seed: the crossed design's
    interval needs every seed on the same tasks."""
    common = {s: set(a[s]) & set(b[s]) for s in a}
    empty = [s for s, ts in common.items() if not ts]
    if empty:
        return {"seeds": sorted(a), "verdict": f"no task with memories on both sides at seed(s) {empty}"}
    shared = sorted(set.intersection(*common.values()))
    if not shared:
        return {"seeds": sorted(a), "verdict": "no task with memories on both sides at every seed"}
    return compare(
        {s: {t: a[s][t] for t in shared} for s in common},
        {s: {t: b[s][t] for t in shared} for s in common},
        names=names,
        level=level,
    )


def score_study(
    items: Sequence[MemoryItem],
    p: Sequence[float],
    arms: Mapping[str, Mapping[int, str]],
    *,
    reference: str,
    warm_start: str | None = None,
    level: float = 0.95,
) -> dict[str, Any]:
    """The seed-level report of the scored memories (``arms``: arm -> seed -> checkpoint label, as
    ``mempo.eval.seeds.seed_study``): per arm and N the per-seed mean P, the seed mean and the tasks with memories;
    per comparison (every other arm against ``reference``, every arm against ``warm_start``) ``compare``'s result
    over the tasks both sides wrote memories for at every seed (per-seed differences, the seed-plus-task t-interval
    the verdict reads, the crossed bootstrap)."""
    return score_means(
        task_means(items, p),
        arms,
        memories=len(items),
        reference=reference,
        warm_start=warm_start,
        level=level,
        turns=turn_scores(items, p),
    )


def score_means(
    means: Mapping[tuple[str, int], Mapping[str, float]],
    arms: Mapping[str, Mapping[int, str]],
    *,
    memories: int | None,
    reference: str,
    warm_start: str | None = None,
    level: float = 0.95,
    turns: TurnScores | None = None,
) -> dict[str, Any]:
    """``score_study`` from the per-task means (``task_means``: (checkpoint, N) -> task -> mean P), e.g. read back
    from a study's per_task.csv; ``memories``: how many memories they average (None when unknown). With ``turns``
    (``turn_scores``, e.g. read back from a study's memory_scores.csv) every comparison also holds ``p_gold_turn``."""
    ns = sorted({n for _, n in means})
    out: dict[str, Any] = {"metric": METRIC, "objectives": ns, "memories": memories, "arms": {}, "warm_start": None}
    for arm, labels in arms.items():
        out["arms"][arm] = {"seeds": sorted(labels), "by_n": {str(n): _per_seed(means, labels, n) for n in ns}}
    pairs = [(arm, reference) for arm in arms if arm != reference]
    if warm_start is not None:
        by_n = {str(n): _per_seed(means, {0: warm_start}, n) for n in ns}
        out["warm_start"] = {"checkpoint": warm_start, "by_n": by_n}
        pairs += [(arm, "warm_start") for arm in arms]
    comparisons = []
    for arm, against in pairs:
        for n in ns:
            # per seed the label of each side: the arm's checkpoint, and the reference arm's or the warm start's
            sides = {s: (warm_start if against == "warm_start" else arms[against][s], label)
                     for s, label in arms[arm].items()}  # fmt: skip
            a = {s: means.get((ref, n), {}) for s, (ref, _) in sides.items()}
            b = {s: means.get((own, n), {}) for s, (_, own) in sides.items()}
            row = {"arm": arm, "against": against, "N": n}
            row[METRIC] = _compare_on_common_tasks(a, b, (against, arm), level)
            if turns is not None:
                matched = {s: _turn_matched(turns.get((ref, n), {}), turns.get((own, n), {}))
                           for s, (ref, own) in sides.items()}  # fmt: skip
                row[METRIC_TURN] = _compare_on_common_tasks(
                    {s: m[0] for s, m in matched.items()}, {s: m[1] for s, m in matched.items()}, (against, arm), level
                )
            comparisons.append(row)
    out["comparisons"] = comparisons
    return out


def score_markdown(study: Mapping[str, Any]) -> str:
    """The scored memories' two tables: per arm and N the per-seed mean P (tasks with memories), then the
    comparisons as ``mempo.eval.seeds.study_markdown`` shows EM's."""

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    rows = []
    entries = [(arm, e) for arm, e in study["arms"].items()]
    if study.get("warm_start"):
        entries.append((f"warm start ({study['warm_start']['checkpoint']})", study["warm_start"]))
    for name, e in entries:
        for n, by in e["by_n"].items():
            rows.append({
                "arm": name, "N": n, "tasks with memories per seed": ", ".join(map(str, by["tasks_with_memories"])),
                "mean P per seed": ", ".join(fmt(v) for v in by["per_seed"]), "seed mean": fmt(by["mean"]),
            })  # fmt: skip
    cols = ["arm", "N", "tasks with memories per seed", "mean P per seed", "seed mean"]
    turn = bool(study["comparisons"]) and all(METRIC_TURN in c for c in study["comparisons"])
    table = comparison_table(study["comparisons"], (METRIC, METRIC_TURN) if turn else (METRIC,), digits=4)
    note = (
        f"{METRIC.upper()}: each task's mean P over its memories; {METRIC_TURN.upper()}: at the turns both sides wrote "
        "a memory at (a memory's P rises with its turn, so shorter rollouts lower P_GOLD alone)."
    )
    return "\n".join([markdown_table(rows, cols), "", table] + (["", note] if turn else []))


def plot_scores(
    items: Sequence[MemoryItem], p: Sequence[float], arms: Mapping[str, Mapping[int, str]], path: Path
) -> Path:
    """Per arm (its seeds pooled; ``arms`` may hold the warm start as an arm of one seed) and N the distribution of
    log10 P(gold | q, m) under the fixed scorer, as step histograms of the share of memories, one panel per N."""
    plt = pyplot()
    ns = sorted({it.objectives for it in items}) or [0]
    fig, axes = plt.subplots(1, len(ns), figsize=(5.5 * len(ns), 3.8), squeeze=False)
    bins = np.linspace(LOG10_FLOOR, 0.0, 33)
    for ax, n in zip(axes[0], ns):
        for i, (arm, labels) in enumerate(arms.items()):
            own = set(labels.values())
            vals = [max(math.log10(max(v, 1e-300)), LOG10_FLOOR) for it, v in zip(items, p)
                    if it.objectives == n and it.checkpoint in own]  # fmt: skip
            if not vals:
                continue
            weights = np.full(len(vals), 1.0 / len(vals))
            ax.hist(vals, bins=bins, weights=weights, histtype="step", lw=1.6, color=f"C{i % 10}",
                    label=f"{arm} ({len(vals)} memories, median P {10 ** float(np.median(vals)):.2g})")  # fmt: skip
        ax.set_xlabel("log10 P(gold | question, memory), fixed scorer")
        ax.set_ylabel("share of memories")
        ax.set_title(f"N = {n}")
        ax.legend(fontsize=7)
    return save_figure(fig, path)
