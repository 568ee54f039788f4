"""The multi-objective composer: determinism, gold joining, epochs with replacement, bad arguments."""

from __future__ import annotations

import pytest

from mempo.core.tasks import ANSWER_SEPARATOR, Question, Task
from mempo.data.compose import compose_tasks

POOL = [Question(f"Question number {i}?", (f"answer {i}", f"alias {i}"), f"q{i}") for i in range(11)]


def qids(tasks: list[Task]) -> list[tuple[str, ...]]:
    return [tuple(q.qid for q in t.objectives) for t in tasks]


def test_one_epoch_uses_each_question_at_most_once() -> None:
    tasks = compose_tasks(POOL, 3, seed=5)
    assert len(tasks) == len(POOL) // 3
    used = [qid for group in qids(tasks) for qid in group]
    assert len(used) == len(set(used)) == 9
    assert [t.task_id for t in tasks] == ["task-0", "task-1", "task-2"]
    assert all(len(t.objectives) == 3 for t in tasks)


def test_same_seed_same_tasks_different_seed_different_tasks() -> None:
    assert compose_tasks(POOL, 2, seed=1) == compose_tasks(POOL, 2, seed=1)
    assert qids(compose_tasks(POOL, 2, seed=1)) != qids(compose_tasks(POOL, 2, seed=2))


def test_gold_joins_canonical_answers_in_objective_order() -> None:
    for task in compose_tasks(POOL, 4, seed=0, prefix="mix"):
        assert task.task_id.startswith("mix-")
        assert task.gold == ANSWER_SEPARATOR.join(q.answers[0] for q in task.objectives)
        assert task.gold.count("; ") == 3
        assert task.gold_answers == tuple(q.answers for q in task.objectives)
        assert task.question.splitlines()[1] == f"(2) {task.objectives[1].question}"


def test_more_tasks_than_one_epoch_repeats_epochs_with_fresh_shuffles() -> None:
    one_epoch = compose_tasks(POOL, 3, seed=4)
    many = compose_tasks(POOL, 3, num_tasks=10, seed=4)
    assert len(many) == 10 and len({t.task_id for t in many}) == 10
    assert many[:3] == one_epoch, "the first tasks do not depend on num_tasks"
    assert compose_tasks(POOL, 3, num_tasks=2, seed=4) == one_epoch[:2]
    for group in qids(many):
        assert len(set(group)) == 3, "no question twice inside one task"
    for epoch in range(3):
        used = [qid for group in qids(many[3 * epoch : 3 * epoch + 3]) for qid in group]
        assert len(used) == len(set(used)), "no question twice inside one epoch"
    assert qids(many[:3]) != qids(many[3:6])


def test_single_objective_and_whole_pool() -> None:
    singles = compose_tasks(POOL, 1)
    assert sorted(q.qid for t in singles for q in t.objectives) == sorted(q.qid for q in POOL)
    assert singles[0].question == singles[0].objectives[0].question
    assert len(compose_tasks(POOL, len(POOL))) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(questions=POOL, objectives=0), "objectives must be >= 1"),
        (dict(questions=[], objectives=2), "pool is empty"),
        (dict(questions=POOL[:3], objectives=4), "pool of 3 questions cannot fill one task of 4"),
        (dict(questions=POOL, objectives=2, num_tasks=0), "num_tasks must be >= 1"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compose_tasks(**kwargs)


def test_an_empty_answer_is_rejected_naming_the_question() -> None:
    with pytest.raises(ValueError, match="'q-empty'"):
        Question("Who?", ("",), "q-empty")
    with pytest.raises(ValueError, match="'q-none'"):
        Question("Who?", (), "q-none")


# ---- real data: MEM1's composition, the capacity of a split, a test split of its own --------------------------


def test_by_source_groups_consecutive_questions_of_one_source():
    from mempo.data.compose import task_capacity

    qs = [Question(f"q{i}?", ("a",), f"id{i}", src) for i, src in enumerate("nnhnhhnh")]
    tasks = compose_tasks(qs, 2, mode="by_source", prefix="t")
    # nq: id0 id1 id3 id6 -> (0,1), (3,6); hotpotqa: id2 id4 id5 id7 -> (2,4), (5,7); no remainder here
    assert [[q.qid for q in t.objectives] for t in tasks] == [
        ["id0", "id1"], ["id3", "id6"], ["id2", "id4"], ["id5", "id7"]
    ]  # fmt: skip
    assert [t.source for t in tasks] == ["n", "n", "h", "h"] and task_capacity(qs, 3, "by_source") == 2
    assert [[q.qid for q in t.objectives] for t in compose_tasks(qs, 3, mode="by_source")] == [
        ["id0", "id1", "id3"], ["id2", "id4", "id5"]
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"5 tasks asked, but 8 questions compose 4 tasks"):
        compose_tasks(qs, 2, mode="by_source", num_tasks=5)


def test_by_source_with_fewer_tasks_draws_each_sources_share_with_the_seed():
    """by_source took its first ``num_tasks`` groups, i.e. the first source(s) of the file only. 200 questions of
    nq then 100 of hotpotqa, N=2: 150 groups, 100 and 50; 30 tasks are 20 and 10, the same ones for the same seed."""
    qs = [Question(f"n{i}?", ("a",), f"n{i}", "nq") for i in range(200)]
    qs += [Question(f"h{i}?", ("a",), f"h{i}", "hotpotqa") for i in range(100)]
    tasks = compose_tasks(qs, 2, mode="by_source", num_tasks=30, seed=0, prefix="t")
    assert [t.source for t in tasks].count("nq") == 20 and [t.source for t in tasks].count("hotpotqa") == 10
    everything = {t.task_id: t for t in compose_tasks(qs, 2, mode="by_source", prefix="t")}
    assert all(everything[t.task_id] == t for t in tasks)  # a task keeps its id in the full pass
    assert [t.task_id for t in tasks] == sorted((t.task_id for t in tasks), key=lambda k: int(k.split("-")[1]))
    assert compose_tasks(qs, 2, mode="by_source", num_tasks=30, seed=0, prefix="t") == tasks
    assert compose_tasks(qs, 2, mode="by_source", num_tasks=30, seed=1, prefix="t") != tasks
