"""The multi-objective composer: N questions bundled into one task (mempo.md §2, after MEM1).

Every data source (the synthetic world, Search-R1-style QA files) yields ``Question``s; this one function
turns any pool of them into ``Task``s, so training and evaluation compose tasks the same way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mempo.core.tasks import Question, Task


def compose_tasks(
    questions: Sequence[Question],
    objectives: int,
    *,
    num_tasks: int | None = None,
    seed: int = 0,
    prefix: str = "task",
) -> list[Task]:
    """Bundle ``objectives`` questions into each task, deterministically in ``seed``.

    The pool is shuffled and cut into consecutive groups of ``objectives`` (one *epoch*); the remainder that
    does not fill a task is left out of that epoch. Without ``num_tasks`` the result is one epoch: as many
    full tasks as the pool allows, no question used twice. With ``num_tasks`` the epochs repeat, each with a
    fresh shuffle, until ``num_tasks`` tasks exist: questions are then sampled *with replacement across
    epochs* (never twice inside one task or one epoch). The first tasks do not depend on ``num_tasks``, so a
    longer run sees a superset of a shorter one's tasks. Task ids are ``f"{prefix}-{k}"``, k = 0, 1, ...

    The gold answer of each task is its questions' canonical answers joined by ``"; "`` (``Task.gold``).
    """
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
