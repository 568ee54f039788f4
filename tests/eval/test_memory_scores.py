"""The study's fixed-scorer memory scores (mempo.eval.memory_scores, mempo.stages.study.score_memories): which memories
are scored, their per-task and per-seed means and paired comparisons worked out by hand, and the scorer being the
warm start (not a checkpoint's own weights) against plain float32 forwards."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from mempo.eval.memory_scores import (
    MemoryItem,
    memory_items,
    read_turn_scores,
    score_markdown,
    score_study,
    task_means,
    turn_scores,
)
from mempo.lm.loading import load_policy
from mempo.stages.builders import build_builder
from mempo.stages.config import compose_config
from mempo.stages.study import score_memories


def record(checkpoint: str, task: str, memories: list[tuple[bool, str]], agent: str = "memory") -> dict:
    trace = [{"turn": i, "ok": ok, "memory": m} for i, (ok, m) in enumerate(memories)]
    return {"checkpoint": checkpoint, "agent": agent, "objectives": 2, "task_id": task, "question": f"q {task}",
            "gold": f"gold {task}", "trace": trace}  # fmt: skip


def test_only_well_formed_turns_with_a_memory_of_the_memory_agent_are_scored() -> None:
    records = [
        record("a_s0", "t1", [(True, "Q1: x"), (False, "broken"), (True, ""), (True, "Q1: x. Q2: y")]),
        record("a_s0", "t2", [(True, "Q1: z")], agent="full"),
    ]
    got = memory_items(records)
    assert [(it.task_id, it.turn, it.memory) for it in got] == [("t1", 0, "Q1: x"), ("t1", 3, "Q1: x. Q2: y")]
    assert got[0] == MemoryItem("a_s0", 2, "t1", 0, "q t1", "Q1: x", "gold t1")


def items_of(spec: dict[str, dict[str, list[float]]]) -> tuple[list[MemoryItem], list[float]]:
    """checkpoint -> task -> the P of each of its memories -> items and scores."""
    items, p = [], []
    for ckpt, tasks in spec.items():
        for task, ps in tasks.items():
            for turn, v in enumerate(ps):
                items.append(MemoryItem(ckpt, 2, task, turn, "q", "m", "g"))
                p.append(v)
    return items, p


def test_per_task_and_per_seed_means_and_the_paired_comparison_by_hand() -> None:
    items, p = items_of({
        "ws": {"t1": [0.1], "t2": [0.2, 0.4], "t3": [0.3]},
        "a_s0": {"t1": [0.2], "t2": [0.2]},                      # no memory on t3
        "a_s1": {"t1": [0.1], "t2": [0.3], "t3": [0.5]},
        "b_s0": {"t1": [0.4, 0.6], "t2": [0.3], "t3": [0.9]},
        "b_s1": {"t1": [0.1], "t2": [0.5], "t3": [0.5]},
    })  # fmt: skip
    means = task_means(items, p)
    assert means[("b_s0", 2)] == pytest.approx({"t1": 0.5, "t2": 0.3, "t3": 0.9})
    assert means[("ws", 2)] == pytest.approx({"t1": 0.1, "t2": 0.3, "t3": 0.3})
    st = score_study(items, p, {"a": {0: "a_s0", 1: "a_s1"}, "b": {0: "b_s0", 1: "b_s1"}}, reference="a",
                     warm_start="ws")  # fmt: skip
    a = st["arms"]["a"]["by_n"]["2"]
    assert a["tasks_with_memories"] == [2, 3] and a["per_seed"] == pytest.approx([0.2, 0.3])
    assert a["mean"] == pytest.approx(0.25) and st["memories"] == len(items)
    b_vs_a = st["comparisons"][0]
    assert (b_vs_a["arm"], b_vs_a["against"], b_vs_a["N"]) == ("b", "a", 2)
    r = b_vs_a["p_gold"]
    # the tasks with memories on both sides at every seed: t1, t2 (a has no memory on t3 at seed 0). Seed 0:
    # (0.5 - 0.2 + 0.3 - 0.2) / 2 = 0.2; seed 1: (0.1 - 0.1 + 0.5 - 0.3) / 2 = 0.1. The task means over seeds are 0.15
    # and 0.15: no task term, so df = K - 1 = 1 and the interval is 0.15 +- 12.7062 * sd(0.2, 0.1) / sqrt(2)
    assert r["tasks"] == [2, 2] and r["per_seed"] == pytest.approx([0.2, 0.1])
    half = 12.7062 * (0.1 / math.sqrt(2)) / math.sqrt(2)
    assert r["df"] == pytest.approx(1.0) and r["interval"] == pytest.approx([0.15 - half, 0.15 + half])
    assert r["verdict"] == "includes 0"
    ws = [c for c in st["comparisons"] if c["against"] == "warm_start" and c["arm"] == "b"][0]["p_gold"]
    # b - ws: seed 0 (0.4 + 0 + 0.6) / 3, seed 1 (0 + 0.2 + 0.2) / 3: the warm start's one checkpoint for each seed
    assert ws["per_seed"] == pytest.approx([1.0 / 3, 0.4 / 3])
    assert "| b - a | 2 | P_GOLD | 0.2000, 0.1000 | 0.1500 | [-0.4853, 0.7853] | 1.0 |" in score_markdown(st)


def test_the_turn_matched_comparison_by_hand() -> None:
    """p_gold_turn: per seed and task, each side's mean P over the turns both wrote a memory at. Here arm b's rollout
    on t1 at seed 0 stops a turn sooner than a's, so its task mean is lower while it matches a turn for turn."""
    items, p = items_of({
        "ws": {"t1": [0.1, 0.2, 0.3], "t2": [0.2]},
        "a_s0": {"t1": [0.1, 0.3, 0.5], "t2": [0.2, 0.4]},
        "a_s1": {"t1": [0.1, 0.2], "t2": [0.3]},
        "b_s0": {"t1": [0.2, 0.3], "t2": [0.2, 0.4, 0.9]},
        "b_s1": {"t1": [0.1, 0.4, 0.6], "t2": [0.5, 0.7]},
    })  # fmt: skip
    assert turn_scores(items, p)[("b_s0", 2)] == {"t1": {0: 0.2, 1: 0.3}, "t2": {0: 0.2, 1: 0.4, 2: 0.9}}
    st = score_study(items, p, {"a": {0: "a_s0", 1: "a_s1"}, "b": {0: "b_s0", 1: "b_s1"}}, reference="a",
                     warm_start="ws")  # fmt: skip
    r = st["comparisons"][0]["p_gold_turn"]
    # seed 0: t1 at turns 0-1 (0.25 - 0.2), t2 at 0-1 (0.3 - 0.3) -> 0.025; seed 1: t1 at 0-1 (0.25 - 0.15), t2 at 0
    # (0.5 - 0.3) -> 0.15. Task means over seeds 0.075 and 0.1: Var = 0.0078125 / 2 + 0.0003125 / 2 = 0.0040625,
    # df = Var^2 / ((0.0078125 / 2)^2 + (0.0003125 / 2)^2) = 1.0800
    assert r["per_seed"] == pytest.approx([0.025, 0.15]) and r["mean"] == pytest.approx(0.0875)
    assert r["df"] == pytest.approx(0.0040625**2 / (0.00390625**2 + 0.00015625**2))
    # the task means compare differently: seed 0 (0.25 - 0.3 + 0.5 - 0.3) / 2 = 0.075
    assert st["comparisons"][0]["p_gold"]["per_seed"][0] == pytest.approx(0.075)
    # b - warm start, seed 0: t1 at 0-1 (0.25 - 0.15), t2 at 0 (0.2 - 0.2) -> 0.05; seed 1: t1 at 0-2 (1.1 / 3 - 0.2),
    # t2 at 0 (0.5 - 0.2) -> (1 / 6 + 0.3) / 2
    ws = [c for c in st["comparisons"] if c["against"] == "warm_start" and c["arm"] == "b"][0]["p_gold_turn"]
    assert ws["per_seed"] == pytest.approx([0.05, (1 / 6 + 0.3) / 2])
    assert "| b - a | 2 | P_GOLD_TURN | 0.0250, 0.1500 | 0.0875 |" in score_markdown(st)


def test_memory_scores_csv_reads_back_and_names_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "memory_scores.csv"
    path.write_text("checkpoint,objectives,task_id,turn,p_gold\na_s0,2,t1,0,0.25\na_s0,2,t1,1,0.5\nws,3,t2,0,1e-3\n")
    assert read_turn_scores(path) == {("a_s0", 2): {"t1": {0: 0.25, 1: 0.5}}, ("ws", 3): {"t2": {0: 0.001}}}
    path.write_text("checkpoint,objectives,task_id,turn,p_gold\na_s0,2,t1,0,0.25\na_s0,2,t1,one,0.5\n")
    with pytest.raises(ValueError, match=r"memory_scores.csv, line 3: column turn is 'one', not a number"):
        read_turn_scores(path)
    path.write_text("checkpoint,objectives,task_id,p_gold\na_s0,2,t1,0.25\n")
    with pytest.raises(ValueError, match=r"no column\(s\) \['turn'\]"):
        read_turn_scores(path)


def test_a_seed_without_common_memories_is_named_not_averaged() -> None:
    items, p = items_of({"a_s0": {"t1": [0.2]}, "b_s0": {"t2": [0.4]}, "a_s1": {"t1": [0.1]}, "b_s1": {"t1": [0.3]}})
    st = score_study(items, p, {"a": {0: "a_s0", 1: "a_s1"}, "b": {0: "b_s0", 1: "b_s1"}}, reference="a")
    assert st["comparisons"][0]["p_gold"]["verdict"] == "no task with memories on both sides at seed(s) [0]"
    assert "no task with memories on both sides" in score_markdown(st)
    # both sides wrote memories at each seed, but on different tasks at seeds 0 and 1: no task the crossed design holds
    items, p = items_of({"a_s0": {"t1": [0.2]}, "b_s0": {"t1": [0.4]}, "a_s1": {"t2": [0.1]}, "b_s1": {"t2": [0.3]}})
    st = score_study(items, p, {"a": {0: "a_s0", 1: "a_s1"}, "b": {0: "b_s0", 1: "b_s1"}}, reference="a")
    assert st["comparisons"][0]["p_gold"]["verdict"] == "no task with memories on both sides at every seed"


def test_the_scorer_is_the_warm_start_against_plain_forwards(tiny_path: Path, tmp_path: Path) -> None:
    """The warm start here is a perturbed copy of the tiny model (the run's own model.name_or_path is the tiny model):
    the scores must be the copy's, computed here by one unpadded float32 forward per memory."""
    model, tok = load_policy(tiny_path)
    torch.manual_seed(0)
    with torch.no_grad():
        for w in model.parameters():
            w.add_(0.05 * torch.randn_like(w))
    model.save_pretrained(tmp_path / "ws")
    tok.save_pretrained(tmp_path / "ws")
    cfg = compose_config("+exp=study", "+debug=default", f"study.warm_start={tmp_path / 'ws'}",
                         "trainer.precision=32-true")  # fmt: skip
    items = [MemoryItem("x", 2, "t1", 0, "Who wrote A?", "Q1: B wrote A. Q2: need the year", "B; 1999"),
             MemoryItem("x", 2, "t2", 1, "Where is C?", "Q1: D", "D; E"),
             MemoryItem("y", 2, "t1", 2, "Who wrote A?", "", "B; 1999")]  # fmt: skip
    got, dtype = score_memories(cfg, items)
    assert dtype == "float32"
    builder = build_builder(cfg, tok)

    def plain(m: torch.nn.Module, it: MemoryItem) -> float:
        prompt, answer = builder.scoring_prompt(it.question, it.memory), builder.answer_ids(it.gold)
        with torch.no_grad():
            logits = m(input_ids=torch.tensor([prompt + answer])).logits[0].float()
        lp = logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(answer)[:, None])
        return float(lp.mean())  # Eq. 4 as mempo reads it: exp(mean token log-prob of the gold answer)

    # compared as log P: the tiny random model gives P ~ 1e-5, below assert_close's default atol on P itself;
    # atol 1e-4 on a mean of token log-probs: padded micro-batches against single rows reorder float32 sums
    log_got = torch.tensor(got, dtype=torch.float64).log()
    assert_close(log_got, torch.tensor([plain(model, it) for it in items], dtype=torch.float64), rtol=0, atol=1e-4)
    original, _ = load_policy(tiny_path)
    own = torch.tensor([plain(original, it) for it in items], dtype=torch.float64)
    assert (log_got - own).abs().min() > 0.1  # the run's own model would have scored them otherwise
