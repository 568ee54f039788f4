"""``data.batch_size`` is tasks per RL step across all data-parallel ranks: each rank takes an equal contiguous share
of the global batch, so the ranks together train on exactly the batches one process would."""

from __future__ import annotations

import itertools

import pytest

from mempo.core.tasks import Question, Task
from mempo.data.compose import compose_tasks
from mempo.data.datamodule import TaskStream, tasks_per_step_line

POOL = compose_tasks([Question(f"Question {i}?", (f"answer {i}",), f"q{i}") for i in range(46)], 2, seed=0)


def ids(tasks: list[Task]) -> list[str]:
    return [t.task_id for t in tasks]


def one_process_batches(batch_size: int, steps: int, start: int = 0) -> list[list[str]]:
    """Batches of a one-process stream, listed independently of the sharding: consecutive slices of the epochs'
    seeded permutations (``TaskStream.batch``)."""
    stream = TaskStream(POOL, batch_size, seed=7, start=start)
    return [ids(b) for b in itertools.islice(iter(stream), steps)]


@pytest.mark.parametrize(("batch_size", "world"), [(4, 2), (6, 3), (8, 8), (16, 4)])
def test_the_union_of_the_ranks_tasks_at_step_k_is_the_one_process_batch_k(batch_size: int, world: int) -> None:
    steps = 7  # 23 tasks in the pool: several steps cross an epoch boundary
    want = one_process_batches(batch_size, steps)
    ranks = [
        [ids(b) for b in itertools.islice(iter(TaskStream(POOL, batch_size, seed=7, rank=r, world_size=world)), steps)]
        for r in range(world)
    ]
    for k in range(steps):
        shares = [ranks[r][k] for r in range(world)]
        assert all(len(s) == batch_size // world for s in shares)
        assert [t for s in shares for t in s] == want[k]  # rank order = the batch's order: nothing shared, none lost


def test_a_resumed_stream_starts_at_its_step_on_every_rank() -> None:
    for r in range(2):
        full = list(itertools.islice(iter(TaskStream(POOL, 4, seed=7, rank=r, world_size=2)), 5))
        resumed = list(itertools.islice(iter(TaskStream(POOL, 4, seed=7, start=3, rank=r, world_size=2)), 2))
        assert [ids(b) for b in resumed] == [ids(b) for b in full[3:]]


def test_one_process_stream_is_unchanged_by_the_global_meaning() -> None:
    # batch k of one process is tasks [k*B, (k+1)*B) of the seeded epoch stream, as before the key became global
    stream = TaskStream(POOL, 3, seed=7)
    flat = [t for k in range(10) for t in ids(stream.batch(k))]
    assert one_process_batches(3, 10) == [flat[i : i + 3] for i in range(0, 30, 3)]


def test_a_batch_the_ranks_cannot_share_equally_is_an_error_naming_the_key_and_the_world_size() -> None:
    with pytest.raises(ValueError, match=r"data\.batch_size=6 .*not divisible by the world size 4"):
        TaskStream(POOL, 6, world_size=4)


def test_the_tasks_per_step_line() -> None:
    assert tasks_per_step_line(128, 8) == "tasks per step: 128 (16 per rank x 8 ranks)"
    assert tasks_per_step_line(2, 1) == "tasks per step: 2"
