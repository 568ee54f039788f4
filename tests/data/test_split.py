"""The entity-level held-out split: held-out tasks ask about a second world that no training data mentions."""

from __future__ import annotations

import re

import pytest

from mempo.data.oracle import oracle_dataset
from mempo.data.synthetic import SyntheticWorld, corpus_passages, heldout_world, split_questions
from mempo.stages.builders import build_tasks
from mempo.stages.config import compose_config


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld.generate(0)


def words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]+", text)}


def test_heldout_world_shares_no_name_with_the_training_world(world) -> None:
    held = heldout_world(world)
    assert held.name_words() and not (held.name_words() & world.name_words())
    # Independently of name_words: no capitalised word of a held-out passage title occurs in any training passage.
    train_text = words(" ".join(p["contents"] for p in world.passages()))
    for p in held.passages():
        title = p["contents"].split("\n", 1)[0].strip('"')
        invented = {w for w in words(title) if w not in {"holdings", "group", "works", "institute", "company",
                                                           "foundation", "labs", "trading"}}  # fmt: skip
        assert invented and not (invented & train_text), title


def test_splits_are_disjoint_and_the_corpus_holds_both_worlds(world) -> None:
    train = split_questions(world, "train", seed=0)
    val, test = split_questions(world, "val", seed=0), split_questions(world, "test", seed=0)
    held_qids = {q.question.qid for q in heldout_world(world).all_questions()}
    assert {q.question.qid for q in train} == {q.question.qid for q in world.all_questions()}
    assert {q.question.qid for q in val} | {q.question.qid for q in test} == held_qids
    assert not ({q.question.qid for q in val} & {q.question.qid for q in test})
    assert not (held_qids & {q.question.qid for q in train})
    ids = [p["id"] for p in corpus_passages(world)]
    assert len(ids) == len(set(ids)) == len(world.passages()) + len(heldout_world(world).passages())
    with pytest.raises(ValueError, match="split must be one of"):
        split_questions(world, "dev", seed=0)


def test_no_heldout_entity_appears_in_training_tasks_or_teacher_turns(world) -> None:
    """What the warm start and RL train on (task questions, teacher turns with their memories and queries) never
    names a held-out entity, so a held-out answer can only come from searching."""
    held = heldout_world(world).name_words()
    seen: set[str] = set()
    for n in (1, 2):
        for task, turns in oracle_dataset(world, "train", n, num_tasks=200, seed=0):
            seen |= words(task.question) | words(" ".join(turns))
    assert seen and not (seen & held)
    # And every held-out task asks about the held-out world only.
    for task, _ in oracle_dataset(world, "val", 2, num_tasks=64, seed=0):
        assert words(task.question) & held
        assert not (words(" ".join(a for q in task.objectives for a in q.answers)) & world.name_words())


def test_build_tasks_trains_and_evaluates_on_different_worlds() -> None:
    cfg = compose_config("model=tiny", "sampler=hf")
    train = build_tasks(cfg, "train", num_tasks=50)
    val = build_tasks(cfg, "val", num_tasks=64, objectives=1)
    train_qids = {q.qid for t in train for q in t.objectives}
    val_qids = {q.qid for t in val for q in t.objectives}
    assert all(q.startswith("w0-") for q in train_qids)
    assert all(q.startswith("w7919-") for q in val_qids) and len(val_qids) == 64


# ---- real data: qa_files splits through build_tasks ------------------------------------------------------------


def _qa(path, questions, source="nq"):
    import json

    rows = [
        {"id": f"{source}-{i}", "question": q, "golden_answers": ["x"], "data_source": source}
        for i, q in enumerate(questions)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_qa_files_splits_capacity_and_overlap(make_cfg, tmp_path):
    """eval.num_tasks above the split silently reused questions, and eval.split=test read the val
    files. Now: null = each question once; more than the split holds is an error naming the numbers; test reads
    data.test_files and refuses a question also in the training or validation files."""
    from mempo.stages.builders import build_tasks

    train = _qa(tmp_path / "train.jsonl", [f"train question {i}?" for i in range(6)])
    val = _qa(tmp_path / "val.jsonl", [f"val question {i}?" for i in range(5)])
    test = _qa(tmp_path / "test.jsonl", [f"test question {i}?" for i in range(4)], source="hotpotqa")
    base = ["data=qa_files", "env=http", f"data.train_files=[{train}]", f"data.val_files=[{val}]"]
    cfg = make_cfg(*base, f"data.test_files=[{test}]")
    assert len(build_tasks(cfg, "val")) == 2  # 5 questions, N=2: each once, remainder dropped
    with pytest.raises(ValueError, match=r"3 tasks of 2 objectives asked of data.val_files .* which holds 2"):
        build_tasks(cfg, "val", num_tasks=3)
    assert len(build_tasks(cfg, "train", num_tasks=7)) == 7  # training reuses questions across epochs
    tasks = build_tasks(cfg, "test", objectives=2)
    assert {q.question for t in tasks for q in t.objectives} == {f"test question {i}?" for i in range(4)}
    with pytest.raises(ValueError, match=r"data.test_files is empty"):
        build_tasks(make_cfg(*base), "test")
    leak = _qa(tmp_path / "leak.jsonl", ["test question 0?", "VAL question 3"])  # normalised: "val question 3"
    with pytest.raises(ValueError, match=r"question 'nq-1' \('VAL question 3'\) is also in data.val_files file"):
        build_tasks(make_cfg(*base, f"data.test_files=[{leak}]"), "test")
