"""The oracle teacher: exact memory-agent trajectories for the supervised warm start (docs/algorithm.md §5.1).

The oracle knows each objective's reasoning chain (``SyntheticQuestion.hops``), so it writes the trajectory a
perfect memory agent would: for each objective in order, one ``<search>`` turn per hop (the query is the hop's
entity name), then one ``<answer>`` turn with every objective's answer joined by ``"; "`` (= ``Task.gold``).

Memory is a full rewrite every turn (docs/algorithm.md §1) and keeps exactly what later turns need, nothing stale:
- each finished objective's answer: ``"Q1: Lisbara."``;
- for the objective in progress, only the latest intermediate finding and what is still missing:
  ``"Q2: the founder of Brask Holdings is Velorin Oskatu; need the birth country of Velorin Oskatu."``
  (earlier findings of that chain are dropped: the next hop only needs the latest one).
The memory written at turn t holds what turn t-1's search returned, since the environment shows that result
in turn t's prompt. A task of N two-hop objectives takes 2N + 1 turns, so it must fit ``max_turns``.

Teacher trajectories are stored as JSONL, one task a line:
``{"task_id", "objectives": [{"question", "answers", "qid"?}], "turns": [turn text, ...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mempo.core.format import Tags, format_turn
from mempo.core.tasks import Question, Task
from mempo.data.compose import compose_tasks
from mempo.data.qa_files import iter_json_rows, require_answers, require_str
from mempo.data.synthetic import SyntheticQuestion, SyntheticWorld, split_questions


@dataclass(frozen=True)
class OracleTrajectory:
    """One teacher trajectory: ``turns[t]`` is exactly ``format_turn(memories[t], thinks[t], ...)``; the
    first ``len(queries)`` turns search, the last one answers ``final_answer``."""

    task_id: str
    turns: tuple[str, ...]
    memories: tuple[str, ...]
    thinks: tuple[str, ...]
    queries: tuple[str, ...]
    final_answer: str


def _check_chains(task: Task, chains: Sequence[SyntheticQuestion]) -> None:
    if len(chains) != len(task.objectives):
        raise ValueError(f"task {task.task_id!r}: {len(task.objectives)} objectives but {len(chains)} chains")
    for i, (objective, chain) in enumerate(zip(task.objectives, chains), start=1):
        if chain.question != objective:
            raise ValueError(f"task {task.task_id!r}: chain {i} is for {chain.question.qid!r}, not {objective.qid!r}")
        if not chain.hops or chain.hops[-1].answer != objective.answers[0]:
            raise ValueError(
                f"task {task.task_id!r}: chain {i} does not end in the gold answer {objective.answers[0]!r}"
            )


def oracle_trajectory(task: Task, chains: Sequence[SyntheticQuestion], tags: Tags = Tags()) -> OracleTrajectory:
    """The teacher's trajectory for ``task``; ``chains[i]`` is the chain of ``task.objectives[i]``."""
    _check_chains(task, chains)
    turns, memories, thinks, queries = [], [], [], []
    done: list[str] = []  # "Qk: answer." of finished objectives
    for i, chain in enumerate(chains, start=1):
        for j, hop in enumerate(chain.hops):
            found = f"{chain.hops[j - 1].note}; " if j > 0 else ""
            memory = " ".join([*done, f"Q{i}: {found}need {hop.wanted}."])
            think = f"Q{i} needs {hop.wanted}, so I search for {hop.query}."
            turns.append(format_turn(memory, think, "search", hop.query, tags))
            memories.append(memory)
            thinks.append(think)
            queries.append(hop.query)
        done.append(f"Q{i}: {chain.question.answers[0]}.")
    final = task.gold
    memory = " ".join(done)
    think = f"I have found all {len(chains)} answers." if len(chains) > 1 else "I have found the answer."
    turns.append(format_turn(memory, think, "answer", final, tags))
    memories.append(memory)
    thinks.append(think)
    return OracleTrajectory(task.task_id, tuple(turns), tuple(memories), tuple(thinks), tuple(queries), final)


def oracle_turns(task: Task, chains: Sequence[SyntheticQuestion], tags: Tags = Tags()) -> list[str]:
    """The teacher's turn texts for ``task`` (each exactly a ``format_turn`` output); see the module docstring."""
    return list(oracle_trajectory(task, chains, tags).turns)


def oracle_dataset(
    world: SyntheticWorld,
    split: str,
    objectives: int,
    num_tasks: int | None = None,
    seed: int = 0,
    tags: Tags = Tags(),
) -> list[tuple[Task, list[str]]]:
    """(task, teacher turns) pairs over ``world``'s ``split`` questions (``split_questions``: "train" asks about
    ``world``, "val"/"test" about its held-out world), composed by ``compose_tasks`` with ``seed``; task ids are
    ``f"syn-{split}-n{objectives}-{k}"``."""
    chained = split_questions(world, split, seed=seed)
    by_qid = {c.question.qid: c for c in chained}
    tasks = compose_tasks(
        [c.question for c in chained], objectives, num_tasks=num_tasks, seed=seed, prefix=f"syn-{split}-n{objectives}"
    )
    return [(task, oracle_turns(task, [by_qid[q.qid] for q in task.objectives], tags)) for task in tasks]


def save_trajectories_jsonl(path: str | Path, items: Iterable[tuple[Task, Sequence[str]]]) -> int:
    """Write (task, turns) pairs as teacher-trajectory JSONL (module docstring); returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for task, turns in items:
            objectives = [{"question": q.question, "answers": list(q.answers), "qid": q.qid} for q in task.objectives]
            f.write(json.dumps({"task_id": task.task_id, "objectives": objectives, "turns": list(turns)}) + "\n")
            n += 1
    return n


def load_trajectories_jsonl(path: str | Path) -> list[tuple[Task, list[str]]]:
    """Read teacher-trajectory JSONL back. A malformed line (broken JSON, missing or mistyped key, empty
    objectives, answers or turns) is a ValueError naming the file, the line and the key; so is an empty file."""
    path = Path(path)
    out = []
    for where, row in iter_json_rows(path):
        task_id = require_str(row, "task_id", where)
        if "objectives" not in row or "turns" not in row:
            raise ValueError(f"{where}: key {'objectives' if 'objectives' not in row else 'turns'!r}: missing")
        objectives = row["objectives"]
        if not isinstance(objectives, list) or not objectives:
            raise ValueError(f"{where}: key 'objectives': expected a non-empty list, got {objectives!r:.80}")
        questions = []
        for k, obj in enumerate(objectives):
            at = f"{where}, objectives[{k}]"
            if not isinstance(obj, dict):
                raise ValueError(f"{at}: expected an object, got {type(obj).__name__}")
            qid = obj.get("qid", "")
            if not isinstance(qid, str):
                raise ValueError(f"{at}: key 'qid': expected a string, got {type(qid).__name__}")
            questions.append(Question(require_str(obj, "question", at), require_answers(obj, "answers", at), qid))
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: key 'turns': expected a non-empty list of strings, got {turns!r:.80}")
        for t, turn in enumerate(turns):
            if not isinstance(turn, str) or not turn.strip():
                raise ValueError(f"{where}: key 'turns': turn {t} is not a non-empty string")
        out.append((Task(task_id, tuple(questions)), turns))
    if not out:
        raise ValueError(f"{path}: no trajectories (the file is empty)")
    return out
