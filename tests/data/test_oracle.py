"""The oracle teacher: well-formed turns, memory that keeps what later turns need, JSONL round trip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import bm25s
import pytest

from mempo.core import format as turn_format
from mempo.core.format import Tags, format_turn
from mempo.core.tasks import Task
from mempo.data.oracle import (
    load_trajectories_jsonl,
    oracle_dataset,
    oracle_trajectory,
    oracle_turns,
    save_trajectories_jsonl,
)
from mempo.data.synthetic import SyntheticQuestion, SyntheticWorld, corpus_passages, heldout_world


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld.generate(0)


@pytest.fixture(scope="module")
def chains(world: SyntheticWorld) -> dict[str, SyntheticQuestion]:
    """Every chain of the training world and of its held-out world (the "val"/"test" splits ask about it)."""
    return {q.question.qid: q for w in (world, heldout_world(world)) for q in w.all_questions()}


def turn_pattern(tags: Tags) -> re.Pattern[str]:
    """format_turn's output shape: one non-empty tag-free body per block, exactly one action, nothing around."""
    body = r" ([^<>\n]+?) "
    action = f"(?P<action>{re.escape(tags.search)}|{re.escape(tags.answer)})"
    return re.compile(
        f"<{tags.mem}>{body}</{tags.mem}>\n<{tags.think}>{body}</{tags.think}>\n<{action}>{body}</(?P=action)>"
    )


def chains_of(task: Task, chains: dict[str, SyntheticQuestion]) -> list[SyntheticQuestion]:
    return [chains[q.qid] for q in task.objectives]


@pytest.mark.parametrize("objectives", [1, 2, 5])
def test_turns_are_well_formed_and_end_in_the_gold_answer(world, chains, objectives: int) -> None:
    tags = Tags()
    pattern = turn_pattern(tags)
    for task, turns in oracle_dataset(world, "train", objectives, num_tasks=20, seed=1):
        traj = oracle_trajectory(task, chains_of(task, chains))
        assert turns == list(traj.turns)
        hops = [h for c in chains_of(task, chains) for h in c.hops]
        assert len(turns) == len(hops) + 1
        assert list(traj.queries) == [h.query for h in hops]
        for t, turn in enumerate(turns):
            match = pattern.fullmatch(turn)
            assert match, turn
            memory, think, action, argument = match.group(1), match.group(2), match.group("action"), match.group(4)
            assert (memory, think) == (traj.memories[t], traj.thinks[t])
            kind = "answer" if t == len(turns) - 1 else "search"
            assert action == tags.actions[kind]
            assert turn == format_turn(memory, think, kind, argument, tags)
            if kind == "search":
                assert argument == hops[t].query
        assert traj.final_answer == task.gold == match.group(4)


def test_memory_keeps_exactly_what_later_turns_need(world, chains) -> None:
    """At each turn: every finished objective's answer, the latest finding of the current chain, nothing stale."""
    for task, _ in oracle_dataset(world, "val", 4, num_tasks=15, seed=2):
        task_chains = chains_of(task, chains)
        traj = oracle_trajectory(task, task_chains)
        schedule = [(i, j) for i, c in enumerate(task_chains) for j in range(len(c.hops))]
        for t, memory in enumerate(traj.memories):
            current, hop = schedule[t] if t < len(schedule) else (len(task_chains), 0)
            for i, chain in enumerate(task_chains[:current], start=1):
                assert f"Q{i}: {chain.question.answers[0]}." in memory
                for h in chain.hops:
                    assert h.note not in memory, f"stale finding of finished Q{i} in {memory!r}"
            if current < len(task_chains):
                chain = task_chains[current]
                assert chain.hops[hop].wanted in memory
                if hop > 0:
                    assert chain.hops[hop - 1].note in memory
                for later in task_chains[current + 1 :]:
                    assert f"need {later.hops[0].wanted}" not in memory
        assert traj.memories[-1] == " ".join(f"Q{i}: {c.question.answers[0]}." for i, c in enumerate(task_chains, 1))


def test_memory_holds_what_the_previous_search_returned(world, chains) -> None:
    """With a real BM25 index over the corpus: the top passage of turn t-1's query states the answer that the
    memory written at turn t records. The corpus holds both worlds, as the agent's index does."""
    passages = corpus_passages(world)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([p["contents"] for p in passages], show_progress=False), show_progress=False)
    for task, _ in oracle_dataset(world, "test", 3, num_tasks=10, seed=3):
        task_chains = chains_of(task, chains)
        traj = oracle_trajectory(task, task_chains)
        hops = [h for c in task_chains for h in c.hops]
        tokens = bm25s.tokenize(list(traj.queries), show_progress=False)
        docs, _ = retriever.retrieve(tokens, k=1, show_progress=False)
        for t, hop in enumerate(hops):
            top = passages[docs[t, 0]]["contents"]
            assert hop.fact in top
            assert hop.answer in traj.memories[t + 1]


def test_custom_tags(world, chains) -> None:
    tags = Tags(search="tool_call", mem="memory")
    task, turns = oracle_dataset(world, "train", 2, num_tasks=1, seed=0, tags=tags)[0]
    pattern = turn_pattern(tags)
    assert all(pattern.fullmatch(turn) for turn in turns)
    assert turns[0].startswith("<memory> ") and "<tool_call> " in turns[0]


@pytest.mark.skipif(not hasattr(turn_format, "parse_turn"), reason="mempo.core.format.parse_turn not merged yet")
def test_turns_pass_the_project_parser(world) -> None:
    for task, turns in oracle_dataset(world, "train", 3, num_tasks=10, seed=4):
        parsed = [turn_format.parse_turn(turn) for turn in turns]
        assert all(p.ok for p in parsed), [p.error for p in parsed]
        assert [p.action for p in parsed] == ["search"] * (len(turns) - 1) + ["answer"]
        assert parsed[-1].argument == task.gold


def test_chains_must_match_the_task(world, chains) -> None:
    task, _ = oracle_dataset(world, "train", 2, num_tasks=1, seed=0)[0]
    task_chains = chains_of(task, chains)
    with pytest.raises(ValueError, match="2 objectives but 1 chains"):
        oracle_turns(task, task_chains[:1])
    with pytest.raises(ValueError, match="chain 1 is for"):
        oracle_turns(task, task_chains[::-1])


def test_dataset_is_deterministic(world) -> None:
    assert oracle_dataset(world, "train", 2, num_tasks=5, seed=9) == oracle_dataset(world, "train", 2, 5, 9)
    assert oracle_dataset(world, "train", 2, num_tasks=5, seed=9) != oracle_dataset(world, "train", 2, 5, 10)


def test_trajectories_jsonl_round_trip(world, tmp_path: Path) -> None:
    items = oracle_dataset(world, "train", 2, num_tasks=6, seed=0)
    path = tmp_path / "sft" / "teacher.jsonl"
    assert save_trajectories_jsonl(path, items) == 6
    assert load_trajectories_jsonl(path) == items


GOOD = {"task_id": "t", "objectives": [{"question": "Who?", "answers": ["Ann"]}], "turns": ["<mem> m </mem>"]}


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('{"task_id": "t", "objectives": [', "JSON"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "task_id"}), "'task_id'"),
        (json.dumps({**GOOD, "task_id": 7}), "'task_id'"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "turns"}), "'turns'"),
        (json.dumps({**GOOD, "objectives": []}), "'objectives'"),
        (json.dumps({**GOOD, "objectives": [{"question": "Who?", "answers": []}]}), "'answers'"),
        (json.dumps({**GOOD, "objectives": [{"question": "Who?", "answers": [""]}]}), "'answers'"),
        (json.dumps({**GOOD, "objectives": [{"answers": ["Ann"]}]}), "'question'"),
        (json.dumps({**GOOD, "turns": "one turn"}), "'turns'"),
        (json.dumps({**GOOD, "turns": ["ok", 3]}), "'turns'"),
        (json.dumps([GOOD]), "expected a JSON object"),
    ],
)
def test_malformed_trajectory_lines_name_file_line_and_key(tmp_path: Path, line: str, key: str) -> None:
    path = tmp_path / "teacher.jsonl"
    path.write_text(f"{json.dumps(GOOD)}\n\n{line}\n{json.dumps(GOOD)}\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        load_trajectories_jsonl(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value) and key in str(err.value)


def test_empty_trajectory_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no trajectories"):
        load_trajectories_jsonl(path)
