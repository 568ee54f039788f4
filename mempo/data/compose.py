"""The multi-objective composer: N questions bundled into one task (docs/algorithm.md §2, after MEM1).

Every data source (the synthetic world, Search-R1-style QA files) yields ``Question``s; this one function
turns any pool of them into ``Task``s, so training and evaluation compose tasks the same way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mempo.core.tasks import Question, Task

COMPOSE_MODES = ("pooled", "by_source")


def by_source_groups(questions: Sequence[Question], objectives: int) -> list[tuple[Question, ...]]:
    """MEM1's composition: consecutive questions of one source, in file order, cut into groups of ``objectives``;
    each source's remainder is dropped. Sources come in the order they first appear."""
    sources: dict[str, list[Question]] = {}
    for q in questions:
        sources.setdefault(q.source, []).append(q)
    return [
        tuple(qs[i : i + objectives])
        for qs in sources.values()
        for i in range(0, len(qs) // objectives * objectives, objectives)
    ]


def subset_by_source(tasks: Sequence[Task], num_tasks: int | None, seed: int) -> list[Task]:
    """``num_tasks`` of ``tasks`` in proportion to their sources (``Task.source``), for evaluation and validation on
    a file whose sources come one after another (MEM1's test file: nq first), where the first rows would be one
    source only. Each source gets ``num_tasks * its share`` rounded by largest remainder (a tie goes to the source
    that appears first), drawn from its tasks with ``seed`` (``random.Random(f"{seed}:{source}")``, so a source's
    draw does not depend on the others); the subset keeps ``tasks``' order. None, or at least ``len(tasks)``: all of
    them, in order."""
    if num_tasks is None or num_tasks >= len(tasks):
        return list(tasks)
    by: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by.setdefault(t.source, []).append(i)
    quota = {s: num_tasks * len(rows) / len(tasks) for s, rows in by.items()}
    take = {s: int(q) for s, q in quota.items()}
    order = sorted(by, key=lambda s: -(quota[s] - take[s]))  # stable: ties keep the order of first appearance
    for s in order[: num_tasks - sum(take.values())]:
        take[s] += 1
    chosen = {i for s, rows in by.items() for i in random.Random(f"{seed}:{s}").sample(rows, take[s])}
    return [t for i, t in enumerate(tasks) if i in chosen]


def source_counts(tasks: Sequence[Task]) -> str:
    """E.g. "nq 64, hotpotqa 64": the tasks of each source, in order of first appearance."""
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.source or "(none)"] = counts.get(t.source or "(none)", 0) + 1
    return ", ".join(f"{s} {n}" for s, n in counts.items())


def task_capacity(questions: Sequence[Question], objectives: int, mode: str = "pooled") -> int:
    """Tasks of ``objectives`` questions one pass over ``questions`` yields (no question used twice)."""
    if mode == "by_source":
        return len(by_source_groups(questions, objectives))
    return len(questions) // objectives


def compose_tasks(
    questions: Sequence[Question],
    objectives: int,
    *,
    num_tasks: int | None = None,
    seed: int = 0,
    prefix: str = "task",
    mode: str = "pooled",
) -> list[Task]:
    """Bundle ``objectives`` questions into each task, deterministically in ``seed``.

    The pool is shuffled and cut into consecutive groups of ``objectives`` (one *epoch*); the remainder that
    does not fill a task is left out of that epoch. Without ``num_tasks`` the result is one epoch: as many
    full tasks as the pool allows, no question used twice. With ``num_tasks`` the epochs repeat, each with a
    fresh shuffle, until ``num_tasks`` tasks exist: questions are then sampled *with replacement across
    epochs* (never twice inside one task or one epoch). The first tasks do not depend on ``num_tasks``, so a
    longer run sees a superset of a shorter one's tasks. Task ids are ``f"{prefix}-{k}"``, k = 0, 1, ...

    The gold answer of each task is its questions' canonical answers joined by ``"; "`` (``Task.gold``).

    mode: pooled (the above) | by_source (MEM1's: ``by_source_groups``, in file order, no shuffle; ids ``k`` count
    the groups of the whole pass; ``num_tasks`` may not exceed one pass, and fewer are drawn by source with ``seed``,
    ``subset_by_source``).
    """
    if mode not in COMPOSE_MODES:
        raise ValueError(f"compose_tasks: mode must be one of {COMPOSE_MODES}, got {mode!r}")
    if objectives < 1:
        raise ValueError(f"compose_tasks: objectives must be >= 1, got {objectives}")
    if not questions:
        raise ValueError("compose_tasks: the question pool is empty")
    if objectives > len(questions):
        raise ValueError(
            f"compose_tasks: a pool of {len(questions)} questions cannot fill one task of {objectives} objectives"
        )
    if num_tasks is not None and num_tasks < 1:
        raise ValueError(f"compose_tasks: num_tasks must be >= 1 or None, got {num_tasks}")

    if mode == "by_source":
        groups = by_source_groups(questions, objectives)
        if not groups:
            raise ValueError(f"compose_tasks: no source holds {objectives} questions (mode by_source)")
        if num_tasks is not None and num_tasks > len(groups):
            raise ValueError(
                f"compose_tasks: {num_tasks} tasks asked, but {len(questions)} questions compose {len(groups)} tasks "
                f"of {objectives} by source (mode by_source does not reuse questions)"
            )
        return subset_by_source([Task(f"{prefix}-{k}", g) for k, g in enumerate(groups)], num_tasks, seed)

    per_epoch = len(questions) // objectives
    wanted = per_epoch if num_tasks is None else num_tasks
    rng = random.Random(seed)
    tasks: list[Task] = []
    while len(tasks) < wanted:
        order = list(range(len(questions)))
        rng.shuffle(order)
        for start in range(0, per_epoch * objectives, objectives):
            if len(tasks) == wanted:
                break
            group = tuple(questions[i] for i in order[start : start + objectives])
            tasks.append(Task(f"{prefix}-{len(tasks)}", group))
    return tasks
